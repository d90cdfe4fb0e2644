"""Occurrences of mined patterns and what is reported about them (``miner.mine.mine``'s last stage).

Per reported pattern: greedy non-overlapping occurrences (:func:`_non_overlapping`), each one's
:class:`~miner.core.pattern.Occurrence` with its safety verdict (:func:`build_occurrence`), Inductor's
view of them from the kernel map (:func:`inductor_view`), whether they are whole fusable regions
(:func:`_bounded`), the stored sample (:func:`_sample`) and the rank (:func:`_score`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Sequence

from miner.core.pattern import InductorView, Occurrence, Pattern
from miner.core.records import KernelRef
from miner.rules import safety

if TYPE_CHECKING:
    from miner.mine.mine import GraphIndex


def _non_overlapping(embs: list) -> list[int]:
    """Greedy maximal set of node-disjoint embeddings (graph order, then node order)."""
    order = sorted(range(len(embs)), key=lambda i: (embs[i][0], sorted(embs[i][1])))
    used: dict[int, set] = defaultdict(set)
    keep = []
    for i in order:
        gi, nodes = embs[i][0], embs[i][1]
        if used[gi].isdisjoint(nodes):
            used[gi].update(nodes)
            keep.append(i)
    return keep


def build_occurrence(G: GraphIndex, nodes: Sequence[int], inputs: Sequence[int],
                     slots: Sequence[tuple[int, int]], sinks: Sequence[int], *, max_extra_outputs: int) -> Occurrence:
    """The :class:`Occurrence` of one embedding: names, scalars, metas, verdict, kernels."""
    g = G.graph
    recs = g.nodes
    names = tuple(G.names[v] for v in nodes)
    occ = Occurrence(graph=g.key, nodes=names, inputs=tuple(G.names[u] for u in inputs),
                     scalars=tuple(G.consts[nodes[j]][c] for j, c in slots), outputs=tuple(sinks),
                     phase=g.key.phase)
    verdict = safety.check(occ, g, max_extra_outputs=max_extra_outputs)
    outputs = tuple(sorted(set(sinks) | set(verdict.extra_outputs)))
    node_kernels = tuple(tuple(k.name for k in recs[v].kernels) for v in nodes)
    kernels: dict[str, KernelRef] = {}
    for v in nodes:
        for k in recs[v].kernels:
            kernels.setdefault(k.name, k)
    return Occurrence(
        graph=g.key, nodes=names, inputs=occ.inputs, scalars=occ.scalars, outputs=outputs,
        input_meta=tuple(recs[u].meta[0] if recs[u].meta else None for u in inputs),
        output_meta=tuple(recs[nodes[j]].meta[0] if recs[nodes[j]].meta else None for j in outputs),
        phase=g.key.phase, verdict=verdict, node_kernels=node_kernels, kernels=tuple(kernels.values()))


def _compute_producers(nodes_p) -> list[list[int]]:
    """For each pattern node, its compute producers inside the pattern, looking through views."""
    out: list[list[int]] = []
    for j, n in enumerate(nodes_p):
        prods = []
        stack = [idx for kind, idx in n.refs() if kind == "node"]
        while stack:
            i = stack.pop()
            if nodes_p[i].is_compute:
                prods.append(i)
            else:
                stack.extend(idx for kind, idx in nodes_p[i].refs() if kind == "node")
        out.append(sorted(set(prods)))
    return out


def inductor_view(nodes_p, occs: Sequence[Occurrence]) -> InductorView:
    """Aggregate Inductor's kernels over occurrences (see :class:`InductorView`)."""
    hist: Counter = Counter()
    splits: Counter = Counter()
    one = recomputed = 0
    prods = _compute_producers(nodes_p)
    mapped = 0
    for o in occs:
        whole = o.in_one_kernel
        if whole is None:
            continue
        mapped += 1
        hist[str(o.n_kernels)] += 1
        one += whole
        recomputed += bool(o.recomputed)
        if not whole:
            for j, ps in enumerate(prods):
                for i in ps:
                    ki, kj = set(o.node_kernels[i]), set(o.node_kernels[j])
                    if ki and kj and ki.isdisjoint(kj):
                        splits[f"n{i}:{nodes_p[i].short} -> n{j}:{nodes_p[j].short}"] += 1
    return InductorView(kernels_hist=dict(sorted(hist.items(), key=lambda kv: int(kv[0]))), one_kernel=one,
                        missed_fusion=mapped > 0 and (mapped - one) * 2 > mapped, splits=dict(splits.most_common()),
                        recomputed=recomputed)


def _sample(occs: list[Occurrence], cap: int) -> tuple[Occurrence, ...]:
    """Up to ``cap`` occurrences spread over graphs, safe ones first (generation takes its
    shapes from stored safe occurrences), plus one example of each rejection reason."""
    by_graph: dict[str, list[Occurrence]] = defaultdict(list)
    for o in sorted(occs, key=lambda o: not o.verdict.ok):  # stable: graph order kept
        by_graph[str(o.graph)].append(o)
    picked: list[Occurrence] = []
    queues = list(by_graph.values())
    while len(picked) < cap and any(queues):
        for q in queues:
            if q and len(picked) < cap:
                picked.append(q.pop(0))
    reasons_shown = {r for o in picked for r in o.verdict.reasons}
    for o in occs:
        new = set(o.verdict.reasons) - reasons_shown
        if new and o not in picked:
            picked.append(o)
            reasons_shown |= new
    return tuple(picked)


def _bounded(G: GraphIndex, nodes: Sequence[int], inputs: Sequence[int]) -> bool:
    """A whole fusable region: no input made, and no value read, by a fusable node outside it."""
    inside = set(nodes)
    kind = G.kind

    # Looking through views: a view between the block and a matmul does not make it a window.
    def made_outside(u: int, depth: int = 3) -> bool:
        if kind[u] != "view" or depth == 0:
            return kind[u] is None
        return all(made_outside(x, depth - 1) for x in G.operands[u])

    def read_outside(w: int, depth: int = 3) -> bool:
        if kind[w] != "view" or depth == 0:
            return kind[w] is None
        return all(read_outside(x, depth - 1) for x in G.users[w])

    return all(made_outside(u) for u in inputs) and \
        all(read_outside(w) for v in nodes for w in G.users[v] if w not in inside)


def _score(p: Pattern) -> tuple:
    # Rank: natural blocks first (most occurrences a whole fusable region, like a GELU between
    # two matmuls, not a window cut out of a larger region), then by the traffic a fusion could
    # save (safe occurrences x (compute nodes - 1) intermediate tensors), then patterns shared
    # by more models, missed fusions first on ties.
    block = p.counts.bounded * 2 >= p.counts.non_overlapping > 0
    return (not block, -(p.counts.safe * (p.n_compute - 1)), -p.support.n_models, not p.inductor.missed_fusion,
            -p.support.n_graphs, p.id)


