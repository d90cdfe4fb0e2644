"""The compute-once rule: which small transcendental values Inductor should compute once, not per kernel.

Inductor inlines a pointwise value into every kernel that reads it unless a heuristic realizes it
(``ir.StorageBox.should_realize_on_reuse``: on CUDA, many reads or a large inner function; the
transcendental-op rule applies to CPU kernels only). A value such as llama's RoPE ``cos``/``sin``
table (``[1, 512, 64]``, computed from the positions and the inverse frequencies) is then recomputed
in each of the 32 RoPE kernels of a 16-layer forward, per element of the ``[16, 32, 512, 64]`` q or k
it multiplies: two libdevice transcendentals per element where a load of a 128 KiB table would do.

The rule (:func:`check`, the same for mining and at compile time: it reads a graph through
``node(name) -> NodeRecord``, a ``CapturedGraph`` or ``miner.rules.graph.FxNodes``) takes a value when

- its op is a transcendental (:data:`HEAVY`) with a known, static output size;
- walking its users through nodes smaller than :data:`RATIO` times its size (the rest of the small
  table's computation: scaling, dtype casts, views), at least two pointwise nodes each produce
  :data:`RATIO` times its elements or more (broadcast consumers, each of which Inductor would inline
  the value into and recompute it per element; a value as large as its consumers, e.g. bert's GELU
  ``erf`` in the backward, is recomputed more cheaply than written and read back: declined with
  that reason).

Inductor realizes a value once when it passes through ``prims.inductor_force_stride_order``
(:data:`FORCE`; its lowering copies an unrealized input into a buffer,
``ir.ExternKernel.require_strides``): that is what the rewrite puts after an accepted value.
Mining the captured graphs for such values is ``miner.mine.recompute``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HEAVY = frozenset({"aten.sin.default", "aten.cos.default", "aten.tan.default", "aten.exp.default",
                   "aten.exp2.default", "aten.log.default", "aten.tanh.default", "aten.erf.default",
                   "aten.sigmoid.default"})
RATIO = 8  # a consumer kernel must do at least this many times the value's elements
FORCE = "prims.inductor_force_stride_order.default"  # what the rewrite puts after the value


def static_numel(shape) -> int | None:
    """The number of elements of ``shape``; None when a size is symbolic."""
    return math.prod(shape) if all(isinstance(s, int) for s in shape) else None


@dataclass(frozen=True)
class Decision:
    """Whether value ``node`` should be computed once (``ok``), and why not; ``applies``: a static
    :data:`HEAVY` value at all; ``consumers``: its broadcast consumers."""

    node: str
    reasons: tuple[str, ...]
    applies: bool = True
    consumers: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.applies and not self.reasons


MAX_DEPTH = 6  # users walked from a value (the small table's own computation is a few ops: scale, cast, view)


def check(graph, name: str) -> Decision:
    """The rule on value ``name`` of ``graph`` (anything with ``node(name) -> NodeRecord``). Never raises
    on an op it does not know: such a user is simply not a broadcast consumer."""
    rec = graph.node(name)
    if rec.op != "call_function" or rec.target not in HEAVY or not rec.meta:
        return Decision(name, (f"{rec.target} is no transcendental",), applies=False)
    if any(graph.node(u).target == FORCE for u in rec.users):
        return Decision(name, ("already computed once",), applies=False)  # the pass's second slot
    numel = static_numel(rec.meta[0].shape)
    if numel is None:
        return Decision(name, (f"symbolic size {list(rec.meta[0].shape)}",))
    consumers, seen, level, largest = [], {name}, [name], 0
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
                    if use.category == "pointwise":
                        consumers.append(u)
                else:
                    nxt.append(u)  # still the small value's own computation
        level = nxt
    if len(consumers) < 2:
        why = (f"{len(consumers)} broadcast consumer(s): nothing to share" if largest >= RATIO * numel else
               f"as large as its consumers ({numel} vs {largest} elements): recomputing is cheaper than a "
               f"round trip through memory")
        return Decision(name, (why,), consumers=tuple(consumers))
    return Decision(name, (), consumers=tuple(consumers))
