"""One harness for the safety, adversarial and property tests: run a chain through a fusion's
rewrite and compare it with eager.

Two ways in:

- ``fx_run``: the chain traced by ``make_fx`` (fake tensors: every node has ``meta['val']``, as in
  Inductor's post-grad graphs), the fusion pass applied to that graph directly, the rewritten graph
  run on the real inputs. No Inductor codegen: a case costs well under a second, so property tests
  can afford many.
- ``compiled_run``: ``torch.compile(fn, options=fusions.inductor_options(...))``, forward and
  backward (seconds per case on a CPU).

Both return a ``Run`` (outputs, grads, the pass's ``counts`` and ``declined``), and ``check``
asserts the contract of issue 12: the fusion fired and matches eager within the output dtype's
tolerance (``miner.core.dtypes.ELEMENT_TOL``), or it declined with a reason, and nothing raised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch._inductor.config

from miner.core import dtypes
from miner.runtime import fusions

REPO = Path(__file__).resolve().parents[1]
FUSIONS = REPO / "fusions"
CANDIDATES = REPO / "candidates"


@dataclass
class Run:
    outputs: tuple
    counts: dict
    declined: dict
    grads: tuple = ()
    reasons: list = field(default_factory=list)
    lines: dict = field(default_factory=dict)  # the pass's log in words (``DecisionLog.lines``)

    def fired(self, name: str) -> int:
        return self.counts.get(name, 0)

    def all_reasons(self) -> list[str]:
        return [r for c in self.declined.values() for r in c]


def graph_pass(where: Path, name: str):
    """The FusionPass of one fusion (a fusions folder) or one candidate (``candidates/<id>``)."""
    if (where / name / "pattern.py").exists() and where.name == "candidates":
        from miner.runtime import rewrite

        return rewrite.FusionPass([rewrite.entry_for(where / name / "pattern.py", name)])
    return fusions.graph_pass(where, [name])


def _tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def clone_args(args: Sequence) -> list:
    """Fresh copies that keep each tensor's strides, storage offset and expansion."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            base = a._base if a._base is not None else a
            b = base.detach().clone()
            out.append(b.as_strided(a.shape, a.stride(), a.storage_offset()) if a._base is not None else b)
        else:
            out.append(a)
    return out


def fx_run(fn: Callable, args: Sequence, where: Path, name: str) -> Run:
    """``fn`` traced with fake tensors, ``name``'s pass applied to the graph, the graph run on ``args``."""
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(fn, tracing_mode="fake")(*clone_args(args))
    p = graph_pass(where, name)
    with p.gate_held("open"):  # on CUDA: the kernels under test, not the in-model gate (it passes CPU matches)
        p(gm.graph)
    gm.recompile()
    return Run(_tuple(gm(*clone_args(args))), dict(p.counts), {k: dict(v) for k, v in p.declined.items()},
               lines=dict(p.log.lines))


def compiled_run(fn: Callable, args: Sequence, where: Path, name: str, *, backward: bool = True,
                 dynamic: bool = False) -> Run:
    """``torch.compile(fn)`` with ``name``'s pass; with ``backward``, grads of ``sum(out * weights)``."""
    torch._dynamo.reset()
    p = graph_pass(where, name)
    args = clone_args(args)
    leaves = [a.detach().requires_grad_(True) if _wants_grad(a, backward) else a for a in args]
    compiled = torch.compile(fn, options=fusions.inductor_options(where, graph_pass_=p), dynamic=dynamic)
    with torch._inductor.config.patch(force_disable_caches=True), p.gate_held("open"):  # a cache hit would skip
        # the pass; the gate held open: on CUDA the kernels under test fire where the in-model gate would not
        outs = _tuple(compiled(*leaves))
        grads = _grads(outs, leaves) if backward else ()
    return Run(tuple(o.detach() for o in outs), dict(p.counts), {k: dict(v) for k, v in p.declined.items()}, grads,
               lines=dict(p.log.lines))


def eager_run(fn: Callable, args: Sequence, *, backward: bool = False) -> Run:
    args = clone_args(args)
    leaves = [a.detach().requires_grad_(True) if _wants_grad(a, backward) else a for a in args]
    outs = _tuple(fn(*leaves))
    grads = _grads(outs, leaves) if backward else ()
    return Run(tuple(o.detach() for o in outs), {}, {}, grads)


def _wants_grad(a, backward: bool) -> bool:
    return backward and isinstance(a, torch.Tensor) and a.is_floating_point()


def _grads(outs, leaves) -> tuple:
    floats = [o for o in outs if o.is_floating_point() and o.requires_grad]
    if not floats:
        return ()
    g = torch.Generator().manual_seed(1)
    loss = sum((o.float() * torch.rand(o.shape, generator=g).to(o.device)).sum() for o in floats)
    want = [a for a in leaves if isinstance(a, torch.Tensor) and a.requires_grad]
    return tuple(torch.autograd.grad(loss, want, allow_unused=True))


# half-precision grads go through several ops more (the backward chain), each rounded in eager
GRAD_HALF_SCALE = 8.0


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) of the output dtype (``dtypes.ELEMENT_TOL``; other dtypes exact)."""
    return dtypes.ELEMENT_TOL.get(dtypes.name(dtype), (0.0, 0.0))


def assert_close(got: Sequence, want: Sequence, what: str, *, half_scale: float = 2.0) -> None:
    """Element-wise within the output dtype's tolerance; bf16/fp16 scaled by ``half_scale`` (eager
    rounds every op in half precision, the kernel and Inductor compute in float32)."""
    assert len(got) == len(want), what
    for i, (a, b) in enumerate(zip(got, want)):
        if a is None or b is None:
            assert a is None and b is None, f"{what}[{i}]"
            continue
        assert a.shape == b.shape and a.dtype == b.dtype, f"{what}[{i}]: {a.shape} {a.dtype} vs {b.shape} {b.dtype}"
        rtol, atol = tolerance(b.dtype)
        if b.dtype in (torch.bfloat16, torch.float16):
            rtol, atol = half_scale * rtol, half_scale * atol
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{what}[{i}]: {m}")


def check(run: Run, eager: Run, name: str, *, expect: str | None = None, declined_parity: bool = True) -> str:
    """The issue-12 contract for one case: fired and equal to eager, or declined with a reason.

    ``expect``: "fire", "decline" or None (either). ``declined_parity``: also compare a declined
    case with eager (off for compiled runs: the graph is then Inductor's own, whose half-precision
    numerics on degenerate rows are not the fusion's). Returns "fired" or "declined".
    """
    if run.fired(name):
        assert expect != "decline", f"{name} fired where it should decline"
        assert_close(run.outputs, eager.outputs, f"{name} outputs")
        assert_close(run.grads, eager.grads, f"{name} grads", half_scale=GRAD_HALF_SCALE)
        return "fired"
    assert expect != "fire", f"{name} declined: {run.declined}"
    if not declined_parity:
        return "declined"
    assert_close(run.outputs, eager.outputs, f"{name} outputs (declined)")
    assert_close(run.grads, eager.grads, f"{name} grads (declined)", half_scale=GRAD_HALF_SCALE)
    return "declined"
