"""What every validator of ``miner validate`` shares: the ``Check`` and ``Validation`` records and their helpers.

A candidate kind's validator (``miner.check.validate`` for row and region kernels, ``miner.check.upcast``,
``miner.check.realize``, ``miner.check.reduce``, and ``miner.check.masks`` for a dropout mask's model
check) returns ``Check`` rows, gathered into one ``Validation`` (``validation.json``). Here, below all
of them: the records, the element-wise comparison with a float64 reference (:func:`compare`,
:func:`outputs_check`), the model to prove a rewrite in (:func:`pick_model`), one seeded model step
(:func:`model_step`), and the printed line of a check (:func:`line`).
"""

from __future__ import annotations

import copy
import datetime as _dt
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from miner import __version__
from miner.core import dtypes

MODEL_ORDER = ("gpt2", "bert", "llama", "t5")  # cheapest compile first


@dataclass
class Check:
    kind: str  # numerics | rewrite | graph (an upcast candidate's rewrite on a traced graph) | stream (a mask's tilings) | captured (matches in the source graphs, rebuilt)
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

COMPARE_CHUNK = 1 << 26  # elements per comparison step: float64 temporaries of ~0.5 GiB each at most


def compare(out, ref, expect_dtype) -> tuple[bool, float, float, str]:
    """(ok, max abs error, max rel error, detail) of one kernel output against its float64 reference
    (``miner.core.dtypes.ELEMENT_TOL`` for the output's dtype; bool outputs exactly). Computed where
    ``out`` lives, :data:`COMPARE_CHUNK` elements at a time (a [8192, 128100] vocabulary-sized output took
    ~40 s per case through the host; its float64 temporaries stay bounded on the device)."""
    import torch

    if out.dtype != expect_dtype:
        return False, math.inf, math.inf, f"dtype {out.dtype}, expected {expect_dtype}"
    if tuple(out.shape) != tuple(ref.shape):
        return False, math.inf, math.inf, f"shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    if out.dtype == torch.bool:
        bad = int((out != ref.to(out.device)).sum())
        return bad == 0, float(bad), float(bad), f"{bad} mismatching booleans" if bad else ""
    rtol, atol = dtypes.ELEMENT_TOL[dtypes.name(out.dtype)]
    o_all, r_all = out.reshape(-1), ref.to(out.device).reshape(-1)
    nan_ok, max_abs, max_rel, far = True, 0.0, 0.0, 0
    for i in range(0, o_all.numel(), COMPARE_CHUNK):
        o, r = o_all[i:i + COMPARE_CHUNK].double(), r_all[i:i + COMPARE_CHUNK].double()
        nan_ok = nan_ok and torch.equal(torch.isnan(o), torch.isnan(r))
        finite = ~torch.isnan(r)
        o, r = o[finite], r[finite]
        if not r.numel():
            continue
        diff = (o - r).abs()
        max_abs = max(max_abs, float(diff.max()))
        max_rel = max(max_rel, float((diff / r.abs().clamp_min(1e-30)).max()))
        far += int((~torch.isclose(o, r, rtol=rtol, atol=atol, equal_nan=True)).sum())
    ok = not far and nan_ok
    detail = "" if ok else (f"{far} elements outside rtol={rtol} atol={atol}" if nan_ok
                            else "NaN positions differ from the reference")
    return ok, max_abs, max_rel, detail


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


# --------------------------------------------------------------------------- a model step

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


def models_build(model_name: str, mode: str, device: str):
    import miner_models as models

    return models.resolve(model_name).build("tiny", mode, device)


def line(c: Check) -> str:
    """One printed line per check: ok / FAIL / skip, its kind, case, worst error and time."""
    mark = "ok  " if c.ok else "FAIL" if c.ok is False else "skip"
    extra = f" max_abs={c.max_abs:.2e}" if c.max_abs is not None and math.isfinite(c.max_abs) else ""
    return f"  {mark} {c.kind:<8} {c.case}{extra} {c.detail} ({c.seconds:.1f}s)".rstrip()
