"""Canonical forms of small op DAGs: node labels, exact canonical order, isomorphism checks.

A pattern is a DAG of ops whose edges carry operand positions (``sub(a, b)`` is not
``sub(b, a)``) and whose external inputs may be shared (``mul(x, x)``, layer norm's ``x``
read by ``var_mean`` and ``sub``). Its canonical form must be equal for two patterns exactly
when they are isomorphic with labels and positions preserved.

How (no general graph-isomorphism search needed):

1. Every node has a *label*: the op target plus its structural constants, with operand
   references and abstracted scalars replaced by placeholders (:func:`template_of`).
2. Given an ordering of the *sinks* (nodes with no user inside the pattern), a post-order
   DFS that visits operands in position order numbers every node and every external input
   deterministically: every node reaches a sink, and the operand order fixes the rest.
3. Sinks are sorted by an isomorphism-invariant key (the label tree unfolded below them);
   sinks with equal keys are permuted, and the lexicographically smallest code wins.

Any isomorphism maps sinks to sinks with equal keys, so the set of codes tried is the same
for isomorphic DAGs and the minimum is a canonical form; the code lists every node's label
and operand references, so it also determines the DAG up to isomorphism: equal codes <=>
isomorphic. :func:`isomorphic` confirms this independently with networkx's ``DiGraphMatcher``
(used by tests and by ``mine(..., verify=True)``).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Hashable, Iterable, Sequence

from miner.core.ops import bind, schema_arguments
from miner.core.pattern import PatternNode, canonical_form, pattern_id, with_canonical_dims
from miner.core.records import NodeRecord

# Scalar-typed arguments that are structural (they change what is computed, not a value).
_STRUCTURAL_SCALARS = {"correction"}

# A tie group of more sinks than this is still searched exhaustively (exactness first),
# but the product of permutations is bounded by the pattern size (<= max nodes).


@dataclass(frozen=True)
class NodeTemplate:
    """A graph node with its operands and abstracted scalars replaced by placeholders.

    ``args``/``kwargs`` hold ``{"ref": i}`` for the i-th operand reference (in
    ``NodeRecord.inputs`` order: args, then kwargs sorted by name) and ``{"const": i}`` for
    the i-th abstracted scalar; every other value is a literal structural constant.
    ``label`` is the exact string identity of the template.
    """

    target: str
    category: str  # pointwise | reduction | view
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    n_refs: int = 0
    n_consts: int = 0

    @property
    def label(self) -> str:
        return self.__dict__.get("_label") or self._make_label()

    def _make_label(self) -> str:
        s = json.dumps([self.target, _plain(self.args), {k: _plain(v) for k, v in sorted(self.kwargs.items())}],
                       sort_keys=True, separators=(",", ":"))
        object.__setattr__(self, "_label", s)
        return s


@lru_cache(maxsize=None)
def _scalar_slots(target: str) -> tuple[dict[int, bool], dict[str, bool]]:
    """Which positional / keyword arguments of ``target`` take a Tensor or a Scalar value.

    A number passed there is an operand value (abstracted into a const slot); a number passed
    to an ``int``/``int[]``/``bool`` argument is structural (dims, keepdim).
    """
    by_pos: dict[int, bool] = {}
    by_name: dict[str, bool] = {}
    for i, a in enumerate(schema_arguments(target) or ()):
        t = a.type
        if t.kind() == "OptionalType":
            t = t.getElementType()
        value = t.kind() in ("TensorType", "NumberType") and a.name not in _STRUCTURAL_SCALARS
        if not a.kwarg_only:
            by_pos[i] = value
        by_name[a.name] = value
    return by_pos, by_name


def template_of(rec: NodeRecord, category: str | None = None) -> tuple[NodeTemplate, tuple[str, ...], tuple[Any, ...]]:
    """The template of one FX node, its operand names (ref order) and its abstracted scalar values.

    Parameters
    ----------
    rec : NodeRecord
        The node.
    category : str, optional
        Overrides ``rec.category`` (``operator.getitem`` of a multi-output op is a "view").
    """
    by_pos, by_name = _scalar_slots(rec.target)
    refs: list[str] = []
    consts: list[Any] = []

    def enc(v: Any, value_slot: bool) -> Any:
        if isinstance(v, dict) and set(v) == {"node"}:
            refs.append(v["node"])
            return {"ref": len(refs) - 1}
        if value_slot and (isinstance(v, (int, float)) and not isinstance(v, bool)
                           or isinstance(v, dict) and set(v) == {"float"}):  # {"float": "-inf"}
            consts.append(v)
            return {"const": len(consts) - 1}
        if isinstance(v, (list, tuple)):
            return tuple(enc(x, False) for x in v)
        return v

    args = tuple(enc(a, by_pos.get(i, False)) for i, a in enumerate(rec.args))
    kwargs = {k: enc(rec.kwargs[k], by_name.get(k, False)) for k in sorted(rec.kwargs)}
    args, kwargs = with_canonical_dims(rec.target, args, kwargs, _operand_rank(rec, args, kwargs))
    t = NodeTemplate(target=rec.target, category=category or rec.category, args=args, kwargs=kwargs,
                     n_refs=len(refs), n_consts=len(consts))
    return t, tuple(refs), tuple(consts)


def _operand_rank(rec: NodeRecord, args: tuple, kwargs: dict) -> int | None:
    """The rank of the operand whose dims ``rec`` names, from its output meta: a reduction without
    ``keepdim`` dropped its dims, anything else kept the rank (None when unknown)."""
    if not rec.meta:
        return None
    ndim = len(rec.meta[0].shape)
    if rec.category != "reduction":
        return ndim
    b = bind(rec.target, rec.args, rec.kwargs)
    if b.get("keepdim"):
        return ndim
    dims = b.get("dim")
    if isinstance(dims, int):
        return ndim + 1
    return ndim + len(dims) if isinstance(dims, (list, tuple)) and dims else None


# --------------------------------------------------------------------------- canonical order


def canonical_order(members: Iterable[Hashable], label: Callable[[Any], str],
                    operands: Callable[[Any], Sequence[Hashable]]) -> tuple[list, list, tuple]:
    """Canonical numbering of a small DAG.

    Parameters
    ----------
    members : iterable
        The DAG's nodes (any hashable ids).
    label : callable
        ``label(m)``: the node's exact label string.
    operands : callable
        ``operands(m)``: the node's operands in position order; ids that are not members are
        external inputs (the same id twice is the same input).

    Returns
    -------
    order : list
        Members in canonical (topological) order.
    inputs : list
        External input ids in canonical order (first use in ``order``).
    code : tuple
        ``((label, refs), ...)`` with refs ``("n", j)`` / ``("i", k)``: equal iff isomorphic.
    """
    mset = set(members)
    used_inside = {u for m in mset for u in operands(m) if u in mset}
    sinks = [m for m in mset if m not in used_inside]
    sig_memo: dict[Any, str] = {}

    def sig(m) -> str:
        s = sig_memo.get(m)
        if s is None:
            s = label(m) + "(" + ",".join(sig(u) if u in mset else "_" for u in operands(m)) + ")"
            sig_memo[m] = s
        return s

    groups: dict[str, list] = {}
    for s in sinks:
        groups.setdefault(sig(s), []).append(s)
    ordered = [groups[k] for k in sorted(groups)]

    best = None
    for combo in itertools.product(*(itertools.permutations(g) for g in ordered)):
        roots = [r for part in combo for r in part]
        result = _walk(roots, mset, label, operands)
        if best is None or result[2] < best[2]:
            best = result
    assert best is not None and len(best[0]) == len(mset), "pattern is not a DAG reachable from its sinks"
    return best


def _walk(roots, mset, label, operands):
    index: dict[Any, int] = {}
    inputs: dict[Any, int] = {}
    order: list = []

    def visit(m):
        # Iterative post-order: operands (in position order) first, then the node.
        stack = [(m, iter(operands(m)))]
        index[m] = -1  # in progress
        while stack:
            node, it = stack[-1]
            for u in it:
                if u in mset:
                    if u not in index:
                        index[u] = -1
                        stack.append((u, iter(operands(u))))
                        break
                elif u not in inputs:
                    inputs[u] = len(inputs)
            else:
                stack.pop()
                index[node] = len(order)
                order.append(node)

    for r in roots:
        if r not in index:
            visit(r)
    code = tuple((label(m), tuple(("n", index[u]) if u in mset else ("i", inputs[u]) for u in operands(m)))
                 for m in order)
    return order, sorted(inputs, key=inputs.__getitem__), code


def structure_order(structure: Sequence[tuple[str, tuple]]) -> tuple[list, list, tuple]:
    """:func:`canonical_order` of an abstract structure ``[(label, refs)]``.

    ``refs`` are ``("n", j)`` (member j) or any other hashable (an external input id).
    """
    ops = [[r[1] if r[0] == "n" else r for r in refs] for _, refs in structure]
    labels = [lab for lab, _ in structure]
    return canonical_order(range(len(structure)), labels.__getitem__, ops.__getitem__)


# --------------------------------------------------------------------------- pattern nodes


def pattern_nodes(code: Sequence[tuple[str, tuple]], templates: dict[str, NodeTemplate]
                  ) -> tuple[tuple[PatternNode, ...], int, int, tuple[tuple[int, int], ...]]:
    """Pattern nodes from a canonical code.

    Returns the nodes, the number of inputs and of const slots, and for each const slot the
    (pattern node, local const index) it comes from, so per-occurrence values can be read off
    each node's ``template_of`` consts.
    """
    nodes: list[PatternNode] = []
    slots: list[tuple[int, int]] = []
    n_inputs = 0
    for j, (lab, refs) in enumerate(code):
        t = templates[lab]
        local_to_global: dict[int, int] = {}

        def dec(v):
            if isinstance(v, dict) and len(v) == 1:
                (k, x), = v.items()
                if k == "ref":
                    kind, idx = refs[x]
                    return {"node": idx} if kind == "n" else {"input": idx}
                if k == "const":
                    if x not in local_to_global:
                        local_to_global[x] = len(slots)
                        slots.append((j, x))
                    return {"const": local_to_global[x]}
            if isinstance(v, tuple):
                return tuple(dec(e) for e in v)
            return v

        args = tuple(dec(a) for a in t.args)
        kwargs = {k: dec(t.kwargs[k]) for k in sorted(t.kwargs)}
        nodes.append(PatternNode(target=t.target, category=t.category, args=args, kwargs=kwargs))
        n_inputs = max([n_inputs] + [idx + 1 for kind, idx in refs if kind == "i"])
    return tuple(nodes), n_inputs, len(slots), tuple(slots)


def code_id(code: Sequence[tuple[str, tuple]], templates: dict[str, NodeTemplate]) -> tuple[str, str]:
    """(pattern id, canonical form string) of a canonical code."""
    nodes, n_inputs, n_consts, _ = pattern_nodes(code, templates)
    form = canonical_form(nodes, n_inputs, n_consts)
    return pattern_id(form), form


# --------------------------------------------------------------------------- isomorphism check


def to_digraph(nodes: Sequence[PatternNode]):
    """A networkx DiGraph of pattern nodes plus one node per external input.

    Node attribute ``label``: the op with its structural constants (placeholders for operands);
    edge attribute ``pos``: the sorted operand positions (so ``sub(a, b)`` != ``sub(b, a)``).
    Const slots become per-node placeholders, so their numbering does not matter.
    """
    import networkx as nx

    g = nx.DiGraph()
    for j, n in enumerate(nodes):
        refs = n.refs()
        label = json.dumps([n.target, _mask(n.args), {k: _mask(v) for k, v in sorted(n.kwargs.items())}],
                           sort_keys=True)
        g.add_node(("n", j), label=label)
        for pos, (kind, idx) in enumerate(refs):
            if kind == "const":
                continue
            src = ("n", idx) if kind == "node" else ("i", idx)
            if src not in g:
                g.add_node(src, label="input")
            if g.has_edge(src, ("n", j)):
                g.edges[src, ("n", j)]["pos"] = tuple(sorted(g.edges[src, ("n", j)]["pos"] + (pos,)))
            else:
                g.add_edge(src, ("n", j), pos=(pos,))
    return g


def isomorphic(a: Sequence[PatternNode], b: Sequence[PatternNode]) -> bool:
    """Exact isomorphism of two patterns' DAGs on labels and operand positions (networkx VF2)."""
    from networkx.algorithms.isomorphism import DiGraphMatcher

    ga, gb = to_digraph(a), to_digraph(b)
    if ga.number_of_nodes() != gb.number_of_nodes() or ga.number_of_edges() != gb.number_of_edges():
        return False
    return DiGraphMatcher(ga, gb, node_match=lambda x, y: x["label"] == y["label"],
                          edge_match=lambda x, y: x["pos"] == y["pos"]).is_isomorphic()


def _mask(v: Any) -> Any:
    if isinstance(v, dict) and len(v) == 1 and next(iter(v)) in ("input", "node", "const"):
        return "<" + next(iter(v)) + ">"
    if isinstance(v, (list, tuple)):
        return [_mask(x) for x in v]
    return v


def _plain(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in sorted(v.items())}
    return v
