"""The compute-once rule: which small, expensive values Inductor should compute once, not per element.

Inductor inlines a pointwise value into every kernel that reads it unless a heuristic realizes it
(``ir.StorageBox.should_realize_on_reuse``: on CUDA, many reads or a large inner function; the
transcendental-op rule applies to CPU kernels only). A small value read by a much larger kernel (a
broadcast) is then recomputed per element of that kernel:

- llama's RoPE ``cos``/``sin`` table (``[1, 512, 64]``) in each of the 32 RoPE kernels of a 16-layer
  forward, per element of the ``[16, 32, 512, 64]`` q or k it multiplies: two libdevice
  transcendentals per element where a load of a 128 KiB table would do;
- t5's relative-position bias: the lookup ``embedding(bias_table, bucket)`` (``[512, 512, 12]``) inside
  each decoder layer's attention kernel, per element of ``[16, 12, 512, 512]``: an index load and a
  gather per element where a load of the looked-up table would do.

The rule (:func:`check`, the same for mining and at compile time: it reads a graph through
``node(name) -> NodeRecord``, a ``CapturedGraph`` or ``miner.rules.graph.FxNodes``) takes a value when

- its op is expensive (:data:`FAMILIES`): a transcendental (:data:`HEAVY`), a lookup (:data:`LOOKUP`),
  an integer division (:data:`INT_DIV`), or the end of a chain of at least :data:`CHAIN` comparisons
  and selects (:data:`COMPARE`, counted through the value's own small computation), with a known,
  static output size;
- walking its users through nodes smaller than :data:`RATIO` times its size (the rest of the small
  value's computation: scaling, dtype casts, views), at least one pointwise node or lookup produces
  :data:`RATIO` times its elements or more (a broadcast consumer, into which Inductor would inline the
  value and recompute it per element; a value as large as its consumers, e.g. bert's GELU ``erf`` in
  the backward, is recomputed more cheaply than written and read back: declined with that reason);
- no later step of that small computation is itself an expensive op: the last one is the value to
  compute once (one buffer for the whole small computation, not one per step);
- it does not follow a reduction within that small computation (a log-sum-exp's ``log``: the
  reducing kernel keeps the per-row value in registers and recomputes nothing per element).

Inductor realizes a value once when it passes through ``prims.inductor_force_stride_order``
(:data:`FORCE`; its lowering copies an unrealized input into a buffer,
``ir.ExternKernel.require_strides``): that is what the rewrite puts after an accepted value. A value
Inductor realizes anyway is left as it is (the identity copies nothing). Mining the captured graphs for
such values, with the kernels they were recomputed in, is ``miner.mine.recompute``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HEAVY = frozenset({"aten.sin.default", "aten.cos.default", "aten.tan.default", "aten.exp.default",
                   "aten.exp2.default", "aten.log.default", "aten.tanh.default", "aten.erf.default",
                   "aten.sigmoid.default"})
LOOKUP = frozenset({"aten.embedding.default", "aten.gather.default", "aten.index.Tensor",
                    "aten.index_select.default"})
INT_DIV = frozenset({"aten.div.Tensor_mode", "aten.div.Scalar_mode", "aten.floor_divide.default",
                     "aten.remainder.Tensor", "aten.remainder.Scalar", "aten.fmod.Tensor", "aten.fmod.Scalar"})
COMPARE = frozenset({f"aten.{op}.{o}" for op in ("lt", "le", "gt", "ge", "eq", "ne") for o in ("Tensor", "Scalar")}
                    | {"aten.where.self", "aten.minimum.default", "aten.maximum.default", "aten.clamp.default",
                       "aten.clamp_min.default", "aten.clamp_max.default", "aten.logical_and.default",
                       "aten.logical_or.default", "aten.logical_not.default"})
# The candidate families (one compute-once candidate each): the transcendental tables (llama's RoPE) and
# the index tables (lookups, integer division, comparison chains: t5's relative-position bucket and bias).
FAMILIES = {"transcendental": HEAVY, "table": LOOKUP | INT_DIV | COMPARE}
EXPENSIVE = HEAVY | LOOKUP | INT_DIV | COMPARE
# the input whose size is the value's (a lookup's index); the pattern's ``x0`` (0 where not listed)
KEY_INPUT = {"aten.embedding.default": 1, "aten.gather.default": 2, "aten.index_select.default": 2}
CHAIN = 4  # a comparison or select is expensive at the end of this many of them (its own included)
RATIO = 8  # a consumer kernel must do at least this many times the value's elements
FORCE = "prims.inductor_force_stride_order.default"  # what the rewrite puts after the value


def family(target: str) -> str | None:
    """The :data:`FAMILIES` entry ``target`` belongs to (None: no expensive op)."""
    return next((f for f, ts in FAMILIES.items() if target in ts), None)


def static_numel(shape) -> int | None:
    """The number of elements of ``shape``; None when a size is symbolic."""
    return math.prod(shape) if all(isinstance(s, int) for s in shape) else None


@dataclass(frozen=True)
class Decision:
    """Whether value ``node`` should be computed once (``ok``), and why not; ``applies``: an expensive
    value at all (:data:`EXPENSIVE`, a comparison at the end of a chain); ``consumers``: its broadcast
    consumers."""

    node: str
    reasons: tuple[str, ...]
    applies: bool = True
    consumers: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.applies and not self.reasons


MAX_DEPTH = 6  # users walked from a value (the small table's own computation is a few ops: scale, cast, view)


def own_computation(graph, name: str) -> list:
    """The records of the small computation ending at ``name``: it and its producers no larger than it,
    walked up :data:`MAX_DEPTH` steps (a reduction is included but not walked through)."""
    rec = graph.node(name)
    numel = static_numel(rec.meta[0].shape) if rec.meta else None
    seen, level, out = {name}, [name], []
    for _ in range(MAX_DEPTH + 1):
        nxt = []
        for cur in level:
            r = graph.node(cur)
            out.append(r)
            if r.category == "reduction":
                continue
            for _, p in r.inputs():
                if p in seen:
                    continue
                seen.add(p)
                pr = graph.node(p)
                n = static_numel(pr.meta[0].shape) if pr.meta else None
                if pr.op == "call_function" and n is not None and numel is not None and n <= numel:
                    nxt.append(p)
        level = nxt
    return out


def chain_length(graph, name: str) -> int:
    """How many :data:`COMPARE` and :data:`INT_DIV` ops lie in the small computation ending at ``name``
    (its own op included, :func:`own_computation`)."""
    return sum(r.target in COMPARE or r.target in INT_DIV for r in own_computation(graph, name))


def expensive(graph, name: str) -> bool:
    """Whether node ``name`` is an expensive op (:data:`EXPENSIVE`; a comparison or select only at the end
    of a chain of :data:`CHAIN`) with a known output."""
    rec = graph.node(name)
    if rec.op != "call_function" or rec.target not in EXPENSIVE or not rec.meta:
        return False
    return rec.target not in COMPARE or chain_length(graph, name) >= CHAIN


def reduced_in(graph, name: str) -> str | None:
    """The node of ``name``'s own computation (:func:`own_computation`) that reduces a larger tensor: a
    reduction, or an op (not a view; of a lookup, its index) reading a producer larger than ``name``
    (``prepare_softmax_online``); None when there is none."""
    rec = graph.node(name)
    numel = static_numel(rec.meta[0].shape) if rec.meta else None
    for r in own_computation(graph, name):
        if r.category == "reduction":
            return r.name
        if r.category == "view" or numel is None:
            continue
        for pos, p in r.inputs():
            if r.target in LOOKUP and pos != KEY_INPUT.get(r.target, 0):
                continue  # the table a lookup reads from may be any size: it gathers, it does not reduce
            pm = graph.node(p).meta
            n = static_numel(pm[0].shape) if pm else None
            if n is not None and n > numel:
                return r.name
    return None


def _consumes(use) -> bool:
    """Whether node record ``use`` would inline a value it reads (a pointwise node, a lookup's gather)."""
    return use.category == "pointwise" or use.target in LOOKUP


def check(graph, name: str) -> Decision:
    """The rule on value ``name`` of ``graph`` (anything with ``node(name) -> NodeRecord``). Never raises
    on an op it does not know: such a user is simply not a broadcast consumer."""
    rec = graph.node(name)
    if not expensive(graph, name):
        return Decision(name, (f"{rec.target} is no expensive op",), applies=False)
    if any(graph.node(u).target == FORCE for u in rec.users):
        return Decision(name, ("already computed once",), applies=False)  # the pass's second slot
    numel = static_numel(rec.meta[0].shape)
    if numel is None:
        return Decision(name, (f"symbolic size {list(rec.meta[0].shape)}",))
    reduced = reduced_in(graph, name)
    if reduced is not None:
        return Decision(name, (f"a value per row of reduction {reduced}: the kernel that reduces keeps it in "
                               f"registers, it recomputes nothing per element",))
    consumers, later, seen, level, largest = [], [], {name}, [name], 0
    for _ in range(MAX_DEPTH):
        nxt = []
        for cur in level:
            for u in graph.node(cur).users:
                if u in seen:
                    continue
                seen.add(u)
                use = graph.node(u)
                n = static_numel(use.meta[0].shape) if use.meta else None
                if n is None:
                    continue  # the output node, a symbolic size: no consumer to count
                largest = max(largest, n)
                if n >= RATIO * numel:
                    if _consumes(use):
                        consumers.append(u)
                else:
                    nxt.append(u)  # still the small value's own computation
                    if expensive(graph, u):
                        later.append(u)
        level = nxt
    if not consumers:
        why = (f"no pointwise broadcast consumer (its users {RATIO}x its size or larger are no pointwise ops)"
               if largest >= RATIO * numel else
               f"as large as its consumers ({numel} vs {largest} elements): recomputing is cheaper than a "
               f"round trip through memory")
        return Decision(name, (why,))
    if later:
        return Decision(name, (f"a later step of the same small computation ({later[0]}) is the value to compute "
                               f"once",), consumers=tuple(consumers))
    return Decision(name, (), consumers=tuple(consumers))
