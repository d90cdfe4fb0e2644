"""``miner validate``: a candidate's numerics, and proof that its rewrite fires inside torch.compile.

Two kinds of checks, each a ``Check(kind, case, ok, detail, ...)``:

- ``numerics``: ``kernel.launch`` against ``pattern`` evaluated in float64 on the same inputs, for
  every observed (shape, dtype) (both kernel variants), plus odd cases derived from the first
  observed shape: a non-power-of-two row, a single row, a row longer than the one-pass limit
  (the looped kernel) and bf16/fp16 inputs (``miner.check.cases``). Tolerances per output dtype:
  ``miner.core.dtypes.ELEMENT_TOL``. On a CPU the Triton kernel runs in the interpreter, so
  shapes are shrunk to ``cases.CPU_MAX_ROWS`` rows.
- ``rewrite``: a zoo model the pattern was found in (tiny preset) compiled with the candidate's
  ``FusionPass``; the pass must match (count > 0) and the loss, logits and gradients must match
  eager (``miner.core.dtypes.MODEL_TOL``). Dropout draws the same numbers in both runs
  (``fallback_random``).
- ``stream`` (a dropout region drawing the four-per-call stream, ``RNG = "philox4"`` in kernel.py):
  the same mask, bit for bit, from one-pass and looped launches of several tile sizes
  (``check_tiling``), plus numerics with float32 inputs. Its ``rewrite`` check is
  ``miner.check.masks.check_model`` on ``device``: its masks differ from eager's and Inductor's, so the
  step is compared with an eager step into which the masks it drew are injected ("masks injected").

Results go to ``candidates/<id>/validation.json``, this stage's only file (with ``failure``: the
first failing check, and ``sources``: the digest of the pattern.py and kernel.py it checked); the
candidate's status follows from it (``miner.core.candidate.status``). ``miner promote`` refuses
anything not validated.
"""

from __future__ import annotations

import copy
import datetime as _dt
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from miner import __version__
from miner.check.cases import numeric_cases
from miner.core import candidate as candidates
from miner.core import dtypes
from miner.core.candidate import Candidate
from miner.core.dtypes import MODEL_TOL
from miner.core.tensors import make_inputs
from miner.core.workspace import Workspace, write_json

MODEL_ORDER = ("gpt2", "bert", "llama", "t5")  # cheapest compile first


@dataclass
class Check:
    kind: str  # numerics | rewrite | graph (an upcast candidate's rewrite on a traced graph) | stream (a mask's tilings)
    case: str
    ok: bool | None  # None: not run where it was asked to (``detail`` says why); never counted as passed
    detail: str = ""
    max_abs: float | None = None
    max_rel: float | None = None
    matches: int | None = None
    seconds: float = 0.0
    device: str | None = None  # where it ran


@dataclass
class Validation:
    id: str
    ok: bool
    device: str
    model: bool = True  # the rewrite was proven in a model (``--no-model``: numerics only)
    checks: list[Check] = field(default_factory=list)
    failure: str | None = None

    def to_json(self) -> dict:
        import torch
        import triton

        return {"id": self.id, "ok": self.ok, "failure": self.failure, "miner_version": __version__,
                "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "device": self.device, "model": self.model, "torch": torch.__version__, "triton": triton.__version__,
                "checks": [asdict(c) for c in self.checks]}


# --------------------------------------------------------------------------- numerics

def _compare(out, ref, expect_dtype) -> tuple[bool, float, float, str]:
    import torch

    if out.dtype != expect_dtype:
        return False, math.inf, math.inf, f"dtype {out.dtype}, expected {expect_dtype}"
    if tuple(out.shape) != tuple(ref.shape):
        return False, math.inf, math.inf, f"shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    if out.dtype == torch.bool:
        bad = int((out != ref).sum())
        return bad == 0, float(bad), float(bad), f"{bad} mismatching booleans" if bad else ""
    rtol, atol = dtypes.ELEMENT_TOL[dtypes.name(out.dtype)]
    o, r = out.double().cpu(), ref.double().cpu()
    nan_ok = torch.equal(torch.isnan(o), torch.isnan(r))
    finite = ~torch.isnan(r)
    diff = (o - r).abs()[finite]
    max_abs = float(diff.max()) if diff.numel() else 0.0
    max_rel = float((diff / r.abs()[finite].clamp_min(1e-30)).max()) if diff.numel() else 0.0
    close = torch.isclose(o[finite], r[finite], rtol=rtol, atol=atol, equal_nan=True)
    ok = bool(close.all()) and nan_ok
    detail = "" if ok else (f"{int((~close).sum())} elements outside rtol={rtol} atol={atol}" if nan_ok
                            else "NaN positions differ from the reference")
    return ok, max_abs, max_rel, detail


def check_numerics(cand: Candidate, label: str, entry: dict, variant: str | None, device: str) -> Check:
    t0 = time.perf_counter()
    xs = make_inputs(entry["inputs"], device=device, seed=0)
    cs = [float(s) for s in entry.get("scalars", [])]
    try:
        expect = cand.pattern_module.pattern(*[x.to("meta") for x in xs], *cs)
        outs = cand.kernel_module.launch(*xs, *cs, variant=variant)
        # a kernel that draws random numbers is compared with its kernel.py reference, which draws the same ones
        random = getattr(cand.kernel_module, "RANDOM", False)
        ref_fn = cand.kernel_module.reference if random else cand.pattern_module.pattern
        ref = ref_fn(*[x.double() if x.is_floating_point() else x for x in xs], *cs)
    except Exception as e:  # noqa: BLE001 - any failure of the kernel is a failed check
        return Check("numerics", label, False, f"{type(e).__name__}: {str(e).splitlines()[0][:300]}",
                     seconds=time.perf_counter() - t0)
    return outputs_check(label, outs, ref, expect, _compare, t0)


def outputs_check(label: str, outs, refs, expect, compare: Callable, t0: float) -> Check:
    """The ``numerics`` check of a kernel's outputs against references: ``compare(out, ref, dtype) ->
    (ok, abs error, rel error, detail)`` per output (``expect``: the pattern's outputs on meta tensors,
    for their dtypes); the first failing output fails it, else the worst errors are reported."""
    worst_abs = worst_rel = 0.0
    for i, (o, r, e) in enumerate(zip(outs, refs, expect)):
        ok, a, rel, detail = compare(o, r, e.dtype)
        worst_abs, worst_rel = max(worst_abs, a), max(worst_rel, rel)
        if not ok:
            return Check("numerics", label, False, f"output {i}: {detail}", a, rel, seconds=time.perf_counter() - t0)
    return Check("numerics", label, True, "", worst_abs, worst_rel, seconds=time.perf_counter() - t0)


# --------------------------------------------------------------------------- the four-per-call random stream

def tilings(n_cols: int) -> list[tuple[str, tuple[int, int, int]]]:
    """(variant, (ROWS, BLOCK, num_warps)) launches that must draw the same mask: one-pass with one
    and several rows per program, looped with two chunk widths (whole groups of four per Philox call
    in the looped kernel; in the one-pass kernel only when ``n_cols % 4 == 0``, else one call per
    element: comparing them checks the fallback against the grouped draw)."""
    import triton

    block = triton.next_power_of_2(n_cols)
    out = [("one_pass", (1, block, 4)), ("one_pass", (4, block, 4)), ("looped", (1, 64, 4)), ("looped", (1, 256, 4))]
    return [(v, c) for v, c in out if v == "looped" or c[0] * c[1] <= 16384]


def _mask_of(outs) -> list:
    """What a dropout kernel's outputs say about its mask: bool outputs as they are, float
    per-element outputs as their zero pattern."""
    return [o if o.dtype.is_floating_point is False else (o == 0) for o in outs]


def check_tiling(cand: Candidate, label: str, entry: dict, device: str) -> Check:
    """The same mask (bitwise) from every launch of :func:`tilings` on the same inputs: an
    element's random number depends on (seed, its index) only, never on the tile or the kernel."""
    import torch

    t0 = time.perf_counter()
    xs = make_inputs(entry["inputs"], device=device, seed=0)
    cs = [float(s) for s in entry.get("scalars", [])]
    from miner.check.cases import rows

    n_cols = rows(entry)[1]
    try:
        base = _mask_of(cand.kernel_module.launch(*xs, *cs))
        for variant, config in tilings(n_cols):
            got = _mask_of(cand.kernel_module.launch(*xs, *cs, variant=variant, config=config))
            for i, (a, b) in enumerate(zip(base, got)):
                if not torch.equal(a, b):
                    bad = int((a != b).sum())
                    return Check("stream", label, False, f"output {i}: {bad} mask element(s) differ under {variant} "
                                 f"ROWS={config[0]} BLOCK={config[1]} from the default launch",
                                 seconds=time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 - any failure of the kernel is a failed check
        return Check("stream", label, False, f"{type(e).__name__}: {str(e).splitlines()[0][:300]}",
                     seconds=time.perf_counter() - t0)
    return Check("stream", label, True, f"same mask in {len(tilings(n_cols)) + 1} tilings",
                 seconds=time.perf_counter() - t0)


def stream_checks(cand: Candidate, device: str) -> list[Check]:
    """A four-per-call dropout candidate's own checks: the same mask under every tiling (an observed
    row length and an odd one, 8 rows) and numerics with float32 inputs (the numeric cases add
    bf16/fp16 ones; the reference draws from ``miner.runtime.philox``)."""
    from miner.check import cases

    observed = [o for o in cand.meta.get("observed", []) if o.get("outputs")]
    if not observed:
        return []
    first = cases.shrink(observed[0], 8)
    odd = cases.reshape(first, n_cols=cases.ODD_COLS)
    out = [check_tiling(cand, f"tilings {cases.describe(e)}", e, device) for e in (first, odd)]
    out.append(check_numerics(cand, "float32 inputs", cases.reshape(first, dtype="float32"), None, device))
    return out


# --------------------------------------------------------------------------- rewrite in a model

def phase_modes(phases) -> list[str]:
    """The step modes whose graphs are these phases: ``train`` for a forward or backward graph,
    ``infer`` for an inference graph (in that order)."""
    phases = set(phases)
    return [m for m, has in (("train", phases - {"inference"}), ("infer", phases & {"inference"})) if has]


def pick_model(meta: dict) -> tuple[str, str] | None:
    """(model, mode) to prove the rewrite in: a model it was observed in, cheapest first."""
    occ = meta.get("occurrences", {})
    models = sorted(occ, key=lambda m: (MODEL_ORDER.index(m) if m in MODEL_ORDER else 99, m))
    if not models:
        return None
    return models[0], (phase_modes(occ[models[0]]) or ["train"])[0]


def gate_context(graph_pass, gate_open: bool):
    """``graph_pass``'s gate held open (``FusionPass.gate_held``) when ``gate_open``; else as the caller left it."""
    import contextlib

    return graph_pass.gate_held("open") if gate_open and graph_pass is not None else contextlib.nullcontext()


def model_step(built, mode: str, device: str, graph_pass=None, *, compiled: bool = True, autocast: bool = False,
               fallback_random: bool = True, gate_open: bool = False) -> tuple:
    """``(loss, logits, grads)`` (``miner.check.verify.observe_step``) of one seeded step of a copy of
    ``built``'s model: eager (``compiled=False``) or ``torch.compile(dynamic=False)`` with
    ``graph_pass`` (None: without), Inductor's caches off; under bf16 autocast as ``miner verify``
    runs it (``autocast``) or in the model's dtype; Inductor drawing eager's random numbers
    (``fallback_random``); the fusion gate held open (``gate_open``)."""
    import torch

    from miner.check.verify import make_step, observe_step
    from miner.runtime import rewrite

    torch._dynamo.reset()
    model = copy.deepcopy(built.model)
    try:
        options = rewrite.inductor_options(graph_pass) if graph_pass is not None else None
        runner = torch.compile(model, options=options, dynamic=False) if compiled else model
        with torch._inductor.config.patch(force_disable_caches=True, fallback_random=fallback_random), \
                gate_context(graph_pass, gate_open):
            step = make_step(runner, built.inputs, built.loss, mode, device, autocast=autocast)
            return observe_step(step, model, mode=mode, device=device, seed=0)
    finally:
        torch._dynamo.reset()


def _parity(reference, got) -> tuple[list[str], float]:
    """Problems (the first pair beyond ``MODEL_TOL``) and the worst max abs difference of two
    ``model_step`` results: logits, loss, each gradient."""
    import torch

    (e_loss, e_logits, e_grads), (c_loss, c_logits, c_grads) = reference, got
    pairs = [("logits", e_logits, c_logits)]
    if e_loss is not None:
        pairs.append(("loss", torch.tensor(e_loss), None if c_loss is None else torch.tensor(c_loss)))
    pairs += [("grads", g, c_grads.get(k)) for k, g in e_grads.items() if g is not None]
    worst = 0.0
    for kind, a, b in pairs:
        if b is None:
            return [f"{kind}: missing in the compiled run"], worst
        a64, b64 = a.double(), b.double().to(a.device)
        rtol, atol = MODEL_TOL[kind]
        d = float((a64 - b64).abs().max()) if a.numel() else 0.0
        worst = max(worst, d)
        if not torch.allclose(a64, b64, rtol=rtol, atol=atol):
            return [f"{kind} differ (max abs {d:.3g}, rtol={rtol} atol={atol})"], worst
    return [], worst


def check_rewrite(cand: Candidate, model_name: str, mode: str, device: str = "cpu") -> Check:
    """Compile ``model_name`` (tiny) with only this candidate's pass; count > 0 and parity.

    Parity is against eager, with Inductor drawing the same dropout numbers as eager
    (``fallback_random``). That changes how dropout appears in the graph, so a pattern that holds
    a dropout mask may not fire there: then the model is compiled with Inductor's own random ops,
    and the reference is the same compile without the fusion (same seed, same random numbers).
    """
    from miner.runtime import rewrite

    t0 = time.perf_counter()
    label = f"{model_name}/tiny/{mode}"
    built = models_build(model_name, mode, device)
    eager = model_step(built, mode, device, compiled=False)
    reference_name = "eager"
    graph_pass = rewrite.FusionPass([rewrite.entry_for(cand.path / "pattern.py", cand.id, cand.pattern_module)])
    try:
        got = model_step(built, mode, device, graph_pass, fallback_random=True)
        reference = eager
        if graph_pass.total() == 0 and mode == "train":
            reference_name = "inductor without the fusion (Inductor's random ops)"
            got = model_step(built, mode, device, graph_pass, fallback_random=False)
            reference = model_step(built, mode, device, None, fallback_random=False)
    except Exception as e:  # noqa: BLE001
        return Check("rewrite", label, False, f"compile failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}",
                     matches=graph_pass.total(), seconds=time.perf_counter() - t0)
    n = graph_pass.total()
    problems, worst = _parity(reference, got)
    if n == 0:
        problems.insert(0, "the rewrite did not fire (0 matches)")
    grads = sum(g is not None for g in eager[2].values())
    detail = "; ".join(problems) or f"{n} match(es); loss/logits/{grads} grads match {reference_name}"
    if problems and reference_name != "eager":
        detail += f" (reference: {reference_name})"
    return Check("rewrite", label, not problems, detail, max_abs=worst, matches=n, seconds=time.perf_counter() - t0)


def models_build(model_name: str, mode: str, device: str):
    import miner_models as models

    return models.resolve(model_name).build("tiny", mode, device)


# --------------------------------------------------------------------------- the stage

def validate(workspace: Workspace, cid: str, device: str | None = None, model: bool = True,
             log=lambda s: None) -> Validation:
    """Run every check of one candidate; writes validation.json (nothing else).

    An upcast-matmul candidate (``kind: upcast_matmul``) runs ``miner.check.upcast.validate``'s checks
    instead, a compute-once candidate (``kind: compute_once``) ``miner.check.realize.validate``'s; the
    file has the same format.
    """
    import torch

    cand = candidates.load(workspace, cid)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if cand.meta.get("kind") == "upcast_matmul":
        from miner.check import upcast

        return _finish(cand, upcast.validate(cand, device, model, log))
    if cand.meta.get("kind") == "compute_once":
        from miner.check import realize

        return _finish(cand, realize.validate(cand, device, model, log))
    if cand.meta.get("kind") == "reduce_region":
        from miner.check import reduce

        return _finish(cand, reduce.validate(cand, device, model, log))
    v = Validation(cand.id, True, device, model)
    for label, entry, variant in numeric_cases(cand.meta, on_cpu=device == "cpu"):
        c = check_numerics(cand, label, entry, variant, device)
        log(_line(c))
        v.checks.append(c)
    if not v.checks:
        v.checks.append(Check("numerics", "observed shapes", False, "no observed shape to check"))
    if getattr(cand.kernel_module, "RNG", None) == "philox4":
        for c in stream_checks(cand, device):
            log(_line(c))
            v.checks.append(c)
    if model:
        pick = pick_model(cand.meta)
        if pick is None:
            v.checks.append(Check("rewrite", "model", False, "no model to prove the rewrite in"))
        else:
            if getattr(cand.kernel_module, "RNG", None) == "philox4":  # another stream: the masks injected
                from miner.check import masks

                c = masks.check_model(cand, *pick, device=device)
            else:
                c = check_rewrite(cand, *pick, device="cpu")
            log(_line(c))
            v.checks.append(c)
    for c in v.checks:
        c.device = c.device or (device if c.kind in ("numerics", "stream") else "cpu")
    return _finish(cand, v)


def _finish(cand: Candidate, v: Validation) -> Validation:
    """``v``'s verdict (a check that did not run fails nothing) written to the candidate's validation.json."""
    failed = [c for c in v.checks if c.ok is False]
    v.ok = not failed
    v.failure = f"{failed[0].kind} {failed[0].case}: {failed[0].detail}" if failed else None
    write_json(cand.path / "validation.json", {**v.to_json(), "sources": candidates.sources_digest(cand.path)})
    return v


def _line(c: Check) -> str:
    mark = "ok  " if c.ok else "FAIL" if c.ok is False else "skip"
    extra = f" max_abs={c.max_abs:.2e}" if c.max_abs is not None and math.isfinite(c.max_abs) else ""
    return f"  {mark} {c.kind:<8} {c.case}{extra} {c.detail} ({c.seconds:.1f}s)".rstrip()
