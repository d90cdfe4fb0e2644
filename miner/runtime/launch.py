"""Launch-time half of a generated kernel: row layout, tile configs, per-shape tuning.

Every generated ``kernel.py`` (``candidates/<id>/``, ``fusions/<name>/``) holds the parts that
depend on its pattern -- ``reference``, ``one_pass_kernel``, ``looped_kernel`` -- and calls
``run`` for the rest, which is the same for all of them:

- **rows**: the last dim of the inputs' broadcast shape is the row; leading dims are coalesced
  into at most three (``layout``) so broadcast and strided inputs are read in place. A pattern
  without reductions whose inputs are all contiguous and full-size is row-agnostic: it is
  re-cut into power-of-two rows (``flat_rows``), so a 3072-wide activation is not padded to 4096.
- **variant**: rows up to ``ONE_PASS_MAX`` take ``one_pass_kernel`` (whole rows in one tile);
  longer ones ``looped_kernel`` (chunks of columns, one row per program).
- **config**: (ROWS, BLOCK, num_warps). On a GPU the candidates of ``configs`` are timed once per
  (kernel, shape, dtypes) with ``triton.testing.do_bench`` and the fastest is kept for the
  process (``TUNED``), as Inductor autotunes its own kernels; under ``TRITON_INTERPRET=1``, or
  while a CUDA graph is being captured, the first (heuristic) config is used untimed.
"""

from __future__ import annotations

import math
import os
from typing import Callable, Sequence

ONE_PASS_MAX = 8192  # longest row the one-pass kernel holds; longer rows take the looped kernel
LOOP_BLOCK = 4096  # default column chunk of the looped kernel
ALIGN = 16  # row starts are rounded down to this many elements in the looped kernel

# (kernel name, n_rows, n_cols, dtypes, aligned flags) -> (ROWS, BLOCK, num_warps)
TUNED: dict[tuple, tuple[int, int, int]] = {}


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def layout(shape: Sequence[int], xs: Sequence) -> tuple[tuple[int, int], list[int], list]:
    """Leading dims of ``shape`` coalesced into (d0, d1, d2) and each input's strides over them.

    Returns ((d1, d2), [s0, s1, s2, s_col per input], inputs expanded to ``shape``). Broadcast
    dims get stride 0. When more than three leading dims cannot be coalesced the inputs are
    made contiguous.
    """
    ex = [x.expand(shape) for x in xs]
    strides = [x.stride() for x in ex]
    dims = []  # outermost first: (size, [stride per input])
    for d, size in enumerate(shape[:-1]):
        if size != 1:
            dims.append((size, [s[d] for s in strides]))
    merged: list[tuple[int, list[int]]] = []
    for size, st in reversed(dims):
        if merged and all(a == b * merged[-1][0] for a, b in zip(st, merged[-1][1])):
            merged[-1] = (merged[-1][0] * size, merged[-1][1])
        else:
            merged.append((size, st))
    merged.reverse()
    if len(merged) > 3:
        return layout(shape, [x.contiguous() for x in ex])
    while len(merged) < 3:
        merged.insert(0, (1, [0] * len(xs)))
    flat: list[int] = []
    for k, s in enumerate(strides):
        flat += [merged[0][1][k], merged[1][1][k], merged[2][1][k], s[-1]]
    return (merged[1][0], merged[2][0]), flat, ex


def flat_rows(shape: Sequence[int], xs: Sequence, numel: int) -> tuple[int, ...] | None:
    """For a reduction-free pattern: ``(numel // B, B)`` with B the largest power of two up to
    4096 dividing ``numel``, when every input is contiguous and full-size (rows do not matter
    then); None when some input broadcasts or is strided, or no B >= 256 divides."""
    if not all(tuple(x.shape) == tuple(shape) and x.is_contiguous() for x in xs):
        return None
    b = 4096
    while b >= 256:
        if numel % b == 0:
            return (numel // b, b)
        b //= 2
    return None


def configs(n_rows: int, n_cols: int, variant: str) -> list[tuple[int, int, int]]:
    """(ROWS, BLOCK, num_warps) to try, the heuristic one first.

    At most four, since each is compiled once per shape: one_pass keeps whole rows (BLOCK = next
    power of two of n_cols) and varies rows per program and warps around the heuristic (tiles up
    to 16K elements); looped keeps one row per program and varies the chunk (2K..8K) and warps.
    """
    import triton

    if variant == "one_pass":
        block = triton.next_power_of_2(n_cols)
        max_rows = min(64, triton.next_power_of_2(n_rows))
        rows0 = min(max(1, 4096 // block), max_rows)
        w0 = _warps(rows0 * block)
        out = [(rows0, block, w0)]
        for rows, warps in ((rows0, w0 * 2), (max(1, rows0 // 2), max(2, w0 // 2)), (1, max(4, _warps(block)))):
            cfg = (rows, block, min(warps, 16))
            if rows <= max_rows and rows * block <= 16384 and cfg not in out:
                out.append(cfg)
        return out
    block0 = min(triton.next_power_of_2(n_cols), LOOP_BLOCK)
    out = [(1, block0, _warps(block0))]
    for block, warps in ((8192, 16), (2048, 4), (4096, 16)):
        if block <= triton.next_power_of_2(n_cols) and (1, block, warps) not in out:
            out.append((1, block, warps))
    return out


def _warps(tile: int) -> int:
    return 4 if tile <= 2048 else 8 if tile <= 8192 else 16


def pick(key: tuple, candidates: list[tuple[int, int, int]], launch: Callable[[tuple[int, int, int]], None],
         device_type: str) -> tuple[int, int, int]:
    """The config for ``key``: cached, else timed on this GPU (first candidate if it cannot be)."""
    if key in TUNED:
        return TUNED[key]
    if len(candidates) == 1 or device_type != "cuda" or interpreting():
        return candidates[0]
    import torch

    if torch.cuda.is_current_stream_capturing():  # no timing inside a graph capture
        return candidates[0]
    from triton.testing import do_bench

    times = []
    for cfg in candidates:
        try:
            launch(cfg)  # compile outside the timing
            times.append((do_bench(lambda: launch(cfg), warmup=5, rep=20), cfg))
        except Exception:  # a config the compiler refuses (e.g. out of shared memory) is skipped
            continue
    best = min(times)[1] if times else candidates[0]
    TUNED[key] = best
    return best


def run(one_pass_kernel, looped_kernel, reference: Callable, xs: Sequence, scalars: Sequence,
        output_kinds: Sequence[str], *, pattern_id: str, levels: int, variant: str | None = None,
        out_meta: Callable | None = None, config: tuple[int, int, int] | None = None) -> tuple:
    """Run a generated pattern on ``xs`` (tensors) and ``scalars``; returns fresh contiguous outputs.

    ``variant`` forces ``one_pass`` or ``looped``; ``config`` forces (ROWS, BLOCK, num_warps).
    """
    import torch
    import triton

    device = xs[0].device
    if device.type == "cpu" and not interpreting():
        raise RuntimeError(f"{pattern_id}: CPU tensors need TRITON_INTERPRET=1 set before triton is imported")
    metas = out_meta(tuple(tuple(x.shape) for x in xs), tuple(x.dtype for x in xs), tuple(scalars))
    outs = tuple(torch.empty(s, dtype=d, device=device) for s, d in metas)
    shape = tuple(torch.broadcast_shapes(*(x.shape for x in xs))) or (1,)
    n_cols = shape[-1]
    n_rows = math.prod(shape[:-1])
    for o, kind in zip(outs, output_kinds):
        if o.numel() != (n_rows * n_cols if kind == "vec" else n_rows):
            raise ValueError(f"{pattern_id}: output of shape {tuple(o.shape)} does not fit rows of {shape}")
    if n_rows * n_cols == 0:
        return outs
    if levels == 0 and variant is None:
        flat = flat_rows(shape, xs, n_rows * n_cols)
        if flat is not None:
            shape, (n_rows, n_cols) = flat, flat
            xs = [x.view(flat) for x in xs]
    (d1, d2), strides, xs = layout(shape, xs)
    variant = variant or ("one_pass" if n_cols <= ONE_PASS_MAX else "looped")
    dtypes = tuple(str(x.dtype) for x in xs)
    if variant == "one_pass":
        def launch(cfg):
            rows, block, warps = cfg
            one_pass_kernel[(triton.cdiv(n_rows, rows),)](*xs, *outs, *scalars, n_rows, n_cols, d1, d2, *strides,
                                                          ROWS=rows, BLOCK=block, num_warps=warps)
        flags: tuple = ()
    else:
        # inputs laid out exactly like the rows (contiguous, full shape) are read from the row's
        # ALIGN-aligned start, so their loads vectorize even when n_cols is not a multiple of 16
        aligned = {f"X{k}_ALIGNED": tuple(x.shape) == shape and x.is_contiguous() for k, x in enumerate(xs)}
        flags = tuple(aligned.values())

        def launch(cfg):
            _, block, warps = cfg
            looped_kernel[(n_rows,)](*xs, *outs, *scalars, n_rows, n_cols, d1, d2, *strides,
                                     ROWS=1, BLOCK=block, num_warps=warps, **aligned)
    key = (pattern_id, variant, n_rows, n_cols, dtypes, flags, tuple(scalars))
    cfg = config or pick(key, configs(n_rows, n_cols, variant), launch, device.type)
    launch(cfg)
    return outs
