"""A region's kernel stores the dropout mask the backward saves as bits itself (issue 29).

Three parts, each against ``miner.runtime.bits.pack`` (the saved format): the ``store_mask`` helper, a generated
kernel asked for bits (``launch(..., bits=(k,))``) in both its one-pass and looped forms, and the post-grad pass
``rewrite.pack_in_kernel`` that asks for them where ``pack(mask)`` reads a kernel's mask and nothing else does.
The step-level check (the same loss and gradients as the bool mask, planted complements failing) is
``tests/test_keep_bits.py``'s region test.
"""

from __future__ import annotations

import operator
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from miner.runtime import bits, fusions, launch, rewrite
from miner.runtime.jit import store_mask

REPO = Path(__file__).resolve().parents[1]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _tile_kernel(x_ptr, out_ptr, n_rows, n_cols, p, ROWS: tl.constexpr, BLOCK: tl.constexpr, REVERSED: tl.constexpr):
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]).to(tl.int64)
    cols = tl.arange(0, BLOCK)[None, :]
    mask = (rows < n_rows) & (cols < n_cols)
    keep = tl.load(x_ptr + rows * n_cols + cols, mask=mask, other=0.0) > p
    if REVERSED:  # planted: element 8 i + k in bit 7 - k
        k = 7 - tl.arange(0, 8)[None, None, :]
        byte = tl.sum(tl.reshape(keep.to(tl.int32), (ROWS, BLOCK // 8, 8)) << k, axis=2).to(tl.uint8)
        first = rows * (n_cols // 8) + tl.arange(0, BLOCK // 8)[None, :]
        tl.store(out_ptr + first, byte, mask=(rows < n_rows) & (tl.arange(0, BLOCK // 8)[None, :] < n_cols // 8))
    else:
        store_mask(out_ptr, rows * n_cols + cols, keep, mask, rows * n_cols, 0, tl.where(rows < n_rows, n_cols, 0))


@pytest.mark.parametrize("n_rows,n_cols,rows,block", [(5, 24, 2, 32), (3, 64, 4, 64), (7, 8, 8, 8)])
def test_store_mask_writes_packs_layout_and_bool_alike(n_rows, n_cols, rows, block):
    """Tiles wider than the row (masked tail columns) and past the last row: as ``bits.pack`` of the mask, and the
    same helper with a bool output stores the mask itself. Planted: bits in reversed order differ."""
    x = torch.rand(n_rows, n_cols, device=DEVICE)
    want = x > 0.4
    grid = (triton.cdiv(n_rows, rows),)
    packed = torch.zeros(n_rows * n_cols // 8, dtype=torch.uint8, device=DEVICE)
    _tile_kernel[grid](x, packed, n_rows, n_cols, 0.4, ROWS=rows, BLOCK=block, REVERSED=False)
    assert torch.equal(packed, bits.pack(want)) and torch.equal(bits.unpack(packed, want.shape), want)
    as_bool = torch.zeros_like(want)
    _tile_kernel[grid](x, as_bool, n_rows, n_cols, 0.4, ROWS=rows, BLOCK=block, REVERSED=False)
    assert torch.equal(as_bool, want)
    _tile_kernel[grid](x, packed, n_rows, n_cols, 0.4, ROWS=rows, BLOCK=block, REVERSED=True)
    assert not torch.equal(packed, bits.pack(want))


@pytest.fixture(scope="module")
def relu_dropout():
    """The promoted t5 relu + dropout region's kernel module (it draws the four-per-call stream)."""
    fusions.graph_pass(REPO, ["relu_dropout"], interpret=True)  # defines the op
    return rewrite.load_module(REPO / "fusions" / "relu_dropout" / "kernel.py", "relu_dropout_kernel_bits_test")


@pytest.mark.parametrize("variant", ["one_pass", "looped"])
@pytest.mark.parametrize("shape", [(3, 24), (2, 5, 40), (4, 128)])
def test_a_generated_kernel_asked_for_bits_stores_its_mask_packed(relu_dropout, variant, shape):
    """One-pass tiles and looped chunks (rows of 24 and 40 elements start 8 past a 16-aligned base in every other
    row): the bits are ``pack`` of the bool mask the same launch stores without them; the other output unchanged."""
    seeds = torch.tensor([11, 12, 13], device=DEVICE)
    x = torch.randn(shape, device=DEVICE, dtype=torch.bfloat16)
    plain = relu_dropout.launch(seeds, x, 1, 0.1, 1 / 0.9, variant=variant)
    packed = relu_dropout.launch(seeds, x, 1, 0.1, 1 / 0.9, variant=variant, bits=(0,))
    assert packed[0].dtype == torch.uint8 and packed[0].shape == (plain[0].numel() // 8,)
    assert torch.equal(packed[0], bits.pack(plain[0])) and torch.equal(packed[1], plain[1])


def test_bits_outside_the_contract_raise_with_the_reason(relu_dropout):
    seeds = torch.tensor([11, 12], device=DEVICE)
    with pytest.raises(launch.ContractError, match="rows of 12 elements: not a multiple of 8"):
        relu_dropout.launch(seeds, torch.randn(4, 12, device=DEVICE), 0, 0.1, 1 / 0.9, variant="one_pass", bits=(0,))
    with pytest.raises(launch.ContractError, match="only bool per-element outputs"):
        relu_dropout.launch(seeds, torch.randn(4, 16, device=DEVICE), 0, 0.1, 1 / 0.9, bits=(1,))


def _graph(shape, also_return_mask=False, marked=True):
    """``pack(mask)`` of the relu_dropout op's mask, as ``miner.runtime.drawn.fold`` leaves it once a region took
    the draw (``marked``: under the ``philox4_dropout_bits_in_region`` knob): the graph returns the op's other
    output and the packed bits (and, asked, the mask itself)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    op = rewrite._OPS["miner::relu_dropout"]

    def step(seeds, x):
        mask, y = op(seeds, x, 0.0, 0.1, 1 / 0.9)
        return (y, mask, mask) if also_return_mask else (y, mask)
    gm = make_fx(step, tracing_mode="fake")(torch.zeros(2, dtype=torch.int64), torch.zeros(shape, dtype=torch.bfloat16))
    graph = gm.graph
    out = next(n for n in graph.nodes if n.op == "output")
    mask = out.args[0][1]
    packed = bits.insert_traced(graph, bits.pack, [mask], after=mask, tags=(bits.REPACK, bits.REPACK))
    packed.meta[bits.IN_KERNEL] = marked
    out.args = ((out.args[0][0], packed, *out.args[0][2:]),)
    return graph


def test_the_pass_asks_the_kernel_for_bits_where_only_the_pack_reads_its_mask(relu_dropout):
    """Marked by the knob, a mask read by its pack alone: the op's ``packed``, no pack node left, the graph returning
    the op's bits. Declined, the graph unchanged: rows of 12 elements, a mask read outside the pack (by the graph's
    output, or through a second getitem), a pack the knob did not mark."""
    graph = _graph((2, 16, 64))
    assert rewrite.pack_in_kernel(graph) == 1
    (op,) = [n for n in graph.nodes if n.target is rewrite._OPS["miner::relu_dropout"]]
    assert op.kwargs["packed"] == [0] and not any(n.meta.get(bits.TAG) for n in graph.nodes)  # no pack node left
    out = next(n for n in graph.nodes if n.op == "output").args[0]
    assert out[1].target.__name__ == "getitem" and tuple(out[1].meta["val"].shape) == (2 * 16 * 64 // 8,)
    assert out[1].meta["val"].dtype == torch.uint8 and op.meta["val"][0].dtype == torch.uint8
    assert rewrite.pack_in_kernel(graph) == 0  # done once

    twice = _graph((2, 16, 64))  # a second getitem of the same mask, read outside the pack
    out = next(n for n in twice.nodes if n.op == "output")
    (op,) = [n for n in twice.nodes if n.target is rewrite._OPS["miner::relu_dropout"]]
    with twice.inserting_before(out):
        again = twice.call_function(operator.getitem, (op, 0))
    out.args = (out.args[0] + (again,),)
    unmarked = _graph((2, 16, 64), marked=False)  # the knob did not ask: the pass packs them, as measured
    for declined in (_graph((2, 16, 12)), _graph((2, 16, 64), also_return_mask=True), twice, unmarked):
        before = str(declined)
        assert rewrite.pack_in_kernel(declined) == 0 and str(declined) == before
