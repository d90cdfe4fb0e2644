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
    Reductions over exactly one dim, the last; a ``keepdim=False`` reduction only as an
    output; pointwise broadcasting only of the shapes a row kernel handles (full, per-row
    ``[..., 1]``, per-column ``[N]``, scalar); no mix of floating dtypes in one op (casts are
    explicit ``convert_element_type`` nodes); contiguous inputs; static shapes.
randomness
    No random op (dropout, ``inductor_random``, seeds) inside.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

from miner.core import ops
from miner.core.dtypes import is_float
from miner.core.ops import RANDOM_NAMES, resolve_target
from miner.core.pattern import Occurrence, Verdict, short_name
from miner.core.records import CapturedGraph, NodeRecord



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
        rec = graph.node(name)
        if rec.category != "view":
            return name
        ins = rec.inputs()
        if not ins:
            return name
        name = ins[0][1]
    return name


def _graph_facts(graph: CapturedGraph) -> dict[str, Any]:
    """Per-graph lookups shared by all occurrences: graph outputs, storages written in place.

    Cached on the (frozen) graph record like ``CapturedGraph._by_name``.
    """
    facts = graph.__dict__.get("_safety_facts")
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


def check_users(occ: Occurrence, graph: CapturedGraph, *, max_extra_outputs: int = 2, ctx: _Ctx | None = None
                ) -> Finding:
    """Interior nodes used outside: extra outputs (recorded), rejected beyond ``max_extra_outputs``."""
    c = ctx or _Ctx(occ, graph)
    reasons, extra = [], []
    for j, rec in enumerate(c.recs):
        outside = [u for u in rec.users if u not in c.inside]
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
    back = _re_entry(c)
    if back is not None:
        reasons.append(f"users: not convex: {c.ref(back)} depends on an outside node that depends on the pattern "
                       "(one fused op would form a cycle)")
    return Finding(tuple(reasons), tuple(extra))


def _re_entry(c: _Ctx) -> str | None:
    """A pattern node reached again by a path that leaves the occurrence, or None (convex).

    Graph order is topological, so only outside nodes placed before the occurrence's last
    node can lie on such a path.
    """
    pos = c.facts["pos"]
    last = max(pos[n] for n in c.occ.nodes)
    stack = [u for rec in c.recs for u in rec.users if u not in c.inside and pos.get(u, last) < last]
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


def check_meta(occ: Occurrence, graph: CapturedGraph, *, ctx: _Ctx | None = None, **_) -> Finding:
    """Shapes, dims, dtypes and strides a generated row kernel handles."""
    c = ctx or _Ctx(occ, graph)
    reasons = []
    for k, name in enumerate(occ.inputs):
        meta = graph.node(name).meta
        if not meta:
            continue
        m = meta[0]
        if m.numel is None:
            reasons.append(f"meta: in{k} has a symbolic shape {list(m.shape)}")
        elif m.contiguous is False:
            reasons.append(f"meta: in{k} is not contiguous (shape {list(m.shape)}, stride {list(m.stride)})")
    for j, rec in enumerate(c.recs):
        if rec.category == "reduction":
            reasons += _reduction_reasons(c, j, rec)
        elif rec.category == "pointwise":
            reasons += _pointwise_reasons(c, j, rec)
    return Finding(tuple(reasons))


def check_randomness(occ: Occurrence, graph: CapturedGraph, *, ctx: _Ctx | None = None, **_) -> Finding:
    """No random op inside (its seed and offset must stay where Inductor put them)."""
    c = ctx or _Ctx(occ, graph)
    reasons = [f"randomness: {c.ref(rec.name)} is a random op" for rec in c.recs if is_random(rec)]
    return Finding(tuple(reasons))


RULES: dict[str, Callable[..., Finding]] = {
    "users": check_users,
    "aliasing": check_aliasing,
    "mutation": check_mutation,
    "meta": check_meta,
    "randomness": check_randomness,
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
    b = bound_args(rec)
    ins = rec.inputs()
    shape = _shape_of(c, ins[0][1]) if ins else None
    ndim = len(shape) if shape is not None else None
    dims = b.get("dim")
    who = c.ref(rec.name)
    out = []
    if isinstance(dims, int):
        dims = [dims]
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        if ndim and ndim > 1:
            out.append(f"meta: {who} reduces over all dims (a row kernel reduces one dim)")
    elif len(dims) > 1:
        out.append(f"meta: {who} reduces over dims {list(dims)} (a row kernel reduces one dim)")
    elif ndim is not None:
        d = dims[0] % ndim if ndim else dims[0]
        if d != ndim - 1 and any(s != 1 for s in shape[d + 1:]):
            out.append(f"meta: {who} reduces over dim {d - ndim} of a {ndim}-d tensor, not the last")
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
    cache = graph.__dict__.setdefault("_safety_pointwise", {})
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
        if is_float(m.dtype) and m.numel != 1:
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
