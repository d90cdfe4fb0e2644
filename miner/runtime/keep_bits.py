"""Dropout keep masks drawn four per Philox call straight into bits: the op ``miner::philox4_keep_bits``.

``philox4_keep_bits(seeds, index, numel, p)`` is the keep mask ``u(L) > p`` of elements ``L < numel``
drawn at seed ``seeds[index]`` from the four-per-call stream of :mod:`miner.runtime.philox` (``u(L)``:
word ``L % 4`` of the Philox call at counter ``L // 4``: a function of the seed and the element's logical
index only), packed as :func:`miner.runtime.bits.pack` packs a mask (element ``8 i + k`` in bit ``k`` of
byte ``i``, uint8, ``ceil(numel / 8)`` bytes). One program writes ``BLOCK`` bytes: two Philox calls per
byte, where Inductor's ``tl.rand(seed, L)`` makes one call per element (eight per byte).

The ``philox4_dropout_bits`` knob (``miner.check.mask_bits.DrawDropoutBits``) replaces Inductor's
``inductor_random(shape, inductor_lookup_seed(seeds, index), "rand") > p`` with ``unpack`` of this op's
bits in a training graph: the forward and the backward read one bit per element, the backward saves an
eighth of the mask bytes, and the masks are another stream than Inductor's (the same law: keep rate,
independence, ``miner.check.random_stats``). A step's parity is then judged with the op's own masks
injected into an eager reference (``miner.check.masks``): inside :func:`miner.runtime.launch.recording`,
every call appends a :class:`miner.runtime.launch.Drawn` of pattern id :data:`PATTERN_ID` (seed vector
as input 0, ``index`` as scalar 0, the unpacked mask as output 0: ``miner.check.masks.KNOB_SLOT``).

On CUDA tensors (or the CPU under ``TRITON_INTERPRET=1``) the Triton kernel runs; on the CPU otherwise
the same numbers come from :mod:`miner.runtime.philox`'s int64 torch arithmetic (slow: tests only).
"""

from __future__ import annotations

import torch

from miner.runtime import bits, philox

QUALNAME = "miner::philox4_keep_bits"
PATTERN_ID = "philox4_keep_bits"  # what ``launch.recording`` records its calls as
BLOCK = 1024  # bytes per program (8192 elements)


def keep_bits(seeds: torch.Tensor, index: int, numel: int, p: float) -> torch.Tensor:
    """The op's implementation (see the module docstring); records its mask inside ``launch.recording``."""
    from miner.runtime import launch

    if seeds.is_cuda or launch.interpreting():
        import triton

        from miner.runtime.jit import fill_keep_bits

        out = fake(seeds, index, numel, p)
        if out.numel():
            fill_keep_bits[(triton.cdiv(out.numel(), BLOCK),)](seeds, index, out, numel, out.numel(), float(p),
                                                               BLOCK=BLOCK)
    else:  # the same numbers in int64 torch arithmetic (slow: tests only)
        out = bits.pack(philox.rand([numel], seeds[index]) > p)
    if launch.RECORDERS:
        launch.record(launch.Drawn(PATTERN_ID, {0: seeds.clone()}, (index, p), (bits.unpack(out, [numel]),)))
    return out


def fake(seeds, index, numel, p):
    """The op's output for ``seeds`` (a real or fake tensor): ``ceil(numel / 8)`` uint8 bytes."""
    return seeds.new_empty((-(-numel // bits.PER_BYTE),), dtype=torch.uint8)


def op():
    """``torch.ops.miner.philox4_keep_bits.default``, registered on first use (a plain
    ``torch.library.Library`` registration, as ``miner.runtime.rewrite.define_op``'s: it runs on the host
    between Inductor's kernels, only ever in post-grad graphs, so it needs no autograd formula)."""
    from miner.runtime import rewrite

    ns, name = QUALNAME.split("::")
    if not hasattr(getattr(torch.ops, ns), name):
        lib = rewrite._LIBS.setdefault(ns, torch.library.Library(ns, "FRAGMENT"))
        lib.define(f"{name}(Tensor seeds, int index, int numel, float p) -> Tensor")
        lib.impl(name, keep_bits, "CompositeExplicitAutograd")
        torch.library.register_fake(QUALNAME, fake, lib=lib)
    return getattr(getattr(torch.ops, ns), name).default
