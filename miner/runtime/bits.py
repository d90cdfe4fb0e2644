"""Bool masks as bits: the saved format (:func:`pack`, :func:`unpack`), and a saved mask's bit round trip
folded away where the mask itself is at hand.

The ``pack_dropout_masks`` / ``pack_bool_masks`` knobs (``miner.check.mask_bits``) give every user of a
bool mask ``unpack(pack(mask))`` in the joint graph, so that the partitioner saves the packed bytes.
After the partition the forward graph still holds ``mask`` and reads it back through the round trip:
the same values, but a dropout region's pattern (``mul(x, mask)``) no longer matches, and the forward
reads the bits it just wrote. :func:`fold_round_trips` gives those users ``mask`` again; the pack stays
(its bytes are the saved output), and a backward graph, where the bits arrive as an input and the mask
is not in the graph, is left alone.

The nodes are recognized by the tag :data:`TAG` in their ``meta`` (set by ``mask_bits`` when it inserts
them; the partitioner copies a node's meta into the forward and backward graphs), never by shape:
``"pack"`` on the nodes of ``pack(mask)``, ``"bits"`` on its result, ``"unpack"`` on the nodes of
``unpack(bits)`` and ``"unpacked"`` on its result.
"""

from __future__ import annotations

import math

import torch

from miner.rules.contract import BITS_GROUP

TAG = "miner_mask_bits"
PACK, BITS, UNPACK, UNPACKED = "pack", "bits", "unpack", "unpacked"
# ``miner::philox4_keep_bits`` nodes (the ``philox4_dropout_bits`` knob), the dtype the draw they replace was cast
# to before its comparison (meta key; None: none), and the nodes ``miner.runtime.drawn`` inserts
KEEP_BITS, DRAW_CAST, DRAWN, REPACK = "keep_bits", "miner_draw_cast", "drawn", "repack"
# meta key: the region taking this draw stores the saved bits in its own kernel (``miner.runtime.rewrite.pack_in_kernel``;
# the ``philox4_dropout_bits_in_region`` knob sets it on its op's nodes, ``miner.runtime.drawn`` on the pack it inserts)
IN_KERNEL = "miner_pack_in_kernel"
PER_BYTE = BITS_GROUP  # mask elements per saved byte (a kernel storing bits itself packs them alike)


def packed_size(numel: int) -> int:
    """Bytes :func:`pack` makes of ``numel`` elements."""
    return -(-numel // PER_BYTE)


def pack(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` (bool, any shape) as uint8 bytes, element ``8 * i + k`` in bit ``k`` of byte ``i`` (the mask
    flattened, padded with ``False`` to a multiple of 8)."""
    flat = mask.reshape(-1).to(torch.uint8)
    rows = torch.nn.functional.pad(flat, [0, -flat.numel() % PER_BYTE]).view(-1, PER_BYTE)
    out = rows[:, 0]
    for k in range(1, PER_BYTE):
        out = out | (rows[:, k] << k)
    return out


def unpack(bits: torch.Tensor, shape) -> torch.Tensor:
    """The bool mask of ``shape`` that :func:`pack` made ``bits`` from."""
    shifts = torch.arange(PER_BYTE, dtype=torch.uint8, device=bits.device)
    spread = (bits.unsqueeze(1) >> shifts) & 1
    return spread.view(-1)[:math.prod(shape)].view(shape).to(torch.bool)


def insert_traced(graph: torch.fx.Graph, fn, args: list, *, after: torch.fx.Node, tags: tuple[str, str],
                  recompute: bool = False) -> torch.fx.Node:
    """``fn(*args)`` inserted after ``after`` (each aten call a node with its fake ``val``); ``args``
    mixes nodes and constants; ``recompute``: its nodes tagged for the partitioner to recompute in the
    backward (never saved); ``tags``: the :data:`TAG` of its nodes and of its result (what lets a post-grad
    pass fold ``unpack(pack(mask))`` back to ``mask``). Returns the result's node."""
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils.checkpoint import CheckpointPolicy

    fake_args = [a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args]
    node_args = [a for a in args if isinstance(a, torch.fx.Node)]
    tensors = [v for v in fake_args if isinstance(v, torch.Tensor)]

    def body(*ts):
        it = iter(ts)
        return fn(*[next(it) if isinstance(v, torch.Tensor) else v for v in fake_args])

    gm = make_fx(body, decomposition_table=select_decomp_table(), tracing_mode="fake")(*tensors)
    env = dict(zip((n for n in gm.graph.nodes if n.op == "placeholder"), node_args))
    with graph.inserting_before(after.next):
        out = graph.graph_copy(gm.graph, env)
    for n in gm.graph.nodes:
        if n.op == "call_function":
            env[n].meta[TAG] = tags[0]
            if recompute:
                env[n].meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
    out.meta[TAG] = tags[1]
    return out


def sources(node: torch.fx.Node, through: frozenset[str]) -> set[torch.fx.Node]:
    """The nodes ``node`` reads, followed back through nodes tagged one of ``through``; constants'
    nodes (no tensor ``val``) left out."""
    out: set[torch.fx.Node] = set()
    stack, seen = list(node.all_input_nodes), set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.meta.get(TAG) in through and n.op == "call_function":
            stack.extend(n.all_input_nodes)
        elif isinstance(n.meta.get("val"), torch.Tensor):
            out.add(n)
    return out


def source_mask(unpacked: torch.fx.Node) -> torch.fx.Node | None:
    """The mask ``unpacked`` (a node tagged ``"unpacked"``) is ``unpack(pack(mask))`` of, when ``mask``
    is a node of this graph of the same shape and dtype; else None (the bits are a graph input)."""
    bits = sources(unpacked, frozenset({UNPACK}))
    if len(bits) != 1:
        return None
    (b,) = bits
    if b.meta.get(TAG) != BITS or b.op != "call_function":
        return None
    masks = sources(b, frozenset({PACK, BITS}))
    if len(masks) != 1:
        return None
    (mask,) = masks
    m, u = mask.meta.get("val"), unpacked.meta.get("val")
    if mask.meta.get(TAG) or not isinstance(m, torch.Tensor) or not isinstance(u, torch.Tensor):
        return None
    if m.dtype != u.dtype or tuple(m.shape) != tuple(u.shape):
        return None
    return mask


def fold_round_trips(graph: torch.fx.Graph) -> int:
    """Give every user of ``unpack(pack(mask))`` ``mask`` where ``mask`` is in ``graph``; the unpack's
    nodes left without users are removed (nothing else). Returns the number of round trips folded."""
    folded = 0
    for node in list(graph.nodes):
        if node.meta.get(TAG) != UNPACKED or not node.users:
            continue
        mask = source_mask(node)
        if mask is not None:
            node.replace_all_uses_with(mask)
            erase_unused(node)
            folded += 1
    return folded


def erase_unused(node: torch.fx.Node, tags: tuple[str, ...] = (UNPACK, UNPACKED)) -> None:
    """Erase ``node`` and, back through its inputs, every node tagged one of ``tags`` left without users."""
    stack, gone = [node], set()
    while stack:
        n = stack.pop()
        if n in gone or n.users or n.op != "call_function" or n.meta.get(TAG) not in tags:
            continue
        inputs = n.all_input_nodes
        n.graph.erase_node(n)
        gone.add(n)
        stack.extend(inputs)
