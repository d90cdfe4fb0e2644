"""Mine frequent connected pointwise/reduction subgraphs of captured post-grad graphs.

``mine(graphs) -> MiningResult`` (see ``miner.core.pattern``). The stages:

1. **Index** each graph (:class:`GraphIndex`): which nodes are *fusable* ("compute" nodes:
   pointwise, reduction, and the ops Inductor fuses like them although torch tags them "other" or
   "random": ``cat``, ``slice_scatter``, gathers/``index``/``embedding``, ``iota``, RNG
   (``inductor_random``, ``inductor_lookup_seed``), ``prepare_softmax_online``, see
   ``miner.core.ops.fusable_extra``; views, and ``getitem`` of a multi-output compute node, as
   connectors), each node's label (``miner.mine.regions.region_template``: the dropout seed index is
   a scalar slot), operands and users. Matmuls, constant fills, other ops and graph inputs are never
   fusable: they bound the patterns. A node
   with more than ``max_fanout`` fusable users (a hub) connects patterns only through its
   operands (:func:`_neighbours`).
2. **Grow** patterns level by level, one node per level. Each connected node set is generated
   exactly once (ESU, :func:`_grow`). Extensions are grouped by (parent pattern, extension
   descriptor): all embeddings in a group are isomorphic children with the same alignment, so
   the child's exact canonical form (``miner.mine.canon.structure_order``) is computed once per
   group. A cheap invariant (label and labelled-edge multisets) drops groups whose child
   cannot be frequent before that. Children are keyed by their exact canonical code, never by
   a hash.
3. **Prune** by support: a pattern whose support is below ``min_support``, or found in fewer
   than ``min_models`` models, is dropped and never extended. Support counts occurrences by
   default (:func:`occurrence_support`, the minimum image count: a block repeated in the 12
   layers of one backward graph has support 12), or graphs (``support="graphs"``). Both are
   anti-monotone (a super-pattern never has more), so nothing frequent is lost.
4. **Report** the valid patterns (>= 2 compute nodes; a view only *between* two pattern
   nodes; a getitem only after its producer; a multi-output node never an output itself),
   closed ones only by default: a pattern is dropped when every one of its embeddings lies
   inside an embedding of one larger pattern with the same support (models and graphs).
5. Per reported pattern: greedy non-overlapping occurrences, their safety verdicts
   (``miner.rules.safety.check``), shapes and dtypes, Inductor's view from the kernel map, and a
   rank (:func:`_score`: natural blocks first, then the traffic a fusion could save).

Cost: linear in the number of embeddings of frequent patterns (each is extended once) plus
one canonical form per surviving extension group. Measured (2-core CPU shared with other
jobs, see ``benchmarks/bench_mining.py``): bert-base + gpt2-base training graphs (4 graphs,
6926 nodes) in 12 s wall / 8 s CPU; the 12 tiny bert/gpt2/llama/t5 train+infer graphs in
47 s / 32 s (train-forward and inference graphs are near copies: everything is frequent).
With occurrence support and the fusable op classes (2026-12-03, same machine, as busy): the 12
tiny graphs in 208 s wall / 62 s CPU (140096 frequent subgraphs, 21603 closed patterns; 22 s CPU,
48917 and 5723 before; graph support with the new classes: 42 s CPU); the H200 bert-base +
gpt2-base training graphs in 241 s / 95 s CPU (101108 frequent, 17845 patterns, 16986 of them in
one graph only): every connected subgraph of a layer is now frequent. ``--support graphs`` is the
fast way when only cross-graph patterns matter. ``limit`` (``miner mine --limit``, default 400)
builds occurrences and safety verdicts only for patterns that can still reach the top: the same
400 patterns of those H200 graphs in 70 s wall (grow 35 s, report 34 s) instead of 314 s; the 12
tiny graphs (`miner mine`, default limit) in 80 s wall / 68 s CPU.
"""

from __future__ import annotations

import bisect
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from miner.mine.canon import NodeTemplate, canonical_order, code_id, isomorphic, pattern_nodes, structure_order
from miner.core.pattern import Counts, MiningResult, Pattern, Support, canonical_form, ops_summary, pattern_id
from miner.core.ops import fusable_extra
from miner.core.records import CapturedGraph
from miner.mine.regions import region_template
from miner.mine.occurrences import (_bounded, _non_overlapping, _sample, _score,  # noqa: F401 (_sample: tests)
                                    build_occurrence, inductor_view)

COMPUTE = ("pointwise", "reduction")
SUPPORTS = ("occurrences", "graphs")

# --------------------------------------------------------------------------- graph index


@dataclass
class GraphIndex:
    """Integer-indexed view of one captured graph, as the miner needs it.

    ``kind[i]`` is "compute", "view" or None (not fusable). ``label[i]`` is the template
    label of a fusable node; ``operands[i]`` its operand producers in reference order (all
    nodes, fusable or not); ``users[i]`` its distinct users; ``consts[i]`` its abstracted
    scalar values.
    """

    graph: CapturedGraph
    names: list[str]
    kind: list[str | None]
    label: list[str | None]
    operands: list[tuple[int, ...]]
    users: list[tuple[int, ...]]
    consts: list[tuple[Any, ...]]
    multi: list[bool]  # a compute node with more than one output (var_mean)

    @property
    def key(self):
        return self.graph.key


def index_graph(graph: CapturedGraph, templates: dict[str, NodeTemplate], multi_labels: set[str]) -> GraphIndex:
    """Build the :class:`GraphIndex` of ``graph``; registers node templates in ``templates``."""
    names = [n.name for n in graph.nodes]
    pos = {n: i for i, n in enumerate(names)}
    recs = graph.nodes
    n = len(recs)
    kind: list[str | None] = [None] * n
    label: list[str | None] = [None] * n
    operands: list[tuple[int, ...]] = [()] * n
    consts: list[tuple] = [()] * n
    multi = [False] * n
    users: list[tuple[int, ...]] = [tuple(dict.fromkeys(pos[u] for u in r.users if u in pos)) for r in recs]
    # A value nothing reaches the graph's output through is dead code: Inductor drops it (no kernel),
    # so it is never part of a pattern (nor a "missed fusion"). Nodes are in topological order.
    live = [False] * n
    for i in range(n - 1, -1, -1):
        live[i] = recs[i].op == "output" or any(live[u] for u in users[i])
    for i, r in enumerate(recs):
        if not live[i]:
            continue
        if r.category in COMPUTE or fusable_extra(r.target, r.category):
            kind[i] = "compute"
            multi[i] = len(r.meta) > 1
        elif r.category == "view":
            kind[i] = "view"
    for i, r in enumerate(recs):
        if r.target == "operator.getitem":
            src = r.inputs()
            if src and src[0][1] in pos and kind[pos[src[0][1]]] == "compute":
                kind[i] = "view"
        if kind[i] is None:
            continue
        t, refs, cs = region_template(r, category="view" if kind[i] == "view" else r.category)
        lab = t.label
        templates.setdefault(lab, t)
        if multi[i]:
            multi_labels.add(lab)
        label[i] = lab
        operands[i] = tuple(pos[x] for x in refs if x in pos)
        if len(operands[i]) != len(refs):  # a reference to a node the capture did not record
            kind[i], label[i] = None, None
            continue
        consts[i] = cs
    return GraphIndex(graph, names, kind, label, operands, users, consts, multi)


def counts_as_compute(t: NodeTemplate) -> bool:
    """A pattern node that counts toward ``max_nodes`` and ``n_compute``: pointwise, reduction, or an op
    of the fusable classes (``cat``, ``embedding``, ``index``, ``iota``, RNG, ``prepare_softmax_online``,
    ..., see ``miner.core.ops.FUSABLE_CLASSES``)."""
    return t.category in COMPUTE or fusable_extra(t.target, t.category)


def occurrence_support(embs: Sequence[tuple]) -> int:
    """Minimum image support of aligned embeddings ``(graph, nodes, ...)``: the least, over pattern
    positions, number of distinct ``(graph, node)`` at that position."""
    if not embs:
        return 0
    return min(len({(e[0], e[1][j]) for e in embs}) for j in range(len(embs[0][1])))


# --------------------------------------------------------------------------- the lattice


@dataclass
class _Pat:
    """A pattern under growth: canonical code and embeddings aligned with it.

    An embedding is ``(graph, nodes, inputs, ext)``: graph node ids aligned with ``code``'s
    nodes and inputs, and ``ext``, its ESU extension set (see :func:`_grow`).
    """

    code: tuple  # ((label, refs), ...) refs ("n", j) | ("i", k)
    n_compute: int
    n_view: int
    embs: list[tuple] = field(default_factory=list)
    graphs: set = field(default_factory=set)
    children: dict = field(default_factory=dict)  # child pid -> set of own embedding indices inside it
    pid: int = -1
    inv: tuple | None = None  # (sorted labels, sorted labelled edges), an isomorphism invariant


def _neighbours(G: GraphIndex, max_fanout: int) -> list[tuple[int, ...]]:
    """Fusable operands and users of every node: the graph in which patterns must be connected.

    The edges from a node with more than ``max_fanout`` fusable users to those users are left
    out (both ways, ESU needs a symmetric graph): such hubs (a shared attention mask, a
    normalized activation read by many gradient terms) would otherwise multiply the
    embeddings combinatorially (C(users, k)) for patterns no kernel wants. Patterns are still
    induced subgraphs: an edge from a hub is part of a pattern whose nodes are connected
    another way.
    """
    kind = G.kind
    hub = [kind[v] is not None and sum(kind[u] is not None for u in G.users[v]) > max_fanout
           for v in range(len(kind))]
    out = []
    for v in range(len(kind)):
        if kind[v] is None:
            out.append(())
            continue
        ops = [u for u in G.operands[v] if kind[u] is not None and not hub[u]]
        users = [] if hub[v] else [u for u in G.users[v] if kind[u] is not None]
        out.append(tuple(dict.fromkeys(ops + users)))
    return out


def _grow(indexes: Sequence[GraphIndex], templates: dict[str, NodeTemplate], options: MineOptions,
          stats: dict) -> list[_Pat]:
    """All frequent connected patterns (valid or not), every embedding of each.

    Each connected node set is generated exactly once, by ESU (Wernicke 2006, "Efficient
    detection of network motifs"): a set grows only from its smallest node id (the root),
    and only by nodes from its extension set, which inherits the parent's later candidates
    plus the new node's *exclusive* neighbours (not adjacent to the set) above the root. Its
    chain of intermediate sets are connected subsets of it, hence at least as frequent, so
    pruning infrequent patterns level by level loses nothing.
    """
    min_support, min_models, max_nodes, max_views, support = (options.min_support, options.min_models,
                                                              options.max_nodes, options.max_views, options.support)
    models = [g.key.model for g in indexes]
    nbrs = [_neighbours(G, options.max_fanout) for G in indexes]
    # Zobrist keys: a node set's key is the XOR of its nodes' random 64-bit keys, so the key
    # of a set with one node removed is one XOR away (used for the containment links below;
    # a false link needs a 64-bit collision between two frequent embeddings of one graph).
    rng = random.Random(0)
    zob = [[rng.getrandbits(64) for _ in G.kind] for G in indexes]
    pats: list[_Pat] = []
    by_code: dict[tuple, int] = {}

    def frequent(p: _Pat) -> bool:
        if len({models[g] for g in p.graphs}) < min_models:
            return False
        return (len(p.graphs) if support == "graphs" else occurrence_support(p.embs)) >= min_support

    # Level 1: every fusable node (views too: ESU roots a set at its smallest node).
    level: list[_Pat] = []
    for gi, G in enumerate(indexes):
        for v, k in enumerate(G.kind):
            if k is None:
                continue
            order, inputs, code = structure_order([(G.label[v], tuple(("x", u) for u in G.operands[v]))])
            p_i = by_code.get(code)
            if p_i is None:
                p_i = by_code[code] = len(pats)
                is_compute = k == "compute"
                pats.append(_Pat(code=code, n_compute=int(is_compute), n_view=int(not is_compute), pid=p_i))
                level.append(pats[p_i])
            p = pats[p_i]
            p.embs.append((gi, (v,), tuple(x[1] for x in inputs), tuple(u for u in nbrs[gi][v] if u > v),
                           zob[gi][v]))
            p.graphs.add(gi)
    level = [p for p in level if frequent(p)]
    index = {(e[0], e[4]): (p.pid, ei) for p in level for ei, e in enumerate(p.embs)}
    stats["levels"] = [[len(level), sum(len(p.embs) for p in level)]]
    stats["canonicalized"] = stats["pruned_groups"] = 0

    while level:
        groups: dict[tuple, list] = defaultdict(list)
        for p in level:
            full_compute = p.n_compute >= max_nodes
            full_views = p.n_view >= max_views
            pid = p.pid
            for ei, (gi, nodes, inputs, ext, _) in enumerate(p.embs):
                G = indexes[gi]
                kind, ops_of, label, nb = G.kind, G.operands, G.label, nbrs[gi]
                root = min(nodes)
                npos = {u: j for j, u in enumerate(nodes)}
                ipos = {u: k for k, u in enumerate(inputs)}
                for i, v in enumerate(ext):
                    if (full_compute if kind[v] == "compute" else full_views):
                        continue
                    # v's exclusive neighbours: not in the set, not adjacent to it (ESU).
                    new_ext = ext[i + 1:] + tuple(u for u in nb[v] if u > root and u not in npos
                                                  and not any(y in npos for y in nb[u]))
                    fresh: dict[int, int] = {}
                    desc = []
                    for u in ops_of[v]:
                        if u in npos:
                            desc.append(("n", npos[u]))
                        elif u in ipos:
                            desc.append(("i", ipos[u]))
                        else:
                            desc.append(("x", fresh.setdefault(u, len(fresh))))
                    groups[(pid, label[v], tuple(desc), ipos.get(v, -1))].append((ei, v, tuple(fresh), new_ext))
        # A cheap isomorphism invariant of each group's child (label multiset, labelled-edge
        # multiset): a child is in no more graphs than all groups sharing its invariant, so a
        # group whose invariant is infrequent is dropped before its canonical form is computed.
        # (Occurrence support: a child's minimum image count is at most its embeddings, at most
        # the items of all groups sharing its invariant.)
        inv_of: dict[tuple, tuple] = {}
        inv_graphs: dict[tuple, set] = defaultdict(set)
        inv_items: Counter = Counter()
        for gkey, items in groups.items():
            par = pats[gkey[0]]
            inv = inv_of[gkey] = _child_invariant(par, gkey[1], gkey[2], gkey[3])
            inv_graphs[inv].update(par.embs[ei][0] for ei, _, _, _ in items)
            inv_items[inv] += len(items)
        nxt: list[_Pat] = []
        for gkey, items in groups.items():
            pid, lab, desc, was_input = gkey
            gs = inv_graphs[inv_of[gkey]]
            if len({models[g] for g in gs}) < min_models or \
                    (len(gs) if support == "graphs" else inv_items[inv_of[gkey]]) < min_support:
                stats["pruned_groups"] += 1
                continue
            parent = pats[pid]
            m = len(parent.code)
            structure = [(plab, tuple(("n", m) if r == ("i", was_input) else r for r in refs))
                         for plab, refs in parent.code]
            structure.append((lab, desc))
            order, inputs, code = structure_order(structure)
            stats["canonicalized"] += 1
            c_i = by_code.get(code)
            if c_i is None:
                is_compute = counts_as_compute(templates[lab])
                c_i = by_code[code] = len(pats)
                pats.append(_Pat(code=code, pid=c_i, n_compute=parent.n_compute + is_compute,
                                 n_view=parent.n_view + (not is_compute), inv=inv_of[gkey]))
                nxt.append(pats[c_i])
            child = pats[c_i]
            for ei, v, fresh, new_ext in items:
                gi, nodes, pin, _, key = parent.embs[ei]
                ext_nodes = nodes + (v,)
                child.embs.append((gi, tuple(ext_nodes[a] for a in order),
                                   tuple(pin[r[1]] if r[0] == "i" else fresh[r[1]] for r in inputs), new_ext,
                                   key ^ zob[gi][v]))
                child.graphs.add(gi)
        level = [p for p in nxt if frequent(p)]
        # Containment links for closedness: each embedding of a frequent child contains, for
        # every node whose removal leaves a frequent embedding, that parent embedding.
        new_index = {}
        for q in level:
            for ei, (gi, nodes, _, _, key) in enumerate(q.embs):
                new_index[(gi, key)] = (q.pid, ei)
                z = zob[gi]
                for x in nodes:
                    hit = index.get((gi, key ^ z[x]))
                    if hit is not None:
                        pats[hit[0]].children.setdefault(q.pid, set()).add(hit[1])
        index = new_index
        stats["levels"].append([len(level), sum(len(p.embs) for p in level)])
    return [p for p in pats if frequent(p)]


def _child_invariant(parent: _Pat, lab: str, desc: tuple, was_input: int) -> tuple:
    """Label multiset + (producer label, consumer label, position) edge multiset of a child."""
    if parent.inv is None:
        labels = [l for l, _ in parent.code]
        parent.inv = (tuple(sorted(labels)),
                      tuple(sorted((labels[r[1]], l, pos) for l, refs in parent.code
                                   for pos, r in enumerate(refs) if r[0] == "n")))
    labels, edges = parent.inv
    new = [(parent.code[r[1]][0], lab, pos) for pos, r in enumerate(desc) if r[0] == "n"]
    if was_input >= 0:
        new += [(lab, l, pos) for l, refs in parent.code for pos, r in enumerate(refs) if r == ("i", was_input)]
    return tuple(sorted(labels + (lab,))), tuple(sorted(edges + tuple(new)))


def _valid(p: _Pat, templates: dict[str, NodeTemplate], multi_labels: set[str]) -> bool:
    """Reportable: >= 2 compute nodes, views strictly between pattern nodes, no multi-output sink."""
    if p.n_compute < 2:
        return False
    used = {r[1] for _, refs in p.code for r in refs if r[0] == "n"}
    for j, (lab, refs) in enumerate(p.code):
        t = templates[lab]
        if t.category == "view":
            if not refs or refs[0][0] != "n":
                return False  # a view (or getitem) of an external input: leave it outside
            if t.target != "operator.getitem" and j not in used:
                return False  # a trailing view: the value before it is the output
        if lab in multi_labels and j not in used:
            return False  # a tuple-valued output (var_mean without its getitems)
    return True


def _closed_flags(pats: list[_Pat], valid: dict[int, bool], models: list[str]) -> dict[int, bool]:
    """closed[pid]: no larger pattern (with the same support) contains every embedding.

    ``covered(P)``: some child Q with the same graphs and models holds an extension of each
    embedding of P, and Q is reportable or itself covered; children come later in ``pats``,
    so one pass in reverse order settles it.
    """
    by_pid = {p.pid: p for p in pats}
    covered: dict[int, bool] = {}
    for p in reversed(pats):
        c = False
        for q_id, eis in p.children.items():
            q = by_pid.get(q_id)
            if q is None or len(eis) != len(p.embs) or q.graphs != p.graphs:
                continue
            if valid.get(q_id) or covered.get(q_id):
                c = True
                break
        covered[p.pid] = c
    return {pid: not c for pid, c in covered.items()}


# --------------------------------------------------------------------------- entry point


@dataclass(frozen=True)
class MineOptions:
    """How :func:`mine` grows, prunes and reports patterns (``miner mine``'s options; its defaults are the CLI's).

    Attributes
    ----------
    min_support : int
        Minimum support: with ``support="occurrences"`` (default) the pattern's occurrence count,
        its *minimum image* count (for each pattern node, the distinct graph nodes it maps to over
        all embeddings; the least of these): a pattern repeated across the 12 layers of one graph
        has support 12. It is anti-monotone (a super-pattern never has more), so pruning by it
        loses nothing, and it never counts two overlapping embeddings of one node twice. With
        ``support="graphs"``: the number of graphs it occurs in (the old rule).
    min_models : int
        Minimum number of distinct models.
    max_nodes : int
        Maximum number of compute (pointwise/reduction) nodes in a pattern (>= 2).
    max_views : int
        Maximum number of view/getitem nodes in a pattern.
    max_fanout : int
        A node with more fusable users than this connects a pattern only through its operands
        (see :func:`_neighbours`); hubs otherwise make embeddings explode combinatorially.
    closed_only : bool
        Keep only closed patterns (see the module docstring).
    max_extra_outputs : int
        Interior nodes used outside an occurrence become extra outputs of the fused op, up to
        this many; beyond that the occurrence is rejected (``miner.rules.safety.check_users``).
    max_stored : int
        Occurrences stored per pattern (plus one per distinct rejection reason); counts cover all.
    limit : int or None, default 400
        Return only the ``limit`` best-ranked patterns (the same ones as without a limit, built
        alone: much faster when most patterns would be cut); ``stats["reported_patterns"]`` still
        counts them all. None: every pattern (what `miner mine --limit 0` asks for).
    verify : bool
        Also confirm with networkx's VF2 matcher that no two reported patterns are isomorphic
        (slow for many patterns; tests use it).
    """

    min_support: int = 2
    min_models: int = 1
    max_nodes: int = 8
    max_views: int = 2
    max_fanout: int = 4
    closed_only: bool = True
    max_extra_outputs: int = 2
    max_stored: int = 2
    verify: bool = False
    support: str = "occurrences"
    limit: int | None = 400


def mine(graphs: Sequence[CapturedGraph], options: MineOptions = MineOptions()) -> MiningResult:
    """Mine frequent pointwise/reduction patterns of ``graphs``.

    Parameters
    ----------
    graphs : sequence of CapturedGraph
        The captured post-grad graphs (``Workspace.load_graphs()``).
    options : MineOptions
        Support, sizes and what is reported.

    Returns
    -------
    MiningResult
        Patterns ranked by :func:`_score`; ``stats`` holds the timings and lattice sizes.
    """
    o = options
    min_support, min_models, max_nodes, max_views, max_fanout = (o.min_support, o.min_models, o.max_nodes, o.max_views,
                                                                 o.max_fanout)
    closed_only, max_extra_outputs, max_stored, verify, support, limit = (o.closed_only, o.max_extra_outputs,
                                                                          o.max_stored, o.verify, o.support, o.limit)
    if max_nodes < 2:
        raise ValueError("max_nodes must be at least 2")
    if support not in SUPPORTS:
        raise ValueError(f"support must be one of {', '.join(SUPPORTS)}, got {support!r}")
    t0 = time.perf_counter()
    templates: dict[str, NodeTemplate] = {}
    multi_labels: set[str] = set()
    indexes = [index_graph(g, templates, multi_labels) for g in graphs]
    models = [g.key.model for g in graphs]
    t1 = time.perf_counter()
    stats: dict[str, Any] = {"graphs": len(graphs), "nodes": sum(len(g.nodes) for g in graphs),
                             "fusable_nodes": sum(sum(k is not None for k in G.kind) for G in indexes)}
    pats = _grow(indexes, templates, options, stats)
    t2 = time.perf_counter()
    valid = {p.pid: _valid(p, templates, multi_labels) for p in pats}
    closed = _closed_flags(pats, valid, models)
    reported = [p for p in pats if valid[p.pid] and (closed[p.pid] or not closed_only)]

    # Every reported pattern's ranking key needs its safe occurrences (the safety checks are most of
    # the report's time), but an optimistic key needs none: safe <= non-overlapping, a missed fusion
    # assumed. With ``limit``, patterns are built in optimistic order and the loop stops once ``limit``
    # built patterns rank before every optimistic key left: the same top ``limit`` as building all.
    ids: dict[str, str] = {}
    prelim = []
    for p in reported:
        nodes_p, n_inputs, n_consts, slots = pattern_nodes(p.code, templates)
        form = canonical_form(nodes_p, n_inputs, n_consts)
        pid = pattern_id(form)
        if ids.setdefault(pid, form) != form:  # never merge two patterns on a hash alone
            raise RuntimeError(f"pattern id collision on {pid}; lengthen miner.core.pattern.pattern_id")
        chosen = _non_overlapping(p.embs)
        bounded = sum(_bounded(indexes[p.embs[i][0]], p.embs[i][1], p.embs[i][2]) for i in chosen)
        n_comp = sum(1 for n in nodes_p if n.is_compute)
        best = (not bounded * 2 >= len(chosen) > 0, -(len(chosen) * max(n_comp - 1, 0)),
                -len({models[gi] for gi in p.graphs}), False, -len(p.graphs), pid)
        prelim.append((best, p, nodes_p, n_inputs, n_consts, slots, pid, chosen, bounded))
    prelim.sort(key=lambda t: t[0])
    out: list[Pattern] = []
    top: list[tuple] = []  # the best ``limit`` exact keys so far
    for best, p, nodes_p, n_inputs, n_consts, slots, pid, chosen, bounded in prelim:
        if limit and len(top) >= limit and top[-1] < best:
            break
        used = {r[1] for _, refs in p.code for r in refs if r[0] == "n"}
        sinks = tuple(j for j in range(len(p.code)) if j not in used)
        occs = [build_occurrence(indexes[p.embs[i][0]], p.embs[i][1], p.embs[i][2], slots, sinks,
                                 max_extra_outputs=max_extra_outputs) for i in chosen]
        safe = [o for o in occs if o.verdict.ok]
        rejections = Counter(r for o in occs for r in o.verdict.reasons)
        gset = sorted({str(indexes[gi].key) for gi in p.graphs})
        out.append(Pattern(
            id=pid, nodes=nodes_p, n_inputs=n_inputs, n_consts=n_consts, outputs=sinks,
            extra_outputs=tuple(sorted({j for o in safe for j in o.verdict.extra_outputs})),
            ops=ops_summary(nodes_p),
            support=Support(models=tuple(sorted({models[gi] for gi in p.graphs})), graphs=tuple(gset)),
            counts=Counts(total=len(p.embs), non_overlapping=len(occs), safe=len(safe),
                          by_phase=dict(sorted(Counter(o.phase for o in occs).items())), bounded=bounded),
            inductor=inductor_view(nodes_p, occs),
            rejections=dict(rejections.most_common()),
            occurrences=_sample(occs, max_stored),
            closed=closed[p.pid]))
        if limit:
            bisect.insort(top, _score(out[-1]))
            del top[limit:]
    out.sort(key=_score)
    out = out[:limit] if limit else out
    t3 = time.perf_counter()
    if verify:
        _verify_distinct(out)
    stats.update({"frequent_patterns": len(pats), "reported_patterns": len(reported), "built_patterns": len(out),
                  "seconds": {"index": round(t1 - t0, 3), "grow": round(t2 - t1, 3),
                              "report": round(t3 - t2, 3), "total": round(time.perf_counter() - t0, 3)}})
    params = dict(min_support=min_support, support=support, min_models=min_models, max_nodes=max_nodes, max_views=max_views,
                  max_fanout=max_fanout,
                  closed_only=closed_only, max_extra_outputs=max_extra_outputs, max_stored=max_stored,
                  models=sorted(set(models)))
    return MiningResult(patterns=tuple(out), params=params, stats=stats)


def _verify_distinct(patterns: Sequence[Pattern]) -> None:
    """Raise if two reported patterns are isomorphic (VF2), bucketing by a cheap invariant first."""
    buckets: dict[tuple, list[Pattern]] = defaultdict(list)
    for p in patterns:
        buckets[(len(p.nodes), p.n_inputs, tuple(sorted(n.target for n in p.nodes)))].append(p)
    for group in buckets.values():
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                if isomorphic(a.nodes, b.nodes):
                    raise AssertionError(f"patterns {a.id} and {b.id} are isomorphic")


def mine_workspace(workspace, models: Iterable[str] | None = None,
                   options: MineOptions = MineOptions()) -> MiningResult:
    """Load the workspace's captured graphs (optionally of some models) and :func:`mine` them."""
    graphs = workspace.load_graphs(list(models) if models else None)
    return mine(graphs, options)


def pattern_at(graph: CapturedGraph, names: Iterable[str], *, max_extra_outputs: int = 2) -> Pattern:
    """The pattern formed by the given FX nodes of ``graph``, with that one occurrence checked.

    For tests and for inspecting a hand-picked subgraph: no support counting, no validity
    filter (any connected or unconnected set of fusable nodes is accepted).
    """
    templates: dict[str, NodeTemplate] = {}
    G = index_graph(graph, templates, set())
    pos = {n: i for i, n in enumerate(G.names)}
    members = [pos[n] for n in names]
    bad = [G.names[m] for m in members if G.kind[m] is None]
    if bad:
        raise ValueError(f"not pointwise/reduction/view nodes: {', '.join(bad)}")
    order, inputs, code = structure_order_of_nodes(G, members)
    nodes_p, n_inputs, n_consts, slots = pattern_nodes(code, templates)
    pid, _ = code_id(code, templates)
    used = {r[1] for _, refs in code for r in refs if r[0] == "n"}
    sinks = tuple(j for j in range(len(code)) if j not in used)
    occ = build_occurrence(G, order, inputs, slots, sinks, max_extra_outputs=max_extra_outputs)
    return Pattern(id=pid, nodes=nodes_p, n_inputs=n_inputs, n_consts=n_consts, outputs=sinks,
                   extra_outputs=occ.verdict.extra_outputs, ops=ops_summary(nodes_p),
                   support=Support(models=(graph.key.model,), graphs=(str(graph.key),)),
                   counts=Counts(total=1, non_overlapping=1, safe=int(occ.verdict.ok),
                                 by_phase={occ.phase: 1}),
                   inductor=inductor_view(nodes_p, [occ]),
                   rejections=dict(Counter(occ.verdict.reasons)), occurrences=(occ,))


def structure_order_of_nodes(G: GraphIndex, members: Sequence[int]) -> tuple[list[int], list[int], tuple]:
    """Canonical order of a set of graph nodes: (nodes in order, input producers in order, code)."""
    mset = set(members)
    return canonical_order(mset, lambda v: G.label[v], lambda v: G.operands[v])

