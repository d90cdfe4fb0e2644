"""miner.runtime.jit: the @triton.jit helpers generated kernels import, each against torch.

Each helper is called from a tiny kernel below (as a generated kernel calls it) and checked on
values that reach its edge cases: tanh near 0 and large |x|, pow at negative bases, integer and
half exponents, and row chunks read aligned and through strides, masked and full. On a GPU
machine the kernels compile (``pytest tests/test_jit.py``); elsewhere they run in the interpreter.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from miner.runtime.jit import load_full, load_masked, pow_c, pow_rt, tanh

# compiled on CUDA (the cross-module inlining as the GPU sees it), else the interpreter on the CPU
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _tanh_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n, other=0.0)
    tl.store(out_ptr + i, tanh(x), mask=i < n)


@triton.jit
def _pow_kernel(x_ptr, e_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n, other=1.0)
    e = tl.load(e_ptr + i, mask=i < n, other=1.0)
    tl.store(out_ptr + i, pow_rt(x, e), mask=i < n)


@triton.jit
def _pow_c_kernel(x_ptr, out_ptr, n, E: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n, other=1.0)
    tl.store(out_ptr + i, pow_c(x, E), mask=i < n)


@triton.jit
def _chunk_kernel(x_ptr, out_ptr, row_start, sc, n_cols, FULL: tl.constexpr, ALIGNED: tl.constexpr,
                  BLOCK: tl.constexpr):
    # one row starting at element row_start of x (stride sc), read as the looped kernel reads its
    # first chunk: columns count from the row's 16-aligned start
    abase = (row_start // 16) * 16
    lead = row_start - abase
    x_row = x_ptr + tl.zeros([1, 1], tl.int64) + row_start
    cols = tl.arange(0, BLOCK)[None, :]
    if FULL:
        v = load_full(x_ptr, x_row, sc, abase, lead, cols, ALIGNED)
    else:
        mask = (cols >= lead) & (cols < lead + n_cols)
        v = load_masked(x_ptr, x_row, sc, abase, lead, cols, mask, ALIGNED)
    tl.store(out_ptr + tl.arange(0, BLOCK)[None, :], v)


def test_tanh_matches_torch_near_zero_and_far():
    x = torch.cat([torch.linspace(-0.1, 0.1, 101), torch.linspace(-20.0, 20.0, 101), torch.tensor([0.0])]).to(DEVICE)
    out = torch.empty_like(x)
    _tanh_kernel[(1,)](x, out, x.numel(), BLOCK=256)
    torch.testing.assert_close(out, torch.tanh(x), rtol=1e-5, atol=1e-7)


def test_pow_rt_follows_torch_pow_signs_and_nans():
    x = torch.tensor([2.0, -2.0, -2.0, -2.0, 0.5, 3.0, -1.5, 0.0], device=DEVICE)
    e = torch.tensor([3.0, 3.0, 2.0, 0.5, -1.0, 0.0, 0.0, 2.0], device=DEVICE)
    out = torch.empty_like(x)
    _pow_kernel[(1,)](x, e, out, x.numel(), BLOCK=8)
    torch.testing.assert_close(out, torch.pow(x, e), rtol=1e-5, atol=1e-6, equal_nan=True)
    assert torch.isnan(out[3])  # negative base, non-integer exponent


@pytest.mark.parametrize("E", [1.0, 2.0, 3.0, 0.5, -0.5, -1.0, 1.7])
def test_pow_c_matches_torch_for_each_specialized_exponent(E):
    x = torch.linspace(0.25, 4.0, 16, device=DEVICE)
    out = torch.empty_like(x)
    _pow_c_kernel[(1,)](x, out, x.numel(), E=E, BLOCK=16)
    torch.testing.assert_close(out, torch.pow(x, E), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("aligned", [True, False])
def test_load_masked_reads_the_row_and_zeros_the_rest(aligned):
    x = torch.arange(64, dtype=torch.float32, device=DEVICE)
    row_start, n_cols = 21, 7  # abase 16, lead 5: columns 5..11 of the chunk hold the row
    sc = 1
    out = torch.full((1, 16), -1.0, device=DEVICE)
    _chunk_kernel[(1,)](x, out, row_start, sc, n_cols, FULL=False, ALIGNED=aligned, BLOCK=16)
    want = torch.zeros(16, device=DEVICE)
    want[5:12] = x[21:28]
    assert torch.equal(out[0], want)


@pytest.mark.parametrize("aligned", [True, False])
def test_load_full_reads_a_whole_chunk_from_the_aligned_base(aligned):
    x = torch.arange(64, dtype=torch.float32, device=DEVICE)
    out = torch.empty((1, 16), device=DEVICE)
    _chunk_kernel[(1,)](x, out, 32, 1, 16, FULL=True, ALIGNED=aligned, BLOCK=16)
    assert torch.equal(out[0], x[32:48])


def test_load_strided_input_follows_its_stride():
    x = torch.arange(64, dtype=torch.float32, device=DEVICE)
    out = torch.empty((1, 16), device=DEVICE)
    _chunk_kernel[(1,)](x, out, 0, 2, 16, FULL=True, ALIGNED=False, BLOCK=16)  # every other element
    assert torch.equal(out[0], x[0:32:2])
