"""A dropout mask the ``philox4_dropout_bits`` knob draws, given back to the dropout region that would draw it.

The knob (``miner.check.mask_bits.DrawDropoutBits``, a joint-graph pass) replaces each seeded keep mask
``gt(inductor_random(shape, inductor_lookup_seed(seeds, k), "rand"), p)`` with ``unpack(bits)``, ``bits =
miner::philox4_keep_bits(seeds, k, numel, p)``, so the backward saves one bit per element. After the partition
the forward graph holds ``bits`` (a graph output: the saved tensor) and ``unpack(bits)`` read by the forward's
dropout. A dropout region (``miner generate --regions``) matches Inductor's draw, which is gone: under the knob
no region fires, and the knob's one kernel drawing every mask (``fill_keep_bits``: Philox arithmetic in a kernel
of its own, 4.5 ms of t5's step on an H100) replaces the draws a region hides under its memory traffic.

:func:`fold` gives each such mask its draw back before the fusions' patterns run, with the saved bits taken from
the mask: ``mask = gt([convert_element_type](inductor_random(shape, inductor_lookup_seed(seeds, k), "rand")),
p)`` read by the forward's users, and ``pack(mask)`` where the graph returned ``bits``. A region drawing the
knob's stream (``RNG == "philox4"``: ``u(L)`` word ``L % 4`` of the Philox call at counter ``L // 4``, kept where
``u > p`` in float32, the bf16 cast elided: the numbers ``philox4_keep_bits`` draws) may then take the draw: its
mask output is what the backward's bits are packed from, so the forward and the backward read one mask
whatever the region drew (``miner.runtime.rewrite.match_reasons`` declines a kernel drawing another stream). Under the
``philox4_dropout_bits_in_region`` knob (its op's node marked :data:`miner.runtime.bits.IN_KERNEL`) the pack is
marked too, and ``miner.runtime.rewrite.pack_in_kernel`` has the region's kernel store the bits itself.
:func:`settle`, after the patterns, puts back every draw no region took: ``bits`` drawn by the op, the forward
reading ``unpack(bits)``, exactly the graph the knob made.

The draw is given back only where the forward graph holds ``bits`` as the knob left it: read by the graph's
output and by one unpack whose result the forward reads, of a static shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from miner.runtime import bits

aten, prims = torch.ops.aten, torch.ops.prims


@dataclass(frozen=True)
class Fold:
    """One mask given back its draw: the op's arguments, the draw's nodes and the pack the graph returns."""

    op: object  # torch.ops.miner.philox4_keep_bits.default, as the knob's node called it
    args: tuple  # its (seeds, k, numel, p)
    val: torch.Tensor  # its fake output (the saved bits)
    shape: tuple[int, ...]
    cast: torch.dtype | None  # the dtype the draw was cast to before the comparison (autocast: bf16)
    draw: torch.fx.Node  # inductor_random: gone once a region took the draw
    mask: torch.fx.Node  # gt(...)
    packed: torch.fx.Node  # pack(mask), where the graph returned the op's bits


def _is_keep_bits(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.meta.get(bits.TAG) == bits.KEEP_BITS


def _unpacked_of(kb: torch.fx.Node) -> list[torch.fx.Node]:
    """The results of ``unpack(kb)`` in the graph (nodes tagged ``unpacked`` read from ``kb`` through unpack nodes)."""
    out, stack, seen = [], list(kb.users), set()
    while stack:
        n = stack.pop()
        if n in seen or n.op != "call_function" or n.meta.get(bits.TAG) not in (bits.UNPACK, bits.UNPACKED):
            continue
        seen.add(n)
        if n.meta.get(bits.TAG) == bits.UNPACKED:
            out.append(n)
        else:
            stack.extend(n.users)
    return out


def _foldable(kb: torch.fx.Node) -> torch.fx.Node | None:
    """The one unpacked mask of ``kb`` the forward reads, where ``kb`` is as the knob left it; else None."""
    if not all(u.op == "output" or u.meta.get(bits.TAG) == bits.UNPACK for u in kb.users):
        return None
    read = [u for u in _unpacked_of(kb) if u.users]
    if len(read) != 1 or not any(u.op == "output" for u in kb.users):
        return None
    val = read[0].meta.get("val")
    if not (isinstance(val, torch.Tensor) and val.dtype == torch.bool and all(isinstance(s, int) for s in val.shape)):
        return None
    return read[0]


def _draw(seeds: torch.Tensor, index: int, shape: list[int], cast, p: float) -> torch.Tensor:
    """Inductor's decomposition of a seeded dropout's keep mask (what a region's pattern matches)."""
    u = prims.inductor_random.default(shape, prims.inductor_lookup_seed.default(seeds, index), "rand")
    if cast is not None:
        u = prims.convert_element_type.default(u, cast)
    return aten.gt.Scalar(u, p)


def fold(graph: torch.fx.Graph) -> list[Fold]:
    """Give every mask the knob drew its draw back, the saved bits packed from it (module docstring)."""
    out = []
    for kb in [n for n in graph.nodes if _is_keep_bits(n)]:
        unpacked = _foldable(kb)
        if unpacked is None:
            continue
        seeds, index, numel, p = kb.args
        shape, cast = tuple(unpacked.meta["val"].shape), kb.meta.get(bits.DRAW_CAST)
        if math.prod(shape) != numel:
            continue
        mask = bits.insert_traced(graph, lambda s: _draw(s, index, list(shape), cast, p), [seeds], after=unpacked,
                                  tags=(bits.DRAWN, bits.DRAWN))
        packed = bits.insert_traced(graph, bits.pack, [mask], after=mask, tags=(bits.REPACK, bits.REPACK))
        if kb.meta.get(bits.IN_KERNEL):  # the knob asks the region's kernel to store these bits itself
            packed.meta[bits.IN_KERNEL] = True
        unpacked.replace_all_uses_with(mask)
        kb.replace_all_uses_with(packed, delete_user_cb=lambda u: u.op == "output")
        bits.erase_unused(unpacked)
        draw = next(n for n in _chain(mask) if n.target is prims.inductor_random.default)
        out.append(Fold(kb.target, (seeds, index, numel, p), kb.meta["val"], shape, cast, draw, mask, packed))
        if not kb.users:
            graph.erase_node(kb)
    return out


def _chain(mask: torch.fx.Node) -> list[torch.fx.Node]:
    """``mask`` and the nodes :func:`fold` inserted for it, back to the seed lookup."""
    out, stack = [], [mask]
    while stack:
        n = stack.pop()
        if n.op == "call_function" and n.meta.get(bits.TAG) == bits.DRAWN and n not in out:
            out.append(n)
            stack.extend(n.all_input_nodes)
    return out


def settle(graph: torch.fx.Graph, folds: list[Fold]) -> int:
    """Put back every fold whose draw no region took (the op draws the bits, the forward reads ``unpack(bits)``);
    returns how many draws regions took."""
    present = set(graph.nodes)
    taken = 0
    for f in folds:
        if f.draw not in present:
            taken += 1
            continue
        with graph.inserting_before(f.mask):
            kb = graph.call_function(f.op, f.args)
        kb.meta.update({"val": f.val, bits.TAG: bits.KEEP_BITS, bits.DRAW_CAST: f.cast})
        unpacked = bits.insert_traced(graph, lambda b: bits.unpack(b, f.shape), [kb], after=kb,
                                      tags=(bits.UNPACK, bits.UNPACKED))
        f.packed.replace_all_uses_with(kb)
        bits.erase_unused(f.packed, (bits.REPACK,))
        f.mask.replace_all_uses_with(unpacked)
        bits.erase_unused(f.mask, (bits.DRAWN,))
    return taken
