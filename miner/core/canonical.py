"""A pattern's canonical form: the dims rule, the identity string, the id and the op summary.

Dims are canonical: a ``dim`` argument (reductions, softmax) names its dims negatively,
counted from the last (``dim=1`` of a 2-d operand is ``-1``), so ``F.log_softmax(x, dim=-1)``
and ``dim=1`` are one pattern. :func:`canonical_dims` is the one rule; mining applies it to
every node it templates (``miner.mine.canon.template_of``), generation to the nodes it renders
(:func:`canonical_nodes`), and the rewrite to the graph before matching
(``miner.runtime.rewrite.canonicalize_dims``).

:func:`canonical_form` is the exact JSON string of a pattern's structure and :func:`pattern_id`
its id (``"p"`` + 10 hex digits of its SHA-1). The records themselves (``PatternNode``,
``Pattern``, ...) live in ``miner.core.pattern``, which re-exports every name here.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    from miner.core.pattern import PatternNode


DIM_TARGETS = ("aten._softmax.default", "aten._log_softmax.default", "aten._softmax_backward_data.default",
               "aten._log_softmax_backward_data.default")  # non-reductions whose dim is canonical too


def canonical_dims(dims: Any, ndim: int | None) -> Any:
    """``dims`` (an int, or a list/tuple of ints) counted from the last dim of an ``ndim``-d operand.

    ``canonical_dims(1, 2) == -1``, ``canonical_dims([2], 3) == [-1]``; negative dims, other
    values and an unknown ``ndim`` come back unchanged (a 0-d operand's dims stay as they are).
    """
    if not ndim or isinstance(dims, bool):
        return dims
    if isinstance(dims, int):
        return dims - ndim if 0 <= dims < ndim else dims
    if isinstance(dims, (list, tuple)) and all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        return type(dims)(canonical_dims(d, ndim) for d in dims)
    return dims


@lru_cache(maxsize=None)
def dim_position(target: str) -> tuple[int | None, str | None]:
    """(positional index, keyword) of the ``dim`` argument of ``target`` when its dims are canonical:
    reductions and :data:`DIM_TARGETS`; (None, None) otherwise."""
    from miner.core import ops

    if target not in DIM_TARGETS and ops.categorize_name(target) != "reduction":
        return None, None
    args = ops.schema_arguments(target) or ()
    for i, a in enumerate(args):
        if a.name == "dim":
            return (None if a.kwarg_only else i), "dim"
    return None, None


def with_canonical_dims(target: str, args: tuple, kwargs: dict, ndim: int | None) -> tuple[tuple, dict]:
    """``args`` / ``kwargs`` of a call of ``target`` on an ``ndim``-d operand, dims canonical."""
    pos, key = dim_position(target)
    if key is None or ndim is None:
        return args, kwargs
    if pos is not None and pos < len(args):
        args = args[:pos] + (canonical_dims(args[pos], ndim),) + args[pos + 1:]
    elif key in kwargs:
        kwargs = {**kwargs, key: canonical_dims(kwargs[key], ndim)}
    return args, kwargs


def canonical_nodes(nodes: Iterable[PatternNode], input_ranks: Iterable[int | None]) -> tuple[PatternNode, ...]:
    """Pattern nodes with canonical dims, given the rank of each ``{"input": k}``.

    Ranks propagate through the pattern: an op's operand is its first tensor argument; a
    reduction keeps its operand's rank (``keepdim``) or drops its dims; a getitem keeps its
    source's; anything else takes its operands' largest (broadcast) rank.
    """
    ranks_in = list(input_ranks)
    ranks: list[int | None] = []
    out = []

    def rank_of(v):
        if isinstance(v, dict) and set(v) == {"input"}:
            return ranks_in[v["input"]] if v["input"] < len(ranks_in) else None
        if isinstance(v, dict) and set(v) == {"node"}:
            return ranks[v["node"]]
        return None

    for node in nodes:
        refs = [a for a in node.args if isinstance(a, dict) and set(a) & {"input", "node"}]
        operand = rank_of(refs[0]) if refs else None
        args, kwargs = with_canonical_dims(node.target, tuple(node.args), dict(node.kwargs), operand)
        out.append(replace(node, args=args, kwargs=kwargs))
        if node.target == "operator.getitem" or node.category != "reduction":
            known = [r for r in (rank_of(a) for a in refs) if r is not None]
            ranks.append(operand if node.target == "operator.getitem" else (max(known) if known else None))
        else:
            pos, _ = dim_position(node.target)
            dims = args[pos] if pos is not None and pos < len(args) else kwargs.get("dim")
            keep = kwargs.get("keepdim", next((a for a in args[2:] if isinstance(a, bool)), False))
            n = len(dims) if isinstance(dims, (list, tuple)) and dims else (1 if isinstance(dims, int) else operand)
            ranks.append(None if operand is None else operand if keep else operand - (n or 0))
    return tuple(out)


def canonical_form(nodes: Iterable[PatternNode], n_inputs: int, n_consts: int) -> str:
    """Deterministic JSON string of a pattern's structure (its identity)."""
    body = {"nodes": [[n.target, _plain(n.args), {k: _plain(v) for k, v in sorted(n.kwargs.items())}]
                      for n in nodes],
            "n_inputs": n_inputs, "n_consts": n_consts}
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def pattern_id(canonical: str) -> str:
    """``"p"`` + 10 hex digits of SHA-1 of the canonical form."""
    return "p" + hashlib.sha1(canonical.encode()).hexdigest()[:10]


def short_name(target: str) -> str:
    """Readable op name: ``aten.sum.dim_IntList`` -> ``sum``, ``operator.getitem`` -> ``getitem``."""
    parts = target.split(".")
    if parts[0] == "operator":
        return parts[-1]
    return parts[1] if len(parts) > 1 else target


def ops_summary(nodes: Iterable[PatternNode]) -> str:
    """``"exp -> sum -> div"``: the compute ops in canonical order (views and getitem left out; ops of
    the fusable classes mining counts as compute, ``cat``, ``iota``, RNG..., shown)."""
    from miner.core.ops import fusable_extra
    return " -> ".join(n.short for n in nodes if n.is_compute or fusable_extra(n.target, n.category))


def _plain(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in sorted(v.items())}
    return v
