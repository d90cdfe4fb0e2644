"""Hand-written ``@triton.jit`` helpers that generated kernels import (only the ones they call).

Triton inlines a jit function called from another module and keys its compile cache on the
callee's source too, so a kernel importing these compiles exactly as if they were pasted into it.
They run under ``TRITON_INTERPRET=1`` as well (``tests/test_jit.py`` checks each against torch).

- ``tanh(x)``, ``pow_rt(x, e)``, ``pow_c(x, E)``: math the interpreter lacks (no libdevice) or
  that a compile-time exponent makes cheaper.
- ``load_masked`` / ``load_full``: one chunk of a row in the looped kernel, whose columns count from
  the row's 16-aligned start ``abase``: an input laid out like the rows (``ALIGNED``) is read at
  ``x_ptr + abase + cols`` (vectorizable), any other at its logical column through its strides
  (``x_row + (cols - lead) * x_sc``). ``load_full`` reads a whole chunk without a mask.
- ``gather_masked`` / ``gather_full``: ``aten.embedding``'s ``table[index, col]`` per element: the
  table's row pointer ``w_row`` (its column through the views, ``miner.generate.emit.gather_views_source``)
  plus ``col * w_sc`` plus ``index * w_g`` (the table's row stride); masked lanes read nothing.
- ``uniform(seed, offset)`` / ``normal(seed, offset)``: ``prims.inductor_random`` ("rand" /
  "randn") at a row-major element offset, exactly as Inductor's Triton kernels draw it
  (``tl.rand(seed, offset.to(tl.uint32))``), so a replaced dropout keeps Inductor's mask.
  ``fill_random`` (a kernel, not a helper) writes them for a whole tensor: the references'
  ``miner.runtime.launch.triton_rand``.
- ``uniform_tile4(seed, group)`` / ``uniform_at(seed, lin)``: the four-per-call dropout stream
  (``miner.runtime.philox``): ``u(L)`` = word ``L % 4`` of Philox4x32-10 at counter ``L // 4``.
  ``uniform_tile4`` draws a ``[R, G]`` tile of group counters with one Philox call each and returns
  the ``[R, 4 G]`` numbers of their elements (words interleaved: element ``4 j + w`` of a row is
  word ``w`` of group ``j``); ``uniform_at`` draws one element per call (the same numbers, for
  tiles that do not cover whole groups). ``fill_uniform4`` (a kernel) writes ``u(L)`` for a
  whole tensor through either (the statistics' and tests' draw). ``fill_keep_bits`` (a kernel) writes the
  keep mask ``u(L) > p`` of a whole tensor as bits (``miner.runtime.keep_bits``'s op).
- ``store_mask(out_ptr, at, v, mask, start, lo, hi)``: a generated kernel's bool output. Stored as bool, or, where
  the launch gave it a uint8 output (``miner.runtime.launch.run``'s ``bits``: a dropout mask the backward
  saves), packed as ``miner.runtime.bits.pack`` packs it: each eight consecutive elements one byte, so
  the kernel writes an eighth of the bytes and no separate pass packs them.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["tanh", "pow_rt", "pow_c", "load_masked", "load_full", "uniform", "normal", "fill_random",
           "philox_words", "uniform_tile4", "uniform_at", "fill_uniform4", "fill_keep_bits", "gather_masked", "gather_full",
           "store_mask"]


@triton.jit
def tanh(x):
    """tanh without libdevice; a series near 0 keeps the relative error small where
    ``(1 - e) / (1 + e)`` would cancel."""
    ax = tl.abs(x)
    e = tl.exp(-2.0 * ax)
    big = (1.0 - e) / (1.0 + e)
    x2 = ax * ax
    small = ax * (1.0 - x2 * (0.3333333333333333 - x2 * (0.13333333333333333 - x2 * 0.05396825396825397)))
    t = tl.where(ax < 0.0625, small, big)
    return tl.where(x < 0, -t, t)


@triton.jit
def pow_rt(x, e):
    """``x ** e`` for a runtime exponent, as ``torch.pow``: ``|x| ** e``, signed for odd integer
    ``e``, nan for ``x < 0`` and non-integer ``e``, 1 for ``e == 0``."""
    r = tl.exp2(e * tl.log2(tl.abs(x)))
    e_int = tl.floor(e) == e
    odd = e_int & (tl.floor(e * 0.5) * 2.0 != e)
    r = tl.where(x < 0, tl.where(e_int, tl.where(odd, -r, r), float("nan")), r)
    return tl.where(e == 0, 1.0, r)


@triton.jit
def pow_c(x, E: tl.constexpr):
    """``x ** E`` for a compile-time exponent: small integer and half powers without exp/log."""
    if E == 1.0:
        r = x
    elif E == 2.0:
        r = x * x
    elif E == 3.0:
        r = x * x * x
    elif E == 0.5:
        r = tl.sqrt(x)
    elif E == -0.5:
        r = tl.rsqrt(x)
    elif E == -1.0:
        r = 1.0 / x
    else:
        r = pow_rt(x, x * 0.0 + E)
    return r


@triton.jit
def load_masked(x_ptr, x_row, x_sc, abase, lead, cols, mask, ALIGNED: tl.constexpr):
    """A masked chunk (0 where masked) of one input's row; ``cols`` count from ``abase``."""
    if ALIGNED:
        v = tl.load(x_ptr + abase + cols, mask=mask, other=0)
    else:
        v = tl.load(x_row + (cols - lead) * x_sc, mask=mask, other=0)
    return v


@triton.jit
def load_full(x_ptr, x_row, x_sc, abase, lead, cols, ALIGNED: tl.constexpr):
    """A full chunk of one input's row, no mask (every lane is a real column)."""
    if ALIGNED:
        v = tl.load(x_ptr + abase + cols)
    else:
        v = tl.load(x_row + (cols - lead) * x_sc)
    return v


@triton.jit
def gather_masked(w_row, w_sc, col, idx, w_g, mask):
    """``table[idx, col]`` where ``mask`` (0 elsewhere): ``w_row + col * w_sc + idx * w_g``."""
    return tl.load(w_row + col * w_sc + idx * w_g, mask=mask, other=0)


@triton.jit
def gather_full(w_row, w_sc, col, idx, w_g):
    """``table[idx, col]`` for a full chunk (every lane a real element)."""
    return tl.load(w_row + col * w_sc + idx * w_g)


@triton.jit
def uniform(seed, offset):
    """U[0, 1) float32 of ``inductor_random(..., "rand")`` at element ``offset`` (one philox per element)."""
    return tl.rand(seed, offset.to(tl.uint32))


@triton.jit
def normal(seed, offset):
    """N(0, 1) float32 of ``inductor_random(..., "randn")`` at element ``offset``."""
    return tl.randn(seed, offset.to(tl.uint32))


@triton.jit
def fill_random(seed_ptr, out_ptr, n, NORMAL: tl.constexpr, BLOCK: tl.constexpr):
    """``out[i] = uniform(seed, i)`` (``normal`` when ``NORMAL``) for ``i < n``; ``seed = seed_ptr[0]``."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    seed = tl.load(seed_ptr)
    if NORMAL:
        r = normal(seed, offs)
    else:
        r = uniform(seed, offs)
    tl.store(out_ptr + offs, r, mask=offs < n)


@triton.jit
def philox_words(seed, group):
    """The four uint32 words of Philox4x32-10 under key ``seed`` at the int64 counters ``group``
    (low word ``c0``, high word ``c1``, ``c2 = c3 = 0``; ``tl.philox`` with explicit 32-bit counters,
    the same on every Triton version)."""
    g = group.to(tl.int64)
    lo = (g & 0xFFFFFFFF).to(tl.uint32)
    hi = (g >> 32).to(tl.uint32)
    z = lo * 0
    return tl.philox(seed, lo, hi, z, z)


@triton.jit
def uniform_tile4(seed, group):
    """``[R, 4 G]`` uniforms of the elements of a ``[R, G]`` tile of group counters: one Philox call
    per group, element ``4 j + w`` of a row is word ``w`` of group ``j`` (``u(L)`` for ``L = 4 group + w``)."""
    w0, w1, w2, w3 = philox_words(seed, group)
    u0 = tl.uint_to_uniform_float(w0)
    u1 = tl.uint_to_uniform_float(w1)
    u2 = tl.uint_to_uniform_float(w2)
    u3 = tl.uint_to_uniform_float(w3)
    # join(join(u0, u2), join(u1, u3))[.., j, a, b] is word 2 a + b of group j: row-major order
    u = tl.join(tl.join(u0, u2), tl.join(u1, u3))
    return tl.reshape(u, (group.shape[0], group.shape[1] * 4))


@triton.jit
def uniform_at(seed, lin):
    """``u(L)`` at element offsets ``lin`` (int64), one Philox call per element: word ``L % 4`` of the
    call at counter ``L // 4`` (what ``uniform_tile4`` draws for the same elements)."""
    lin = lin.to(tl.int64)
    w0, w1, w2, w3 = philox_words(seed, lin >> 2)
    k = lin & 3
    w = tl.where(k == 0, w0, tl.where(k == 1, w1, tl.where(k == 2, w2, w3)))
    return tl.uint_to_uniform_float(w)


@triton.jit
def fill_uniform4(seed_ptr, out_ptr, n, start, PER_GROUP: tl.constexpr, BLOCK: tl.constexpr):
    """``out[i] = u(start + i)`` for ``i < n`` (``seed = seed_ptr[0]``, ``start % 4 == 0``): through
    ``uniform_tile4`` (``PER_GROUP``) or ``uniform_at``; ``BLOCK`` a multiple of 4."""
    seed = tl.load(seed_ptr)
    base = tl.program_id(0).to(tl.int64) * BLOCK
    offs = base + tl.arange(0, BLOCK)[None, :]
    if PER_GROUP:
        r = uniform_tile4(seed, (start + base) // 4 + tl.arange(0, BLOCK // 4)[None, :])
    else:
        r = uniform_at(seed, start + offs)
    tl.store(out_ptr + offs, r, mask=offs < n)


@triton.jit
def fill_keep_bits(seeds_ptr, index, out_ptr, numel, nbytes, p, BLOCK: tl.constexpr):
    """``out[b]`` (uint8): bit ``k`` is ``u(8 b + k) > p`` (0 past ``numel``), ``seed = seeds_ptr[index]``;
    ``BLOCK`` bytes per program, two Philox calls per byte (``uniform_tile4``)."""
    seed = tl.load(seeds_ptr + index)
    b = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    u = uniform_tile4(seed, b[:, None] * 2 + tl.arange(0, 2)[None, :])  # [BLOCK, 8]: element 8 b + k
    k = tl.arange(0, 8)[None, :]
    keep = (u > p) & (b[:, None] * 8 + k < numel)
    tl.store(out_ptr + b, tl.sum(keep.to(tl.int32) << k, axis=1).to(tl.uint8), mask=b < nbytes)


@triton.jit
def store_mask(out_ptr, at, v, mask, start, lo, hi):
    """A bool tile ``v`` at element offsets ``at`` (``[R, B]``) under ``mask`` (None: every element), exactly as
    a generated kernel stores any output. A uint8 ``out_ptr`` takes bits instead: element ``8 i + k`` in bit ``k``
    of byte ``i``, where tile column ``j`` of row ``r`` is element ``start[r] + j`` and is stored where
    ``lo <= j < hi`` (``lo`` None: every column). The launch's contract (rows of a multiple of eight elements)
    makes ``start``, ``lo`` and ``hi`` multiples of eight, so each byte is stored whole by one program, at offsets
    and under a mask computed per byte, never reduced from the elements'."""
    if out_ptr.dtype.element_ty == tl.uint8:
        k = tl.arange(0, 8)[None, None, :]
        byte = tl.sum(tl.reshape(tl.broadcast_to(v.to(tl.int32), at.shape), (at.shape[0], at.shape[1] // 8, 8)) << k,
                      axis=2)
        j8 = tl.arange(0, at.shape[1] // 8)[None, :] * 8
        if lo is None:
            tl.store(out_ptr + (start >> 3) + (j8 >> 3), byte.to(tl.uint8))
        else:
            tl.store(out_ptr + (start >> 3) + (j8 >> 3), byte.to(tl.uint8), mask=(j8 >= lo) & (j8 < hi))
    else:
        tl.store(out_ptr + at, v.to(out_ptr.dtype.element_ty), mask=mask)
