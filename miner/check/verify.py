"""End-to-end check of the promoted fusions on real model steps (``miner verify``).

For each model and mode the same model (same seeded weights, same inputs) is compiled twice:
``torch.compile(model)`` and ``torch.compile(model, options=fusions.inductor_options())``. Each
runs warm-up steps (the first compiles), one parity step from a fixed RNG seed (so that
dropout draws the same masks in both), and timed steps:

* train: zero grads, forward + loss under bf16 autocast, backward;
* infer: forward under bf16 autocast and ``torch.no_grad()``.

Reported: median step time with 20/80% quantiles (CUDA events around each step), the speedup,
the peak memory of the timed steps, loss / logits / gradient parity between the two, and how
many times each fusion matched while compiling (the ``fusions`` package's counters).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from miner.bench import roofline as rl
from miner.core.dtypes import AUTOCAST_MODEL_TOL, PARITY_ATOL, PARITY_FLOOR_MAX, PARITY_K
from miner.core.errors import MinerError, UsageError


FIXED, FLOOR = "fixed tolerance", "float32 floor"
QUANTITIES = ("loss", "logits", "grads")
STEP_DTYPE = "bf16 autocast"  # how make_step runs a model (the A/B's and miner verify's steps)


@dataclass(frozen=True)
class StepStats:
    median_ms: float
    p20_ms: float
    p80_ms: float
    steps: int
    peak_mem_bytes: int  # the step's peak beyond what was allocated before it (weights excluded)
    first_step_s: float  # the compiling step, wall clock


@dataclass(frozen=True)
class Parity:
    """One seeded step of a variant against the default compile's (relative norm differences), and, where
    a float32 reference step was measured, both against it: ``ok`` then follows :func:`judge_parity`
    (``judged`` says which rule decided, ``reason`` why)."""

    loss_default: float | None
    loss_fused: float | None
    loss_rel: float | None
    logits_rel: float | None
    grads_rel: float | None  # || g_fused - g_default || / || g_default || over all parameters
    grads_worst: str | None  # the parameter with the largest relative difference
    grads_worst_rel: float | None
    ok: bool
    judged: str = FIXED  # FIXED (AUTOCAST_MODEL_TOL on the direct differences) or FLOOR (judge_parity)
    floor: dict | None = None  # the default compile's relative error to the float32 step, per quantity
    error: dict | None = None  # this variant's, per quantity
    reason: str = ""

    @property
    def unjudged(self) -> bool:
        """The rule could not be applied (``judged`` ends "(not judged)", ``reason`` says why): not a
        measured failure, never a win either (``ok`` is False)."""
        return "not judged" in self.judged


@dataclass(frozen=True)
class VerifyResult:
    model: str
    mode: str
    preset: str
    batch: int | None
    seq: int | None
    default: StepStats | None = None
    fused: StepStats | None = None
    parity: Parity | None = None
    matches: dict[str, int] = field(default_factory=dict)  # fusion name -> times it fired
    gate: dict[str, int] = field(default_factory=dict)  # measured-wins gate decisions while compiling
    error: str | None = None
    env: dict[str, Any] = field(default_factory=dict)

    @property
    def speedup(self) -> float | None:
        if self.default is None or self.fused is None or self.fused.median_ms <= 0:
            return None
        return self.default.median_ms / self.fused.median_ms


def result_to_json(r: VerifyResult) -> dict:
    d = asdict(r)
    d["speedup"] = r.speedup
    return d


def result_from_json(d: dict) -> VerifyResult:
    d = {k: v for k, v in d.items() if k != "speedup"}
    for k in ("default", "fused"):
        d[k] = StepStats(**d[k]) if d.get(k) else None
    d["parity"] = Parity(**d["parity"]) if d.get("parity") else None
    return VerifyResult(**d)


# --------------------------------------------------------------------------- parity math

def rel_diff(a, b) -> float:
    """|| a - b || / || b || in float64 (tensors or floats); NaN anywhere -> inf."""
    import torch

    def f64(x):
        return x.detach().to("cpu", torch.float64) if torch.is_tensor(x) else torch.tensor(x, dtype=torch.float64)

    a64, b64 = f64(a), f64(b)
    if a64.shape != b64.shape:
        return float("inf")
    if not (torch.isfinite(a64).all() and torch.isfinite(b64).all()):
        return float("inf")
    num = (a64 - b64).norm().item()
    den = b64.norm().item()
    return num / den if den > 0 else num


def grads_parity(fused: dict[str, Any], default: dict[str, Any]) -> tuple[float, str | None, float]:
    """Global relative difference over all gradients, and the worst single parameter (a pair on two
    devices is compared on ``default``'s, one parameter at a time)."""
    import torch

    num = den = 0.0
    worst, worst_rel = None, 0.0
    for name, g in default.items():
        f = fused.get(name)
        if g is None and f is None:
            continue
        if g is None or f is None:
            return float("inf"), name, float("inf")
        g64, f64 = g.detach().double(), f.detach().to(g.device, torch.float64)
        if not (torch.isfinite(g64).all() and torch.isfinite(f64).all()):
            return float("inf"), name, float("inf")
        d2 = (f64 - g64).norm().item() ** 2
        n2 = g64.norm().item() ** 2
        num += d2
        den += n2
        r = math.sqrt(d2) / math.sqrt(n2) if n2 > 0 else math.sqrt(d2)
        if r > worst_rel:
            worst, worst_rel = name, r
    return (math.sqrt(num) / math.sqrt(den) if den > 0 else math.sqrt(num)), worst, worst_rel


def errors(got: tuple, ref: tuple) -> dict[str, float | None]:
    """Relative errors of one observed step ``(loss, logits, grads)`` to another, per quantity."""
    loss = rel_diff(got[0], ref[0]) if got[0] is not None and ref[0] is not None else None
    logits = rel_diff(got[1], ref[1]) if got[1] is not None and ref[1] is not None else None
    grads = grads_parity(got[2], ref[2])[0] if ref[2] else None
    return {"loss": loss, "logits": logits, "grads": grads}


def judge_parity(error: dict, floor: dict, *, k: float = PARITY_K, atol: dict | None = None) -> tuple[bool, str]:
    """Whether a variant's step is as close to the float32 step as the default compile's is.

    Pure. Per quantity (loss, logits, grads): ``error[q] <= k * floor[q] + atol[q]``, where ``floor``
    is the default compile's relative error to the float32 step of the same seeded inputs and
    dropout draws, ``error`` the variant's (:data:`miner.core.dtypes.PARITY_K`, ``PARITY_ATOL``). A
    rewrite that rounds differently lands near the floor (two such errors add to about 1.41 times
    one); a wrong one (a scale of 1.1) lands far above it. A missing quantity is skipped; an
    infinite error (NaN, a missing gradient) fails.

    Returns
    -------
    (bool, str)
        ok, and the quantities compared (``grads 0.031 <= 2 x 0.020 + 0.001``), the failing one first.
    """
    atol = PARITY_ATOL if atol is None else atol
    parts, bad = [], []
    for q in QUANTITIES:
        e, f = error.get(q), floor.get(q)
        if e is None or f is None:
            continue
        limit = k * f + atol[q]
        ok = math.isfinite(e) and e <= limit
        (parts if ok else bad).append(f"{q} {e:.3g} {'<=' if ok else '>'} {k:g} x {f:.3g} + {atol[q]:g}")
    return not bad, "; ".join(bad + parts)


def make_parity(loss_d, loss_f, logits_d, logits_f, grads_d, grads_f, reference: tuple | None = None) -> Parity:
    """The :class:`Parity` of a variant's observed step (``*_f``) against the default's (``*_d``).

    ``reference``: ``(loss, logits, grads)`` of the same step in float32 (same weights, inputs and
    dropout draws); with it, ``ok`` is :func:`judge_parity` of both steps' errors to it, else the
    direct differences within ``AUTOCAST_MODEL_TOL``. A reference the default is farther from than
    ``PARITY_FLOOR_MAX`` drew other numbers: the fixed tolerance decides, and ``reason`` says so.
    """
    loss_rel = rel_diff(loss_f, loss_d) if loss_d is not None and loss_f is not None else None
    logits_rel = rel_diff(logits_f, logits_d) if logits_d is not None and logits_f is not None else None
    g_rel, worst, worst_rel = grads_parity(grads_f, grads_d) if grads_d else (None, None, None)
    direct = {"loss": loss_rel, "logits": logits_rel, "grads": g_rel}
    fixed_ok = all(v is None or v <= AUTOCAST_MODEL_TOL[k] for k, v in direct.items())
    judged, floor, error, reason, ok = FIXED, None, None, "no float32 reference step", fixed_ok
    if reference is not None:
        floor = errors((loss_d, logits_d, grads_d), reference)
        error = errors((loss_f, logits_f, grads_f), reference)
        far = [q for q, v in floor.items() if v is not None and not v <= PARITY_FLOOR_MAX]
        if far:
            reason = (f"float32 reference unusable: the default is {floor[far[0]]:.3g} from it in {far[0]} "
                      f"(> {PARITY_FLOOR_MAX}: other dropout draws?); fixed tolerance")
        else:
            ok, reason = judge_parity(error, floor)
            judged = FLOOR
    return Parity(None if loss_d is None else float(loss_d), None if loss_f is None else float(loss_f),
                  loss_rel, logits_rel, g_rel, worst, worst_rel, ok, judged, floor, error, reason)


# --------------------------------------------------------------------------- fusions

def load_fusions(where):
    """The fusions of workspace ``where`` (``<where>/fusions/``), loaded by path."""
    from miner.runtime.fusions import Fusions

    fusions = Fusions(where)
    if not fusions.names():
        raise UsageError(f"no fusions in {fusions.root} to verify; promote a candidate first (`miner promote`)")
    return fusions


def match_counts(fusions_mod=None) -> dict[str, int]:
    """Current match counters: the fusions package's own, plus Inductor's pattern-matcher total."""
    import torch

    out: dict[str, int] = {}
    if fusions_mod is not None:
        for attr in ("counts", "match_counts", "counters", "matches"):
            f = getattr(fusions_mod, attr, None)
            if f is None:
                continue
            data = f() if callable(f) else f
            try:
                out.update({str(k): int(v) for k, v in dict(data).items()})
                break
            except (TypeError, ValueError):
                continue
    c = torch._dynamo.utils.counters
    out["inductor.pattern_matcher_count"] = int(c["inductor"].get("pattern_matcher_count", 0))
    return out


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items()}


# --------------------------------------------------------------------------- steps

def resize_inputs(inputs: dict[str, Any], batch: int | None, seq: int | None) -> dict[str, Any]:
    """The zoo's inputs at another batch / sequence length (token tensors sliced or tiled)."""
    import torch

    if batch is None and seq is None:
        return inputs
    out = {}
    for k, v in inputs.items():
        if torch.is_tensor(v) and v.dim() in (1, 2) and not v.is_floating_point():
            if batch is not None and v.shape[0] != batch:
                reps = math.ceil(batch / v.shape[0])
                v = v.repeat(reps, *([1] * (v.dim() - 1)))[:batch]
            if seq is not None and v.dim() == 2 and v.shape[1] != seq:
                reps = math.ceil(seq / v.shape[1])
                v = v.repeat(1, reps)[:, :seq]
            v = v.contiguous()  # a slice keeps the long row's stride: the model's .view(-1) of labels breaks
        out[k] = v
    return out


def _first_tensor(out) -> Any:
    import torch

    if torch.is_tensor(out):
        return out
    for key in ("logits", "last_hidden_state"):
        v = out.get(key) if isinstance(out, dict) else getattr(out, key, None)
        if torch.is_tensor(v):
            return v
    seq = out.to_tuple() if hasattr(out, "to_tuple") else out if isinstance(out, (list, tuple)) else ()
    return next((t for t in seq if torch.is_tensor(t) and t.dim() > 0), None)


def make_step(model, inputs: dict[str, Any], loss_fn: Callable, mode: str, device: str, *,
              autocast: bool = True) -> Callable:
    """One step of ``model`` on ``inputs``: train (forward, ``loss_fn``, backward; gradients cleared
    first) or infer (forward under ``no_grad``), under bf16 autocast as ``miner verify`` runs it
    (``autocast=False``: in the model's own dtype). Returns ``(out, loss)``."""
    import contextlib

    import torch

    amp = (torch.autocast(device_type="cuda" if device.startswith("cuda") else "cpu", dtype=torch.bfloat16)
           if autocast else contextlib.nullcontext())
    params = [p for p in model.parameters() if p.requires_grad]

    if mode == "train":
        def step():
            for p in params:
                p.grad = None
            with amp:
                out = model(**inputs)
                loss = loss_fn(out)
            loss.backward()
            return out, loss
    else:
        def step():
            with torch.no_grad(), amp:
                out = model(**inputs)
            return out, None
    return step


def observe_step(step: Callable, model, *, mode: str, device: str, seed: int,
                 grads_to_cpu: bool = False) -> tuple[float | None, Any, dict[str, Any]]:
    """One ``make_step`` step from a fixed RNG state (dropout draws the same masks): ``(loss, logits,
    grads)``, the logits as float32 on the CPU, the gradients (training only, else ``{}``) as float32
    copies per parameter (None where it got none), on the device unless ``grads_to_cpu`` (compared
    there in float64 per parameter: a 1B model's are 5 GB). Gradients are cleared before and after."""
    import torch

    torch.manual_seed(seed)
    if device.startswith("cuda"):
        torch.cuda.manual_seed_all(seed)
    _zero_grads(model)
    out, loss = step()
    logits = _first_tensor(out)
    logits = None if logits is None else logits.detach().float().cpu()
    grads = {n: (None if p.grad is None else
                 (p.grad.detach().float().cpu() if grads_to_cpu else p.grad.detach().float().clone()))
             for n, p in model.named_parameters() if p.requires_grad} if mode == "train" else {}
    loss_v = None if loss is None else float(loss.detach().float())
    del out, loss
    _zero_grads(model)
    return loss_v, logits, grads


def _zero_grads(model) -> None:
    for p in model.parameters():
        p.grad = None


PREFILL_CYCLES = 2_000_000  # GPU clock cycles (about 1 ms on an H200)


def time_step(step: Callable, device: str) -> tuple[float, int]:
    """One step: milliseconds (CUDA events; wall clock on CPU) and its peak memory beyond what was
    allocated before it (weights, optimizer-free state: what the step itself needs)."""
    ms, peak, _ = time_step_host(step, device)
    return ms, peak


def time_step_host(step: Callable, device: str) -> tuple[float, int, float]:
    """:func:`time_step` and the host's milliseconds to issue the step (``step()`` called until it
    returns, before the synchronize): a step whose host time reaches its GPU time is bound by the
    host (Python, launches), and then anything on the host shows in the step."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        # ~1 ms of GPU work queued ahead, as in a training loop that never synchronizes: the step's
        # first launches (Dynamo's guards, Python) overlap it instead of being timed as idle GPU.
        torch.cuda._sleep(PREFILL_CYCLES)
        a.record()
        t0 = time.perf_counter()
        step()
        host = (time.perf_counter() - t0) * 1e3
        b.record()
        torch.cuda.synchronize()
        return a.elapsed_time(b), int(torch.cuda.max_memory_allocated() - base), host
    t0 = time.perf_counter()
    step()
    ms = (time.perf_counter() - t0) * 1e3
    return ms, 0, ms


@dataclass
class _Variant:
    name: str
    built: Any
    step: Callable
    first_step_s: float
    matches: dict[str, int]
    loss: float | None = None
    logits: Any = None
    grads: dict[str, Any] = field(default_factory=dict)
    times: list[float] = field(default_factory=list)
    peak: int = 0
    gate: dict[str, int] = field(default_factory=dict)


def prepare_variant(name: str, built, *, mode: str, device: str, options: dict | None,
                    compile_fn: Callable | None, warmup: int, fusions_mod=None) -> _Variant:
    """Compile ``built.model`` (with ``options``) and run the warm-up steps (the first compiles)."""
    import torch

    graph_pass = (options or {}).get("post_grad_custom_post_pass")
    log = getattr(graph_pass, "log", None)  # the pass's decisions (``miner.runtime.decisions.DecisionLog``)
    before = match_counts(fusions_mod)
    gate_before = dict(log.lines) if log is not None else {}
    if compile_fn is None:
        compiled = torch.compile(built.model, options=options) if options else torch.compile(built.model)
    else:
        compiled = compile_fn(built.model, options)
    step = make_step(compiled, built.inputs, built.loss, mode, device)
    t0 = time.perf_counter()
    step()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    for _ in range(max(0, warmup - 1)):
        step()
    gate = {k: n for k, n in _delta(dict(log.lines), gate_before).items() if n} if log is not None else {}
    return _Variant(name, built, step, first_s, _delta(match_counts(fusions_mod), before), gate=gate)


def parity_step(v: _Variant, *, mode: str, device: str, seed: int) -> None:
    """One step from a fixed RNG state (dropout draws the same masks); outputs kept on the CPU."""
    v.loss, v.logits, v.grads = observe_step(v.step, v.built.model, mode=mode, device=device, seed=seed,
                                             grads_to_cpu=True)


@dataclass(frozen=True)
class VerifyOptions:
    """How ``miner verify`` (without ``--ab``) runs: the same for every model (built once from the command line)."""

    modes: tuple[str, ...] = ("train",)  # train: forward + loss + backward; infer: forward under no_grad
    preset: str = "tiny"
    device: str = "cpu"
    batch: int | None = None  # None: the preset's
    seq: int | None = None
    warmup: int = 3  # steps per variant before timing (the first compiles)
    steps: int = 20  # timed steps per variant
    rounds: int = 4  # blocks the timed steps alternate in
    seed: int = 1234  # the RNG state of the parity step
    compile_fn: Callable | None = None  # (model, options) -> the compiled model; None: torch.compile


@dataclass(frozen=True)
class Fused:
    """The fused variant of ``verify_model``: its ``torch.compile`` options, the graph pass whose
    ``counts`` say how often each fusion matched, and the fusions' names (each reported, 0 included)."""

    options: dict
    counter: Any = None
    names: tuple[str, ...] = ()


def verify_model(build: Callable[[], Any], *, model: str, mode: str, options: VerifyOptions, fused: Fused,
                 env: dict | None = None, log: Callable[[str], None] = print) -> VerifyResult:
    """Default compile vs compile with ``fused.options`` on one model and mode.

    ``build()`` returns a fresh ``models.Built`` (seeded weights: two builds are identical). Both
    compiled models stay resident; the timed steps alternate between them in ``options.rounds`` blocks
    so that clock or thermal drift during the run falls on both alike.
    """
    import torch

    preset, device, batch, seq, steps, seed = (options.preset, options.device, options.batch, options.seq,
                                               options.steps, options.seed)
    variants = []
    for name, opts in (("default", None), ("fused", fused.options)):
        built = build()
        built.inputs = resize_inputs(built.inputs, batch, seq)
        log(f"  {model} {mode} {name}: compiling")
        torch._dynamo.reset()  # no compiled code shared between the two
        v = prepare_variant(name, built, mode=mode, device=device, options=opts, compile_fn=options.compile_fn,
                            warmup=options.warmup, fusions_mod=fused.counter)
        log(f"  {model} {mode} {name}: first step {v.first_step_s:.1f} s; matches "
            f"{ {k: n for k, n in v.matches.items() if n} }")
        for decision, n in sorted(v.gate.items()):
            log(f"    gate x{n}: {decision}")
        variants.append(v)
    from miner.bench.timing import gpu_timing_lock

    with gpu_timing_lock():
        for v in variants:
            parity_step(v, mode=mode, device=device, seed=seed)
    rounds = max(1, min(options.rounds, steps))
    for r in range(rounds):
        for v in (variants if r % 2 == 0 else variants[::-1]):
            with gpu_timing_lock():  # a block of one model's steps: never beside another process's timing
                for _ in range(steps // rounds + (r < steps % rounds)):
                    _zero_grads(v.built.model)
                    ms, peak = time_step(v.step, device)
                    v.times.append(ms)
                    v.peak = max(v.peak, peak)
    stats = {}
    for v in variants:
        m, lo, hi = rl.summarize(v.times)
        stats[v.name] = StepStats(m, lo, hi, len(v.times), v.peak, v.first_step_s)
        log(f"  {model} {mode} {v.name}: median {m:.2f} ms ({lo:.2f}-{hi:.2f}), step peak {v.peak / 2**30:.2f} GiB")
    d, f = variants
    parity = make_parity(d.loss, f.loss, d.logits, f.logits, d.grads, f.grads)
    matches = {n: 0 for n in fused.names}
    matches.update(f.matches)
    result = VerifyResult(model=model, mode=mode, preset=preset, batch=batch, seq=seq, default=stats["default"],
                          fused=stats["fused"], parity=parity, matches=matches, gate=f.gate, env=env or {})
    del variants, d, f
    torch._dynamo.reset()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return result


def run_env(device: str) -> dict:
    from miner.bench.timing import environment
    e = environment(device, copy_gbps=0.0)
    return {"gpu": e.gpu, "torch": e.torch, "triton": e.triton, "cuda": e.cuda, "date": e.date,
            "device": e.device, "interpret": e.interpret}


def run_verify(models: Sequence[str], options: VerifyOptions, *, time_budget_s: float | None = None,
               on_result: Callable[[VerifyResult], None] | None = None, workspace: Any = ".",
               log: Callable[[str], None] = print) -> list[VerifyResult]:
    import miner_models as zoo

    fusions_mod = load_fusions(getattr(workspace, "root", workspace))
    # one pass object, kept: its ``counts`` say how often each fusion matched
    counter = fusions_mod.graph_pass()
    fused = Fused(fusions_mod.inductor_options(graph_pass_=counter), counter, tuple(fusions_mod.names()))
    log(f"fusions: {', '.join(fused.names)}")
    preset, device, batch, seq = options.preset, options.device, options.batch, options.seq
    env = run_env(device)
    specs = [zoo.resolve(m) for m in models]
    t_start = time.perf_counter()
    results = []
    for mode in options.modes:  # every model's first mode before any second mode: train results come first
        for spec in specs:
            if time_budget_s is not None and time.perf_counter() - t_start > time_budget_s:
                r = VerifyResult(spec.name, mode, preset, batch, seq, error="skipped: --time-budget spent", env=env)
            else:
                log(f"{spec.name} ({mode}, preset {preset})")
                try:
                    r = verify_model(lambda: spec.build(preset, mode, device), model=spec.name, mode=mode,
                                     options=options, fused=fused, env=env, log=log)
                except MinerError:
                    raise
                except Exception as e:  # one model failing must not lose the others
                    msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400]
                    log(f"  {spec.name} {mode}: ERROR {msg}")
                    r = VerifyResult(spec.name, mode, preset, batch, seq, error=msg, env=env)
            results.append(r)
            if on_result is not None:
                on_result(r)
    return results


# --------------------------------------------------------------------------- output

def format_step(s: StepStats | None) -> str:
    """Median step time with its 20/80% quantiles, e.g. ``26.44 (25.34-28.57)``; ``-`` when absent."""
    return "-" if s is None else f"{s.median_ms:.2f} ({s.p20_ms:.2f}-{s.p80_ms:.2f})"


def markdown_table(results: Sequence[VerifyResult]) -> str:
    lines = ["| model | mode | preset | default ms (p20-p80) | fused ms (p20-p80) | speedup | step peak GiB default/fused | "
             "loss rel | logits rel | grads rel (worst param) | parity | fusion matches |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]


    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:.2e}"

    for r in results:
        if r.error:
            lines.append(f"| {r.model} | {r.mode} | {r.preset} | - | - | - | - | - | - | - | {r.error} | - |")
            continue
        p = r.parity
        mem = "-" if r.default is None or r.fused is None else \
            f"{r.default.peak_mem_bytes / 2**30:.2f} / {r.fused.peak_mem_bytes / 2**30:.2f}"
        grads = "-" if p is None or p.grads_rel is None else f"{p.grads_rel:.2e} ({p.grads_worst}: {p.grads_worst_rel:.1e})"
        own = {k: v for k, v in r.matches.items() if not k.startswith("inductor.")}
        matches = ", ".join(f"{k}={v}" for k, v in sorted(own.items())) or "none"
        lines.append(f"| {r.model} | {r.mode} | {r.preset} | {format_step(r.default)} | {format_step(r.fused)} | "
                     f"{'-' if r.speedup is None else f'{r.speedup:.3f}x'} | {mem} | {num(p and p.loss_rel)} | "
                     f"{num(p and p.logits_rel)} | {grads} | {'ok' if p and p.ok else 'FAIL'} | {matches} |")
    return "\n".join(lines) + "\n"


def save(results: Sequence[VerifyResult], out_dir: Path) -> list[Path]:
    from miner.core.workspace import write_json, write_text

    out_dir = Path(out_dir)
    env = next((r.env for r in results if r.env), {})
    data = {"schema": 1, "kind": "VerifyRun", "env": env, "parity_tolerance": AUTOCAST_MODEL_TOL,
            "results": [result_to_json(r) for r in results]}
    head = (f"GPU {env.get('gpu')}, torch {env.get('torch')}, triton {env.get('triton')}, CUDA {env.get('cuda')}, "
            f"date {env.get('date')}")
    md = (f"# miner verify\n\n{head}\n\n`torch.compile(model)` vs `torch.compile(model, "
          "options=fusions.inductor_options())`, bf16 autocast; train = forward + loss + backward. Median step "
          "time over the timed steps (CUDA events), peak memory of those steps, parity of one seeded step "
          f"(relative norm differences; tolerances {AUTOCAST_MODEL_TOL}).\n\n" + markdown_table(results))
    gates = [(r, d, n) for r in results for d, n in sorted(r.gate.items())]
    if gates:
        md += ("\n## Measured-wins gate while compiling the fused model\n\nA promoted fusion fires on CUDA only "
               "where `miner bench` measured it at least as fast as Inductor (`fusions/<name>/wins.json`).\n\n"
               + "\n".join(f"- {r.model} {r.mode}: x{n} {d}" for r, d, n in gates) + "\n")
    return [write_json(out_dir / "verify.json", data), write_text(out_dir / "verify.md", md)]


def load(path: Path) -> list[VerifyResult]:
    from miner.core.workspace import read_json
    data = read_json(path)
    if data.get("kind") != "VerifyRun":
        raise MinerError(f"{path}: not a miner verify file")
    return [result_from_json(r) for r in data["results"]]
