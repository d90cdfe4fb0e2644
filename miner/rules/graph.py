"""The graph the rules read: ``node(name) -> NodeRecord``, at mining and at compile time alike.

Mining hands the rules a ``CapturedGraph`` (``miner scan``'s records); the rewrite hands them the
``torch.fx.Graph`` being compiled, seen through :class:`FxNodes`: each FX node converted once, on
demand, by ``miner.core.fxnode.node_record``, the function ``miner scan`` records nodes with. So
one rule reads the same records in both places.
"""

from __future__ import annotations

from typing import Protocol

from miner.core.fxnode import node_record
from miner.core.records import NodeRecord


class Graph(Protocol):
    """What a rule reads: a node's record by name (``CapturedGraph`` and :class:`FxNodes` have it)."""

    def node(self, name: str) -> NodeRecord: ...


class FxNodes:
    """A ``torch.fx.Graph`` through ``node(name) -> NodeRecord`` (each FX node converted once, on demand).

    Build one per match: the graph changes between matches.
    """

    def __init__(self, graph):
        self._fx = {n.name: n for n in graph.nodes}
        self._recs: dict[str, NodeRecord] = {}

    def node(self, name: str) -> NodeRecord:
        rec = self._recs.get(name)
        if rec is None:
            rec = self._recs[name] = node_record(self._fx[name])
        return rec
