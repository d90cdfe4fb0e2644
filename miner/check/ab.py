"""In-model A/B of each fusion (``miner verify --ab``): is the model's step faster with it?

Per zoo model, step mode (train / infer) and compile mode (``default``: ``dynamic=False``;
``dynamic``: ``dynamic=True``; ``reduce-overhead``: CUDA graphs, inference), the same seeded
model is compiled as these variants, all resident at once:

* ``default``: ``torch.compile`` with no fusion (Inductor's FX cache allowed);
* ``control``: the same again (an FX-cache hit when the first wrote it; said in the output): the
  default-vs-default difference is the noise band, measured, not assumed;
* ``all``: every fusion, gate forced open ("what would it do if it fired"); its match counts say
  which fusions fire in this model at all (one with 0 matches "does not fire" and gets no
  variant of its own);
* ``alone:<f>``: each fusion that fired, alone, gate open (when only one fired, ``all`` is it);
* ``gated``: every fusion with the gate on, deciding from the in-model evidence of earlier runs
  plus this run's ``alone`` verdicts; compiled only when that graph differs from one already
  measured (every match fires: ``all``; none: ``default``);
* ``knob:<k>`` / ``knob:<k>+fusions`` (``--knobs``, ``miner.check.knobs``): a one-line change a user
  could make instead (an SDPA flag, ``mode="reduce-overhead"``, an Inductor option), alone and with
  the fusions as they fire with the gate on; timed with ``gated`` in a second phase beside
  ``default`` and ``control`` (alone in it when ``all`` is not compiled: then its control gives the band).

Timed steps alternate between the variants (round robin, the start rotating each round), so
drift falls on all alike: median and 20/80% quantiles of the step per variant, and the speedup as
the median of the per-round ratios default/variant (paired; the control's give the noise band). Fusion variants compile with
Inductor's FX and AOT caches off (a cache hit would skip the pass and its counters). Each variant
then runs a few steps under torch.profiler (``miner.scan.profile.kernel_times``) and
``miner.check.explain`` lists the kernels it removed, added and the neighbours that changed.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Sequence

from miner.check.masks import METHOD as MASKS
from miner.check.verify import (Parity, StepStats, _zero_grads, make_parity, make_step, observe_step, resize_inputs,
                                time_step_host)
from miner.core.executor import one_line
from miner.runtime import direct as _direct

COMPILE_MODES = ("default", "dynamic", "reduce-overhead")
GATE_OPEN, GATE_ON, NO_GATE = "open", "on", "-"
FUSION_VARIANTS = ("all", "alone", "gated")  # the fusion variants run_ab can compile (``ABOptions.fusion_variants``)


@dataclass(frozen=True)
class ABOptions:
    """How each in-model A/B runs: ``miner verify --ab``'s options, the same for every model and mode
    (``miner.check.abrun.ABRun`` adds what the run plans)."""

    preset: str
    device: str
    warmup: int = 3  # steps per variant before timing (the first compiles)
    rounds: int = 15  # alternating timed rounds, one step per variant each
    profile_steps: int = 3  # steps per variant under torch.profiler for the kernel diff (0: none)
    parity_reference: bool = True  # compile the float32 reference step parity is judged against (reference_step)
    # which of ``all`` (``alone`` needs it), ``alone`` and ``gated`` to compile (without ``all`` the gated
    # variant is always compiled: nothing says which fusions fire)
    fusion_variants: tuple[str, ...] = FUSION_VARIANTS
    compile_fn: Callable | None = None  # (model, compile mode) -> the compiled model; None: torch.compile
    kernel_times: Callable | None = None  # the profiler table function; None: miner.scan.profile.kernel_times


@dataclass(frozen=True)
class ABCase:
    """One A/B: a model in a step mode (train / infer) and compile mode, at a batch and seq (None: the preset's)."""

    model: str
    mode: str
    compile_mode: str
    batch: int | None = None
    seq: int | None = None


@dataclass
class VariantResult:
    name: str  # default, control, all, alone:<f>, gated
    fusions: list[str]
    gate: str
    step: StepStats | None = None
    speedup: float | None = None  # median over rounds of default / this (paired; same timing phase)
    verdict: str | None = None  # win / loss / noise (beyond / within the control's band)
    parity: Parity | None = None
    matches: dict[str, int] = field(default_factory=dict)
    contexts: dict[str, dict[str, int]] = field(default_factory=dict)  # fusion -> site -> matches
    gate_decisions: dict[str, int] = field(default_factory=dict)
    kernels: dict | None = None  # miner.check.explain.diff against default
    compile_s: float | None = None
    fx_cache_hits: int | None = None
    note: str = ""
    error: str | None = None
    speedup_p20: float | None = None  # 20/80% quantiles of the per-round ratios behind ``speedup``
    speedup_p80: float | None = None
    knob: str | None = None  # knob:<k> and knob:<k>+fusions variants: the knob's name (miner.check.knobs)
    numerics: str = ""  # how the knob changes numerics ("" when it does not)
    cudagraphs: bool = False  # ran under CUDA graphs (its step peak is the graphs' pool, not measured)
    # the peak allocated over the warm-up steps (the compile and, under CUDA graphs, their recording: the
    # pool holding the step's tensors) beyond what was allocated before them; CUDA only
    warmup_peak_bytes: int | None = None
    # per timed round of the phase its numbers come from: the step's GPU ms, and the host's ms to issue it
    round_ms: list[float] = field(default_factory=list)
    host_ms: list[float] = field(default_factory=list)
    # generated kernels launched in its timed steps, per path (``miner.runtime.direct.LAUNCHES``: direct, triton,
    # checked), and those steps ("steps"); a CUDA-graph replay launches none from Python
    launches: dict[str, int] = field(default_factory=dict)
    # wall seconds miner's fusion pass spent inside this variant's compile, per fusion (``FusionPass.seconds``:
    # "(build)" traces the patterns, "(prepare)" its graph rewrites before matching); part of ``compile_s``
    pass_s: dict[str, float] = field(default_factory=dict)


@dataclass
class ABResult:
    model: str
    mode: str  # train / infer
    compile: str  # default / dynamic / reduce-overhead
    preset: str
    batch: int | None
    seq: int | None
    variants: list[VariantResult] = field(default_factory=list)
    noise_band: float | None = None
    # knob -> the noise band of steps on top of that knob: its own compiled step timed a second time in each
    # round (:func:`knob_control`), as the default's control gives ``noise_band``; a fusion measured on top of
    # the knob is judged against it (where the default is host-bound and the knob runs under CUDA graphs, the
    # default's band is the host's jitter, not the knob's: t5 B8 S256 on the H100, ±10.3%, every fusion over the
    # knob "noise"; at B16 S256 the knob's own band was ±0.33% against the run's ±0.60%)
    knob_bands: dict[str, float] = field(default_factory=dict)
    fires: dict[str, int] = field(default_factory=dict)  # fusion -> matches with the gate open
    gate: dict[str, dict[str, str]] = field(default_factory=dict)  # fusion -> site -> the gate's decision
    error: str | None = None
    seconds: float = 0.0
    env: dict[str, Any] = field(default_factory=dict)

    def variant(self, name: str) -> VariantResult | None:
        return next((v for v in self.variants if v.name == name), None)


def taken_text(graph_pass) -> str:
    """``; 60 of the knob's mask draws taken by the regions`` where a knob drawing the masks itself
    (``philox4_dropout_bits``) gave regions their draws back (``miner.runtime.drawn``), and how many saved masks
    the regions' kernels pack into bits (``miner.runtime.rewrite.pack_in_kernel``); "" elsewhere."""
    n, packed = getattr(graph_pass, "draws_taken", 0), getattr(graph_pass, "masks_packed", 0)
    out = f"; {n} of the knob's mask draws taken by the regions (miner.runtime.drawn)" if n else ""
    return out + (f"; {packed} saved masks packed into bits by their region's kernel" if packed else "")


def knob_pass_counts(knob) -> dict[str, tuple[Counter, Counter]]:
    """What the counting graph passes among ``knob``'s options (those with ``counts`` and ``declined``, e.g.
    ``miner.runtime.epilogue.GemmEpilogues``) have taken and declined so far: option -> (taken, declined)."""
    return {k: (Counter(p.counts), Counter(p.declined))
            for k, p in (getattr(knob, "options", None) or {}).items() if hasattr(p, "counts")}


def knob_pass_text(knob, before: dict[str, tuple[Counter, Counter]], cache_hits: int = 0) -> str:
    """``; GemmEpilogues took gelu_tanh x12, declined 2 (reason)`` for one compile: its pass's counts since ``before``
    (:func:`knob_pass_counts`); "" for a knob without such a pass. A compile served from Inductor's FX cache ran
    no pass: it says so instead of "took nothing"."""
    parts = []
    for k, (taken, declined) in knob_pass_counts(knob).items():
        was_taken, was_declined = before.get(k, (Counter(), Counter()))
        took, why = taken - was_taken, declined - was_declined
        name = type(knob.options[k]).__name__
        if cache_hits and not took and not why:
            parts.append(f"{name} not run (FX cache hit: the graphs it made before)")
            continue
        parts.append(f"{name} took {', '.join(f'{a} x{n}' for a, n in sorted(took.items())) or 'nothing'}"
                     + (f", declined {'; '.join(f'{n} ({r[:120]})' for r, n in sorted(why.items())[:2])}"
                        if why else ""))
    return "".join(f"; {p}" for p in parts)


def pass_text(pass_s: dict[str, float], top: int = 2) -> str:
    """``pass_s`` (``VariantResult.pass_s``) in a few words: "" when empty, else ", miner's pass 12.3 s
    (relu_dropout 8.1, (build) 2.0)", its largest parts first."""
    if not pass_s:
        return ""
    parts = sorted(pass_s.items(), key=lambda kv: -kv[1])[:top]
    return (f", miner's pass {sum(pass_s.values()):.1f} s ("
            + ", ".join(f"{k} {v:.1f}" for k, v in parts) + (", ..." if len(pass_s) > top else "") + ")")


def ab_to_json(r: ABResult) -> dict:
    return asdict(r)


def _first_sentences(text: str, n: int = 2) -> str:
    """``text`` up to the end of its ``n``-th sentence (an allocator's error runs on for 300 characters)."""
    parts = text.split(". ")
    return text if len(parts) <= n else ". ".join(parts[:n]) + "."


def _draws_own_stream(knob: str | None) -> bool:
    """The knob named ``knob`` (``a+b`` for two) holds a built-in knob that draws a dropout stream of its own."""
    from miner.check.knobs import KNOBS

    return bool(knob) and any(KNOBS[k].draws for k in knob.split("+") if k in KNOBS)


def _awaiting_judge(parity: Parity, verdict: str | None, why: str) -> tuple[Parity, str | None]:
    """A variant under a knob drawing its own dropout stream, its masks judge not (yet) decided: the direct
    difference compares two streams and decides nothing, so its parity is "not judged" (``why``) and its verdict
    ``not-judged`` (none where it had none)."""
    return (replace(parity, ok=False, judged=f"{MASKS} (not judged)",
                    reason=f"another dropout stream than the default's: {why}"),
            UNJUDGED if verdict is not None else None)


def ab_from_json(d: dict) -> ABResult:
    d = dict(d)
    vs = []
    for v in d.pop("variants", []):
        v = dict(v)
        v["step"] = StepStats(**v["step"]) if v.get("step") else None
        v["parity"] = Parity(**v["parity"]) if v.get("parity") else None
        if v.get("verdict") == PARITY_FAIL and v["parity"] is not None and v["parity"].unjudged:
            v["verdict"] = UNJUDGED  # files written before the two were told apart: nothing failed there
            v["parity"] = replace(v["parity"], reason=_first_sentences(v["parity"].reason))
        if v["parity"] is not None and _draws_own_stream(v.get("knob")) and not v["parity"].judged.startswith(MASKS):
            # a file written before such a knob's parity waited for its judge (a run ended inside it): the direct
            # difference of two dropout streams decided nothing
            v["parity"], v["verdict"] = _awaiting_judge(v["parity"], v.get("verdict"),
                                                        "the run ended before its masks were injected")
        vs.append(VariantResult(**v))
    return ABResult(**d, variants=vs)


# --------------------------------------------------------------------------- statistics
# Timed steps alternate between the variants, so round r of every variant ran under the same
# conditions (clocks, allocator, other processes): a variant's speedup is the median over rounds of
# default[r] / variant[r] (paired), not the ratio of two medians, which keeps drift between rounds
# out of the estimate. The control's paired ratios give the noise band.

def paired_ratios(base: Sequence[float], times: Sequence[float]) -> list[float]:
    """Per round, the default's step time over this variant's (> 1: this variant was faster)."""
    return [b / t for b, t in zip(base, times) if t > 0]


def ratio_stats(ratios: Sequence[float]) -> tuple[float, float, float]:
    """(median, p20, p80) of paired ratios."""
    from miner.bench import roofline as rl

    m, lo, hi = rl.summarize(list(ratios))
    return m, lo, hi


def rel_se_median(ratios: Sequence[float]) -> float:
    """Standard error of the median of ``ratios``, from their p20-p80 spread (normal: 1.683 sigma)."""
    if len(ratios) < 2:
        return 0.0
    _, lo, hi = ratio_stats(ratios)
    return 1.2533 * (hi - lo) / 1.683 / math.sqrt(len(ratios))


def noise_band(control_ratios: Sequence[float]) -> float:
    """The relative step change two identical compiles show: the larger of the control's paired
    offset ``|median(default/control) - 1|`` and twice the standard error of that median."""
    if not control_ratios:
        return 0.0
    return max(abs(ratio_stats(control_ratios)[0] - 1.0), 2.0 * rel_se_median(control_ratios))


def rounds_for(band: float | None, offset: float, rounds: int, target: float = 0.01) -> tuple[int, float] | None:
    """``(rounds needed, band reached)``: what would narrow a noise ``band`` measured over ``rounds`` towards
    ``target``; None when it is already within it, or when the control's own offset (``|median(default /
    control) - 1|``, which more rounds do not shrink) sets it. The standard-error part shrinks as
    1/sqrt(rounds), down to the offset."""
    if band is None or band <= target or rounds < 2 or offset >= band - 1e-12:
        return None
    reach = max(target, offset)
    return math.ceil(rounds * (band / reach) ** 2), reach


PARITY_FAIL = "parity-fail"
UNJUDGED = "not-judged"  # parity could not be judged (``Parity.unjudged``): never a win, not a measured failure


def verdict(speedup: float | None, band: float | None, parity: Parity | None = None) -> str | None:
    """win / loss beyond the band, else noise; ``parity-fail`` whatever the speedup when the variant's
    step broke parity (a wrong result is never a win), ``not-judged`` when its parity could not be judged."""
    if parity is not None and not parity.ok:
        return UNJUDGED if parity.unjudged else PARITY_FAIL
    if speedup is None or band is None:
        return None
    if speedup > 1.0 + band:
        return "win"
    if speedup < 1.0 - band:
        return "loss"
    return "noise"


MARGINAL = "marginal win"


def step_label(verdict: str | None, p20: float | None) -> str:
    """The one verdict shown for one measurement: a ``win`` whose p20 of the per-round ratios reaches
    below 1.0 is a ``marginal win`` (the median is beyond the noise band, but a fifth or more of the
    rounds were slower); anything else as measured (win / loss / noise / parity-fail)."""
    if verdict == "win" and p20 is not None and p20 < 1.0:
        return MARGINAL
    return verdict or "-"


def setup_of(r) -> str:
    """Where an A/B result was measured, in words: ``NVIDIA H200, base B16 S512, bf16 autocast`` (the
    preset's sizes where the result has none)."""
    from miner.check.verify import STEP_DTYPE

    env = getattr(r, "env", {}) or {}
    where = (env.get("gpu") or "GPU") if env.get("device", "cuda") == "cuda" else f"CPU interpreter ({env.get('gpu') or 'cpu'})"
    return f"{where}, {r.preset} {size_text(r)}, {STEP_DTYPE}"


def size_text(r) -> str:
    """``B16 S512`` (the preset's sizes where the result has none; "-" without either); a model fed features, not
    tokens: its inputs as they ran (``x float32[4,32,64]``, :func:`untokenized_sizes`)."""
    from miner.runtime.evidence import shape_of

    if sizes := (getattr(r, "env", None) or {}).get("inputs"):
        return sizes
    batch, seq = shape_of(r)
    return "-" if batch is None else f"B{batch} S{seq}"


# --------------------------------------------------------------------------- variants

@dataclass
class _Live:
    res: VariantResult
    model: Any
    step: Callable
    times: list[float] = field(default_factory=list)
    host: list[float] = field(default_factory=list)
    peak: int = 0
    knob: Any = None  # the variant's ``miner.check.knobs.Knob`` (a parity judge compiles its fusions under it)


def compile_options(compile_mode: str, graph_pass=None, *, cache: bool, tag: str) -> dict:
    """``torch.compile(options=...)`` of one variant.

    Each variant's options must differ: torch treats two inductor backends with equal options as
    one, and dynamo would then run the first variant's compiled code for the second without
    compiling it. ``tag`` goes into ``trace.debug_dir``, read only when tracing is on and left out
    of the FX cache key (so ``control`` still hits the default's cache entry). ``reduce-overhead``
    is given as its option (``triton.cudagraphs``): ``mode=`` cannot go with ``options=``.
    """
    opts: dict = {"post_grad_custom_pre_pass": graph_pass, "post_grad_custom_post_pass": graph_pass,
                  "trace.debug_dir": f"miner-ab-{tag}"}
    if compile_mode == "reduce-overhead":
        opts["triton.cudagraphs"] = True
    if not cache:
        opts["fx_graph_cache"] = False
    return opts


def _compile(model, compile_mode: str, options: dict):
    import torch

    return torch.compile(model, dynamic=compile_mode == "dynamic", options=options)


def _compile_context(*, cache: bool):
    """The first steps of one variant (they compile): the AOT cache off for fusion variants (a hit
    would skip the pass and its counters)."""
    import torch._functorch.config as fconfig

    return contextlib.nullcontext() if cache else fconfig.patch(enable_autograd_cache=False)


def _wrap_step(step: Callable, compile_mode: str) -> Callable:
    if compile_mode != "reduce-overhead":
        return step
    import torch

    def marked():
        torch.compiler.cudagraph_mark_step_begin()
        return step()
    return marked


@dataclass(frozen=True)
class VariantSpec:
    """One variant to compile: its name, the graph pass and the fusions it holds, the gate's mode,
    whether Inductor's FX cache may serve it, and the knob (``miner.check.knobs.Knob``) it applies."""
    name: str
    graph_pass: Any = None
    fusions: tuple[str, ...] = ()
    gate: str = NO_GATE
    cache: bool = False
    knob: Any = None


def prepare(spec: VariantSpec, built, inputs: dict, case: ABCase, options: ABOptions) -> _Live:
    """A copy of ``built.model`` compiled as the variant ``spec``, warmed up (the first step compiles).

    ``spec.graph_pass``: the variant's own pass, its gate mode set by whoever made it (``spec.gate`` names
    it in the result); its counts and log become the variant's matches, contexts and gate decisions.
    ``spec.knob``: its options join the variant's, and its context is entered around each call of the
    step (the compiling one included)."""
    import torch

    name, graph_pass, fusions, gate, cache, knob = (spec.name, spec.graph_pass, spec.fusions, spec.gate, spec.cache,
                                                    spec.knob)
    mode, compile_mode, device, compile_fn = case.mode, case.compile_mode, options.device, options.compile_fn
    model = copy.deepcopy(built.model)
    opts = {**compile_options(compile_mode, graph_pass, cache=cache, tag=name), **(knob.options if knob else {})}
    compiled = compile_fn(model, compile_mode) if compile_fn else _compile(model, compile_mode, opts)
    graphs = compile_mode == "reduce-overhead" or bool(opts.get("triton.cudagraphs"))
    step = _wrap_step(make_step(compiled, inputs, built.loss, mode, device), "reduce-overhead" if graphs else compile_mode)
    if knob is not None:
        step = knob.around(step)
    counts_before = Counter(graph_pass.counts) if graph_pass is not None else Counter()
    seconds_before = Counter(graph_pass.seconds) if graph_pass is not None else Counter()
    hits_before = int(torch._dynamo.utils.counters["inductor"].get("fxgraph_cache_hit", 0))
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        allocated = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    with _compile_context(cache=cache):
        for _ in range(max(1, options.warmup)):
            _zero_grads(model)
            step()
        if cuda:
            torch.cuda.synchronize()
    res = VariantResult(name, list(fusions), gate, compile_s=time.perf_counter() - t0,
                        knob=knob.name if knob else None, numerics=knob.numerics if knob else "", cudagraphs=graphs,
                        warmup_peak_bytes=int(torch.cuda.max_memory_allocated() - allocated) if cuda else None)
    res.fx_cache_hits = int(torch._dynamo.utils.counters["inductor"].get("fxgraph_cache_hit", 0)) - hits_before
    if graph_pass is not None:
        res.matches = {f: graph_pass.counts[f] - counts_before[f] for f in fusions}
        res.contexts = {f: {c.site: n for c, n in sites.items()} for f, sites in graph_pass.log.contexts.items()}
        res.gate_decisions = dict(graph_pass.log.lines)
        res.pass_s = {k: round(v, 3) for k, v in (graph_pass.seconds - seconds_before).items() if v >= 0.0005}
    _zero_grads(model)
    return _Live(res, model, step, knob=knob)


PARITY_SEED = 1234


def reference_step(built, inputs: dict, *, mode: str, device: str, seed: int = PARITY_SEED,
                   compile_fn: Callable | None = None) -> tuple | None:
    """The parity reference: one seeded step of the same model compiled in float32 (no autocast):
    ``(loss, logits, grads)``, or None when it cannot run (its reason logged by the caller).

    Dropout is held equal, not off: Inductor draws each graph's dropout seeds from the default
    generator when the compiled step runs (``inductor_seeds``) and each element's number from
    (seed, element index), so after the same ``torch.manual_seed`` the float32 compile, with the
    same random ops in the same order, draws the masks the bf16 ones do (tests/test_parity.py).
    """
    model = copy.deepcopy(built.model)
    options = compile_options("default", None, cache=True, tag="float32-reference")
    compiled = compile_fn(model, "default") if compile_fn else _compile(model, "default", options)
    step = make_step(compiled, inputs, built.loss, mode, device, autocast=False)
    _zero_grads(model)
    step()  # compiles
    out = observe_step(step, model, mode=mode, device=device, seed=seed, grads_to_cpu=True)  # held all run long
    del model, compiled, step
    return out


def parity_of(live: _Live, mode: str, device: str, seed: int = PARITY_SEED) -> tuple:
    """(loss, logits on CPU, grads on the device) of one step from a fixed RNG state."""
    return observe_step(live.step, live.model, mode=mode, device=device, seed=seed)


def interleave(lives: list[_Live], rounds: int, device: str) -> list[_Live]:
    """``rounds`` timed steps per variant, round robin, the first variant rotating each round.

    Out of device memory in a timed step (a knob's CUDA-graph pool holds its memory for the whole run), the
    knob variants under CUDA graphs leave ``lives`` (each recorded with why, :func:`drop_graph_variants`) and
    the rounds start again with the others, so every variant left keeps the same rounds; returns the
    dropped. With nothing of that kind to drop, the error propagates."""
    from miner.bench.timing import gpu_timing_lock

    dropped: list[_Live] = []
    r = 0
    while r < rounds:
        n = len(lives)
        try:
            with _collected_then_paused():  # a collection inside a timed step stalls its launches
                for live in list(lives[r % n:]) + list(lives[:r % n]):
                    _zero_grads(live.model)
                    before = Counter(_direct.LAUNCHES)
                    with gpu_timing_lock():
                        ms, peak, host = time_step_host(live.step, device)
                    counted = live.res.launches
                    for path, n in (_direct.LAUNCHES - before).items():
                        counted[path] = counted.get(path, 0) + n
                    counted["steps"] = counted.get("steps", 0) + 1
                    live.times.append(ms)
                    live.host.append(host)
                    live.peak = max(live.peak, peak)
        except Exception as e:
            gone = drop_graph_variants(lives, e, device) if type(e).__name__ == "OutOfMemoryError" else []
            if not gone:
                raise
            dropped += gone
            for live in lives:
                live.times.clear()
                live.host.clear()
                live.peak = 0
            r = 0
            continue
        r += 1
    return dropped


def drop_graph_variants(lives: list[_Live], error: BaseException, device: str) -> list[_Live]:
    """Take the knob variants that run under CUDA graphs out of ``lives`` after ``error`` (out of device
    memory in a timed step), record why on each, and free their pools (Inductor's CUDA-graph trees are
    reset: the variants left run without graphs). Returns them; none when no such variant is there."""
    gone = [live for live in lives if live.res.cudagraphs and live.res.knob]
    for live in gone:
        lives.remove(live)
        pool = live.res.warmup_peak_bytes
        live.res.error = ("dropped: out of device memory in a timed step beside the other variants "
                          f"({_first_sentences(one_line(error))})"
                          + (f"; its CUDA graphs' pool held about {pool / 2**30:.1f} GiB" if pool else "")
                          + "; measure it on a GPU with more memory or at a smaller batch")
        live.times.clear()
        live.host.clear()
        live.model = live.step = None
    if gone:
        try:
            from torch._inductor.cudagraph_trees import reset_cudagraph_trees
            reset_cudagraph_trees()
        except Exception:  # noqa: BLE001 - another torch: the pools go with their last reference
            pass
        release_free_memory(device)
    return gone


GRAPH_POOL_MARGIN = 1.1  # the room asked for beside a CUDA-graph pool, over twice the default step's peak


def graph_room(default_peak: int | None, device: str, free_total: tuple[int, int] | None = None,
               pool: int = 0) -> str | None:
    """Why a variant under CUDA graphs is not compiled now, or None where it fits. Its graphs keep a
    pool about as large as the step's peak for the rest of the run (H100: t5-base B16 S512 pool 14.62 GiB
    for a default step of 14.33, bert 4.81 for 4.90), and each variant without graphs still needs one
    step's peak beside it: so twice the default's warm-up peak (with ``GRAPH_POOL_MARGIN``) must be free.
    Otherwise the timed rounds run out of memory (DeBERTa-v2 base B16 S512 on the H100: a 32 GiB pool
    beside steps of 31.6 GiB ran out; 69.6 GiB asked for, 63.4 free).

    ``pool``: what the CUDA-graph variants compiled before this one already hold (the largest warm-up peak
    among them). Inductor keeps one CUDA-graph tree per device, and every graph of every compiled function
    on it records into that tree's one memory pool (``torch._inductor.cudagraph_trees``:
    ``TreeManagerContainer``, "a single tree manager container per device"; ``CUDAGraphNode`` gets the
    manager's ``cuda_graphs_thread_pool``); a step's tensors die before the next variant's step starts, so a
    second variant's graphs reuse the first one's blocks and ask only for what exceeds them. ``free_total``:
    ``torch.cuda.mem_get_info()`` (read when None)."""
    if not str(device).startswith("cuda") or not default_peak:
        return None
    if free_total is None:
        import torch

        release_free_memory(device)
        free_total = torch.cuda.mem_get_info()
    free, total = free_total
    step = default_peak * GRAPH_POOL_MARGIN
    grow = max(0.0, step - pool)
    need = step + grow
    if free >= need:
        return None
    held = (f"; the graphs compiled before it hold {pool / 2**30:.1f} GiB of the pool they share" if pool else "")
    return (f"not compiled: its CUDA graphs would keep about {default_peak / 2**30:.1f} GiB (the default step's "
            f"peak) and the other variants' steps need as much again, {need / 2**30:.1f} GiB{held}, where "
            f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB are free; measure it on a GPU with more memory or at "
            "a smaller batch")


def graph_pool(lives: Sequence[_Live]) -> int:
    """What the CUDA-graph variants among ``lives`` hold of the pool they share (:func:`graph_room`): the
    largest warm-up peak among them (0: none)."""
    return max((live.res.warmup_peak_bytes or 0 for live in lives if live.res.cudagraphs and live.step is not None),
               default=0)


@contextlib.contextmanager
def _collected_then_paused():
    """Python's garbage collector run now, then off until the block ends (as ``timeit`` does)."""
    import gc

    was_on = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def _stats(live: _Live) -> StepStats:
    from miner.bench import roofline as rl

    m, lo, hi = rl.summarize(live.times)
    return StepStats(m, lo, hi, len(live.times), live.peak, live.res.compile_s or 0.0)


def _record_phase(lives: Sequence[_Live], band: float | None) -> list[float]:
    """Step stats and paired speedups (against ``lives[0]``) of one timing phase; returns the
    per-round ratios of ``lives[1]`` (the control), which give the noise band."""
    base = list(lives[0].times)
    control: list[float] = []
    for i, live in enumerate(lives):
        live.res.step = _stats(live)
        ratios = paired_ratios(base, live.times)
        if ratios:
            live.res.speedup, live.res.speedup_p20, live.res.speedup_p80 = ratio_stats(ratios)
        if i == 1:
            control = ratios
        if live.res.name != "default":
            live.res.verdict = verdict(live.res.speedup, band)
        live.res.round_ms = [round(t, 3) for t in live.times]
        live.res.host_ms = [round(t, 3) for t in live.host]
        live.times, live.host = [], []
    return control


def in_model_record(r: ABResult, v: VariantResult, fusion: str, source: str | None = None):
    """The evidence a fusion-alone variant gives (``miner.runtime.evidence.InModelRecord``: the gate reads these)."""
    from miner.runtime.evidence import InModelRecord

    return InModelRecord(r.model, r.mode, round(v.speedup, 4), round(r.noise_band or 0.0, 4), v.verdict,
                         compile=r.compile, preset=r.preset, batch=r.batch, seq=r.seq,
                         matches=v.matches.get(fusion, 0), contexts=dict(v.contexts.get(fusion, {})),
                         gpu=r.env.get("gpu"), torch=r.env.get("torch"), date=r.env.get("date"), source=source)


def alone_variant(r: ABResult, fusion: str) -> VariantResult | None:
    """The variant of ``r`` that measured ``fusion`` alone: ``alone:<fusion>``, or ``all`` when it
    was the only fusion that fired."""
    v = r.variant(f"alone:{fusion}")
    if v is None and [g for g, k in r.fires.items() if k] == [fusion]:
        v = r.variant("all")
    return v


def alone_records(r: ABResult) -> dict:
    """fusion -> its in-model record from ``r`` (the ``alone`` variant; ``all`` when it fired alone)."""
    out = {}
    for f, n in r.fires.items():
        if not n:
            continue
        v = alone_variant(r, f)
        if v is not None and v.speedup is not None and v.verdict is not None and v.matches.get(f):
            out[f] = in_model_record(r, v, f)  # an alone variant it did not match in measured nothing of it
    return out


def knob_alone_variant(r: ABResult, knob: str, fusion: str) -> VariantResult | None:
    """The variant of ``r`` that measured ``fusion`` alone on top of ``knob``: ``knob:<k>+alone:<f>``, or
    ``knob:<k>+fusions`` when ``fusion`` was the only one that fired there."""
    v = r.variant(f"knob:{knob}+alone:{fusion}")
    fused = r.variant(f"knob:{knob}+fusions")
    if v is None and fused is not None and [g for g, k in fused.matches.items() if k] == [fusion]:
        v = fused
    return v


@dataclass(frozen=True)
class OverKnob:
    """One fusion measured alone on top of a knob: the knob's variant, the fusion's, and the knob's step over
    the fusion's (median and p20-p80 of the per-round ratios: both were timed in the same rounds)."""

    fusion: str
    knob: VariantResult
    variant: VariantResult
    speedup: float
    p20: float
    p80: float


def over_knobs(r: ABResult) -> list[OverKnob]:
    """Every fusion measured alone on top of a knob in ``r`` (:func:`knob_alone_variant`)."""
    out = []
    for base in r.variants:
        if not base.knob or base.name != f"knob:{base.knob}" or not base.round_ms:
            continue
        fired = {f for v in r.variants if v.knob == base.knob for f, n in v.matches.items() if n}
        for f in sorted(fired):
            v = knob_alone_variant(r, base.knob, f)
            if v is not None and v.round_ms and len(v.round_ms) == len(base.round_ms) and v.matches.get(f):
                out.append(OverKnob(f, base, v, *ratio_stats(paired_ratios(base.round_ms, v.round_ms))))
    return out


def knob_records(r: ABResult) -> list[tuple[str, Any]]:
    """(fusion, record) for every fusion measured alone on top of a knob in ``r`` (:func:`over_knobs`): its
    speedup over the knob alone, the verdict against the run's band and the variant's parity. The evidence
    for a fusion that exists only in a knob's graph (t5's attention regions under ``sdpa_reduced_math``) or
    that is worth taking only on top of one."""
    return [(o.fusion, rec) for o in over_knobs(r) if (rec := knob_record(r, o)) is not None]


def knob_record(r: ABResult, o: OverKnob):
    """The in-model record of one :class:`OverKnob` measurement of ``r`` (None without a verdict)."""
    band = band_over_knob(r, o.knob.knob)
    verdict_ = verdict(o.speedup, band, o.variant.parity)
    if verdict_ is None:
        return None
    return replace(in_model_record(r, o.variant, o.fusion), speedup=round(o.speedup, 4), verdict=verdict_,
                   band=round(band or 0.0, 4), knob=o.knob.knob, compile=knob_mode(o.knob, r.compile))


def band_over_knob(r: ABResult, knob: str | None) -> float | None:
    """The noise band a step on top of ``knob`` is judged against: the knob's own (``ABResult.knob_bands``,
    from its control) where the run timed one, else the run's (default vs control)."""
    return r.knob_bands.get(knob, r.noise_band) if knob else r.noise_band


def knob_mode(v: VariantResult, compile_mode: str) -> str:
    """The compile mode the gate reads (``miner.runtime.gate.compile_mode``) in a compile with ``v``'s knob: a
    knob under CUDA graphs is ``reduce-overhead``, one setting ``max_autotune`` is ``max-autotune``. A record
    over ``reduce_overhead`` is then evidence for a user's ``mode="reduce-overhead"`` compile, and a loss
    over the default compile does not veto it there (gpt2's dropout + LayerNorm region, H200 2026-12-06:
    0.956x alone, 1.010x on top of CUDA graphs)."""
    from miner.check import knobs
    from miner.runtime.gate import mode_of

    try:
        options = dict(knobs.parse(v.knob)[0].options) if v.knob else {}
    except Exception:  # noqa: BLE001 - a knob of your own that no longer imports: what the variant recorded
        options = {}
    return mode_of(bool(options.get(knobs.CUDAGRAPHS) or v.cudagraphs),
                   bool(options.get("max_autotune") or options.get("max_autotune_pointwise")), gate_mode(compile_mode))


def gate_mode(compile_mode: str) -> str:
    """The mode the gate reads while compiling an A/B variant of ``compile_mode`` (``dynamic`` is the default
    mode with symbolic sizes)."""
    return "default" if compile_mode == "dynamic" else compile_mode


def run_records(r: ABResult) -> dict[str, list]:
    """fusion -> every in-model record ``r`` gives it: alone over the default (:func:`alone_records`) and
    alone over each knob (:func:`knob_records`)."""
    out = {f: [rec] for f, rec in alone_records(r).items()}
    for f, rec in knob_records(r):
        out.setdefault(f, []).append(rec)
    return out


def gate_verdicts(r: ABResult, modules: dict[str, Any], compile_mode: str,
                  records: dict[str, Sequence[Any]] | None = None) -> dict[str, dict[str, str]]:
    """fusion -> {site: "fire: <reason>" | "decline: <reason>"}: the gate's decision, with the evidence of
    each fusion's ``WINS`` and ``records`` (fusion -> this run's in-model records), for every context a
    variant of ``r`` saw the fusion in."""
    from miner.runtime import evidence

    mode = gate_mode(compile_mode)
    out: dict[str, dict[str, str]] = {}
    for v in r.variants:
        for f, sites in v.contexts.items():
            wins = getattr(modules.get(f), "WINS", None)
            records_f = evidence.merge(evidence.records_of(wins), (records or {}).get(f, ()))
            for site in sites:
                fire, reason = evidence.decide(evidence.Site(site, mode), records_f, evidence.isolated_rows(wins))
                out.setdefault(f, {})[site] = f"{'fire' if fire else 'decline'}: {reason}"
    return out


def knob_graph_only(shortcut: str | None, gated: bool) -> bool:
    """Whether ``knob:<k>+fusions`` is the knob's own graph (recorded, not compiled): only where a gate
    declines every match (``shortcut`` "default"). Candidates (``gated`` False) have no gate: every match
    of theirs fires, so the variant is compiled whatever the gate would have decided."""
    return gated and shortcut == "default"


def _gated_shortcut(r: ABResult) -> str | None:
    """"all" / "default" when the gated graph equals one already measured, else None (compile it).

    From ``r.gate`` (every seen context re-decided): all fire -> the ``all`` graph; none fires ->
    nothing can fire (a context no variant saw is unmeasured and declines)."""
    decisions = [d.startswith("fire") for sites in r.gate.values() for d in sites.values()]
    if all(decisions):
        return "all" if decisions else "default"
    return "default" if not any(decisions) else None




def run_ab(build: Callable[[], Any], case: ABCase, fusions, options: ABOptions, *, knobs: Sequence[Any] = (),
           deadline: float | None = None, env: dict | None = None, log: Callable[[str], None] = print) -> ABResult:
    """The A/B of one model, step mode and compile mode (``case``; see the module docstring).

    ``fusions``: a ``miner.runtime.fusions.Fusions`` (or a set of candidates; no names: knobs only).
    ``options``: how it runs (:class:`ABOptions`). ``deadline`` (``time.perf_counter()``): no new variant
    is compiled after it (those left out are recorded). ``knobs`` (``miner.check.knobs.Knob``): each
    measured alone (``knob:<k>``) and with the fusions as a user gets them (``knob:<k>+fusions``: the
    gate on; candidates: all of them), timed in the phase of ``gated``.
    """
    t0 = time.perf_counter()
    so_far = _SoFar(ABResult(case.model, case.mode, case.compile_mode, options.preset, case.batch, case.seq,
                             env=env or {}))
    try:
        return _run_ab(build, case, fusions, options, so_far, knobs=knobs, deadline=deadline, log=log)
    except KeyboardInterrupt as e:
        raise Interrupted(interrupted(so_far.result, so_far.made, time.perf_counter() - t0)) from e


@dataclass
class _SoFar:
    """What :func:`run_ab` has so far: its result, and each variant's as it is compiled."""

    result: ABResult
    made: list[VariantResult] = field(default_factory=list)

    def longest_compile(self) -> float:
        """The longest compile of a variant so far (0 before any): what the next one is reckoned to take."""
        return max((v.compile_s or 0.0 for v in self.made), default=0.0)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM (``miner.cli``) inside :func:`run_ab`; ``result`` is what it measured before
    (:func:`interrupted`), for the caller to save before it stops. MegatronBert on the H100, 2026-12-06:
    ``timeout`` killed an A/B in its second phase and the first phase's measured win was never written."""

    def __init__(self, result: ABResult):
        super().__init__()
        self.result = result


def interrupted(r: ABResult, made: Sequence[VariantResult], seconds: float) -> ABResult:
    """``r`` as it stands when interrupted: variants already recorded keep their numbers; the others of
    ``made`` (compiled) are added, a variant timed whose parity was not judged yet as ``not-judged`` (never
    a win), one not timed as not measured. No variant measured: ``r.error`` says so."""
    why = f"interrupted {seconds:.0f} s into this A/B"
    for res in made:
        if any(v is res for v in r.variants):
            continue
        if (res.step is not None and res.speedup is not None and res.parity is None
                and res.name not in ("default", "control")):
            res.verdict, res.note = UNJUDGED, ((res.note + "; ") if res.note else "") + f"{why}: parity not judged"
        elif res.step is None or res.speedup is None:
            res.error = f"not measured: {why}"
        r.variants.append(res)
    if not any(v.step is not None and v.speedup is not None for v in r.variants):
        r.error = f"{why}, before a timed phase finished"
    r.seconds = seconds
    return r


def phase_room(deadline: float | None, compile_s: float, tail_s: float, variants: int,
               now: float | None = None) -> str | None:
    """Why one more variant is not compiled within ``deadline`` (None: it is): its compile (``compile_s``,
    the longest of this A/B so far) and the timed phase it joins (``tail_s`` per variant: the rounds, parity
    and the judge of the first phase, measured; 0 before it; ``variants`` in that phase with it) must end
    before it. MegatronBert on the H100 (2026-12-06, a 490 s tune): its last knob variant (a 57 s compile, then
    four variants' rounds and judges) started before the deadline and ran the A/B past 560 s, into ``timeout``."""
    if deadline is None:
        return None
    need = compile_s + tail_s * variants
    left = deadline - (time.perf_counter() if now is None else now)
    if left >= need and left > 0:
        return None
    return (f"not compiled: --time-budget spent (~{need:.0f} s needed: compile ~{compile_s:.0f} s, the timed phase "
            f"~{tail_s * variants:.0f} s; {max(left, 0):.0f} s left)")


def _run_ab(build: Callable[[], Any], case: ABCase, fusions, options: ABOptions, so_far: _SoFar, *,
            knobs: Sequence[Any], deadline: float | None, log: Callable[[str], None]) -> ABResult:
    """:func:`run_ab`'s body: fills ``so_far`` (its result, and each variant as it is compiled)."""
    import torch

    r, made = so_far.result, so_far.made
    model, mode, compile_mode, batch, seq = case.model, case.mode, case.compile_mode, case.batch, case.seq
    preset, device, rounds, compile_fn = options.preset, options.device, options.rounds, options.compile_fn
    t0 = time.perf_counter()
    raise_compile_limits()
    built = build()
    inputs = resize_inputs(built.inputs, batch, seq)
    r.batch, r.seq = input_shape(inputs, batch, seq)
    if (sizes := untokenized_sizes(inputs)) is not None:  # --batch/--seq size token inputs only: say what ran
        r.env = {**r.env, "inputs": sizes}
        if batch is not None or seq is not None:
            log(f"  {model}: --batch/--seq size token inputs and it has none: it runs at its own inputs, {sizes}")
    names = fusions.names()
    modules = {f: fusions.load(f) for f in names}
    wanted = set(options.fusion_variants) if names else set()

    tail = [0.0]  # seconds per variant of a timed phase (rounds, parity, the judge), once the first phase ran

    def out_of_time(variants: int) -> str | None:  # why one more variant is not compiled (None: it is)
        return phase_room(deadline, so_far.longest_compile(), tail[0], variants)

    def make(name, graph_pass=None, chosen=(), gate_mode=NO_GATE, cache=False, knob=None) -> _Live:
        log(f"  {model} {mode}/{compile_mode} {name}: compiling")
        before = knob_pass_counts(knob)
        live = prepare(VariantSpec(name, graph_pass, tuple(chosen), gate_mode, cache, knob), built, inputs, case, options)
        made.append(live.res)
        if live.res.fx_cache_hits:  # compiled in an earlier process: its compile s is a cache load
            live.res.note = f"FX graph cache hit ({live.res.fx_cache_hits} graphs): compile s is a cache load"
        fired = {f: n for f, n in live.res.matches.items() if n}
        if knob_took := knob_pass_text(knob, before, live.res.fx_cache_hits):  # kept with the variant's result too
            live.res.note = (f"{live.res.note}{knob_took}" if live.res.note else knob_took[2:])
        log(f"  {model} {mode}/{compile_mode} {name}: {live.res.compile_s:.1f} s"
            f"{f', FX cache hits {live.res.fx_cache_hits}' if live.res.fx_cache_hits else ''}"
            f"{pass_text(live.res.pass_s)}; matches {fired}{taken_text(graph_pass)}{knob_took}{memory_text(device)}")
        return live

    def make_graphs(name, graph_pass, chosen, gate_mode, knob, cache=False) -> _Live | None:
        """:func:`make` for a knob's variant; recorded not compiled, with why, where its CUDA graphs find no room
        beside the variants compiled so far (:func:`graph_room`) or its compile runs out of device memory (its
        graphs recorded beside the others'): None, and the A/B goes on."""
        why = graph_room(default.res.warmup_peak_bytes, device, pool=graph_pool(phase_b)) if knob.cudagraphs else None
        if why is None:
            try:
                return make(name, graph_pass, chosen, gate_mode, cache, knob)
            except Exception as e:  # noqa: BLE001 - only running out of memory is the variant's own failure
                if type(e).__name__ != "OutOfMemoryError":
                    raise
                release_free_memory(device)
                why = (f"not compiled: out of device memory while compiling beside the other variants "
                       f"({_first_sentences(one_line(e))}); measure it on a GPU with more memory or at a smaller "
                       "batch")
        log(f"  {model} {mode}/{compile_mode} {name}: {why}")
        r.variants.append(VariantResult(name, list(chosen), gate_mode, knob=knob.name, numerics=knob.numerics,
                                        cudagraphs=knob.cudagraphs, error=why))
        return None

    reference = None
    if options.parity_reference:
        log(f"  {model} {mode}/{compile_mode} float32 reference: compiling")
        try:
            reference = reference_step(built, inputs, mode=mode, device=device, compile_fn=compile_fn)
        except Exception as e:  # e.g. out of memory in float32: the fixed tolerance decides, and says so
            log(f"  {model} {mode}/{compile_mode} float32 reference failed ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}); parity by the fixed tolerance"[:300])
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    default = make("default", cache=True)
    control = make("control", cache=True)
    if control.res.fx_cache_hits:
        control.res.note = f"FX graph cache hit ({control.res.fx_cache_hits} graphs): the default's compiled code"
    from miner.check.masks import ab_judge

    masked = ab_judge(built, inputs, modules, mode=mode, device=device,  # philox4 variants' parity
                      graph_pass=lambda chosen: fusions.graph_pass(chosen, gate=GATE_OPEN),
                      room=lambda n: phase_room(deadline, n * so_far.longest_compile(), 0.0, 0))
    phase_a = [default, control]
    if "all" in wanted:
        every = make("all", fusions.graph_pass(names, gate=GATE_OPEN), names, GATE_OPEN)
        r.fires = dict(every.res.matches)
        fired = [f for f in names if r.fires.get(f)]
        phase_a.append(every)
        if len(fired) == 1:
            every.res.note = f"only {fired[0]} fires: this is {fired[0]} alone"
        elif not fired:
            every.res.note = "no fusion fires" + ("" if every.res.gate_decisions else
                                                  ": no pattern matched the graph (nothing declined)")
        for f in (fired if len(fired) > 1 and "alone" in wanted else []):
            if why := out_of_time(len(phase_a) + 1):
                r.variants.append(VariantResult(f"alone:{f}", [f], GATE_OPEN, error=why))
                continue
            kept = knob_reserve(knobs, default.res.compile_s, deadline)
            if kept:
                r.variants.append(VariantResult(f"alone:{f}", [f], GATE_OPEN, error=kept))
                continue
            phase_a.append(make(f"alone:{f}", fusions.graph_pass([f], gate=GATE_OPEN), [f], GATE_OPEN))
    if len(phase_a) > 2 or not (knobs or "gated" in wanted):  # else the band comes from the second phase
        log(f"  {model} {mode}/{compile_mode}: {rounds} alternating rounds over {len(phase_a)} variants")
        t_phase = time.perf_counter()
        interleave(phase_a, rounds, device)
        r.noise_band = noise_band(_record_phase(phase_a, None))
        for live in phase_a[1:]:
            live.res.verdict = verdict(live.res.speedup, r.noise_band)
        _parity(phase_a, mode, device, reference, masked)
        _log_phase(phase_a, log, f"  {model} {mode}/{compile_mode}")
        _explain(phase_a, options.kernel_times, device, options.profile_steps)
        tail[0] = (time.perf_counter() - t_phase) / len(phase_a)
    r.variants[:0] = [live.res for live in phase_a]
    this_run = {f: [rec] for f, rec in alone_records(r).items()}  # join the evidence of the gated compiles
    for live in phase_a[2:]:  # free the fusion variants; default and control stay for the second phase
        live.model = live.step = None
    del phase_a[2:]
    if device.startswith("cuda"):
        torch.cuda.empty_cache()

    # on the CPU the gate passes (interpreter timings decide nothing): the gated graph is ``all``'s
    r.gate = gate_verdicts(r, modules, compile_mode, this_run)
    gated_on = getattr(fusions, "gated", True)
    shortcut = None if "all" not in wanted else _gated_shortcut(r) if device.startswith("cuda") else "all"
    phase_b: list[_Live] = [default, control]
    if "gated" not in wanted or not gated_on:
        pass  # candidates have no gate: no gated variant
    elif shortcut is not None:
        src = r.variant(shortcut)
        same = VariantResult("gated", names, GATE_ON, step=src.step, speedup=src.speedup, verdict=src.verdict,
                             matches=dict(src.matches) if shortcut == "all" else {f: 0 for f in names},
                             note=(f"same graph as `{shortcut}`: with the gate on "
                                   f"{'every' if shortcut == 'all' else 'no'} match fires; not compiled again"
                                   + ("" if device.startswith("cuda") else " (CPU: the gate passes)")))
        r.variants.append(same)
    elif why := out_of_time(len(phase_b) + 1):
        r.variants.append(VariantResult("gated", names, GATE_ON, error=why))
    else:
        phase_b.append(make("gated", fusions.graph_pass(names, records=this_run), names, GATE_ON))
    fused_mode = GATE_ON if gated_on else NO_GATE
    untimed: list[VariantResult] = []  # compiled knob:<k>+fusions where no match fired (:func:`_untimed_as_knob`)
    for knob in knobs:
        for fused in (False, True) if names else (False,):
            name = f"knob:{knob.name}" + ("+fusions" if fused else "")
            held, gate = (names, fused_mode) if fused else ([], NO_GATE)
            if fused and knob_graph_only(shortcut, gated_on):  # no fusion fires: the knob's own graph
                r.variants.append(VariantResult(name, names, fused_mode, knob=knob.name, numerics=knob.numerics,
                                                note=f"same graph as `knob:{knob.name}`: with the gate on no match "
                                                     "fires; not compiled"))
            elif why := out_of_time(len(phase_b) + 1):
                r.variants.append(VariantResult(name, held, gate, knob=knob.name, error=why))
            elif (live := make_graphs(name, fusions.graph_pass(names, records=this_run) if fused else None,
                                      held, gate, knob, cache=cacheable(knob, fused))) is not None:
                phase_b.append(live)
                fired_k = [f for f in names if live.res.matches.get(f)] if fused else []
                base = knob_live(phase_b, knob.name) if fused else None
                if base is not None and not fired_k:
                    untimed.append(_untimed_as_knob(phase_b.pop(), knob.name))  # the knob's graph: not timed twice
                    continue
                if base is not None:  # the fusions are judged on top of the knob: its own band
                    phase_b.append(knob_control(base))
                for f in (fired_k if len(fired_k) > 1 and "alone" in wanted else []):  # each on top of the knob
                    alone_k = f"knob:{knob.name}+alone:{f}"
                    if why := out_of_time(len(phase_b) + 1):
                        r.variants.append(VariantResult(alone_k, [f], GATE_OPEN, knob=knob.name, error=why))
                    elif (live := make_graphs(alone_k, fusions.graph_pass([f], gate=GATE_OPEN), [f], GATE_OPEN,
                                              knob)) is not None:
                        phase_b.append(live)
    if len(phase_b) > 2:
        log(f"  {model} {mode}/{compile_mode}: {rounds} alternating rounds over {len(phase_b)} variants")
        for live in interleave(phase_b, rounds, device):
            if not is_knob_control(live.res):
                log(f"  {model} {mode}/{compile_mode} {live.res.name}: {live.res.error}")
                r.variants.append(live.res)
        if r.noise_band is None:  # no first phase: this one's control gives the band
            r.noise_band = noise_band(_record_phase(phase_b, None))
            for live in phase_b[1:]:
                live.res.verdict = verdict(live.res.speedup, r.noise_band)
        else:
            saved = [(live.res.step, live.res.speedup, live.res.speedup_p20, live.res.speedup_p80, live.res.verdict,
                      live.res.round_ms, live.res.host_ms) for live in (default, control)]
            _record_phase(phase_b, r.noise_band)
            for live in phase_b[2:]:
                live.res.note = ((live.res.note + "; ") if live.res.note else "") + (
                    f"timed in a second phase with default and control (there: default "
                    f"{default.res.step.median_ms:.2f} ms, control {control.res.speedup:.3f}x)")
            for live, kept in zip((default, control), saved):  # phase A's numbers stand
                (live.res.step, live.res.speedup, live.res.speedup_p20, live.res.speedup_p80,
                 live.res.verdict, live.res.round_ms, live.res.host_ms) = kept
        r.knob_bands.update(knob_bands(phase_b))
        phase_b[:] = [live for live in phase_b if not is_knob_control(live.res)]  # its numbers are the band
        for k, band in r.knob_bands.items():
            log(f"  {model} {mode}/{compile_mode}: noise band on top of knob:{k} ±{100 * band:.2f}% (its step "
                f"timed twice per round), of the run ±{100 * (r.noise_band or 0):.2f}% (default vs control)")
        _parity([default] + phase_b[2:], mode, device, reference, masked)
        _log_phase([default] + phase_b[2:], log, f"  {model} {mode}/{compile_mode}")
        _explain([default] + phase_b[2:], options.kernel_times, device, options.profile_steps)
        r.variants.extend(live.res for live in phase_b[2:])
        r.variants.extend(untimed)  # only where its knob was compiled, so timed here
    if default.res.step is None:  # neither phase had more than the two defaults: time them for the band
        interleave([default, control], rounds, device)
        r.noise_band = noise_band(_record_phase([default, control], None))
        control.res.verdict = verdict(control.res.speedup, r.noise_band)
    _same_as_knob(r)
    del reference
    r.seconds = time.perf_counter() - t0
    return r


def cacheable(knob: Any, fused: bool) -> bool:
    """Whether Inductor's FX and AOT caches may serve a knob's variant: only the knob alone (a fusion pass
    would count no matches on a hit) and only a knob of options alone (they are in the cache keys; a
    context's global state, e.g. the SDPA flag, is in neither key, and the AOT cache keys the graph Dynamo
    traced, before the flag changes what it decomposes into: a hit would run the default's code)."""
    return not fused and knob.context is None


def knob_reserve(knobs: Sequence[Any], compile_s: float | None, deadline: float | None,
                 now: float | None = None) -> str | None:
    """Why a fusion-alone variant is not compiled (None: it is): the knobs' variants come after it, each
    knob alone and with the fusions, and within ``deadline`` they come first (the best one-line
    alternative is what the fusions must beat). Each is reckoned as long as the default's compile
    (``compile_s``). bert and gpt2 on the H100, 2026-12-06: the `alone` variants took gpt2's budget and its
    reduce-overhead knob was never compiled."""
    if deadline is None or not knobs or not compile_s:
        return None
    need = 2 * len(knobs) * compile_s
    left = deadline - (time.perf_counter() if now is None else now)
    if left >= need:
        return None
    return (f"not compiled: the knobs' {2 * len(knobs)} variants come first within --time-budget (~{need:.0f} s, "
            f"{max(left, 0):.0f} s left)")


def raise_compile_limits() -> None:
    """Every variant of a model compiles the same code objects: allow 64 cache entries, not 8, and make
    a hit of the limit an error (Dynamo would otherwise run the variant eagerly and time that)."""
    import torch._dynamo.config as dc

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dc, name):
            setattr(dc, name, max(getattr(dc, name), 64))
    if hasattr(dc, "fail_on_recompile_limit_hit"):
        dc.fail_on_recompile_limit_hit = True


def input_shape(inputs: dict, batch: int | None, seq: int | None) -> tuple[int | None, int | None]:
    """(batch, seq) of the step's token inputs (the first 2-d integer tensor); the given values otherwise."""
    import torch

    ids = next((v for v in inputs.values() if torch.is_tensor(v) and v.dim() == 2 and not v.is_floating_point()),
               None)
    return (batch, seq) if ids is None else (int(ids.shape[0]), int(ids.shape[1]))


def untokenized_sizes(inputs: dict) -> str | None:
    """``x float32[4,32,64]``: the step's tensor inputs, where none is a token tensor (a model of one's own fed
    features: its batch and sequence are not the preset's, which ``resize_inputs`` applies to tokens only); None
    where one is."""
    import torch

    tensors = {k: v for k, v in inputs.items() if torch.is_tensor(v)}
    if not tensors or any(v.dim() in (1, 2) and not v.is_floating_point() for v in tensors.values()):
        return None
    from miner.core import dtypes

    return ", ".join(f"{k} {dtypes.name(v.dtype)}[{','.join(str(int(d)) for d in v.shape)}]" for k, v in tensors.items())


def knob_live(phase: Sequence[_Live], knob: str) -> _Live | None:
    """``knob:<knob>`` (the knob alone) among the compiled variants of ``phase``, or None."""
    return next((live for live in phase if live.res.name == f"knob:{knob}"), None)


def _untimed_as_knob(live: _Live, knob: str) -> VariantResult:
    """``knob:<k>+fusions`` compiled with the gate on where no match fired: its graph is the knob's own, so it is
    not timed again (its rounds, parity and CUDA-graph pool would measure the knob twice); it keeps its compile,
    matches and the gate's decisions, and takes ``knob:<k>``'s numbers (:func:`_same_as_knob`). t5 at B24 on the
    H100 (2026-12-07): every match declined outside the evidence, and the variant's timed phase ran the A/B out
    of its time."""
    live.res.note = ((live.res.note + "; ") if live.res.note else "") + (
        f"same graph as `knob:{knob}`: with the gate on no match fired (the gate's decisions below); not timed")
    live.model = live.step = None
    return live.res


KNOB_CONTROL = "+control"  # the name suffix of a knob's control (:func:`knob_control`)


def knob_control(base: _Live) -> _Live:
    """The control of a knob's variant: its own compiled step, timed once more in each round under another
    name (as the default's control is the default's compiled code again, from the FX cache). The paired ratios
    of the two give the noise band of steps on top of the knob (:func:`knob_bands`); it is no variant of the
    result."""
    res = base.res
    twin = VariantResult(res.name + KNOB_CONTROL, [], NO_GATE, knob=res.knob, numerics=res.numerics,
                         cudagraphs=res.cudagraphs, note=f"the compiled step of `{res.name}` timed again")
    return _Live(twin, base.model, base.step)


def is_knob_control(v: VariantResult) -> bool:
    return bool(v.knob) and v.name == f"knob:{v.knob}{KNOB_CONTROL}"


def knob_bands(lives: Sequence[_Live]) -> dict[str, float]:
    """knob -> its noise band, from the rounds a timing phase gave each knob's variant and its control
    (:func:`knob_control`; ``_record_phase`` has stored their ``round_ms``)."""
    by_name = {live.res.name: live.res for live in lives}
    out = {}
    for v in by_name.values():
        if is_knob_control(v):
            knob = by_name.get(f"knob:{v.knob}")
            ratios = paired_ratios(knob.round_ms, v.round_ms) if knob is not None else []
            if ratios:
                out[v.knob] = round(noise_band(ratios), 6)
    return out


def _same_as_knob(r: ABResult) -> None:
    """A ``knob:<k>+fusions`` whose graph is the knob's own (not compiled, or compiled and no match fired) takes
    ``knob:<k>``'s numbers; its own compile time stays where it was compiled."""
    for v in r.variants:
        if v.knob and v.name.endswith("+fusions") and v.step is None and v.error is None:
            src = r.variant(f"knob:{v.knob}")
            if src is not None:
                v.step, v.speedup, v.speedup_p20, v.speedup_p80, v.verdict, v.parity = (
                    src.step, src.speedup, src.speedup_p20, src.speedup_p80, src.verdict, src.parity)
                v.compile_s = src.compile_s if v.compile_s is None else v.compile_s
                v.cudagraphs = src.cudagraphs


def host_share(v: VariantResult) -> str:
    """``41.2 ms (p20-p80 40.1-44.0), as long as the GPU step or longer in 3 of 15 rounds``: the host's
    time to issue the step, and in how many rounds it took at least the step's GPU time (the GPU
    then waited on the host: the ~1 ms of work queued ahead is all the head start it had)."""
    from miner.bench import roofline as rl

    m, lo, hi = rl.summarize(v.host_ms)
    bound = sum(h >= g for h, g in zip(v.host_ms, v.round_ms))
    return (f"{m:.1f} ms (p20-p80 {lo:.1f}-{hi:.1f}), as long as the GPU step or longer in {bound} of "
            f"{len(v.host_ms)} rounds")


def launch_share(v: VariantResult) -> str:
    """``; per step 23 launches of miner's kernels: 22 direct, 1 triton``: how they were launched in the timed steps
    (``miner.runtime.direct``); "" where none ran outside a CUDA-graph replay."""
    steps = v.launches.get("steps", 0)
    paths = {k: n for k, n in sorted(v.launches.items()) if k != "steps" and n}
    if not steps or not paths:
        return ""
    return (f"; per step {sum(paths.values()) / steps:g} launches of miner's kernels: "
            + ", ".join(f"{n / steps:g} {k}" for k, n in paths.items()))


def _log_phase(lives: Sequence[_Live], log: Callable, prefix: str) -> None:
    """One line per variant as soon as a phase is measured: a call killed later keeps these in its log."""
    for live in lives:
        v = live.res
        if v.step is None:
            continue
        parity = "" if v.parity is None else (" parity ok" if v.parity.ok else " parity NOT JUDGED"
                                              if v.parity.unjudged else " parity FAIL") + (
            f" ({v.parity.judged}: {v.parity.reason[:300]})" if v.parity.reason else f" ({v.parity.judged})")
        log(f"{prefix} {v.name}: {v.step.median_ms:.2f} ms ({v.step.p20_ms:.2f}-{v.step.p80_ms:.2f})"
            + (f" {v.speedup:.3f}x (p20-p80 {v.speedup_p20:.3f}-{v.speedup_p80:.3f})"
               if v.speedup and v.speedup_p20 is not None else "")
            + (f" peak {v.step.peak_mem_bytes / 2**30:.2f} GiB" if not v.cudagraphs else
               " step peak not measured (CUDA graphs)")
            + ("" if v.warmup_peak_bytes is None else f" (warm-up peak {v.warmup_peak_bytes / 2**30:.2f} GiB"
               + (": the graphs' pool)" if v.cudagraphs else ")"))
            + (f" {step_label(v.verdict, v.speedup_p20)}" if v.verdict else "")
            + (f"; host issues it in {host_share(v)}" if v.host_ms else "") + launch_share(v) + parity)


def _parity(lives: Sequence[_Live], mode: str, device: str, reference: tuple | None = None,
            masked: Callable | None = None) -> None:
    """Each variant's parity against ``lives[0]`` (and the float32 ``reference``), then its verdict
    again: one that broke parity is ``parity-fail``, one whose parity could not be judged ``not-judged``.
    ``masked``: ``miner.check.masks.ab_judge``'s
    judge, for variants whose dropout kernels draw another stream ("masks injected")."""
    ref = parity_of(lives[0], mode, device)
    held: dict[int, str | None] = {}  # verdicts held back until the judge decides
    for live in lives[1:]:
        got = parity_of(live, mode, device)
        live.res.parity = make_parity(ref[0], got[0], ref[1], got[1], ref[2], got[2], reference=reference)
        if masked is not None and getattr(getattr(live, "knob", None), "draws", ""):
            # a knob drawing its own dropout stream: the direct difference compares two streams and decides nothing;
            # unjudged until the judge below decides (a run interrupted before it must not say "FAIL": t5 B16 S512
            # with philox4_dropout_bits on an H100, 2026-12-07, grads 0.085 apart by their masks alone)
            held[id(live)] = live.res.verdict
            live.res.parity, live.res.verdict = _awaiting_judge(live.res.parity, live.res.verdict,
                                                                "judged by its masks injected")
        del got
    del ref  # the judge's eager float32 step needs the room (DeBERTa-v2, H100: out of memory beside them)
    for live in lives[1:]:
        if masked is not None:
            live.res.parity = _judged(masked, lives[0], live, device)
            live.res.verdict = held.pop(id(live), live.res.verdict)
        if live.res.verdict is not None and not live.res.parity.ok:
            live.res.verdict = UNJUDGED if live.res.parity.unjudged else PARITY_FAIL


def _judged(masked: Callable, default: _Live, live: _Live, device: str) -> Parity:
    """``masked``'s verdict on ``live`` (its own parity where the judge has none). The judge runs after
    every timed round, beside every variant's weights and CUDA-graph pool: out of device memory, the
    allocator's free blocks are returned and it runs once more (the pools stay: the variants still run
    under torch.profiler and in phase B); out of memory again, it judges the same fusions at batch
    ``JUDGE_BATCH`` (``miner.check.masks.smaller_batch_judge``: two compiles more, said in its method). A
    judge that still breaks leaves the variant unjudged, with the first line of its error: the run is never
    lost."""
    from miner.check.masks import JUDGE_BATCH

    for attempt in (0, 1):
        try:
            return masked(default, live, live.res.parity) or live.res.parity
        except Exception as e:  # noqa: BLE001 - see the docstring
            oom = type(e).__name__ == "OutOfMemoryError"
            if oom:
                release_free_memory(device)
                if attempt == 0:
                    continue
            held = held_memory(device) if oom else ""
            hint = "".join(f"; {part}" for part in (held, "fewer variants per call leave it more memory") if part and oom)
            why = f"the judge failed: {_first_sentences(one_line(e))}{hint}"
            if not oom:
                return replace(live.res.parity, ok=False, judged="masks injected (not judged)", reason=why)
    try:  # the step's own judge does not fit beside the variants: the same fusions at a smaller batch
        small = masked(default, live, live.res.parity, batch=JUDGE_BATCH)
    except Exception as e:  # noqa: BLE001 - see the docstring
        small, why = None, f"{why}; at batch {JUDGE_BATCH}: {_first_sentences(one_line(e))}"
    if small is None:
        return replace(live.res.parity, ok=False, judged="masks injected (not judged)", reason=why[:400])
    known = "; ".join(part for part in (oom_need(why), held) if part)
    first = f"the step's judge ran out of device memory{f' ({known})' if known else ''}; at batch {JUDGE_BATCH}: "
    return replace(small, reason=(first + (small.reason or ""))[:400])


def oom_need(message: str) -> str:
    """``it asked for 12.00 GiB more`` from a CUDA out-of-memory message ("" where it names no size): with
    :func:`held_memory`, what the next run needs to know to make the judge fit (t5-large B8 S512 on an H100,
    2026-12-07: the reason kept neither)."""
    import re

    m = re.search(r"Tried to allocate ([\d.]+ [KMGT]i?B)", message)
    return f"it asked for {m.group(1)} more" if m else ""


def held_memory(device: str) -> str:
    """What the A/B holds on ``device`` beside the judge, in words ("" off CUDA): after an out-of-memory
    judge, it says whether the variants or the judge's own step took the memory."""
    import torch

    if not (str(device).startswith("cuda") and torch.cuda.is_available()):
        return ""
    return (f"{torch.cuda.memory_allocated(device) / 2 ** 30:.1f} GiB held by the A/B's variants and reference "
            f"after it, {_free_text(device)}")


def _free_text(device: str) -> str:
    """"12.3 of 79.2 GiB free" on a CUDA ``device``."""
    import torch

    free, total = torch.cuda.mem_get_info(device)
    return f"{free / 2 ** 30:.1f} of {total / 2 ** 30:.1f} GiB free"


def memory_text(device: str) -> str:
    """The device's memory after a variant compiled, in words ("" off CUDA): what the caching allocator
    holds (CUDA-graph pools included) and what is free; the log shows how much each variant added."""
    import torch

    if not (str(device).startswith("cuda") and torch.cuda.is_available()):
        return ""
    return f"; device memory {torch.cuda.memory_reserved(device) / 2 ** 30:.1f} GiB reserved, {_free_text(device)}"


def release_free_memory(device: str) -> None:
    """Collect garbage and return the caching allocator's free blocks on ``device`` (live tensors and
    CUDA-graph pools stay)."""
    import gc

    import torch

    gc.collect()
    if str(device).startswith("cuda") and torch.cuda.is_available():
        torch.cuda.empty_cache()


def _explain(lives: Sequence[_Live], kernel_times: Callable | None, device: str, steps: int) -> None:
    """Each variant's kernel table under torch.profiler, diffed against the default's."""
    from miner.check import explain

    if steps < 1:
        return
    if kernel_times is None:
        from miner.scan.profile import kernel_times  # CUDA: kernel device time; CPU: op self time
    tables = []
    for live in lives:
        try:
            tables.append(kernel_times(live.step, steps=steps, device=device))
        except Exception as e:  # a profiler failure must not lose the timings
            tables.append(None)
            live.res.note = (live.res.note + f"; profiler failed: {type(e).__name__}: {e}")[:300]
    for live, table in zip(lives[1:], tables[1:]):
        if tables[0] is not None and table is not None:
            live.res.kernels = explain.diff(tables[0], table)
