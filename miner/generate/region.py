"""A whole Inductor region (``mined/regions.json``) as a pattern the row-kernel generator can lower.

A region pattern (``miner.mine.regions``) is everything Inductor put into one kernel, so a
candidate made from it never splits an Inductor kernel. Some things in a region are no row-kernel
values, and ``prepare`` rewrites them before lowering:

- a **view of an input** (``reshape``/``view`` of a matmul result ``[B*S, N] -> [B, S, N]``): the
  view stays in the graph and the pattern reads its result, so the pattern's input ``k`` becomes
  the view (its shape is the view's, its stride the row-major one when the source was
  contiguous). Only views whose source no other pattern node reads are taken out.
- the **shape of a random op** (``inductor_random([16, 512, 3072], seed, "rand")`` holds it as
  a literal): it becomes ``{"shape_of": k}``, the shape of the input ``k`` with the same shape in
  the observed occurrences, so the pattern (and the custom op's fake implementation) follows the
  shapes it is called with. No such input: ``Unsupported``.
- the **literal shape of a ``full`` or an ``expand``** (``full([16, 12, 512, 512], 0.0)``,
  ``expand(mask, [16, -1, 512, 512])``) becomes ``{"shape_of": k}`` when input ``k`` has that
  shape, else one ``{"dim_of": [k, d]}`` per size (``-1`` and ``1`` stay), and ``full``'s device
  ``{"device_of": k}``: the pattern follows the batch it is called with.
- a **reshape of a computed value** (DeBERTa's attention region views its scores ``[B, H, S, S] ->
  [-1, S, S]`` before the cast): its sizes become ``{"dim_of": [k, e]}`` of an input dim at the same
  distance from the end (``-1`` stays; a lone merged leading size becomes ``-1``), so the pattern follows
  the batch; ``miner.generate.lower`` lowers it as the identity on the rows (a reshape moves no element
  of a row-major layout) and the kernel's contract takes an output that merges or splits only leading dims.
- the **index of a dropout seed** (``inductor_lookup_seed(seeds, 4)``, a const slot since every
  layer reads its own seed) becomes ``{"int_const": c}``: rendered ``int(c<c>)``, since const
  slots are passed as floats.

Inputs observed only as per-column vectors (a norm's weight) are read once per program by the
one-pass kernel (``column_inputs``; ``eviction_policy="evict_last"``).

The candidate keeps the region pattern's id (the profile's row), and ``candidate.json`` records
where it came from (``source``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterable, Sequence

from miner.core.pattern import Pattern, PatternNode
from miner.core.tensors import TensorSpec, contiguous_strides
from miner.generate.lower import Unsupported

VIEW_TARGETS = ("aten.reshape.default", "aten.view.default", "aten._unsafe_view.default")
RANDOM_TARGET = "prims.inductor_random.default"
SEED_TARGET = "prims.inductor_lookup_seed.default"


def is_region(pattern: Pattern) -> bool:
    """Whether ``pattern`` came from ``mined/regions.json`` (its occurrences say so)."""
    return any("region: not safety-checked" in o.verdict.notes for o in pattern.occurrences)


# Ops that move or retype values without computing: a region of only these is a copy, which the
# replaced Inductor kernel already is (t5's and MegatronBert's weight casts, `pae82366874`: 536 sites,
# 0.769x in MegatronBert's step with parity failed, H100 2026-12-06; its single-node pattern also took
# the attention region's final cast first, so the attention region matched nowhere).
COPY_TARGETS = VIEW_TARGETS + ("prims.convert_element_type.default", "aten.clone.default",
                               "aten._to_copy.default", "operator.getitem")


def nothing_to_fuse(pattern: Pattern) -> str | None:
    """Why a region offers nothing to fuse (every node a copy, :data:`COPY_TARGETS`), or None."""
    if all(n.target in COPY_TARGETS for n in pattern.nodes):
        ops = sorted({n.target.split(".")[1] for n in pattern.nodes})
        return (f"nothing to fuse: the region only copies ({', '.join(ops)}); Inductor's kernel is that copy "
                "already, and a one-op pattern would take nodes of larger regions first")
    return None


def prepare(pattern: Pattern) -> Pattern:
    """The region pattern with its input views taken out and its random shapes tied to inputs.

    Parameters
    ----------
    pattern : Pattern
        A region pattern (``RegionPattern.pattern``).

    Returns
    -------
    Pattern
        The same id and occurrences (their ``input_meta`` now the views' metas); nodes renumbered.

    Raises
    ------
    Unsupported
        A random op whose shape no input has.
    """
    return _prepare(pattern)[0]


def _prepare(pattern: Pattern) -> tuple[Pattern, dict[int, int]]:
    """:func:`prepare`, and where each kept node of ``pattern`` went (old index -> new index)."""
    nodes = list(pattern.nodes)
    occs = list(pattern.occurrences)
    index = {j: j for j in range(len(nodes))}
    for j in reversed(range(len(nodes))):
        k = _hoistable_view(nodes, j)
        if k is None or j in pattern.all_outputs:
            continue  # a view the region outputs is read outside it: it stays (and the lowering refuses it)
        shape = nodes[j].args[1]
        occs = [replace(o, input_meta=_view_meta(o.input_meta, k, shape)) for o in occs]
        nodes, remap = _drop(nodes, j, {"input": k})
        index = {old: remap[new] for old, new in index.items() if new in remap}
        pattern = replace(pattern, outputs=tuple(remap[o] for o in pattern.outputs),
                          extra_outputs=tuple(remap[o] for o in pattern.extra_outputs))
    metas = next((o.input_meta for o in occs if all(m is not None for m in o.input_meta)), ())
    for j, node in enumerate(nodes):
        if node.target == SEED_TARGET and isinstance(node.args[1], dict) and set(node.args[1]) == {"const"}:
            nodes[j] = node = replace(node, args=(node.args[0], {"int_const": node.args[1]["const"]}))
        if node.target == RANDOM_TARGET and isinstance(node.args[0], (list, tuple)):
            k = next((k for k, m in enumerate(metas) if list(m.shape) == list(node.args[0])), None)
            if k is None:
                raise Unsupported(f"inductor_random of shape {list(node.args[0])}: no input has that shape")
            nodes[j] = replace(node, args=({"shape_of": k},) + tuple(node.args[1:]))
        if node.target in SHAPED and metas:
            nodes[j] = _tie_shape(node, [list(m.shape) for m in metas])
        if node.target in VIEW_TARGETS and metas:
            seeds = {n.args[0]["input"] for n in nodes if n.target == SEED_TARGET and isinstance(n.args[0], dict)
                     and "input" in n.args[0]}
            _check_rows(node, [m for k, m in enumerate(metas) if k not in seeds])
            nodes[j] = _tie_reshape(node, [list(m.shape) for m in metas])
    return replace(pattern, nodes=tuple(nodes), occurrences=tuple(occs)), index


def shared_outputs(pattern: Pattern) -> tuple[int, ...]:
    """The nodes of the prepared region (:func:`prepare`) that another Inductor kernel also reads.

    Inductor recomputes a cheap producer in every kernel that reads it, so a node of one region
    can be read outside it without leaving its kernel: t5's relu, read by its gradient mask
    ``le(relu, 0)`` in another kernel; the attention regions' position-bias cast and ``full``
    constants, read by every layer. In the FX graph such a node has users outside the region, and
    ``register_replacement`` matches an interior pattern node only with exactly its traced users:
    the candidate's ``search`` returns these nodes too (a pattern output may have any users) and
    its ``replacement`` recomputes them from the region's inputs, outside the kernel, with the ops
    that computed them (their outside readers see the same values, computed as Inductor did).

    A node is shared when, in an occurrence, the kernel map (``Occurrence.node_kernels``) puts it
    in a kernel other than the region's own that holds none of its readers inside the pattern. A
    view (the fused op's outputs are no aliases), a node already an output and a node whose
    recomputation needs a random op or a reduction (:func:`recomputed_nodes`) are not listed:
    such a region still does not match where the node is read outside.

    Parameters
    ----------
    pattern : Pattern
        A region pattern (``RegionPattern.pattern``), not yet prepared.

    Returns
    -------
    tuple of int
        Indices into the prepared pattern's nodes, ascending.
    """
    prepared, index = _prepare(pattern)
    out = []
    for j in sorted(_read_elsewhere(pattern)):
        if j not in index or j in pattern.all_outputs:
            continue
        k = index[j]
        if prepared.nodes[k].category == "view" or not _recomputable(prepared.nodes, k):
            continue
        out.append(k)
    return tuple(out)


def recomputed_nodes(nodes: Sequence[PatternNode], roots: Iterable[int]) -> tuple[int, ...]:
    """``roots`` and every pattern node they depend on (the nodes a recomputation of them runs), ascending."""
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        j = stack.pop()
        if j in seen:
            continue
        seen.add(j)
        stack.extend(r["node"] for r in _refs(nodes[j]) if set(r) == {"node"})
    return tuple(sorted(seen))


def _recomputable(nodes: Sequence[PatternNode], j: int) -> bool:
    """Whether node ``j`` can be recomputed from the region's inputs by cheap ops: no random op (the
    kernel draws those), no reduction and no multi-output op among the nodes it depends on."""
    return not any(nodes[i].category in ("random", "reduction") or nodes[i].target in MULTI_OUTPUT_TARGETS
                   or nodes[i].target == "operator.getitem" for i in recomputed_nodes(nodes, [j]))


MULTI_OUTPUT_TARGETS = ("prims.prepare_softmax_online.default",)


def _read_elsewhere(pattern: Pattern) -> set[int]:
    """Pattern nodes that a kernel other than the region's own reads (see :func:`shared_outputs`)."""
    users: dict[int, list[int]] = {j: [] for j in range(len(pattern.nodes))}
    for u, node in enumerate(pattern.nodes):
        for r in _refs(node):
            if set(r) == {"node"}:
                users[r["node"]].append(u)
    out: set[int] = set()
    for occ in pattern.occurrences:
        if len(occ.node_kernels) != len(pattern.nodes):
            continue
        own = {k.name for k in occ.kernels}

        def holders(u: int) -> set[str]:  # a view or getitem without a kernel lives where its readers do
            ks = set(occ.node_kernels[u])
            return ks if ks else set().union(*(holders(w) for w in users[u]))

        for j in range(len(pattern.nodes)):
            readers = set().union(*(holders(u) for u in users[j]))
            if set(occ.node_kernels[j]) - own - readers:
                out.add(j)
    return out


# ops whose literal shape argument is tied to the inputs' (position of the shape argument)
SHAPED = {"aten.full.default": 0, "aten.expand.default": 1}


def _tie_shape(node: PatternNode, shapes: list[list[int]]) -> PatternNode:
    """``node`` with its literal shape tied to the inputs' shapes (and ``full``'s device to an input's)."""
    pos = SHAPED[node.target]
    args, kwargs = list(node.args), dict(node.kwargs)
    shape = list(args[pos]) if len(args) > pos and isinstance(args[pos], (list, tuple)) else None
    if shape is None:
        return node
    whole = next((k for k, s in enumerate(shapes) if s == shape and shape), None)
    if whole is not None:
        args[pos] = {"shape_of": whole}
    else:
        args[pos] = [tie_size(s, d, len(shape), shapes) for d, s in enumerate(shape)]
    if "device" in kwargs:
        kwargs["device"] = {"device_of": whole if whole is not None else 0}
    return replace(node, args=tuple(args), kwargs=kwargs)


def _check_rows(node: PatternNode, metas: Sequence) -> None:
    """``Unsupported`` unless the reshape's target holds the rows' elements in their order: the inputs
    (``metas``: the dropout seed vectors, which ``inductor_lookup_seed`` reads, left out by the caller)
    broadcast to one row space and the target merges or splits only its leading dims (gpt2's
    ``[8192, 3072]`` gradient viewed ``[16, 512, 3072]`` beside a ``[16, 512, 3072]`` input has no one
    row space)."""
    import math

    from miner.rules.contract import same_layout, row_shape

    shapes = [tuple(m.shape) for m in metas]
    full = row_shape(shapes)
    target = list(node.args[1]) if len(node.args) > 1 and isinstance(node.args[1], (list, tuple)) else None
    if full is None or target is None or not all(isinstance(s, int) for s in (*full, *target)):
        raise Unsupported(f"{node.target} of a computed value where the inputs have no one row space "
                          f"({' '.join(str(list(s)) for s in shapes)})")
    if -1 in target:
        known = math.prod(s for s in target if s != -1)
        target = [math.prod(full) // known if s == -1 else s for s in target]
    if not same_layout(tuple(target), tuple(full)):
        raise Unsupported(f"{node.target} to {list(node.args[1])} changes the rows {list(full)} (only leading dims "
                          f"may merge or split)")


def _tie_reshape(node: PatternNode, shapes: list[list[int]]) -> PatternNode:
    """A reshape of a computed value (``[16, 24, 512, 512] -> [-1, 512, 512]``) with its sizes tied to the
    inputs' dims from the right: the kernel computes in the rows' row-major order, so a reshape it can
    take keeps the trailing dims and merges or splits leading ones (``-1`` stays); each size becomes the
    input dim at the same distance from the end (``{"dim_of": [k, e]}``), else stays literal."""
    args = list(node.args)
    shape = list(args[1]) if len(args) > 1 and isinstance(args[1], (list, tuple)) else None
    if shape is None:
        return node
    tied = []
    for i, s in enumerate(shape):
        back = len(shape) - 1 - i
        k = next((k for k, sh in enumerate(shapes) if isinstance(s, int) and s > 1 and len(sh) > back
                  and sh[len(sh) - 1 - back] == s), None)
        tied.append(s if k is None else {"dim_of": [k, len(shapes[k]) - 1 - back]})
    loose = [i for i, s in enumerate(tied) if isinstance(s, int) and s > 1]
    if len(loose) == 1 and -1 not in tied:  # one merged leading size ([8192, 1536] of [16, 512, 1536]):
        tied[loose[0]] = -1  # the reshape infers it from the elements, at any batch
    args[1] = tied
    return replace(node, args=tuple(args))


def tie_size(s: Any, d: int, rank: int, shapes: list[list[int]]) -> Any:
    """A size as ``{"dim_of": [k, e]}``: input ``k`` of the same rank with ``s`` at ``d``, else the
    first input dim of size ``s``; -1, 0, 1 and sizes no input has stay literal."""
    if not isinstance(s, int) or isinstance(s, bool) or s <= 1:
        return s
    for k, shape in enumerate(shapes):
        if len(shape) == rank and shape[d] == s:
            return {"dim_of": [k, d]}
    for k, shape in enumerate(shapes):
        if s in shape:
            return {"dim_of": [k, shape.index(s)]}
    return s


def column_inputs(pattern: Pattern) -> tuple[int, ...]:
    """Float inputs observed only as per-column vectors (``[N]``, a norm's weight): the one-pass
    kernel reads them once per program (``X<k>_COL``, decided at launch from the strides)."""
    out = []
    for k in range(pattern.n_inputs):
        metas = [o.input_meta[k] for o in pattern.occurrences if k < len(o.input_meta) and o.input_meta[k] is not None]
        if metas and all(len(m.shape) == 1 and m.dtype != "int64" for m in metas):
            out.append(k)
    return tuple(out)


def _hoistable_view(nodes: list[PatternNode], j: int) -> int | None:
    """The input ``k`` when node ``j`` is a view of input ``k`` that nothing else reads."""
    node = nodes[j]
    if node.target not in VIEW_TARGETS or not node.args or not (isinstance(node.args[0], dict)
                                                                and set(node.args[0]) == {"input"}):
        return None
    k = node.args[0]["input"]
    readers = [i for i, n in enumerate(nodes) if i != j and {"input": k} in _refs(n)]
    return None if readers else k


def _refs(node: PatternNode) -> list[Any]:
    out = []

    def walk(v):
        if isinstance(v, dict):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
    walk(list(node.args))
    walk(list(node.kwargs.values()))
    return out


def _drop(nodes: list[PatternNode], j: int, by: dict) -> tuple[list[PatternNode], dict[int, int]]:
    """Nodes without node ``j``; references to it become ``by``, later nodes renumbered."""
    remap = {i: (i if i < j else i - 1) for i in range(len(nodes)) if i != j}

    def sub(v):
        if isinstance(v, dict) and set(v) == {"node"}:
            return dict(by) if v["node"] == j else {"node": remap[v["node"]]}
        if isinstance(v, list):
            return [sub(x) for x in v]
        if isinstance(v, tuple):
            return tuple(sub(x) for x in v)
        return v
    out = [replace(n, args=tuple(sub(a) for a in n.args), kwargs={k: sub(v) for k, v in n.kwargs.items()})
           for i, n in enumerate(nodes) if i != j]
    return out, remap


def _view_meta(metas: tuple, k: int, shape: list) -> tuple:
    """``metas`` with input ``k`` replaced by its view to ``shape`` (row-major when it was contiguous)."""
    m = metas[k]
    if m is None:
        return metas
    numel = 1
    for s in m.shape:
        numel *= s
    known = 1
    for s in shape:
        known *= s if s != -1 else 1
    new = tuple(numel // known if s == -1 else s for s in shape)
    stride = contiguous_strides(new) if m.contiguous is not False else None
    return metas[:k] + (TensorSpec(new, m.dtype, stride, m.device),) + metas[k + 1:]


__all__ = ["prepare", "is_region", "column_inputs", "recomputed_nodes", "shared_outputs", "tie_size",
           "VIEW_TARGETS"]
