"""Captured graphs as ``networkx`` graphs.

``to_networkx(graph)`` gives one ``nx.DiGraph`` per captured graph. Node ids are FX node
names. Node attributes: ``op`` (the target string), ``category``, ``dtype``, ``shape``,
``stride``, ``n_users``, ``kernels`` (tuple of kernel names), ``kernel`` (the first, or None),
``module``, ``fx_op`` and ``args`` (the JSON args, for constants). Edge ``(u, v)`` carries
``pos`` (the operand position of ``u`` in ``v``'s args) and, when ``u`` feeds several
operands of ``v`` (``mul(x, x)``), ``positions`` with all of them.
"""

from __future__ import annotations

import networkx as nx

from miner.core.records import CapturedGraph


def to_networkx(graph: CapturedGraph) -> nx.DiGraph:
    g = nx.DiGraph(key=graph.key)
    for n in graph.nodes:
        m = n.meta[0] if n.meta else None
        g.add_node(
            n.name,
            op=n.target,
            fx_op=n.op,
            category=n.category,
            dtype=m.dtype if m else None,
            shape=m.shape if m else None,
            stride=m.stride if m else None,
            n_users=len(n.users),
            kernels=tuple(k.name for k in n.kernels),
            kernel=n.kernels[0].name if n.kernels else None,
            module=n.module,
            args=n.args,
        )
    for n in graph.nodes:
        for pos, src in n.inputs():
            if g.has_edge(src, n.name):
                g.edges[src, n.name]["positions"] += (pos,)
            else:
                g.add_edge(src, n.name, pos=pos, positions=(pos,))
    return g
