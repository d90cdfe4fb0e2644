"""The dropout random stream of ``--rng philox4`` candidates, in plain torch (reference and tests).

The stream is a function of (seed, logical element index ``L``) only::

    u(L) = uniform(word L % 4 of Philox4x32-10(key=seed, counter=(L // 4) low, high, 0, 0))

so one Philox call yields the numbers of four consecutive elements, and no block size, tiling,
launch grid or kernel variant can change an element's number (the forward, a recompute in the
backward and a re-tuned kernel agree). ``L`` is the element's row-major index in the random op's
shape (``inductor_random``'s). Inductor's own stream is ``tl.rand(seed, L)``: word 0 of a
Philox call at counter ``L`` (four times the Philox work for the same numbers of draws).

The generated kernels draw it with ``miner.runtime.jit``'s ``uniform_tile4`` (one
``tl.philox`` per group of four, the words interleaved) or ``uniform_at`` (one call per element,
word ``L % 4``: the same numbers where a tile does not cover whole groups). This module is the
same computation with int64 tensor arithmetic (bit-exact against Triton: ``tests/test_random.py``
checks it under the interpreter): the candidates' ``reference`` draws its numbers here, so a
float64 reference sees the kernel's own mask.

- ``philox4x32(seed, counter)``: the four 32-bit words (as int64 tensors in [0, 2**32)).
- ``to_uniform(word)``: ``tl.uint_to_uniform_float`` of a 32-bit word, float32 in [0, 1).
- ``uniform(seed, index)``: ``u(L)`` at the int64 indices ``index``.
- ``rand(shape, seed, kind)``: ``u(L)`` for every element of ``shape`` (``inductor_random``'s
  signature; what a candidate's ``reference`` calls).
"""

from __future__ import annotations

import importlib
from typing import Sequence

import torch

MASK32 = 0xFFFFFFFF
KEY_A, KEY_B = 0x9E3779B9, 0xBB67AE85  # Weyl increments of the key (Triton's PHILOX_KEY_A/B)
ROUND_A, ROUND_B = 0xD2511F53, 0xCD9E8D57  # Philox4x32 multipliers (Triton's PHILOX_ROUND_A/B)
N_ROUNDS = 10
SCALE = 4.6566127342e-10  # tl.uint_to_uniform_float's 32-bit scale: max int32 * SCALE < 1 in float32
CHUNK = 1 << 22  # elements per slice of ``uniform``: bounds the int64 temporaries (~200 MiB)

__all__ = ["philox4x32", "to_uniform", "uniform", "rand", "seed_value"]


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit words of ``a * b`` for a 32-bit constant ``a`` and 32-bit words ``b``.

    ``b`` is split in 16-bit halves so no product leaves int64's range (``a * b`` itself may not fit).
    """
    bh, bl = b >> 16, b & 0xFFFF
    mid = a * bh  # < 2**48
    low = a * bl  # < 2**48
    hi = (mid + (low >> 16)) >> 16
    lo = (((mid & 0xFFFF) << 16) + low) & MASK32
    return hi, lo


def philox4x32(seed: int, counter: torch.Tensor, n_rounds: int = N_ROUNDS) -> tuple[torch.Tensor, ...]:
    """The four 32-bit words of Philox4x32 at ``counter`` under key ``seed`` (Triton's ``tl.philox``).

    Parameters
    ----------
    seed : int
        The key: its low 32 bits are ``k0``, its next 32 bits ``k1`` (a negative int64 seed is
        taken as its two's complement, as Triton's ``seed.to(tl.uint64)``).
    counter : torch.Tensor
        int64 counters >= 0: low 32 bits are ``c0``, high 32 bits ``c1``; ``c2 = c3 = 0``.
    n_rounds : int
        Philox rounds (10, Triton's default).

    Returns
    -------
    tuple of torch.Tensor
        ``(w0, w1, w2, w3)``, int64 tensors of ``counter``'s shape holding values in [0, 2**32).
    """
    seed = int(seed) & ((1 << 64) - 1)
    k0, k1 = seed & MASK32, (seed >> 32) & MASK32
    counter = counter.to(torch.int64)
    c0, c1 = counter & MASK32, (counter >> 32) & MASK32
    c2 = torch.zeros_like(c0)
    c3 = torch.zeros_like(c0)
    for _ in range(n_rounds):
        hi_b, lo_b = _mulhilo(ROUND_B, c2)
        hi_a, lo_a = _mulhilo(ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + KEY_A) & MASK32, (k1 + KEY_B) & MASK32
    return c0, c1, c2, c3


def to_uniform(word: torch.Tensor) -> torch.Tensor:
    """``tl.uint_to_uniform_float`` of 32-bit words: the word as int32 ``x``, ``~x`` where negative,
    times ``SCALE`` in float32 (bit-exact with Triton's conversion)."""
    x = torch.where(word >= 1 << 31, word - (1 << 32), word)  # the bits as int32
    x = torch.where(x < 0, -x - 1, x)
    return x.to(torch.float32) * torch.tensor(SCALE, dtype=torch.float32)


def uniform(seed: int, index: torch.Tensor) -> torch.Tensor:
    """``u(L)`` (float32) at the logical indices ``index`` (int64, any shape): word ``L % 4`` of the
    Philox call at counter ``L // 4``.

    Parameters
    ----------
    seed : int
        The dropout seed (one per random op: ``inductor_lookup_seed``'s value).
    index : torch.Tensor
        int64 element indices >= 0.

    Returns
    -------
    torch.Tensor
        float32 in [0, 1), ``index``'s shape, on ``index``'s device.
    """
    flat = index.reshape(-1).to(torch.int64)
    out = torch.empty(flat.shape, dtype=torch.float32, device=index.device)
    for s in range(0, flat.numel(), CHUNK):
        lin = flat[s:s + CHUNK]
        words = torch.stack(philox4x32(seed, lin >> 2), dim=-1)  # [n, 4]
        out[s:s + CHUNK] = to_uniform(words.gather(1, (lin & 3)[:, None])[:, 0])
    return out.reshape(index.shape)


def seed_value(seed) -> int:
    """An int seed from an int or a one-element int64 tensor (``inductor_lookup_seed``'s result)."""
    return int(seed.item()) if isinstance(seed, torch.Tensor) else int(seed)


def rand(shape: Sequence[int], seed, kind: str = "rand") -> torch.Tensor:
    """``prims.inductor_random(shape, seed, "rand")`` drawn from the four-per-call stream.

    Element ``L`` of the row-major ``shape`` is ``u(L)`` (:func:`uniform`). On meta tensors it is
    the prim itself (shapes only: ``miner.runtime.launch.traced_contract`` records the random op).

    Parameters
    ----------
    shape : sequence of int
        The random op's shape.
    seed : torch.Tensor or int
        The seed (a 0-d int64 tensor as ``inductor_lookup_seed`` returns it).
    kind : str
        "rand" only (a dropout's uniform numbers).

    Returns
    -------
    torch.Tensor
        float32 of ``shape`` on the seed's device (CPU for an int seed).

    Raises
    ------
    ValueError
        For another ``kind`` than "rand".
    """
    device = seed.device if isinstance(seed, torch.Tensor) else torch.device("cpu")
    if device.type == "meta":
        importlib.import_module("torch._inductor.inductor_prims")  # registers prims.inductor_random

        return torch.ops.prims.inductor_random.default(list(shape), seed, kind)
    if kind != "rand":
        raise ValueError(f"inductor_random of kind {kind!r}: the four-per-call stream draws 'rand' only")
    n = 1
    for s in shape:
        n *= int(s)
    return uniform(seed_value(seed), torch.arange(n, device=device)).reshape(tuple(shape))
