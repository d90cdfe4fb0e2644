"""``miner validate`` for an upcast-matmul candidate (``miner.rules.upcast``), and the checks its fusion's tests run.

An upcast candidate has no generated kernel: its rewrite turns a float32 ``bmm``/``mm`` of exact
bf16/fp16 upcasts into ``aten.bmm.dtype`` / ``aten.mm.dtype`` on the low-precision sources. Its
checks, each a ``miner.check.checks.Check`` with the device it ran on (``device``); a check that
cannot run where it is asked to has ``ok=None`` and says why (never an ``ok`` it did not earn):

- ``numerics`` (CUDA only: the ``.dtype`` overload has no CPU kernel): ``kernel.launch`` (the
  ``.dtype`` GEMM) on every observed (shape, layout, dtype), plus the first shape in fp16 and as a
  2-d ``mm``, against the float64 product of the same bf16/fp16 values. It passes within the float32
  element tolerance (``miner.core.dtypes.ELEMENT_TOL``) or, where the float32 GEMM it replaces is
  itself further off, when its max abs error is at most ``SLACK`` times that GEMM's (both reported).
- ``graph`` (any machine): t5's attention chain under SDPA's math path, rebuilt at the observed
  shapes (QK^T of upcasts as mined, then PV after a dropout's 1/0.9 scale) and traced on fake CUDA
  tensors (:func:`attention_chain`): the candidate's pass must rewrite the QK^T bmm into the
  ``.dtype`` overload on bf16/fp16 operands and decline the PV bmm with the rule's reason
  (:func:`check_graph`); then the rewritten graph, run on the CPU with the ``.dtype`` GEMM emulated as
  the float32 GEMM of the upcasts, must equal the original chain (:func:`check_emulated`, shapes
  shrunk to a few elements).
- ``rewrite`` (CUDA only): the tiny zoo model the candidate was found in (t5), compiled for CUDA under
  bf16 autocast with only this candidate's pass: it must match (count > 0) and one training step
  (loss, logits, gradients) must agree with the same compile without it within
  ``miner.core.dtypes.AUTOCAST_MODEL_TOL`` (:func:`check_model`). On a CPU it is recorded as not
  proven: the rule declines every CPU matmul ("out_dtype matmul needs CUDA").
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

from miner.check.checks import Check, Validation, compare, line, model_step, models_build, pick_model

SLACK = 2.0  # the rewritten GEMM may be off float64 by at most this many times the float32 GEMM it replaces
DROPOUT_SCALE = 1 / 0.9  # PV in t5's chain: probabilities times 1/(1-p), p = 0.1 (no exact upcast: declined)
SHRUNK = {"batch": 1, "heads": 2, "seq": 6, "dim": 4}  # the emulated CPU run's sizes (at most)
CUDA_ONLY = "aten.bmm.dtype / aten.mm.dtype have no CPU kernel"


# --------------------------------------------------------------------------- numerics (CUDA)

def numeric_entries(meta: dict) -> list[tuple[str, dict]]:
    """(label, entry) per observed shape, then the first one in fp16 and as a 2-d ``mm`` (the rule takes both)."""
    out = []
    for o in meta.get("observed", ()):
        shapes = "x".join(str(i["shape"]).replace(" ", "") for i in o["inputs"])
        low = next((i["dtype"] for i in o["inputs"] if i["dtype"] != "float32"), "float32")
        out.append((f"{o['model']} {o['phase']} {shapes} {low}", {"inputs": o["inputs"]}))
    if out:
        first = meta["observed"][0]["inputs"]
        demoted = any(i["dtype"] == "float32" for o in meta["observed"] for i in o["inputs"])
        if not demoted:  # the demoting rule takes bf16 only (rounding to fp16 could overflow)
            out.append((f"{out[0][0].rsplit(' ', 1)[0]} float16", {"inputs": [dict(i, dtype="float16") for i in first]}))
        if len(first[0]["shape"]) == 3:
            mm = [{"shape": i["shape"][1:], "dtype": i["dtype"], "stride": i["stride"][1:]} for i in first]
            out.append((f"mm {'x'.join(str(i['shape']).replace(' ', '') for i in mm)} {out[0][0].rsplit(' ', 1)[1]}",
                        {"inputs": mm}))
    return out


def check_numerics(kernel, label: str, entry: dict, device: str) -> Check:
    """The ``.dtype`` GEMM (``kernel.launch``) against float64 on ``entry``'s inputs; ``ok=None`` off CUDA."""
    import torch

    from miner.core.tensors import make_inputs

    if device != "cuda":
        return Check("numerics", label, None, f"not run on {device}: {CUDA_ONLY} (run on a CUDA machine)",
                     device=device)
    t0 = time.perf_counter()
    try:
        xs = make_inputs(entry["inputs"], device=device, seed=0)
        (out,) = kernel.launch(*xs)
        (fp32,) = kernel.reference(*xs)
        ref = (torch.bmm if xs[0].dim() == 3 else torch.mm)(xs[0].double(), xs[1].double())
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - any failure of the GEMM is a failed check
        return Check("numerics", label, False, f"{type(e).__name__}: {str(e).splitlines()[0][:300]}",
                     seconds=time.perf_counter() - t0, device=device)
    low = [x.dtype for x in xs if x.dtype != torch.float32]
    if len(low) == 1:  # the demoting rule: one float32 operand rounded, the output seen rounded to ``low``
        ok, max_abs, max_rel, detail = compare_demoted(out, fp32, ref, low[0])
    else:
        ok, max_abs, max_rel, detail = compare_gemm(out, fp32, ref)
    return Check("numerics", label, ok, detail, max_abs, max_rel, seconds=time.perf_counter() - t0, device=device)


def compare_gemm(out, fp32, ref) -> tuple[bool, float, float, str]:
    """(ok, max abs, max rel, detail) of the rewritten GEMM's ``out`` against the float64 ``ref``: within the
    float32 element tolerance, or off by at most ``SLACK`` times the replaced float32 GEMM's (``fp32``) max abs error."""
    import torch

    ok, max_abs, max_rel, detail = compare(out, ref, torch.float32)
    fp32_abs = float((fp32.double() - ref.double()).abs().max()) if fp32.numel() else 0.0
    if not ok and math.isfinite(max_abs) and out.shape == ref.shape and max_abs <= SLACK * fp32_abs:
        ok, detail = True, f"outside the float32 element tolerance, within {SLACK:g}x the replaced GEMM's error"
    return ok, max_abs, max_rel, "; ".join(d for d in (detail, f"float32 GEMM it replaces: max abs {fp32_abs:.2e}") if d)


def compare_demoted(out, fp32, ref, low) -> tuple[bool, float, float, str]:
    """(ok, max abs, max rel, detail) of a demoted GEMM's ``out`` once rounded to ``low`` (what its
    users see) against the float64 ``ref``: within ``low``'s element tolerance, or off by at most
    ``SLACK`` times the replaced float32 GEMM's output rounded to ``low`` (both reported)."""
    ok, max_abs, max_rel, detail = compare(out.to(low), ref, low)
    before = float((fp32.to(low).double() - ref.double()).abs().max()) if fp32.numel() else 0.0
    ratio = max_abs / before if before else math.inf
    if not ok and math.isfinite(max_abs) and out.shape == ref.shape and max_abs <= SLACK * before:
        ok, detail = True, f"outside the {low} element tolerance, within {SLACK:g}x the replaced GEMM's error"
    return ok, max_abs, max_rel, "; ".join(d for d in (
        detail, f"rounded to {str(low).split('.')[-1]}: max abs {max_abs:.2e} vs the float32 GEMM's {before:.2e} "
                f"({ratio:.2f}x)") if d)


# --------------------------------------------------------------------------- the chain on fake CUDA tensors

def attention_chain(entry: dict) -> tuple[Callable, list[tuple[list[int], Any]]] | None:
    """t5's attention under SDPA's math path at ``entry``'s shapes, or None when they are no such chain.

    ``entry`` is an observed entry of ``candidate.json`` (``sources``: the bf16/fp16 ``[B, H, S, D]``
    q and k; ``float32_inputs``: the bmm's ``[B*H, S, D]`` and ``[B*H, D, S]`` operands). Returns
    ``(fn, specs)``: ``fn(q, k, v) -> (pv, qk_operand)`` upcasts q and k (k times exactly 1.0), lays
    them out as the bmm reads them (transpose, expand, clone, reshape), runs QK^T (the mined bmm),
    softmax, a dropout's scale and PV (the bmm that must decline); ``specs`` are ``(shape, dtype)``
    of q, k, v.
    """
    import torch

    aten = torch.ops.aten
    try:
        srcs, (a32, b32) = entry["sources"], [i["shape"] for i in entry["float32_inputs"]]
        demoted = [s.get("demote") for s in srcs]
        exact = [s for s in srcs if not s.get("demote")]
        qs = exact[0]["shape"]
        dtype = getattr(torch, exact[0]["dtype"])
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return None
    if len(qs) != 4 or len(a32) != 3 or len(b32) != 3:
        return None
    bh, s_, d_ = qs[0] * qs[1], qs[2], qs[3]
    if demoted == [None, None]:  # QK^T: [B*H, S, D] x [B*H, D, S], k's source as q's
        if srcs[1]["shape"] != qs or a32 != [bh, s_, d_] or b32 != [bh, d_, s_]:
            return None
    elif demoted[0] and not demoted[1]:  # PV: [B*H, S, S] (rounded) x [B*H, S, D] (v's source)
        if a32 != [bh, s_, s_] or b32 != [bh, s_, d_]:
            return None
    else:
        return None

    def operand(x, shape, unit: bool):
        xf = x.float()
        if unit:
            xf = aten.mul.Tensor(xf, 1.0)
        if list(xf.shape[-2:]) != list(shape[-2:]):
            xf = xf.transpose(-1, -2)
        return xf.expand(xf.shape).clone(memory_format=torch.contiguous_format).reshape(shape)

    def fn(q, k, v):
        a = operand(q, [q.shape[0] * q.shape[1], q.shape[2], q.shape[3]], False)
        b = operand(k, [k.shape[0] * k.shape[1], k.shape[3], k.shape[2]], True)
        probs = aten.mul.Tensor(torch.softmax(aten.bmm.default(a, b), -1), DROPOUT_SCALE)
        pv = aten.bmm.default(probs, v.float().reshape(-1, v.shape[2], v.shape[3]))
        return pv.to(q.dtype), a  # SDPA's math path rounds its output to the inputs' dtype; ``a`` saved for backward

    return fn, [(list(qs), dtype)] * 3


def _qkv(entry: dict) -> dict:
    """The ``[B, H, S, D]`` bf16/fp16 source of ``entry`` (q for QK^T, v for PV)."""
    return next(s for s in entry["sources"] if not s.get("demote"))


def shrunk(entry: dict) -> dict:
    """``entry`` with ``[B, H, S, D]`` cut to at most :data:`SHRUNK`'s sizes (same layout): for CPU runs."""
    b, h, s, d = _qkv(entry)["shape"]
    b, h, s, d = (min(b, SHRUNK["batch"]), min(h, SHRUNK["heads"]), min(s, SHRUNK["seq"]), min(d, SHRUNK["dim"]))
    if entry["sources"][0].get("demote"):  # PV: the rounded probabilities [B*H, S, S], v's source
        src = [dict(entry["sources"][0], shape=[b * h, s, s]), dict(entry["sources"][1], shape=[b, h, s, d])]
        return dict(entry, sources=src, float32_inputs=[{"shape": [b * h, s, s]}, {"shape": [b * h, s, d]}])
    src = [dict(x, shape=[b, h, s, d]) for x in entry["sources"]]
    return dict(entry, sources=src, float32_inputs=[{"shape": [b * h, s, d]}, {"shape": [b * h, d, s]}])


def trace(fn: Callable, specs, device: str = "cuda"):
    """``fn`` traced by ``make_fx`` on fake tensors of ``specs`` (``(shape, dtype)`` each) on ``device``."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    with FakeTensorMode():
        args = [torch.empty(s, dtype=d, device=device) for s, d in specs]
    return make_fx(fn, tracing_mode="fake")(*args)


def _pass(module, name: str, gate: str = "on"):
    from miner.runtime import rewrite

    return rewrite.FusionPass([rewrite.entry_for(module.__file__, name, module)], gate=gate)


def rewrite_chain(module, name: str, entry: dict, *, gate_open: bool = False):
    """The chain of ``entry`` traced on fake CUDA tensors and rewritten by ``module``'s pass.

    Returns ``(gm, pass, fn, specs)``, or None when ``entry`` is no attention chain. ``gate_open``
    holds a promoted fusion's in-model gate open (the pass's ``gate="open"``).
    """
    built = attention_chain(entry)
    if built is None:
        return None
    fn, specs = built
    gm = trace(fn, specs)
    p = _pass(module, name, gate="open" if gate_open else "on")
    p(gm.graph)
    gm.recompile()
    return gm, p, fn, specs


def _label(entry: dict) -> str:
    qkv = _qkv(entry)
    return f"{entry.get('model', '?')} attention chain q/k/v {qkv['dtype']}{qkv['shape']}"


def _not_a_chain(label: str) -> Check:
    return Check("graph", label, None, "not run: the observed shapes are no [B,H,S,D] attention chain", device="cpu")


def check_graph(module, name: str, entry: dict, *, gate_open: bool = False) -> Check:
    """The pass on the chain at ``entry``'s shapes (fake CUDA tensors). The exact rule: QK^T becomes
    ``.dtype`` on low-precision operands, PV declines with "... is not exact". The demoting rule
    (``module.LABEL == "demote_matmul"``): PV becomes ``.dtype`` on its rounded probabilities and v's
    source, QK^T (two exact upcasts) is not its candidate."""
    import torch

    t0 = time.perf_counter()
    label = _label(entry) + " (fake CUDA tensors)"
    done = rewrite_chain(module, name, entry, gate_open=gate_open)
    if done is None:
        return _not_a_chain(label)
    gm, p, _, _ = done
    demote = getattr(module, "LABEL", "") == "demote_matmul"
    which = "PV" if demote else "QK^T"
    problems = []
    if p.counts[name] != 1:
        problems.append(f"{p.counts[name]} matches, expected 1 ({which})")
    declined = p.declined.get(name, {})
    if demote and declined:
        problems.append(f"declined {dict(declined)}: QK^T is no candidate of the demoting rule, PV must fire")
    if not demote and not any("is not exact" in r for r in declined):
        problems.append(f"PV not declined for its dropout scale (declined: {dict(declined) or 'none'})")
    new = [n for n in gm.graph.nodes if n.target in (torch.ops.aten.bmm.dtype, torch.ops.aten.mm.dtype)]
    low = (torch.bfloat16, torch.float16)
    if len(new) != 1 or any(a.meta["val"].dtype not in low for a in new[0].args[:2]) \
            or new[0].meta["val"].dtype != torch.float32:
        problems.append(f"expected one .dtype GEMM on bf16/fp16 operands with a float32 output, got {len(new)}")
    detail = "; ".join(problems) or (f"{which} -> {new[0].target} on {new[0].args[0].meta['val'].dtype} operands; "
                                     + (f"PV declined: {'; '.join(declined)}" if not demote else
                                        f"operand 0 rounded by {new[0].args[0].target}"))
    return Check("graph", label, not problems, detail, matches=p.counts[name], seconds=time.perf_counter() - t0,
                 device="cpu (fake cuda tensors)")


def emulated_run(gm, args):
    """Run ``gm`` on CPU tensors with ``aten.bmm.dtype`` / ``aten.mm.dtype`` as the float32 GEMM of the upcasts."""
    import torch

    aten = torch.ops.aten

    class Emulate(torch.fx.Interpreter):
        def call_function(self, target, a, kw):
            if target in (aten.bmm.dtype, aten.mm.dtype):
                op = aten.bmm.default if target is aten.bmm.dtype else aten.mm.default
                return op(a[0].to(a[2]), a[1].to(a[2]))
            return super().call_function(target, a, kw)

    return Emulate(gm).run(*args)


def check_emulated(module, name: str, entry: dict, *, gate_open: bool = False) -> Check:
    """The rewritten chain (shapes shrunk) run on the CPU, the GEMM emulated, against the original chain."""
    import torch

    t0 = time.perf_counter()
    small = shrunk(entry) if attention_chain(entry) is not None else entry
    label = _label(small) + " rewritten, run on CPU with the GEMM emulated"
    done = rewrite_chain(module, name, small, gate_open=gate_open)
    if done is None:
        return _not_a_chain(label)
    gm, p, fn, specs = done
    if not p.counts[name]:
        return Check("graph", label, False, "the rewrite did not fire", matches=0, device="cpu",
                     seconds=time.perf_counter() - t0)
    gen = torch.Generator().manual_seed(0)
    args = [torch.randn(s, generator=gen).to(d) for s, d in specs]
    worst, worst_rel, bad = 0.0, 0.0, ""
    for i, (w, g) in enumerate(zip(fn(*args), emulated_run(gm, args))):
        ok, a, rel, detail = compare(g, w.double(), w.dtype)
        worst, worst_rel = max(worst, a), max(worst_rel, rel)
        bad = bad or ("" if ok else f"output {i}: {detail}")
    return Check("graph", label, not bad, bad or "equals the original chain", worst, worst_rel, p.counts[name],
                 time.perf_counter() - t0, device="cpu")


# --------------------------------------------------------------------------- in a compiled model (CUDA)

def check_model(module, name: str, model: str, mode: str, device: str, *, gate_open: bool = False) -> Check:
    """The pass inside ``torch.compile`` of the tiny zoo ``model`` on CUDA: matches > 0 and one step's
    parity with the same compile without it (``AUTOCAST_MODEL_TOL``); ``ok=None`` off CUDA."""
    label = f"{model}/tiny/{mode} ({device})"
    if device != "cuda":
        return Check("rewrite", label, None,
                     f"not proven on {device}: the rule declines every CPU matmul ('out_dtype matmul needs CUDA'); "
                     f"run `miner validate {getattr(module, 'PATTERN_ID', name)} --device cuda` on a CUDA machine",
                     device=device)
    return model_check(module, name, model, mode, device, gate_open=gate_open)


def model_check(module, name: str, model: str, mode: str, device: str, *, gate_open: bool = False) -> Check:
    """``module``'s pass alone inside ``torch.compile`` of the tiny zoo ``model`` on ``device``: matches > 0
    and one step's parity (loss, logits, gradients) with the same compile without it (``make_parity``)."""
    from miner.check.verify import make_parity

    label = f"{model}/tiny/{mode} ({device})"
    t0 = time.perf_counter()
    p = _pass(module, name)
    try:
        built = models_build(model, mode, device)
        got = model_step(built, mode, device, p, autocast=True, gate_open=gate_open)
        ref = model_step(built, mode, device, None, autocast=True)
    except Exception as e:  # noqa: BLE001
        return Check("rewrite", label, False, f"compile failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}",
                     matches=p.counts[name], seconds=time.perf_counter() - t0, device=device)
    par = make_parity(ref[0], got[0], ref[1], got[1], ref[2], got[2])
    n = p.counts[name]
    rels = ", ".join(f"{k} {v:.2e}" for k, v in (("loss", par.loss_rel), ("logits", par.logits_rel),
                                                 ("grads", par.grads_rel)) if v is not None)
    problems = ([] if n else ["the rewrite did not fire (0 matches)"]) + (
        [] if par.ok else [f"step differs from the compile without it beyond AUTOCAST_MODEL_TOL ({rels})"])
    declined = sum(p.declined.get(name, {}).values())
    detail = "; ".join(problems) or (f"{n} match(es), {declined} declined; one bf16-autocast step vs the same "
                                     f"compile without it: relative {rels}")
    worst = max((v for v in (par.loss_rel, par.logits_rel, par.grads_rel) if v is not None), default=None)
    return Check("rewrite", label, not problems, detail, max_rel=worst, matches=n,
                 seconds=time.perf_counter() - t0, device=device)


# --------------------------------------------------------------------------- the stage

def validate(cand, device: str, model: bool = True, log: Callable[[str], None] = lambda s: None) -> Validation:
    """Every check of upcast candidate ``cand`` on ``device`` (``cuda`` or ``cpu``); ``validation.json`` is
    written by the caller (``miner.check.validate.validate``)."""
    v = Validation(cand.id, True, device, model)
    checks: list[Check] = []

    def add(c: Check) -> None:
        log(line(c))
        checks.append(c)

    for label, entry in numeric_entries(cand.meta):
        add(check_numerics(cand.kernel_module, label, entry, device))
    for entry in cand.meta.get("observed", ())[:1]:  # the chain's checks do not depend on which shape
        add(check_graph(cand.pattern_module, cand.id, entry))
        add(check_emulated(cand.pattern_module, cand.id, entry))
    if not checks:
        add(Check("numerics", "observed shapes", False, "no observed shape to check", device=device))
    if model:
        pick = pick_model(cand.meta)
        add(Check("rewrite", "model", False, "no model to prove the rewrite in", device=device)
            if pick is None else check_model(cand.pattern_module, cand.id, *pick, device=device))
    v.checks = checks
    v.model = model and any(c.kind == "rewrite" and c.ok is not None for c in checks)
    return v


def fusion_test_cases(workspace, name: str, meta: dict) -> list[tuple[str, str, dict]]:
    """The rows of an upcast fusion's test table (``miner_testing.upcast``): ``(test, case id, arguments)``.

    The chain's checks at each observed entry (the emulated run at the first), the GEMM at
    :func:`numeric_entries`, the zoo model it was found in.
    """
    keep = ("model", "preset", "phase", "target", "inputs", "float32_inputs", "sources")
    observed = [{k: o[k] for k in keep if k in o} for o in meta["observed"]]
    ids = [f"{o['model']}/{o['phase']}" for o in observed]
    zoo = pick_model(meta)
    return ([(test, cid, o) for test in ("test_rewrites_the_mined_chain_and_declines_pv",
                                         "test_the_gate_decides_from_its_in_model_evidence")
             for cid, o in zip(ids, observed)]
            + [("test_rewritten_chain_equals_the_original_on_cpu", cid, o) for cid, o in zip(ids[:1], observed)]
            + [("test_gemm_matches_float64", label, {"label": label, **entry})
               for label, entry in numeric_entries({"observed": observed})]
            + ([("test_fires_in_its_zoo_model", "/".join(zoo), {"model": zoo[0], "mode": zoo[1]})] if zoo else []))


__all__ = ["CUDA_ONLY", "DROPOUT_SCALE", "SHRUNK", "SLACK", "attention_chain", "check_emulated", "check_graph",
           "check_model", "check_numerics", "compare_demoted", "model_check", "compare_gemm", "emulated_run", "fusion_test_cases",
           "numeric_entries",
           "rewrite_chain", "shrunk", "trace", "validate"]
