"""``miner validate`` for a compute-once candidate (``miner.rules.recompute``, ``miner.generate.realize``).

The rewrite changes no value (it puts an identity after a value so that Inductor computes it once), so
what needs proof is that it fires where it should, leaves the results unchanged, and does what it is for.
Each family of ``miner.rules.recompute.FAMILIES`` has its chain (:data:`CHAINS`): a small value shared by
three layers, each of which reads it broadcast: the ``transcendental`` family a llama-like RoPE table
(``cos``/``sin`` of positions times inverse frequencies), the ``table`` family a t5-like relative-position
bias (bucket: ``abs``, ``log``, comparisons, ``where``; then ``embedding`` into a per-head table, added to
each layer's scores). Checks, each a ``miner.check.checks.Check``:

- ``graph`` (any machine): the chain traced on fake tensors of the validating device: the pass must put
  ``prims.inductor_force_stride_order`` after exactly the chain's values (cos and sin; the lookup, not
  the bucket's earlier steps), with every consumer moved onto it, and a second run of the pass must
  take nothing (the pass runs in both post-grad slots);
- ``rewrite`` (any machine): the same chain compiled by Inductor with and without the pass: outputs as
  accurate against float64 as Inductor's own (bitwise equal on the CPU; on CUDA an inlined value's
  products may contract into FMAs differently), and in the generated code the kernel computing the
  value (``cos``, ``embedding``) runs once instead of once per layer;
- ``rewrite`` (the model): the tiny zoo model it was found in (the one with the largest predicted
  saving), one training step compiled with only this pass against the same compile without it:
  matches > 0 and parity within the autocast tolerances (``miner.check.upcast.model_check``: bf16
  autocast, as ``miner verify`` runs it).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
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


def bias_chain():
    """``fn(x, pos)``: a t5-like relative-position bias of ``pos`` shared by :data:`LAYERS` attention
    layers (``x``: ``[B, H, S, D]``): the bucket (``abs``, ``log``, ``minimum``, ``where``), its lookup
    ``embedding(bucket, table)`` (``[S, S, H]``), permuted and added to each layer's scores
    (``[B, H, S, S]``, B >= 8: a broadcast of 8 or more)."""
    import torch

    def fn(x, pos):
        heads = x.shape[1]
        rel = pos.unsqueeze(0) - pos.unsqueeze(1)
        n = rel.abs()
        large = 4 + (torch.log(n.to(x.dtype).clamp(min=1) / 4) / math.log(4) * 4).to(torch.int64)
        large = torch.minimum(large, torch.full_like(large, 7))
        bucket = torch.where(n < 4, n, large) + (rel > 0).to(torch.int64) * 8
        table = torch.linspace(-1.0, 1.0, 16 * heads, device=x.device, dtype=x.dtype).reshape(16, heads)
        bias = torch.nn.functional.embedding(bucket, table).permute(2, 0, 1).unsqueeze(0)
        for k in range(LAYERS):
            x = ((x @ x.transpose(-1, -2)) * (0.1 * (k + 1)) + bias).softmax(-1) @ x
        return x

    return fn


@dataclass(frozen=True)
class Chain:
    """A family's validation chain: ``make() -> fn(x, pos)``, ``x``'s shape, the values the pass must take,
    the op name the kernels computing them carry."""

    make: Callable
    shape: tuple[int, ...]
    values: tuple[str, ...]
    kernel_op: str
    label: str


CHAINS = {
    "transcendental": Chain(rope_chain, (2, 4, 32, 16), ("aten.cos.default", "aten.sin.default"), "cos",
                            f"RoPE table shared by {LAYERS} layers"),
    "table": Chain(bias_chain, (8, 4, 32, 16), ("aten.embedding.default",), "embedding",
                   f"relative-position bias shared by {LAYERS} layers"),
}


def chain_of(module) -> Chain:
    """The chain of the family ``module`` (a compute-once ``pattern.py``) belongs to."""
    from miner.rules.recompute import family

    targets = [p[0] for p in getattr(module, "PATTERNS", ())] or list(getattr(module, "TARGETS", ()))
    return CHAINS["table" if any(family(t) == "table" for t in targets) else "transcendental"]


def _pass(module, name: str, gate: str = "on"):
    from miner.runtime import rewrite

    return rewrite.FusionPass([rewrite.entry_for(module.__file__, name, module)], gate=gate)


def check_graph(module, name: str, device: str, *, gate_open: bool = False) -> Check:
    """The pass on the family's traced chain (:func:`chain_of`): its values computed once, all consumers
    moved, a second run takes nothing (``gate_open``: a promoted fusion's in-model gate held open)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from miner.rules.recompute import FORCE

    t0 = time.perf_counter()
    chain = chain_of(module)
    label = f"{chain.label} (fake {device} tensors)"
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(*chain.shape, device=device)
        pos = torch.empty(chain.shape[2], dtype=torch.int64, device=device)
    gm = make_fx(chain.make(), tracing_mode="fake")(x, pos)
    gate = "open" if gate_open else "on"
    p = _pass(module, name, gate)
    p(gm.graph)
    again = _pass(module, name, gate)
    again(gm.graph)
    problems = []
    forced = [n for n in gm.graph.nodes if str(n.target) == FORCE]
    sources = sorted(str(n.args[0].target) for n in forced)
    want = sorted(chain.values)
    if p.counts[name] != len(want) or sources != want:
        problems.append(f"{p.counts[name]} matches on {sources or 'nothing'}, expected {', '.join(want)}")
    for n in forced:
        if list(n.args[0].users) != [n] or not n.users:
            problems.append(f"{n.args[0].name}: {len(n.users)} consumers on the computed-once value, "
                            f"{len(n.args[0].users) - 1} still on the original")
    if again.counts[name]:
        problems.append(f"a second run of the pass matched {again.counts[name]} more")
    ops = " and ".join(v.split(".")[1] for v in want)
    detail = "; ".join(problems) or (f"{ops} computed once, {sum(len(n.users) for n in forced)} consumers "
                                     f"moved onto them; a second run takes nothing")
    return Check("graph", label, not problems, detail, matches=p.counts[name], seconds=time.perf_counter() - t0,
                 device=device)


def check_compiled(module, name: str, device: str) -> Check:
    """Inductor with and without the pass on the family's chain: equal outputs; the kernel computing the
    value (``cos``, ``embedding``) runs once, not per layer."""
    import torch
    from torch._inductor.utils import run_and_get_code

    from miner.runtime import rewrite

    t0 = time.perf_counter()
    chain = chain_of(module)
    label = f"{chain.label}, compiled by Inductor ({device})"
    fn = chain.make()
    g = torch.Generator().manual_seed(1)
    x, pos = torch.randn(*chain.shape, generator=g).to(device), torch.arange(chain.shape[2], device=device)
    calls, outs, n = {}, {}, 0
    try:
        for with_pass in (False, True):
            torch._dynamo.reset()
            p = _pass(module, name) if with_pass else None
            opts = rewrite.inductor_options(p) if p is not None else None
            with torch._inductor.config.patch(force_disable_caches=True):
                outs[with_pass], code = run_and_get_code(torch.compile(fn, options=opts, dynamic=False), x, pos)
            src = "\n".join(code)
            kernels = {k for k in re.findall(r"^(\w+) = async_compile", src, re.M) if chain.kernel_op in k}
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
        problems.append(f"the kernel computing {chain.kernel_op} runs {calls[True]}x with the pass, "
                        f"{calls[False]}x without")
    same = "outputs bitwise equal" if diff == 0 else f"outputs differ by {diff:.1e}"
    detail = "; ".join(problems) or (f"{n} matches; the kernel computing {chain.kernel_op} runs {calls[True]}x instead of "
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
        pick = _best_model(cand.meta)
        c = (Check("rewrite", "model", False, "no model to prove the rewrite in", device=device) if pick is None
             else check_model(cand.pattern_module, cand.id, *pick, device=device))
        log(line(c))
        v.checks.append(c)
    v.model = model and any(c.kind == "rewrite" and "/tiny/" in c.case and c.ok is not None for c in v.checks)
    return v


def _best_model(meta: dict) -> tuple[str, str] | None:
    """(model, mode) to prove the rewrite in: the model with the largest predicted saving (``predicted_us``
    of ``observed``), else ``pick_model``'s cheapest."""
    saved: dict[str, float] = {}
    for o in meta.get("observed", ()):
        saved[o["model"]] = saved.get(o["model"], 0.0) + o.get("predicted_us", 0.0)
    if not saved or not any(saved.values()):
        return pick_model(meta)
    return max(saved, key=lambda m: (saved[m], m)), "train"


def fusion_test_cases(workspace, name: str, meta: dict) -> list[tuple[str, str, dict]]:
    """The rows of a compute-once fusion's test table (``miner_testing.compute_once``): ``(test, case id,
    arguments)``: the RoPE chain traced and compiled on the CPU, the zoo model it was found in."""
    zoo = _best_model(meta)
    chain = {"device": "cpu"}
    return ([("test_computes_the_shared_tables_once_in_the_traced_chain", "rope_chain", chain),
             ("test_compiled_chain_is_unchanged_and_runs_the_table_kernel_once", "rope_chain", chain)]
            + ([("test_fires_in_its_zoo_model", "/".join(zoo), {"model": zoo[0], "mode": zoo[1]})] if zoo else []))


__all__ = ["CHAINS", "Chain", "LAYERS", "bias_chain", "chain_of", "check_compiled", "check_graph", "check_model",
           "fusion_test_cases", "rope_chain", "validate"]
