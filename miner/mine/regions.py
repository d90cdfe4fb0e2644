"""Regions: what Inductor fused into one kernel, as a canonical pattern.

A **region** is the FX node set of one generated kernel call site (``KernelRef`` ``name:handle``
of a :class:`~miner.core.records.CapturedGraph`): its nodes in graph order, its external inputs, its
outputs, and the canonical :class:`~miner.core.pattern.Pattern` of that node set (the same nouns and
ids as mining: a mined pattern equal to a whole region has the region's id). Identical regions
across layers, graphs and models group into one :class:`RegionPattern` with one occurrence per
call site (t5's 12 attention-softmax kernels are one region pattern with 12 occurrences), each
occurrence carrying the kernel's measured time and roofline floor when a step profile exists.

API::

    regions.extract(graph, kinds=FUSED_KINDS) -> list[Region]      one per kernel call site
    regions.group(graphs, profiles=None) -> list[RegionPattern]    heaviest first
    regions.save(workspace, region_patterns) / regions.load(workspace)   mined/regions.json

What a region holds (Inductor's kernel map, ``NodeRecord.kernels``, is many-to-many: Inductor
recomputes cheap pointwise producers inside several kernels, so such a node is in each of
their regions):

- **nodes**: every node the kernel map puts in the kernel, plus the unmapped views and
  ``getitem`` s that feed it (a ``reshape`` of a matmul result, the ``getitem`` of
  ``prepare_softmax_online``): the region's inputs are then the tensors its ops really read. A
  ``getitem`` joins only when its producer is in the region. Every op class takes part:
  ``cat``, ``slice``, ``slice_scatter``, ``embedding``, ``index``/``gather``, ``iota``,
  ``full``, ``where`` and masks, ``inductor_lookup_seed`` / ``inductor_random``,
  ``prims.prepare_softmax_online``, views (see ``miner.core.ops.FUSABLE_CLASSES``).
- **inputs**: producers outside the region that its nodes read, in first-use order.
- **outputs**: region nodes whose value leaves the kernel: read by the graph output, by an
  extern/other op, or by a node of another kernel that does not recompute it (looking through
  unmapped views). Sinks of the region always count as outputs.
- **pattern**: the canonical pattern (``miner.mine.canon``); ``pattern.occurrences`` holds this one
  region's :class:`~miner.core.pattern.Occurrence` (nodes aligned with the pattern's nodes). The
  ``inductor_lookup_seed`` index (which dropout seed of the step) is abstracted into a scalar
  slot, as ``mul(x, 0.5)``'s 0.5 is, so the dropouts of every layer are one pattern.
- **bytes**: the bytes of its inputs plus its outputs from the captured metas (each tensor once);
  a lower bound of the kernel's traffic, used when no profile gives Inductor's own count.

Region occurrences are not safety-checked (``Occurrence.verdict`` is a plain ok with a note):
lowering a whole region is a different contract from the mined pattern's row kernel.

Canonical forms: a region with few sinks of identical shape is numbered exactly as
``miner.mine.canon.canonical_order`` does (mining's ids); one whose sink tie groups admit more than
:data:`MAX_PERMUTATIONS` orders, or whose unfolded label trees are huge, is numbered with
hashed subtree signatures and a greedy choice among tied sinks (:func:`region_order`): still a
function of the structure in every case seen, but not proven canonical (``Region.exact`` is then
False), so two isomorphic regions of that size could in principle land in two region patterns.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from miner.mine.canon import NodeTemplate, _walk, canonical_order, pattern_nodes, template_of
from miner.core.pattern import (Counts, InductorView, Occurrence, Pattern, PatternNode, Support, Verdict,
                           canonical_form, node_from_json, occurrence_from_json, occurrence_to_json, pattern_id)
from miner.core import dtypes
from miner.core.ops import FUSABLE_CLASSES, VALUE_INT_ARGS
from miner.core.records import CapturedGraph, GraphKey, KernelRef, NodeRecord, to_json

REGIONS_SCHEMA = 1
REGIONS_FILE = "regions.json"

#: Kernel kinds whose call sites become regions by default (Inductor-generated code, Triton or C++).
FUSED_KINDS = ("pointwise", "reduction", "persistent_reduction", "template", "foreach", "other")

MAX_PERMUTATIONS = 720  # tied-sink orders tried exactly (6!)
MAX_SIGNATURE = 200_000  # characters of an unfolded label tree before hashed signatures are used

# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Region:
    """One kernel call site's FX node set (see the module docstring).

    Attributes
    ----------
    graph : GraphKey
    kernel : KernelRef
        ``name:handle`` (``handle``: the call site) and kind.
    nodes, inputs, outputs : tuple[str, ...]
        FX names: the region's nodes in graph order, its external inputs (first use, graph order),
        the nodes whose values leave it (graph order).
    pattern : Pattern
        The canonical pattern; ``pattern.occurrences == (occurrence,)``.
    bytes : int or None
        Bytes of inputs + outputs from the captured metas (None when a meta is missing).
    exact : bool
        False when the canonical numbering fell back to hashed signatures / greedy ties.
    """

    graph: GraphKey
    kernel: KernelRef
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    pattern: Pattern
    bytes: int | None = None
    exact: bool = True

    @property
    def kernel_name(self) -> str:
        """The generated function's name (the profiler's name), without the call-site handle."""
        return kernel_base(self.kernel.name)

    @property
    def occurrence(self) -> Occurrence:
        return self.pattern.occurrences[0]

    @property
    def ops(self) -> str:
        return region_ops(self.pattern.nodes)


@dataclass(frozen=True)
class RegionOccurrence:
    """One region of a region pattern, with its measured time when a profile has it.

    ``us_per_step`` / ``floor_us_per_step``: this call site's share of the kernel's in-context
    time per step and its floor at the copy bandwidth (None without a profile or without bytes);
    ``source``: ``"measured"`` (a step profile) or ``None``.
    """

    region: Region
    us_per_step: float | None = None
    floor_us_per_step: float | None = None
    calls_per_step: float | None = None
    source: str | None = None

    @property
    def above_floor_us(self) -> float | None:
        if self.us_per_step is None or self.floor_us_per_step is None:
            return None
        return max(0.0, self.us_per_step - self.floor_us_per_step)


@dataclass(frozen=True)
class RegionPattern:
    """Identical regions grouped: one canonical pattern, one occurrence per kernel call site.

    ``pattern`` has support (models, graphs), counts (``total`` = ``non_overlapping`` = call
    sites; ``by_phase``) and every region's occurrence. Times are sums over the measured
    occurrences (per step); ``measured`` counts them.
    """

    pattern: Pattern
    occurrences: tuple[RegionOccurrence, ...]

    @property
    def id(self) -> str:
        return self.pattern.id

    @property
    def ops(self) -> str:
        return region_ops(self.pattern.nodes)

    @property
    def kernel_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(o.region.kernel_name for o in self.occurrences))

    @property
    def measured(self) -> int:
        return sum(o.us_per_step is not None for o in self.occurrences)

    @property
    def us_per_step(self) -> float:
        return sum(o.us_per_step or 0.0 for o in self.occurrences)

    @property
    def floor_us_per_step(self) -> float:
        return sum(o.floor_us_per_step or 0.0 for o in self.occurrences if o.us_per_step is not None)

    @property
    def above_floor_us(self) -> float:
        """Recoverable time: sum over measured occurrences of (time - floor), floored at 0 each."""
        return sum(o.above_floor_us or 0.0 for o in self.occurrences)

    @property
    def roofline(self) -> float | None:
        """floor / time over the measured occurrences that have a floor (1.0 = at the memory floor)."""
        t = sum(o.us_per_step for o in self.occurrences if o.us_per_step and o.floor_us_per_step is not None)
        return self.floor_us_per_step / t if t else None

    def summary(self) -> str:
        t = f" {self.us_per_step:.0f} us/step" if self.measured else ""
        return f"{self.id} {self.ops} [{len(self.occurrences)} occ, {self.pattern.support.n_models} models]{t}"


# --------------------------------------------------------------------------- extraction


def kernel_base(ref: str) -> str:
    """``"triton_per_fused_x_13:812"`` -> ``"triton_per_fused_x_13"`` (the handle names the call site)."""
    head, sep, tail = ref.rpartition(":")
    return head if sep and tail.isdigit() else ref


def extract(graph: CapturedGraph, kinds: Iterable[str] = FUSED_KINDS) -> list[Region]:
    """One :class:`Region` per kernel call site of ``graph`` whose kind is in ``kinds``.

    Call sites in launch order (``graph.kernels``; when that is empty, the kernels of the nodes in
    first-seen order); a call site whose kernel map lists no node gives no region.
    """
    kinds = set(kinds)
    recs = graph.nodes
    pos = {r.name: i for i, r in enumerate(recs)}
    members: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(recs):
        for k in r.kernels:
            members[k.name].append(i)
    facts = _Facts(graph, pos)
    sites = graph.kernels or tuple({k.name: k for r in recs for k in r.kernels}.values())
    out = []
    for k in sites:
        if k.kind not in kinds or not members.get(k.name):
            continue
        out.append(_region(graph, facts, k, members[k.name]))
    return out


class _Facts:
    """Per-graph lookups shared by its regions: positions, operand names, kernel sets."""

    def __init__(self, graph: CapturedGraph, pos: dict[str, int]):
        self.graph = graph
        self.pos = pos
        self.operands = [tuple(dict.fromkeys(n for _, n in r.inputs() if n in pos)) for r in graph.nodes]
        self.kernels = [frozenset(k.name for k in r.kernels) for r in graph.nodes]
        self.templates: dict[str, NodeTemplate] = {}
        self.labels: dict[int, tuple[str, tuple[str, ...], tuple[Any, ...]]] = {}

    def label(self, i: int):
        got = self.labels.get(i)
        if got is None:
            rec = self.graph.nodes[i]
            t, refs, consts = region_template(rec)
            self.templates.setdefault(t.label, t)
            got = self.labels[i] = (t.label, refs, consts)
        return got


def _is_connector(rec: NodeRecord) -> bool:
    return not rec.kernels and (rec.category == "view" or rec.target == "operator.getitem")


def _region(graph: CapturedGraph, F: _Facts, kernel: KernelRef, mapped: list[int]) -> Region:
    recs = graph.nodes
    inside = set(mapped)
    # Unmapped views / getitems feeding the region join it (walk up chains of them).
    stack = list(mapped)
    while stack:
        v = stack.pop()
        for name in F.operands[v]:
            u = F.pos[name]
            if u in inside or not _is_connector(recs[u]):
                continue
            if recs[u].target == "operator.getitem":
                src = F.operands[u]
                if not src or F.pos[src[0]] not in inside:
                    continue
            inside.add(u)
            stack.append(u)
    # A getitem joined above may have a producer that joined later: settle to a fixpoint.
    changed = True
    while changed:
        changed = False
        for u in list(inside):
            rec = recs[u]
            if rec.target == "operator.getitem" and not rec.kernels:
                src = F.operands[u]
                if not src or F.pos[src[0]] not in inside:
                    inside.discard(u)
                    changed = True
    order = sorted(inside)
    names = tuple(recs[i].name for i in order)
    name_set = set(names)
    inputs = tuple(dict.fromkeys(n for i in order for n in F.operands[i] if n not in name_set))
    # A connector leaves too where something outside reads it: a getitem of a multi-output reduction (the
    # softmax's row max and sum that the backward reads: DeBERTa's attention, 2026-12-06) maps to no kernel,
    # yet a pattern whose inner node has readers outside never matches, so it must be an output.
    leaving = tuple(recs[i].name for i in order if _leaves(F, i, inside, kernel.name))
    exact, pattern = _pattern(graph, F, kernel, order, leaving)
    out = set(pattern_outputs_names(pattern))
    outputs = tuple(n for n in names if n in out)
    return Region(graph=graph.key, kernel=kernel, nodes=names, inputs=inputs, outputs=outputs, pattern=pattern,
                  bytes=_bytes(graph, inputs, outputs), exact=exact)


def pattern_outputs_names(p: Pattern) -> tuple[str, ...]:
    """FX names of the values leaving a one-occurrence pattern (its sinks and extra outputs)."""
    occ = p.occurrences[0]
    return tuple(occ.nodes[j] for j in occ.outputs)


def _leaves(F: _Facts, i: int, inside: set[int], kname: str) -> bool:
    """Does node i's value have to leave kernel ``kname``?

    Yes when a consumer outside the region (looking through unmapped views) reads it from
    memory: the graph output, an op without a kernel, or a kernel that does not itself hold
    (recompute) node i. A node held by several kernels is stored by the first of them in
    launch order (Inductor inlines a recomputed producer; only a realized buffer is read).
    """
    recs = F.graph.nodes
    holders = F.kernels[i]
    if len(holders) > 1 and min(holders, key=lambda k: (_handle(k), k)) != kname:
        return False
    seen: set[str] = set()
    stack = list(recs[i].users)
    while stack:
        uname = stack.pop()
        if uname in seen:
            continue
        seen.add(uname)
        u = F.pos.get(uname)
        if u is None:
            return True
        if u in inside:
            continue
        ur = recs[u]
        if ur.op == "output" or (not ur.kernels and not _is_connector(ur)):
            return True
        if _is_connector(ur):
            stack.extend(ur.users)
            continue
        if not F.kernels[u] <= holders:
            return True
    return False


def _handle(ref: str) -> int:
    tail = ref.rpartition(":")[2]
    return int(tail) if tail.isdigit() else 0


def region_template(rec: NodeRecord, category: str | None = None) -> tuple[NodeTemplate, tuple[str, ...], tuple[Any, ...]]:
    """``miner.mine.canon.template_of`` with :data:`VALUE_INT_ARGS` abstracted into scalar slots
    (mining uses it too, so that every layer's ``inductor_lookup_seed`` is one label)."""
    t, refs, consts = template_of(rec, category)
    slots = VALUE_INT_ARGS.get(rec.target)
    if not slots:
        return t, refs, consts
    args = list(t.args)
    consts = list(consts)
    for p in slots:
        if p < len(args) and isinstance(args[p], int) and not isinstance(args[p], bool):
            consts.append(args[p])
            args[p] = {"const": len(consts) - 1}
    t = NodeTemplate(target=t.target, category=t.category, args=tuple(args), kwargs=t.kwargs, n_refs=t.n_refs,
                     n_consts=len(consts))
    return t, refs, tuple(consts)


def _pattern(graph: CapturedGraph, F: _Facts, kernel: KernelRef, order: list[int],
             out_names: tuple[str, ...]) -> tuple[bool, Pattern]:
    recs = graph.nodes
    members = [recs[i].name for i in order]
    info = {recs[i].name: F.label(i) for i in order}
    exact, corder, cinputs, code = region_order(members, lambda m: info[m][0], lambda m: info[m][1])
    nodes_p, n_inputs, n_consts, slots = pattern_nodes(code, F.templates)
    form = canonical_form(nodes_p, n_inputs, n_consts)
    pid = pattern_id(form)
    idx = {m: j for j, m in enumerate(corder)}
    used = {r[1] for _, refs in code for r in refs if r[0] == "n"}
    sinks = tuple(j for j in range(len(code)) if j not in used)
    leaving = {idx[n] for n in out_names}
    outputs = tuple(sorted(set(sinks) | leaving))
    extra = tuple(sorted(leaving - set(sinks)))
    scalars = tuple(info[corder[j]][2][c] for j, c in slots)
    by = graph._by_name
    occ = Occurrence(
        graph=graph.key, nodes=tuple(corder), inputs=tuple(cinputs), scalars=scalars, outputs=outputs,
        input_meta=tuple(by[u].meta[0] if by[u].meta else None for u in cinputs),
        output_meta=tuple(by[corder[j]].meta[0] if by[corder[j]].meta else None for j in outputs),
        phase=graph.key.phase, verdict=Verdict(ok=True, notes=("region: not safety-checked",)),
        node_kernels=tuple(tuple(k.name for k in by[n].kernels) for n in corder), kernels=(kernel,))
    pat = Pattern(id=pid, nodes=nodes_p, n_inputs=n_inputs, n_consts=n_consts, outputs=sinks, extra_outputs=extra,
                  ops=region_ops(nodes_p), support=Support(models=(graph.key.model,), graphs=(str(graph.key),)),
                  counts=Counts(total=1, non_overlapping=1, safe=0, by_phase={graph.key.phase: 1}, bounded=1),
                  inductor=InductorView(kernels_hist={"1": 1}, one_kernel=1), occurrences=(occ,))
    return exact, pat


def region_ops(nodes: Sequence[PatternNode]) -> str:
    """``"embedding -> add -> prepare_softmax_online -> sub -> exp -> ..."``: every op in canonical
    order but plain views (reshape, permute, expand, ...) and getitem; ops of the fusable classes
    (``slice``, ``cat``, ``embedding``, RNG, ...) are listed, unlike a mined pattern's ``ops``."""
    shown = [n.short for n in nodes if n.target != "operator.getitem"
             and (n.category != "view" or n.short in FUSABLE_CLASSES)]
    return " -> ".join(shown) or " -> ".join(n.short for n in nodes)


def _bytes(graph: CapturedGraph, inputs: Sequence[str], outputs: Sequence[str]) -> int | None:
    total = 0
    by = graph._by_name
    for n in list(inputs) + list(outputs):
        metas = by[n].meta
        if not metas:
            if by[n].target == "operator.getitem" or by[n].op == "placeholder":
                return None
            continue
        for m in metas[:1]:
            size = m.numel
            width = dtypes.size(m.dtype, default=0) or None
            if size is None or width is None:
                return None
            total += size * width
    return total


# --------------------------------------------------------------------------- canonical order for big DAGs


def region_order(members: Sequence, label, operands) -> tuple[bool, list, list, tuple]:
    """(exact, order, inputs, code) of a region's DAG; ``miner.mine.canon.canonical_order`` when affordable.

    Affordable: the unfolded label tree below every sink is at most :data:`MAX_SIGNATURE`
    characters and the tied sinks admit at most :data:`MAX_PERMUTATIONS` orders. Otherwise sinks
    are ordered by hashed subtree signatures and ties broken greedily: the next root is the tied
    sink whose walk, appended to the roots chosen so far, gives the smallest code.
    """
    mset = set(members)
    used_inside = {u for m in members for u in operands(m) if u in mset}
    sinks = [m for m in members if m not in used_inside]
    length: dict[Any, int] = {}
    for m in members:  # members are in graph (topological) order
        length[m] = len(label(m)) + 2 + sum(length[u] + 1 if u in mset else 2 for u in operands(m))
    if max(length[s] for s in sinks) <= MAX_SIGNATURE:
        sig_memo: dict[Any, str] = {}
        for m in members:
            sig_memo[m] = label(m) + "(" + ",".join(sig_memo[u] if u in mset else "_" for u in operands(m)) + ")"
        ties = Counter(sig_memo[s] for s in sinks)
        if math.prod(math.factorial(c) for c in ties.values()) <= MAX_PERMUTATIONS:
            order, inputs, code = canonical_order(members, label, operands)
            return True, order, inputs, code
        keys = {s: sig_memo[s] for s in sinks}
    else:
        h: dict[Any, str] = {}
        for m in members:
            body = label(m) + "(" + ",".join(h[u] if u in mset else "_" for u in operands(m)) + ")"
            h[m] = hashlib.sha1(body.encode()).hexdigest()
        keys = {s: h[s] for s in sinks}
    groups: dict[str, list] = defaultdict(list)
    for s in sinks:
        groups[keys[s]].append(s)
    roots: list = []
    for k in sorted(groups):
        pending = list(groups[k])
        while pending:
            if len(pending) == 1:
                roots.append(pending.pop())
                break
            best = min(pending, key=lambda s: _walk(roots + [s], mset, label, operands)[2])
            roots.append(best)
            pending.remove(best)
    order, inputs, code = _walk(roots, mset, label, operands)
    return False, order, inputs, code


# --------------------------------------------------------------------------- grouping


def group(graphs: Iterable[CapturedGraph], profiles: Iterable[Any] | None = None, *,
          kinds: Iterable[str] = FUSED_KINDS) -> list[RegionPattern]:
    """Group the regions of ``graphs`` by canonical pattern.

    Parameters
    ----------
    graphs : iterable of CapturedGraph
    profiles : iterable of StepProfile, optional
        ``miner.scan.profile.StepProfile`` records (anything with ``site_times(graph_key)`` ->
        ``{"name:handle": (us_per_step, floor_us_per_step or None, calls_per_step)}``); each
        occurrence whose call site a profile measured carries that time.
    kinds : kernel kinds that make regions (default :data:`FUSED_KINDS`).

    Returns
    -------
    list of RegionPattern
        Heaviest first: measured time above floor, then measured time, then occurrences, then id.
    """
    times: dict[tuple, tuple] = {}
    for prof in profiles or ():
        for key in prof.graph_keys():
            for ref, t in prof.site_times(key).items():
                times[(str(key), ref)] = t
    by_id: dict[str, list[Region]] = defaultdict(list)
    forms: dict[str, str] = {}
    for g in graphs:
        for r in extract(g, kinds):
            form = r.pattern.canonical()
            if forms.setdefault(r.pattern.id, form) != form:
                raise RuntimeError(f"pattern id collision on {r.pattern.id}; lengthen miner.core.pattern.pattern_id")
            by_id[r.pattern.id].append(r)
    out = []
    for pid, regs in by_id.items():
        occs = [RegionOccurrence(r, *t, "measured") if (t := times.get((str(r.graph), r.kernel.name))) else
                RegionOccurrence(r) for r in regs]
        out.append(RegionPattern(_grouped_pattern(regs), tuple(occs)))
    out.sort(key=lambda rp: (-rp.above_floor_us, -rp.us_per_step, -len(rp.occurrences), rp.id))
    return out


def _grouped_pattern(regs: Sequence[Region]) -> Pattern:
    p = regs[0].pattern
    occs = tuple(r.occurrence for r in regs)
    extra = tuple(sorted({j for o in occs for j in o.outputs} - set(p.outputs)))
    return Pattern(id=p.id, nodes=p.nodes, n_inputs=p.n_inputs, n_consts=p.n_consts, outputs=p.outputs,
                   extra_outputs=extra, ops=p.ops,
                   support=Support(models=tuple(sorted({r.graph.model for r in regs})),
                                   graphs=tuple(sorted({str(r.graph) for r in regs}))),
                   counts=Counts(total=len(regs), non_overlapping=len(regs), safe=0,
                                 by_phase=dict(sorted(Counter(r.graph.phase for r in regs).items())),
                                 bounded=len(regs)),
                   inductor=InductorView(kernels_hist={"1": len(regs)}, one_kernel=len(regs)),
                   occurrences=occs)


def regions_by_node(regions: Iterable[Region]) -> dict[tuple[str, str], list[Region]]:
    """``(str(graph key), fx name) -> regions holding that node`` (several when Inductor recomputed it)."""
    out: dict[tuple[str, str], list[Region]] = defaultdict(list)
    for r in regions:
        for n in r.nodes:
            out[(str(r.graph), n)].append(r)
    return out


# --------------------------------------------------------------------------- JSON


def regions_path(workspace: Any):
    from pathlib import Path
    mined = getattr(workspace, "mined", None)
    return (Path(mined) if mined is not None else Path(workspace) / "mined") / REGIONS_FILE


def region_pattern_to_json(rp: RegionPattern) -> dict:
    p = rp.pattern
    return {"id": p.id, "ops": rp.ops, "nodes": to_json(p.nodes), "n_inputs": p.n_inputs, "n_consts": p.n_consts,
            "outputs": list(p.outputs), "extra_outputs": list(p.extra_outputs),
            "support": to_json(p.support), "counts": to_json(p.counts),
            "us_per_step": rp.us_per_step if rp.measured else None,
            "floor_us_per_step": rp.floor_us_per_step if rp.measured else None,
            "occurrences": [{"kernel": to_json(o.region.kernel), "region_nodes": list(o.region.nodes),
                             "region_inputs": list(o.region.inputs), "region_outputs": list(o.region.outputs),
                             "bytes": o.region.bytes, "exact": o.region.exact,
                             "us_per_step": o.us_per_step, "floor_us_per_step": o.floor_us_per_step,
                             "calls_per_step": o.calls_per_step, "source": o.source,
                             "occurrence": occurrence_to_json(o.region.occurrence)} for o in rp.occurrences]}


def region_pattern_from_json(d: dict) -> RegionPattern:
    nodes = tuple(node_from_json(n) for n in d["nodes"])
    occs = []
    regs = []
    for o in d["occurrences"]:
        occ = occurrence_from_json(o["occurrence"])
        kernel = KernelRef(**o["kernel"])
        pat = Pattern(id=d["id"], nodes=nodes, n_inputs=d["n_inputs"], n_consts=d["n_consts"],
                      outputs=tuple(d["outputs"]), ops=d.get("ops", ""), occurrences=(occ,),
                      support=Support(models=(occ.graph.model,), graphs=(str(occ.graph),)))
        r = Region(graph=occ.graph, kernel=kernel, nodes=tuple(o["region_nodes"]), inputs=tuple(o["region_inputs"]),
                   outputs=tuple(o["region_outputs"]), pattern=pat, bytes=o.get("bytes"),
                   exact=bool(o.get("exact", True)))
        regs.append(r)
        occs.append(RegionOccurrence(r, o.get("us_per_step"), o.get("floor_us_per_step"), o.get("calls_per_step"),
                                     o.get("source")))
    rp = RegionPattern(_grouped_pattern(regs), tuple(occs))
    if pattern_id(rp.pattern.canonical()) != rp.id:
        raise ValueError(f"region pattern {rp.id}: id does not match its canonical form")
    return rp


def save(workspace: Any, region_patterns: Iterable[RegionPattern]) -> Any:
    """Write ``mined/regions.json`` atomically (one region pattern per line); returns its path."""
    import json

    from miner.core.workspace import write_text

    rows = [json.dumps(region_pattern_to_json(rp), separators=(",", ":")) for rp in region_patterns]
    text = '{"schema": %d, "kind": "RegionPatterns", "region_patterns": [\n' % REGIONS_SCHEMA
    text += ",\n".join(rows) + "\n]}\n"
    return write_text(regions_path(workspace), text)


def load(workspace: Any) -> list[RegionPattern]:
    """Read ``mined/regions.json``; ``WorkspaceError`` naming the file when it is unusable."""
    from miner.core.errors import WorkspaceError
    from miner.core.workspace import read_envelope

    path = regions_path(workspace)
    data = read_envelope(path, "RegionPatterns", REGIONS_SCHEMA, "miner mine")
    try:
        return [region_pattern_from_json(d) for d in data["region_patterns"]]
    except (ValueError, TypeError, KeyError) as e:
        raise WorkspaceError(f"{path}: malformed regions file ({e}); re-run `miner mine`") from None
