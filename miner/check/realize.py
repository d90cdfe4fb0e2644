"""``miner validate`` for a compute-once candidate (``miner.rules.recompute``, ``miner.generate.realize``).

The rewrite changes no value (it puts an identity after a value so that Inductor computes it once), so
what needs proof is that it fires where it should, leaves the results unchanged, and does what it is for.
Checks, each a ``miner.check.checks.Check``:

- ``graph`` (any machine): a llama-like chain, a RoPE table (``cos``/``sin`` of positions times inverse
  frequencies) shared by three layers, traced on fake tensors of the validating device: the pass must
  put ``prims.inductor_force_stride_order`` after both values, with every consumer moved onto it, and a
  second run of the pass must take nothing (the pass runs in both post-grad slots);
- ``rewrite`` (any machine): the same chain compiled by Inductor with and without the pass: outputs as
  accurate against float64 as Inductor's own (bitwise equal on the CPU; on CUDA the inlined ``cos``'s
  products may contract into FMAs differently), and in the generated code the kernel computing ``cos``
  runs once instead of once per layer;
- ``rewrite`` (the model): the tiny zoo model it was found in (llama), one training step compiled with
  only this pass against the same compile without it: matches > 0 and parity within the autocast
  tolerances (``miner.check.upcast.model_check``: bf16 autocast, as ``miner verify`` runs it).
"""

from __future__ import annotations

import re
import time
from typing import Callable

from miner.check.checks import Check, Validation, line, pick_model

LAYERS = 3
REF_SLACK = 2.0  # the rewrite's error vs float64 may be at most this times Inductor's own ...
FLOAT32_EPS = 2.0 ** -23  # ... plus one float32 rounding of the largest output


def rope_chain():
    """``fn(x, pos)``: a RoPE table of ``pos`` shared by :data:`LAYERS` layers (matmul, then rotate-half).
    Its constants are made on ``x``'s device and in its dtype inside ``fn`` (so it traces on fake CUDA
    tensors too, and runs in float64 for the reference)."""
    import torch

    def fn(x, pos):
        inv = 1.0 / (100.0 ** (torch.arange(8, device=x.device, dtype=x.dtype) / 8))
        e = torch.cat([pos.unsqueeze(1).to(x.dtype) * inv.unsqueeze(0)] * 2, -1)
        c, s = e.cos(), e.sin()
        for k in range(LAYERS):
            w = torch.linspace(-0.5, 0.5, 256, device=x.device, dtype=x.dtype).reshape(16, 16).roll(k, 0)
            q = x @ w
            x = q * c + torch.cat([-q.narrow(-1, 8, 8), q.narrow(-1, 0, 8)], -1) * s
        return x

    return fn


def _pass(module, name: str, gate: str = "on"):
    from miner.runtime import rewrite

    return rewrite.FusionPass([rewrite.entry_for(module.__file__, name, module)], gate=gate)


def check_graph(module, name: str, device: str, *, gate_open: bool = False) -> Check:
    """The pass on the traced chain: both tables computed once, all consumers moved, a second run takes
    nothing (``gate_open``: a promoted fusion's in-model gate held open)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from miner.rules.recompute import FORCE

    t0 = time.perf_counter()
    label = f"RoPE table shared by {LAYERS} layers (fake {device} tensors)"
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(2, 4, 32, 16, device=device)
        pos = torch.empty(32, dtype=torch.int64, device=device)
    gm = make_fx(rope_chain(), tracing_mode="fake")(x, pos)
    gate = "open" if gate_open else "on"
    p = _pass(module, name, gate)
    p(gm.graph)
    again = _pass(module, name, gate)
    again(gm.graph)
    problems = []
    forced = [n for n in gm.graph.nodes if str(n.target) == FORCE]
    sources = sorted(str(n.args[0].target) for n in forced)
    if p.counts[name] != 2 or sources != ["aten.cos.default", "aten.sin.default"]:
        problems.append(f"{p.counts[name]} matches on {sources or 'nothing'}, expected cos and sin")
    for n in forced:
        if list(n.args[0].users) != [n] or len(n.users) < LAYERS:
            problems.append(f"{n.args[0].name}: {len(n.users)} consumers on the computed-once value, "
                            f"{len(n.args[0].users) - 1} still on the original")
    if again.counts[name]:
        problems.append(f"a second run of the pass matched {again.counts[name]} more")
    detail = "; ".join(problems) or (f"cos and sin computed once, {sum(len(n.users) for n in forced)} consumers "
                                     f"moved onto them; a second run takes nothing")
    return Check("graph", label, not problems, detail, matches=p.counts[name], seconds=time.perf_counter() - t0,
                 device=device)


def check_compiled(module, name: str, device: str) -> Check:
    """Inductor with and without the pass on the chain: equal outputs; ``cos``'s kernel runs once, not per layer."""
    import torch
    from torch._inductor.utils import run_and_get_code

    from miner.runtime import rewrite

    t0 = time.perf_counter()
    label = f"RoPE chain compiled by Inductor ({device})"
    fn = rope_chain()
    g = torch.Generator().manual_seed(1)
    x, pos = torch.randn(2, 4, 32, 16, generator=g).to(device), torch.arange(32, device=device)
    calls, outs, n = {}, {}, 0
    try:
        for with_pass in (False, True):
            torch._dynamo.reset()
            p = _pass(module, name) if with_pass else None
            opts = rewrite.inductor_options(p) if p is not None else None
            with torch._inductor.config.patch(force_disable_caches=True):
                outs[with_pass], code = run_and_get_code(torch.compile(fn, options=opts, dynamic=False), x, pos)
            src = "\n".join(code)
            kernels = {k for k in re.findall(r"^(\w+) = async_compile", src, re.M) if "cos" in k}
            calls[with_pass] = sum(len(re.findall(rf"^\s+{k}[\.(]", src, re.M)) for k in kernels)
            n = p.counts[name] if p is not None else n
    except Exception as e:  # noqa: BLE001 - a compile failure is a failed check
        return Check("rewrite", label, False, f"{type(e).__name__}: {str(e).splitlines()[0][:300]}",
                     seconds=time.perf_counter() - t0, device=device)
    finally:
        torch._dynamo.reset()
    # the values are unchanged, but not always bitwise: inlined into its consumers, cos/sin's argument and
    # the products around it may round (FMA contraction) differently on CUDA than from a loaded buffer.
    # So both compiles are compared with float64: the rewrite must be no less accurate than Inductor alone.
    ref = fn(x.double(), pos)
    diff = float((outs[True].double() - outs[False].double()).abs().max())
    err = {w: float((outs[w].double() - ref).abs().max()) for w in (False, True)}
    bound = REF_SLACK * err[False] + FLOAT32_EPS * float(ref.abs().max())
    problems = [] if n else ["the rewrite did not fire"]
    if err[True] > bound:
        problems.append(f"max error vs float64 {err[True]:.2e} with the pass, {err[False]:.2e} without "
                        f"(bound {bound:.2e})")
    if not calls[True] < calls[False]:
        problems.append(f"the kernel computing cos runs {calls[True]}x with the pass, {calls[False]}x without")
    same = "outputs bitwise equal" if diff == 0 else f"outputs differ by {diff:.1e}"
    detail = "; ".join(problems) or (f"{n} matches; the kernel computing cos runs {calls[True]}x instead of "
                                     f"{calls[False]}x; {same}; max error vs float64 {err[True]:.2e} with the "
                                     f"pass, {err[False]:.2e} without")
    return Check("rewrite", label, not problems, detail, err[True], matches=n, seconds=time.perf_counter() - t0,
                 device=device)


def check_model(module, name: str, model: str, mode: str, device: str, *, gate_open: bool = False) -> Check:
    """The pass inside ``torch.compile`` of the tiny zoo ``model``: matches > 0 and one step's parity
    (``miner.check.upcast.model_check``: bf16 autocast as ``miner verify`` runs it); ``gate_open``: a
    promoted fusion's in-model gate held open."""
    from miner.check.upcast import model_check

    return model_check(module, name, model, mode, device, gate_open=gate_open)


def validate(cand, device: str, model: bool = True, log: Callable[[str], None] = lambda s: None) -> Validation:
    """Every check of compute-once candidate ``cand`` on ``device``; ``validation.json`` is written by the caller."""
    v = Validation(cand.id, True, device, model)
    for c in (check_graph(cand.pattern_module, cand.id, device), check_compiled(cand.pattern_module, cand.id, device)):
        log(line(c))
        v.checks.append(c)
    if model:
        pick = pick_model(cand.meta)
        c = (Check("rewrite", "model", False, "no model to prove the rewrite in", device=device) if pick is None
             else check_model(cand.pattern_module, cand.id, *pick, device=device))
        log(line(c))
        v.checks.append(c)
    v.model = model and any(c.kind == "rewrite" and "/tiny/" in c.case and c.ok is not None for c in v.checks)
    return v


def fusion_test_cases(workspace, name: str, meta: dict) -> list[tuple[str, str, dict]]:
    """The rows of a compute-once fusion's test table (``miner_testing.compute_once``): ``(test, case id,
    arguments)``: the RoPE chain traced and compiled on the CPU, the zoo model it was found in."""
    zoo = pick_model(meta)
    chain = {"device": "cpu"}
    return ([("test_computes_the_shared_tables_once_in_the_traced_chain", "rope_chain", chain),
             ("test_compiled_chain_is_unchanged_and_runs_the_table_kernel_once", "rope_chain", chain)]
            + ([("test_fires_in_its_zoo_model", "/".join(zoo), {"model": zoo[0], "mode": zoo[1]})] if zoo else []))


__all__ = ["LAYERS", "check_compiled", "check_graph", "check_model", "fusion_test_cases", "rope_chain", "validate"]
