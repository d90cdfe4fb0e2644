"""The GEMM-epilogue rewrite: ``addmm`` + an activation chain as one ``aten._addmm_activation`` (cuBLASLt epilogue).

The rule is :mod:`miner.rules.epilogue` (the one mining applies); this module applies it to the FX graph being
compiled: :func:`decision` reads an ``addmm`` node through ``FxNodes`` (a graph the rule cannot read declines with
the error as its reason: a compile never fails here) and :func:`replace` puts ``_addmm_activation(bias, x, w,
use_gelu=...)`` right after the GEMM, a ``reshape`` to each replaced node's shape, moves their users onto it and
erases the chain. Inductor has no lowering for ``_addmm_activation`` and calls the aten op (cuBLASLt with the bias
and activation epilogue where its layout conditions hold, else addmm then the activation: the same values).

:class:`GemmEpilogues` is the pass on its own (a post-grad custom pass: every match the rule takes, counted in
``counts`` and ``declined``), for a knob or a test; a candidate's ``pattern.py`` applies the same two functions
through the pattern matcher with the in-model gate.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

aten = torch.ops.aten


def decision(node: torch.fx.Node):
    """``miner.rules.epilogue.check`` on FX ``addmm`` node ``node`` (a ``Decision``)."""
    from miner.rules import epilogue
    from miner.rules.graph import FxNodes

    try:
        return epilogue.check(FxNodes(node.graph), node.name)
    except Exception as e:  # noqa: BLE001 - see the module docstring
        return epilogue.Decision(node.name, (f"rule failed: {type(e).__name__}: {e}",))


def replace(gemm: torch.fx.Node, d) -> torch.fx.Node:
    """Rewrite ``gemm`` and its chain as decision ``d`` (ok) says; returns the ``_addmm_activation`` node."""
    graph = gemm.graph
    nodes = {n.name: n for n in graph.nodes}
    bias, x, w = gemm.args[:3]
    with graph.inserting_after(gemm):
        fused = graph.call_function(aten._addmm_activation.default, (bias, x, w), {"use_gelu": d.use_gelu})
    fused.meta.update({k: v for k, v in gemm.meta.items() if k in ("val", "tensor_meta", "stack_trace")})
    last = fused
    for name in d.replaced:
        old = nodes[name]
        with graph.inserting_after(last):
            new = graph.call_function(aten.reshape.default, (fused, list(old.meta["val"].shape)))
        new.meta["val"] = old.meta["val"]
        old.replace_all_uses_with(new)
        last = new
    for name in reversed((gemm.name,) + d.chain + tuple(r for r in d.replaced if r not in d.chain)):
        n = nodes[name]
        if not n.users:
            graph.erase_node(n)
    return fused


class GemmEpilogues(CustomGraphPass):
    """A graph pass taking every ``addmm`` + activation chain the rule accepts (no gate: a knob's pass)."""

    def __init__(self):
        self.counts: Counter = Counter()  # activation -> rewrites
        self.declined: Counter = Counter()  # reason -> addmms the rule declined (those it applies to)

    def __call__(self, graph: torch.fx.Graph) -> None:
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target is not aten.addmm.default:
                continue
            d = decision(node)
            if d.ok:
                replace(node, d)
                self.counts[d.activation] += 1
            elif d.applies:
                self.declined.update(d.reasons)

    def uuid(self) -> bytes:
        """Inductor's cache key part: this file and the rules' sources (a change to either recompiles)."""
        from miner.rules import source_files

        return hashlib.sha256(b"".join(Path(f).read_bytes() for f in (__file__, *source_files()))).digest()

    def __deepcopy__(self, memo):  # torch.compile deep-copies the inductor config: one pass, one count
        return self


__all__ = ["GemmEpilogues", "decision", "replace"]
