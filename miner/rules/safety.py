"""Is it safe to replace one occurrence of a pattern by one fused op? ``check(occurrence, graph)``.

Each rule is its own function ``rule(occurrence, graph, ...) -> Finding`` listed in ``RULES``;
``check`` runs them all and returns a ``Verdict(ok, reasons, extra_outputs, notes)``.
A reason reads ``"<rule>: <text>"`` and names pattern nodes ``n<j>`` (position in
``occurrence.nodes``) and inputs ``in<k>`` rather than FX names, so equal reasons group across
occurrences (``miner patterns show`` prints them grouped).

The rules (the invariants of ``torch/_inductor/fx_passes/README.md`` plus what a generated
row kernel can do):

users
    An interior node used outside the occurrence must also be returned by the fused op: it is
    recorded as an extra output; more than ``max_extra_outputs`` of them reject. A multi-output
    node (``var_mean``) read outside through a getitem that is not in the pattern rejects. A
    non-convex occurrence (a path leaves it and comes back) rejects: one op cannot replace it.
aliasing
    The fused op returns fresh tensors: an interior *view* used outside, an output that is
    itself a view, or an output that is a graph output aliased by another graph output would
    change aliasing. Inputs that alias each other are only read: a note.
mutation
    No mutating op (schema ``is_mutable``, in-place overload ``foo_``, ``copy_``) inside; no
    input produced by one, and no input whose storage a mutation (e.g. the ``copy_`` epilogue
    of a buffer update) writes anywhere in the graph.
meta
    A ``keepdim=False`` reduction only as an output; pointwise broadcasting only of the shapes
    a row kernel handles (full, per-row ``[..., 1]``, per-column ``[N]``, scalar); no mix of
    floating dtypes in one op among operands of rank >= 1 (casts are explicit
    ``convert_element_type`` nodes; the kernel computes in float32 where eager would round
    in between); contiguous inputs. Sizes may be symbolic (``dynamic=True``).
randomness
    No random op (dropout, ``inductor_random``, seeds) inside; at compile time, for a fused op
    that draws them itself (a region with dropout), only ones no one else reads (see
    ``check_randomness``).
kernel
    The generated row kernel's shape contract (``miner.rules.contract.shape_contract``, the
    precondition its launch checks): inputs broadcast and are fp32/bf16/fp16/bool; every
    reduction reduces a whole row of the inputs' broadcast shape (a size-1 last dim broadcast
    to wider rows later is rejected: the kernel would reduce the broadcast copies); every
    per-element output fills the rows, every per-row output has one value per row.

One rule set, two callers. Mining runs ``check(occurrence, graph)`` on a ``CapturedGraph``; the
rewrite runs ``check_match(match, ...)`` at compile time, which views the FX graph through
:class:`FxGraph` (the same ``node(name) -> NodeRecord`` / ``nodes`` interface, converted from
``meta['val']`` on demand, ``miner.rules.graph``) and the match as an ``Occurrence``, then applies
the same ``RULES``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Sequence

import torch

from miner.core import ops
from miner.core.dtypes import is_float
from miner.core.ops import RANDOM_NAMES, categorize, resolve_target, target_name
from miner.core.pattern import Occurrence, Verdict, short_name
from miner.core.records import CapturedGraph, GraphKey, NodeRecord
from miner.rules.contract import shape_contract
from miner.rules.graph import FxNodes


@dataclass(frozen=True)
class Finding:
    """What one rule found: blocking reasons, extra outputs (users rule) and notes."""

    reasons: tuple[str, ...] = ()
    extra_outputs: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()


class _Ctx:
    """Shared lookups for the rules: records, positions, the graph's outputs and alias bases."""

    def __init__(self, occ: Occurrence, graph: CapturedGraph):
        self.occ = occ
        self.graph = graph
        self.recs = [graph.node(n) for n in occ.nodes]
        self.inside = set(occ.nodes)
        self.pos = {n: j for j, n in enumerate(occ.nodes)}
        self.inpos = {n: k for k, n in enumerate(occ.inputs)}
        facts = self.facts = _graph_facts(graph)
        self.graph_outputs = facts["outputs"]
        self.out_bases = facts["out_bases"]
        self.written = facts["written"]

    def ref(self, name: str) -> str:
        """``n<j>(op)`` for a pattern node, ``in<k>`` for an input, else the FX name."""
        if name in self.pos:
            j = self.pos[name]
            return f"n{j}({short_name(self.recs[j].target)})"
        if name in self.inpos:
            return f"in{self.inpos[name]}"
        return name

    def base(self, name: str) -> str:
        bases = self.facts["bases"]
        b = bases.get(name)
        if b is None:
            b = bases[name] = _base(self.graph, name)
        return b


def _base(graph: CapturedGraph, name: str) -> str:
    """The storage a value lives in: follow view ops up to a non-view producer."""
    for _ in range(64):
        source = view_source(graph, name)
        if source is None:
            return name
        name = source
    return name


def view_source(graph: CapturedGraph, name: str) -> str | None:
    """The node view op ``name`` reads (its first node input), None when ``name`` is no view or reads no
    node. An :class:`FxGraph` answers from the FX node without converting it to a record (``_base`` asks
    for every graph output and every in-place op, per match)."""
    from_fx = getattr(graph, "view_source", None)
    if from_fx is not None:
        return from_fx(name)
    rec = graph.node(name)
    if rec.category != "view":
        return None
    ins = rec.inputs()
    return ins[0][1] if ins else None


def seed_lookups(graph: CapturedGraph) -> list:
    """The graph's ``inductor_lookup_seed`` records (an :class:`FxGraph` finds them without converting
    every node)."""
    found = getattr(graph, "seed_lookups", None)
    if found is not None:
        return found()
    return [r for r in graph.nodes if short_name(r.target) == "inductor_lookup_seed"]


def _graph_facts(graph: CapturedGraph) -> dict[str, Any]:
    """Per-graph lookups shared by all occurrences: graph outputs, storages written in place.

    Cached on the (frozen) graph record like ``CapturedGraph._by_name``.
    """
    facts = getattr(graph, "_safety_facts", None) or graph.__dict__.get("_safety_facts")
    if facts is None:
        out = [n for n in graph.nodes if n.op == "output"]
        written: dict[str, str] = {}  # storage base -> the mutating op writing it
        for rec in graph.nodes:
            if rec.op == "call_function" and is_mutating(rec):
                ins = rec.inputs()
                if ins:
                    written.setdefault(_base(graph, ins[0][1]), short_name(rec.target))
        outputs = [name for _, name in out[0].inputs()] if out else []
        out_bases: dict[str, list[str]] = {}
        for o in outputs:
            out_bases.setdefault(_base(graph, o), []).append(o)
        facts = {"outputs": set(outputs), "out_bases": out_bases, "written": written, "bases": {},
                 "pos": {n.name: i for i, n in enumerate(graph.nodes)}}
        object.__setattr__(graph, "_safety_facts", facts)
    return facts


# --------------------------------------------------------------------------- rules

CONSTANT_OPS = ("aten.full.default", "aten.scalar_tensor.default")  # a value from no tensor input


def is_constant(rec: NodeRecord) -> bool:
    """A node whose value depends on no tensor (``CONSTANT_OPS`` without a node argument): a fused op
    computes it again, so it may be shared with nodes outside a match (Inductor shares one node per
    distinct constant)."""
    return rec.op == "call_function" and rec.target in CONSTANT_OPS and not rec.inputs()



def check_users(occ: Occurrence, graph: CapturedGraph, *, max_extra_outputs: int = 2, ctx: _Ctx | None = None,
                recomputed: frozenset[str] = frozenset(), **_) -> Finding:
    """Interior nodes used outside: extra outputs (recorded), rejected beyond ``max_extra_outputs``; and
    convexity (:func:`_re_entry`). ``recomputed``: pattern nodes the replacement recomputes outside the
    fused op from the pattern's inputs (a region's shared outputs and the nodes they depend on, see
    :func:`check_match`): their outside readers read that copy, so a path from them is no cycle."""
    c = ctx or _Ctx(occ, graph)
    reasons, extra = [], []
    constants = frozenset(rec.name for rec in c.recs if is_constant(rec))
    for j, rec in enumerate(c.recs):
        outside = [u for u in rec.users if u not in c.inside]
        if rec.name in constants:  # the fused op computes its own copy; the graph keeps this one for the others
            continue
        if len(rec.meta) > 1:  # multi-output: its value leaves only through getitems
            if outside:
                reasons.append(f"users: {c.ref(rec.name)} is a multi-output op read outside the pattern "
                               "through a getitem that is not in it")
            continue
        if outside and j not in occ.outputs and rec.category != "view":
            extra.append(j)
    if len(extra) > max_extra_outputs:
        reasons.append(f"users: {len(extra)} interior nodes are used outside ("
                       + ", ".join(f"n{j}" for j in extra) + f"); more than {max_extra_outputs} extra outputs")
    back = _re_entry(c, recomputed | constants)
    if back is not None:
        reasons.append(f"users: not convex: {c.ref(back)} depends on an outside node that depends on the pattern "
                       "(one fused op would form a cycle)")
    return Finding(tuple(reasons), tuple(extra))


def _re_entry(c: _Ctx, recomputed: frozenset[str] = frozenset()) -> str | None:
    """A pattern node reached again by a path that leaves the occurrence from a node the fused op
    computes (not one of ``recomputed``), or None (convex).

    Graph order is topological, so only outside nodes placed before the occurrence's last
    node can lie on such a path.
    """
    pos = c.facts["pos"]
    last = max(pos[n] for n in c.occ.nodes)
    stack = [u for rec in c.recs if rec.name not in recomputed
             for u in rec.users if u not in c.inside and pos.get(u, last) < last]
    seen: set[str] = set()
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        for w in c.graph.node(u).users:
            if w in c.inside:
                return w
            if pos.get(w, last) < last:
                stack.append(w)
    return None


def check_aliasing(occ: Occurrence, graph: CapturedGraph, *, ctx: _Ctx | None = None, **_) -> Finding:
    """No aliasing created or broken by replacing the occurrence with a fused op."""
    c = ctx or _Ctx(occ, graph)
    reasons, notes = [], []
    for j, rec in enumerate(c.recs):
        if rec.category != "view":  # getitem of var_mean is a value of its own, not an alias
            continue
        if j in occ.outputs:
            reasons.append(f"aliasing: output {c.ref(rec.name)} is a view; the fused op would return a new "
                           "tensor where the graph has an alias")
        elif any(u not in c.inside for u in rec.users):
            reasons.append(f"aliasing: view {c.ref(rec.name)} is used outside; the fused op would return a "
                           "copy where the graph has an alias")
    bases = c.out_bases
    for j in occ.outputs:
        if j >= len(c.recs):
            continue
        name = c.recs[j].name
        aliases = [o for o in bases.get(name, []) if o != name]
        if aliases and (name in c.graph_outputs or len(aliases) > 1):
            reasons.append(f"aliasing: output {c.ref(name)} is returned by the graph together with a view of "
                           "it; fused outputs would no longer alias")
    in_bases: dict[str, list[int]] = {}
    for k, name in enumerate(occ.inputs):
        in_bases.setdefault(c.base(name), []).append(k)
    for ks in in_bases.values():
        if len(ks) > 1:
            notes.append("aliasing: inputs " + ", ".join(f"in{k}" for k in ks) + " view the same tensor (read only)")
    return Finding(tuple(reasons), notes=tuple(notes))


def check_mutation(occ: Occurrence, graph: CapturedGraph, *, ctx: _Ctx | None = None, **_) -> Finding:
    """No mutation inside, and no input produced or written in place by a mutation."""
    c = ctx or _Ctx(occ, graph)
    reasons = []
    for rec in c.recs:
        if is_mutating(rec):
            reasons.append(f"mutation: {c.ref(rec.name)} mutates its operand in place")
    written = c.written
    for k, name in enumerate(occ.inputs):
        prod = graph.node(name)
        if is_mutating(prod):
            reasons.append(f"mutation: in{k} is produced by the in-place op {short_name(prod.target)}")
        elif c.base(name) in written:
            reasons.append(f"mutation: in{k} is written in place by {written[c.base(name)]} elsewhere in the "
                           "graph (copy_ epilogue)")
    return Finding(tuple(reasons))


def check_meta(occ: Occurrence, graph: CapturedGraph, *, ctx: _Ctx | None = None, region: bool = False,
               **_) -> Finding:
    """Shapes, dims, dtypes and strides a generated row kernel handles.

    ``region``: the fused op replaces a whole Inductor kernel (``miner generate --regions``), which
    computes in float32 between its loads and stores exactly as the generated kernel does, so an op
    mixing float dtypes is no difference from what it replaces (a note, not a reason); and the region
    kernel reads every input through broadcasting strides and computes each pointwise value at the
    inputs' full broadcast shape (``launch.shape_contract``'s model), so a pointwise op broadcasting
    an operand (t5's decoder bias ``[1, H, S, S]`` and causal mask ``[B, 1, S, S]``) is a note too, as is
    a non-contiguous input (t5's encoder bias ``[B, H, S, S]`` with strides ``[.., 1, 6144, 12]``).
    """
    c = ctx or _Ctx(occ, graph)
    reasons, notes = [], []
    for k, name in enumerate(occ.inputs):
        meta = graph.node(name).meta
        if not meta:
            continue
        m = meta[0]
        if m.contiguous is False:
            # a region kernel reads it in place through its strides (t5's shared position bias, laid out
            # heads last by its embedding); a row kernel reads rows of contiguous columns
            (notes if region else reasons).append(
                f"meta: in{k} is not contiguous (shape {list(m.shape)}, stride {list(m.stride)})")
    for j, rec in enumerate(c.recs):
        if rec.category == "reduction":
            reasons += _reduction_reasons(c, j, rec)
        elif rec.category == "pointwise":
            found = _pointwise_reasons(c, j, rec)
            mixed = [r for r in found if (r.endswith("]") and " mixes dtypes " in r) or " broadcasts operand " in r]
            if region and mixed:
                notes += mixed
                found = [r for r in found if r not in mixed]
            reasons += found
    return Finding(tuple(reasons), notes=tuple(notes))


def check_randomness(occ: Occurrence, graph: CapturedGraph, *, ctx: _Ctx | None = None, random: bool = False,
                     **_) -> Finding:
    """No random op inside (its seed and offset must stay where Inductor put them), unless the fused
    op draws them itself (``random``: a region kernel with dropout, ``miner.generate.region``).

    Then the replacement is correct only when what the forward draws is used through the fused op's
    outputs alone: each random op is ``inductor_lookup_seed`` of a seed vector the match takes as an
    input, or ``inductor_random`` ("rand"/"randn") of such a seed; no random value or seed is read
    outside the match; no other ``inductor_lookup_seed`` in the graph reads the same seed (the same
    numbers drawn again, e.g. a backward that regenerates the mask from the seed instead of reading
    the saved mask); the seed vector is not a graph output (a later graph could regenerate them).
    """
    c = ctx or _Ctx(occ, graph)
    randoms = [rec for rec in c.recs if is_random(rec)]
    if not random:
        return Finding(tuple(f"randomness: {c.ref(rec.name)} is a random op" for rec in randoms))
    reasons = []
    if randoms and _emulating_precision_casts():
        reasons.append("randomness: torch._inductor.config.emulate_precision_casts is on; the kernel draws "
                       "the numbers of Inductor's default (a random number's bf16 cast elided)")
    for rec in randoms:
        who = c.ref(rec.name)
        short = short_name(rec.target)
        if short not in ("inductor_lookup_seed", "inductor_random"):
            reasons.append(f"randomness: {who} is {short}; the kernel draws inductor_random of a looked-up seed only")
            continue
        outside = [u for u in rec.users if u not in c.inside]
        if outside:
            reasons.append(f"randomness: {who} ({short}) is also read outside the match; the kernel's numbers "
                           "would differ from what that reader sees")
        if short == "inductor_random":
            kind = rec.args[2] if len(rec.args) > 2 else rec.kwargs.get("generator")
            if kind not in ("rand", "randn"):
                reasons.append(f"randomness: {who} draws {kind!r}; the kernel draws rand and randn only")
        if short == "inductor_lookup_seed":
            seeds, index = (list(rec.args) + [None, None])[:2]
            seeds = seeds.get("node") if isinstance(seeds, dict) else None
            if seeds not in c.inpos:
                reasons.append(f"randomness: {who} reads a seed vector that is no input of the match")
                continue
            if seeds in c.graph_outputs:
                reasons.append(f"randomness: the seed vector of {who} is a graph output (another graph could "
                               "draw the same numbers again)")
            again = [r.name for r in seed_lookups(c.graph) if r.name != rec.name
                     and r.args and r.args[0] == rec.args[0] and list(r.args[1:2]) == [index]]
            if again:
                reasons.append(f"randomness: seed {index} of {who} is looked up again outside the match "
                               f"({again[0]}): the same numbers drawn twice must stay one stream")
    return Finding(tuple(reasons))


def check_kernel(occ: Occurrence, graph: CapturedGraph, *, ctx: _Ctx | None = None, **_) -> Finding:
    """The generated kernel's shape contract (``contract.shape_contract``) on the occurrence's metas."""
    c = ctx or _Ctx(occ, graph)
    if any(rec.category not in ("pointwise", "reduction", "random") and rec.target != "operator.getitem"
           for rec in c.recs):
        return Finding()  # views, matmuls, ...: outside the row-kernel model (codegen refuses them with its reason)
    seeds, randoms = [], []
    for rec in c.recs:
        if short_name(rec.target) == "inductor_lookup_seed" and rec.inputs() and rec.inputs()[0][1] in c.inpos:
            seeds.append(c.inpos[rec.inputs()[0][1]])
        elif short_name(rec.target) == "inductor_random" and rec.meta:
            randoms.append((c.ref(rec.name), tuple(rec.meta[0].shape)))
    inputs = []
    for name in occ.inputs:
        meta = graph.node(name).meta
        if not meta:
            return Finding((f"kernel: {c.ref(name)} has no tensor meta",))
        inputs.append((tuple(meta[0].shape), meta[0].dtype))
    reductions = []
    for rec in c.recs:
        if rec.category == "reduction":
            ins = rec.inputs()
            shape = _shape_of(c, ins[0][1]) if ins else None
            if shape is None:
                continue
            dims = bound_args(rec).get("dim")
            dims = [dims] if isinstance(dims, int) else (list(dims) if dims is not None else None)
            reductions.append((c.ref(rec.name), shape, dims))
    kinds = _value_kinds(c)
    outputs = [(c.ref(c.recs[j].name), tuple(c.recs[j].meta[0].shape), kinds[c.recs[j].name])
               for j in occ.outputs if j < len(c.recs) and c.recs[j].meta]
    return Finding(tuple(f"kernel: {r}" for r in shape_contract(inputs, reductions, outputs, seeds=sorted(set(seeds)),
                                                                randoms=randoms)))


def _value_kinds(c: _Ctx) -> dict[str, str]:
    """Per pattern node, how the row kernel holds its value: "vec" (per element) or "row" (per row).

    Inputs are read per element; a reduction gives one value per row (its getitems too); any
    other op is per element when one of its operands is, else per row (codegen's rule).
    """
    kinds: dict[str, str] = {}

    def kind(name: str) -> str:
        if name not in c.inside:
            return "vec"
        if name not in kinds:
            rec = c.recs[c.pos[name]]
            ins = [n for _, n in rec.inputs()]
            if rec.category == "reduction":
                kinds[name] = "row"
            elif rec.target == "operator.getitem":
                kinds[name] = kind(ins[0]) if ins else "vec"
            else:
                kinds[name] = "vec" if any(kind(n) == "vec" for n in ins) else "row"
        return kinds[name]

    for rec in c.recs:
        kind(rec.name)
    return kinds


RULES: dict[str, Callable[..., Finding]] = {
    "users": check_users,
    "aliasing": check_aliasing,
    "mutation": check_mutation,
    "meta": check_meta,
    "randomness": check_randomness,
    "kernel": check_kernel,
}


def check(occurrence: Occurrence, graph: CapturedGraph, *, max_extra_outputs: int = 2) -> Verdict:
    """Run every rule of ``RULES`` on one occurrence.

    ``occurrence.outputs`` must hold the pattern's sinks (the values that leave it anyway);
    ``occurrence.inputs`` the producers of its external inputs.
    """
    ctx = _Ctx(occurrence, graph)
    reasons, extra, notes = [], [], []
    for rule in RULES.values():
        f = rule(occurrence, graph, max_extra_outputs=max_extra_outputs, ctx=ctx)
        reasons += f.reasons
        extra += f.extra_outputs
        notes += f.notes
    return Verdict.of(reasons, extra, notes)


# --------------------------------------------------------------------------- helpers


def is_mutating(rec: NodeRecord) -> bool:
    """Schema ``is_mutable``, an in-place overload (``add_``), or miner's "mutation" category."""
    return _is_mutating(rec.category, rec.op, rec.target)


@lru_cache(maxsize=None)
def _is_mutating(category: str, op: str, target: str) -> bool:
    if category == "mutation":
        return True
    if op != "call_function" or target.startswith("operator."):
        return False
    parts = target.split(".")
    if len(parts) > 1 and parts[1].endswith("_") and not parts[1].startswith("_"):
        return True
    schema = getattr(resolve_target(target), "_schema", None)
    return bool(schema is not None and schema.is_mutable)


def _emulating_precision_casts() -> bool:
    """Inductor's ``emulate_precision_casts`` (rounds bf16/fp16 intermediates as eager does), if torch has it."""
    try:
        from torch._inductor import config
    except ImportError:  # pragma: no cover - torch without Inductor
        return False
    return bool(getattr(config, "emulate_precision_casts", False))


def is_random(rec: NodeRecord) -> bool:
    if rec.category == "random":
        return True
    parts = rec.target.split(".")
    return len(parts) > 1 and parts[1] in RANDOM_NAMES


def bound_args(rec: NodeRecord) -> dict[str, Any]:
    """The node's arguments by schema name (defaults filled in)."""
    return ops.bind(rec.target, rec.args, rec.kwargs)


def _shape_of(c: _Ctx, name: str) -> tuple | None:
    meta = c.graph.node(name).meta
    return tuple(meta[0].shape) if meta else None


def _reduction_reasons(c: _Ctx, j: int, rec: NodeRecord) -> list[str]:
    """keepdim=False results used inside (which dims a reduction may reduce: the ``kernel`` rule)."""
    b = bound_args(rec)
    ins = rec.inputs()
    shape = _shape_of(c, ins[0][1]) if ins else None
    ndim = len(shape) if shape is not None else None
    who = c.ref(rec.name)
    out = []
    if b.get("keepdim") is False and ndim and ndim > 1:
        inside_users = [u for u in rec.users if u in c.inside]
        if inside_users and len(rec.meta) == 1:
            out.append(f"meta: {who} drops the reduced dim (keepdim=False) and is used inside the pattern")
        elif len(rec.meta) > 1:
            # var_mean: its getitems carry the value; same rule on them.
            for g in rec.users:
                if g in c.inside and any(u in c.inside for u in c.graph.node(g).users):
                    out.append(f"meta: {who} drops the reduced dim (keepdim=False) and is used inside the pattern")
                    break
    return out


def _pointwise_reasons(c: _Ctx, j: int, rec: NodeRecord) -> list[str]:
    who = c.ref(rec.name)
    return [f"meta: {who} {text}" for text in _pointwise_findings(c.graph, rec)]


def _pointwise_findings(graph: CapturedGraph, rec: NodeRecord) -> list[str]:
    """Broadcast and dtype findings of one pointwise node (they depend on the node only: cached)."""
    cache = graph.__dict__.setdefault("_safety_pointwise", {})  # per CapturedGraph / per FxGraph
    found = cache.get(rec.name)
    if found is not None:
        return found
    found = []
    shape = tuple(rec.meta[0].shape) if rec.meta else None
    dtypes = set()
    for pos, name in rec.inputs():
        meta = graph.node(name).meta
        if not meta:
            continue
        m = meta[0]
        if is_float(m.dtype) and len(m.shape) > 0:  # a 0-d tensor takes part in promotion like a scalar
            dtypes.add(m.dtype)
        if shape is not None and not _row_broadcastable(tuple(m.shape), shape):
            found.append(f"broadcasts operand {pos} of shape {list(m.shape)} to {list(shape)} "
                         "(not full, per-row, per-column or scalar)")
    if len(dtypes) > 1 and not rec.target.startswith("prims.convert_element_type"):
        found.append(f"mixes dtypes {sorted(dtypes)}")
    cache[rec.name] = found
    return found


def _row_broadcastable(t: tuple, s: tuple) -> bool:
    """Can a row kernel (rows = all dims but the last) read operand shape ``t`` for output ``s``?"""
    if t == s:
        return True
    if len(t) > len(s):
        return False
    t = (1,) * (len(s) - len(t)) + t
    if all(a == 1 for a in t):
        return True  # scalar
    if not s:
        return False
    if t[:-1] == s[:-1] and t[-1] in (1, s[-1]):
        return True  # full or per-row value [..., 1]
    if t[-1] == s[-1] and all(a == 1 for a in t[:-1]):
        return True  # per-column vector [N]
    return False


# --------------------------------------------------------------------------- the same rules at compile time


class FxGraph(FxNodes):
    """A ``torch.fx.Graph`` seen through ``CapturedGraph``'s interface, for the rules at compile time.

    ``node(name)`` converts one FX node to a ``NodeRecord`` on demand (:class:`FxNodes`); ``nodes``
    lists them all; the per-graph facts (outputs, storages written in place, positions) are
    computed once from the FX nodes. Build one per match: the graph changes between matches.
    """

    def __init__(self, graph):
        super().__init__(graph)
        self._lookups: list[NodeRecord] | None = None
        out = [n for n in graph.nodes if n.op == "output"]
        outputs = [a.name for a in out[0].all_input_nodes] if out else []
        written: dict[str, str] = {}
        for n in graph.nodes:
            if n.op == "call_function":
                name = target_name(n.target)
                if _is_mutating(categorize(n.target), n.op, name) and n.all_input_nodes:
                    written.setdefault(_base(self, n.all_input_nodes[0].name), short_name(name))
        out_bases: dict[str, list[str]] = {}
        for o in outputs:
            out_bases.setdefault(_base(self, o), []).append(o)
        self._safety_facts = {"outputs": set(outputs), "out_bases": out_bases, "written": written, "bases": {},
                              "pos": {n: i for i, n in enumerate(self._fx)}}

    @property
    def nodes(self) -> list[NodeRecord]:
        return [self.node(n) for n in self._fx]

    def view_source(self, name: str) -> str | None:
        """:func:`view_source` read from the FX node: ``categorize`` of its target, its first node reference
        in the order ``NodeRecord.inputs`` lists them (the args, then the kwargs by name)."""
        n = self._fx[name]
        if n.op != "call_function" or categorize(n.target) != "view":
            return None
        for value in (*n.args, *(v for _, v in sorted(n.kwargs.items()))):
            refs = _fx_refs(value)
            if refs:
                return refs[0]
        return None

    def seed_lookups(self) -> list[NodeRecord]:
        """The records of the graph's ``inductor_lookup_seed`` nodes (:func:`seed_lookups`)."""
        if self._lookups is None:
            self._lookups = [self.node(name) for name, n in self._fx.items() if n.op == "call_function"
                             and short_name(target_name(n.target)) == "inductor_lookup_seed"]
        return self._lookups


def _fx_refs(value: Any) -> list[str]:
    """The FX nodes ``value`` (an FX argument) refers to, by name, as ``NodeRecord.inputs`` finds them."""
    if isinstance(value, torch.fx.Node):
        return [value.name]
    if isinstance(value, (list, tuple)):
        return [r for v in value for r in _fx_refs(v)]
    return []


MATCH_KEY = GraphKey("torch.compile", "-", "-", "-")


def match_occurrence(match, n_inputs: int) -> Occurrence | None:
    """An Inductor pattern-matcher ``Match`` as an ``Occurrence``: its nodes in graph order, inputs
    ``x0..x{n-1}``, outputs the nodes whose values the replacement returns; None when an input is
    no graph node (a constant)."""
    inputs = [match.kwargs.get(f"x{k}") for k in range(n_inputs)]
    if not all(hasattr(i, "name") for i in inputs):
        return None
    order = {n: i for i, n in enumerate(match.graph.nodes)}
    input_set = set(inputs)
    nodes = sorted({n for n in match.nodes if n not in input_set and n.op == "call_function"}, key=order.get)
    pos = {n: j for j, n in enumerate(nodes)}
    outputs = tuple(pos[o] for o in match.output_nodes() if o is not None and o in pos)
    return Occurrence(graph=MATCH_KEY, nodes=tuple(n.name for n in nodes), inputs=tuple(i.name for i in inputs),
                      outputs=outputs)


def recomputed_names(match, occ: Occurrence, kernel_outputs: int | None) -> frozenset[str]:
    """The match's nodes that its replacement recomputes outside the fused op: the outputs after the
    first ``kernel_outputs`` (a region's shared outputs: t5's position bias, read by every layer) and
    the match's nodes they depend on. Empty when every output is the fused op's."""
    outs = list(match.output_nodes())
    if kernel_outputs is None or len(outs) <= kernel_outputs:
        return frozenset()
    inside = set(occ.nodes)
    stack = [o.name for o in outs[kernel_outputs:] if o is not None and o.name in inside]
    by_name = {n.name: n for n in match.nodes}
    seen: set[str] = set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        stack.extend(i.name for i in by_name[name].all_input_nodes if i.name in inside)
    return frozenset(seen)


def scalar_reasons(match) -> list[str]:
    """A pattern's scalars (``c0``, ``c1``, ...: an eps, an exponent) are constants compiled into the
    kernel; one bound to a graph value declines. Under ``dynamic=True`` Dynamo turns a Python float
    such as a norm's eps into a 0-d tensor input of the graph (a SymFloat, not specialized)."""
    out = []
    for key in sorted(k for k in match.kwargs if k[:1] == "c" and k[1:].isdigit()):
        v = match.kwargs[key]
        if hasattr(v, "op") and hasattr(v, "meta"):  # an FX node
            val = v.meta.get("val")
            what = (f"{str(val.dtype).replace('torch.', '')}{list(val.shape)} tensor" if hasattr(val, "dtype")
                    else type(val).__name__)
            out.append(f"scalar: {key} is a graph value (a {what}), not a constant the kernel is "
                       "compiled with (under dynamic=True a Python float becomes a tensor input)")
    return out


def check_match(match, n_inputs: int, input_kinds: Sequence[str] = (), random: bool = False,
                region: bool = False, kernel_outputs: int | None = None) -> Verdict:
    """``RULES`` on one compile-time match (no extra outputs: a fusion returns what its pattern does),
    plus the input kinds the fusion's pattern was traced with ("float" / "bool" / "seed").
    ``random``: the fused op draws its random numbers itself (see :func:`check_randomness`);
    ``region``: it replaces a whole Inductor kernel (see :func:`check_meta`); ``kernel_outputs``: how
    many of the match's outputs, in order, the fused op computes: the rest are a region's shared
    outputs, which the replacement recomputes from the inputs outside it (:func:`recomputed_names`).
    Never raises: an unexpected error is a reason of its own ("error: ...")."""
    try:
        occ = match_occurrence(match, n_inputs)
        if occ is None:
            return Verdict.of(["meta: an input is not a graph node"])
        scalars = scalar_reasons(match)
        if scalars:
            return Verdict.of(scalars)
        graph = FxGraph(match.graph)
        reasons = []
        for k, (name, kind) in enumerate(zip(occ.inputs, input_kinds)):
            meta = graph.node(name).meta
            dt = meta[0].dtype if meta else None
            if dt is not None and (dt == "bool") != (kind == "bool"):
                reasons.append(f"kernel: in{k} is {dt}; the fusion's pattern takes {kind}")
        ctx = _Ctx(occ, graph)
        recomputed = recomputed_names(match, occ, kernel_outputs)
        for rule in RULES.values():
            reasons += rule(occ, graph, max_extra_outputs=0, ctx=ctx, random=random, region=region,
                            recomputed=recomputed).reasons
        return Verdict.of(reasons)
    except Exception as e:  # a decline with its reason, never a crash of the user's compile
        return Verdict.of([f"error: {type(e).__name__}: {e}"])
