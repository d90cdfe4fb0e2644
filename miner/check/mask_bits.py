"""Bool masks saved for the backward as one bit per element (the ``pack_dropout_masks`` and
``pack_bool_masks`` knobs), or not saved at all (``recompute_dropout_masks``).

In training, Inductor's dropout draws ``keep = inductor_random(shape, seed) > p`` (a bool tensor) in
the forward and multiplies by it in both the forward and the backward, so AOTAutograd's partitioner
saves ``keep`` for the backward: one byte per element. :class:`PackDropoutMasks` is a joint-graph
pass (``torch._inductor.config.joint_custom_post_pass``, run on the joint forward+backward graph
before the min-cut partitioner decides what is saved): for each keep mask with backward users it
inserts ``bits = pack(keep)`` (uint8, eight elements per byte) and gives every user ``unpack(bits)``
instead, so the partitioner saves ``bits`` (an eighth of the bytes) and the backward recomputes
``unpack`` (pointwise). The unpack's nodes are tagged ``CheckpointPolicy.MUST_RECOMPUTE`` (as selective
activation checkpointing tags nodes): without it the min-cut's heuristics may save the unpacked bool
mask. The forward's users read ``unpack(bits)`` too: the partitioner may recompute a forward node in
the backward (a GELU's input ``keep * x``), and a recomputed copy reading ``keep`` would make it save
the bool mask after all. Every node the pass inserts carries a ``miner.runtime.bits`` tag, so that a
fusion pass can fold the forward's ``unpack(pack(mask))`` back to ``mask`` after the partition (the saved
bits stay): a dropout region's pattern reads the mask itself.

The random stream and the masks are unchanged, only the saved mask's format: the same ops on the same
values (bitwise-equal results with scalar C++ kernels on the CPU); kernels split differently around
the unpack may differ in the last bits where a vectorized and a scalar math function meet.

:class:`PackBoolMasks` does the same for every bool tensor the backward reads that does not depend on
the backward's inputs (the tangents) and has at least :data:`MIN_NUMEL` elements: the dropout keep masks
and, e.g., a ReLU's ``le(out, 0)`` that the partitioner computes in the forward and saves (t5's
feed-forward: one byte per element of ``[B, S, d_ff]`` per layer).

:class:`RecomputeDropoutMasks` saves no mask: each keep mask drawn by Inductor's own random op
(``prims.inductor_random(shape, seed, "rand")``, a function of the seed and the element's index only) is
tagged, with its draw (and the dtype cast autocast puts between them), ``MUST_RECOMPUTE``, and the seed it
was drawn from (``inductor_lookup_seed``: one int64) ``MUST_SAVE``; the partitioner then saves the seed and
the backward draws the same numbers again. A dropout region kernel drawing another stream does not match
such a mask: its seed is read outside the region, by the backward.
A mask drawn by ``aten.rand``/``rand_like`` (``fallback_random``) is left alone: a second call would draw
from the generator's next state, another mask. The same masks, the same values; a Philox draw per element
in the backward where the default reads a byte.

Both functions are plain aten ops over the mask flattened (padded with ``False`` to a multiple of 8);
bit ``k`` of byte ``i`` is element ``8 * i + k``. Masks with a symbolic element count are left alone.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import torch
import torch._inductor.inductor_prims  # noqa: F401  (registers prims.inductor_random)
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch.utils.checkpoint import CheckpointPolicy

from miner.runtime import bits as bits_tag
from miner.runtime.bits import pack, unpack

aten, prims = torch.ops.aten, torch.ops.prims

# The ops a keep mask is compared from: Inductor's own random draw (its decomposition of rand/rand_like)
# and the eager ones (``fallback_random``).
RANDOM_OPS = frozenset({prims.inductor_random.default, aten.rand.default, aten.rand_like.default})
COMPARISONS = frozenset({aten.gt.Scalar, aten.ge.Scalar, aten.lt.Scalar, aten.le.Scalar})
MIN_NUMEL = 1 << 12  # PackBoolMasks: smaller bool tensors are left alone (a pack and an unpack for a few bytes)


def keep_mask_chain(node: torch.fx.Node) -> tuple[torch.fx.Node, ...] | None:
    """``(draw, [cast,] node)`` where ``node`` compares a random draw with a constant into a bool tensor of a
    static element count: the draw itself, or the draw cast to another dtype (under autocast a bf16 dropout
    compares ``convert_element_type(draw, bf16)``); None otherwise."""
    val = node.meta.get("val")
    if not (node.op == "call_function" and node.target in COMPARISONS and isinstance(val, torch.Tensor)
            and val.dtype == torch.bool and isinstance(node.args[0], torch.fx.Node)
            and all(isinstance(s, int) for s in val.shape)):
        return None
    src = node.args[0]
    if src.target is prims.convert_element_type.default and isinstance(src.args[0], torch.fx.Node):
        return (src.args[0], src, node) if src.args[0].target in RANDOM_OPS else None
    return (src, node) if src.target in RANDOM_OPS else None


def is_keep_mask(node: torch.fx.Node) -> bool:
    """``node`` is a dropout keep mask (:func:`keep_mask_chain`)."""
    return keep_mask_chain(node) is not None


def forward_nodes(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The nodes the joint graph's forward outputs depend on (empty when ``graph`` has no tangents:
    an inference graph). The joint graph returns the forward outputs, then one gradient per primal."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if not any(n.name.startswith("tangents") for n in placeholders):
        return set()
    n_grads = sum(n.name.startswith("primals") for n in placeholders)
    outputs = torch.utils._pytree.arg_tree_leaves(*next(iter(graph.find_nodes(op="output"))).args)
    stack = [o for o in outputs[:len(outputs) - n_grads] if isinstance(o, torch.fx.Node)]
    seen: set[torch.fx.Node] = set()
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    return seen


def tangent_dependent(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The joint graph's nodes that depend on a tangent (the backward's own inputs): the backward proper."""
    stack = [n for n in graph.find_nodes(op="placeholder") if n.name.startswith("tangents")]
    seen: set[torch.fx.Node] = set()
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(u for u in n.users if u.op != "output")
    return seen


def is_saved_bool(node: torch.fx.Node, forward: set[torch.fx.Node], backward: set[torch.fx.Node]) -> bool:
    """``node`` is a bool tensor of a static element count of at least :data:`MIN_NUMEL`, computable in the
    forward (not in ``backward``: :func:`tangent_dependent`) and read on the backward's side (a user the
    forward outputs do not need, :func:`forward_nodes`: the backward, or a cast the backward reads)."""
    val = node.meta.get("val")
    return (node.op == "call_function" and node not in backward and isinstance(val, torch.Tensor)
            and val.dtype == torch.bool and all(isinstance(s, int) for s in val.shape)
            and val.numel() >= MIN_NUMEL and any(u not in forward for u in node.users))


def _pack_through_bits(graph: torch.fx.Graph, mask: torch.fx.Node) -> None:
    """Insert ``bits = pack(mask)`` and give every user of ``mask`` ``unpack(bits)`` (tagged to be recomputed)."""
    users = list(mask.users)
    shape = list(mask.meta["val"].shape)
    bits = bits_tag.insert_traced(graph, pack, [mask], after=mask, tags=(bits_tag.PACK, bits_tag.BITS))
    keep = bits_tag.insert_traced(graph, lambda b: unpack(b, shape), [bits], after=bits, recompute=True,
                                  tags=(bits_tag.UNPACK, bits_tag.UNPACKED))
    for u in users:
        u.replace_input_with(mask, keep)


class _JointPass(CustomGraphPass):
    """A joint-graph pass of this module: its uuid (in Inductor's cache keys) follows this file's source and the
    pass's class (one uuid for every pass of the file let Inductor's FX cache serve one knob's graphs to another:
    ``recompute_dropout_masks`` ran ``philox4_dropout_bits``'s code and failed parity, 2026-12-07)."""

    def uuid(self) -> bytes:
        return hashlib.sha256(Path(__file__).read_bytes() + type(self).__qualname__.encode()).digest()

    def __deepcopy__(self, memo):  # torch.compile deep-copies the inductor config
        return self


class PackDropoutMasks(_JointPass):
    """The joint-graph pass: each dropout keep mask the backward uses is saved as :func:`pack`'s
    bytes, every user reading :func:`unpack` of them (forward-only graphs are left alone)."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        fwd = forward_nodes(graph)
        if not fwd:
            return
        for mask in [n for n in graph.nodes if n in fwd and is_keep_mask(n)]:
            if not all(u in fwd for u in mask.users):
                _pack_through_bits(graph, mask)
        graph.lint()


class RecomputeDropoutMasks(_JointPass):
    """The joint-graph pass that saves no dropout mask: each keep mask the backward uses and that
    Inductor's seeded random op drew (:func:`recomputable_draw`) is recomputed in the backward from its
    saved seed (see the module docstring)."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        fwd = forward_nodes(graph)
        if not fwd:
            return
        for mask in [n for n in graph.nodes if n in fwd]:
            chain = seeded_mask(mask)
            if chain is None or all(u in fwd for u in mask.users):
                continue
            chain[0].args[1].meta["recompute"] = CheckpointPolicy.MUST_SAVE  # the backward reads the forward's seed
            for n in chain:
                n.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
        graph.lint()


def seeded_mask(node: torch.fx.Node) -> tuple[torch.fx.Node, ...] | None:
    """:func:`keep_mask_chain` of ``node`` where drawing it again gives the same mask: Inductor's seeded draw
    (:func:`recomputable_draw`), and a cast between draw and comparison read by the comparison only."""
    chain = keep_mask_chain(node)
    if chain is None or not recomputable_draw(chain[0]) or (len(chain) == 3 and len(chain[1].users) != 1):
        return None
    return chain


def recomputable_draw(draw: torch.fx.Node) -> bool:
    """``draw`` is ``inductor_random(shape, seed, "rand")`` with the seed a node (Inductor's
    ``inductor_lookup_seed`` of the step's seed vector): drawing it again gives the same numbers."""
    return (draw.target is prims.inductor_random.default and len(draw.args) >= 2
            and isinstance(draw.args[1], torch.fx.Node)
            and draw.args[1].target is prims.inductor_lookup_seed.default)


class DrawDropoutBits(_JointPass):
    """The joint-graph pass of the ``philox4_dropout_bits`` knob: each dropout keep mask Inductor draws from its
    seeded random op (:func:`bit_drawable`) is drawn instead by ``miner::philox4_keep_bits``
    (:mod:`miner.runtime.keep_bits`: four numbers per Philox call, written as bits), every user reading
    :func:`unpack` of those bits (tagged to be recomputed, so the backward reads the saved bits; the bits tagged
    to be saved). Another random stream than Inductor's, compared in float32 (``u > p``: a keep rate of exactly
    ``1 - p``, where autocast's ``bf16(u) > p`` rounds ``u`` first); the masks are the op's, which a parity
    judge records and injects (``miner.check.masks``). The op's node is tagged, with the dtype the draw was cast
    to, so that a fusion pass can give a dropout region drawing the same stream its draw back
    (``miner.runtime.drawn``)."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        from miner.runtime import keep_bits

        fwd = forward_nodes(graph)
        if not fwd:
            return
        for mask in [n for n in graph.nodes if n in fwd]:
            chain = bit_drawable(mask)
            if chain is None:
                continue
            draw = chain[0]
            seeds, index = draw.args[1].args
            shape = list(mask.meta["val"].shape)
            numel, p = math.prod(shape), float(mask.args[1])
            with graph.inserting_after(mask):
                drawn = graph.call_function(keep_bits.op(), (seeds, index, numel, p))
            drawn.meta["val"] = keep_bits.fake(seeds.meta["val"], index, numel, p)
            drawn.meta["recompute"] = CheckpointPolicy.MUST_SAVE
            # what a post-grad pass needs to give a dropout region the draw back (``miner.runtime.drawn``)
            drawn.meta[bits_tag.TAG] = bits_tag.KEEP_BITS
            drawn.meta[bits_tag.DRAW_CAST] = chain[1].args[1] if len(chain) == 3 else None
            keep = bits_tag.insert_traced(graph, lambda b: unpack(b, shape), [drawn], after=drawn, recompute=True,
                                          tags=(bits_tag.UNPACK, bits_tag.UNPACKED))
            mask.replace_all_uses_with(keep)
            for n in reversed((*chain, draw.args[1])):
                if not n.users:
                    graph.erase_node(n)
        graph.lint()


class DrawDropoutBitsInRegion(DrawDropoutBits):
    """:class:`DrawDropoutBits` (the ``philox4_dropout_bits_in_region`` knob), its op's nodes marked so that a dropout
    region taking the draw back stores the saved bits in its own kernel (``miner.runtime.rewrite.pack_in_kernel``)
    instead of a packing pass reading its bool mask back."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        super().__call__(graph)
        for n in graph.nodes:
            if n.meta.get(bits_tag.TAG) == bits_tag.KEEP_BITS:
                n.meta[bits_tag.IN_KERNEL] = True


def bit_drawable(node: torch.fx.Node) -> tuple[torch.fx.Node, ...] | None:
    """:func:`seeded_mask` of ``node`` where ``miner::philox4_keep_bits`` can draw it: ``gt(u, p)`` (dropout's
    keep mask, ``p`` a number in [0, 1)) of a uniform draw (``"rand"``) read by nothing else."""
    chain = seeded_mask(node)
    if chain is None or node.target is not aten.gt.Scalar:
        return None
    draw, p = chain[0], node.args[1]
    if (len(draw.args) < 3 or draw.args[2] != "rand" or len(draw.users) != 1 or not isinstance(p, (int, float))
            or not 0 <= p < 1 or not isinstance(draw.args[1].args[1], int)):
        return None
    return chain


class PackBoolMasks(PackDropoutMasks):
    """The joint-graph pass for every bool tensor the backward reads (:func:`is_saved_bool`): the dropout
    keep masks, a ReLU's ``le`` mask, ...: saved as :func:`pack`'s bytes, every user reading :func:`unpack`."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        forward, backward = forward_nodes(graph), tangent_dependent(graph)
        if not backward:
            return
        for mask in [n for n in graph.nodes if is_saved_bool(n, forward, backward)]:
            _pack_through_bits(graph, mask)
        graph.lint()
