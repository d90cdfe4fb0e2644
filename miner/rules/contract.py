"""The generated row kernel's shape contract: which shapes and dtypes one launch can compute.

One function, :func:`shape_contract`, three callers: the ``kernel`` safety rule at mining and at
compile time (``miner.rules.safety.check_kernel``, on the occurrence's or the match's metas),
``miner.runtime.launch`` before the first launch of each (shapes, strides, dtypes) (on the
pattern traced on meta tensors; a violation raises ``launch.ContractError``), and ``miner generate``
(:func:`row_shape`, the rows of a candidate's observed shapes).
"""

from __future__ import annotations

import math
from typing import Sequence

KERNEL_DTYPES = ("float32", "bfloat16", "float16", "bool")  # what generated kernels load (floats in float32)


def row_shape(shapes: Sequence[Sequence[int]]) -> tuple[int, ...] | None:
    """The broadcast shape of ``shapes`` as the kernel's rows see it (rank 0 -> ``(1,)``); None if they do not broadcast."""
    out: list[int] = []
    for s in shapes:
        s = list(s)
        if len(s) > len(out):
            out = [1] * (len(s) - len(out)) + out
        s = [1] * (len(out) - len(s)) + s
        for i, (a, b) in enumerate(zip(out, s)):
            if a != b and a != 1 and b != 1:
                return None
            out[i] = b if a == 1 else a
    return tuple(out) or (1,)


def shape_contract(inputs: Sequence[tuple[Sequence[int], str]],
                   reductions: Sequence[tuple[str, Sequence[int], Sequence[int] | None]] = (),
                   outputs: Sequence[tuple[str, Sequence[int], str]] = (),
                   seeds: Sequence[int] = (), randoms: Sequence[tuple[str, Sequence[int]]] = (),
                   gathered: Sequence[tuple[int, Sequence[int]]] = ()) -> list[str]:
    """Why a generated row kernel cannot compute these shapes: an empty list when it can.

    The kernel's model: every input is read per element of the inputs' broadcast shape ``full``
    (any strides, broadcast dims read with stride 0); a row is ``full``'s last dim (``n_cols``
    elements), ``n_rows`` = the product of the others; a reduction reduces one row; a value is
    either per element (``vec``) or per row (``row``).

    Sizes may be symbolic (any hashable but int, e.g. ``"s0"`` as ``miner scan`` writes a SymInt):
    equal symbols are equal sizes, and a symbol is never 1 (torch specializes sizes 0 and 1), so a
    contract that holds for the symbols holds for every size the compiled graph runs with.

    Parameters
    ----------
    inputs : sequence of (shape, dtype name)
        The kernel's tensor inputs.
    reductions : sequence of (who, operand shape, dims or None)
        Every reduction of the pattern: its operand's shape and its dims (None: all dims).
    outputs : sequence of (who, shape, kind)
        Every output, ``kind`` "vec" or "row".
    seeds : sequence of int
        Inputs that are dropout seed vectors (``inductor_seeds``, int64, 1-D): read at one index per
        program, never per element, so they take no part in the broadcast.
    randoms : sequence of (who, shape)
        Every random op (``inductor_random``): the kernel draws one number per element of the rows
        at the element's row-major offset, so its shape must be the rows' full shape.
    gathered : sequence of (int, shape)
        Inputs an embedding reads (its table and int64 index), each with its shape in the rows' space
        (seen through the embedding result's views, ``miner.generate.emit.gather_views_source``): they
        broadcast with that shape, and their dtypes are the gather's to check.

    Returns
    -------
    list of str
        One clause per violation: inputs that do not broadcast, a dtype the kernel does not
        load, a reduction over another dim than the last or over fewer elements than a row (a
        size-1 dim broadcast to wider rows later: the kernel would reduce ``n_cols`` copies) or over
        rows of one element (nothing to reduce; a norm's gradient there is ill-conditioned), a
        per-element output that is not ``full``, a per-row output that is not one value per row, a
        seed input that is no 1-D int64 vector, a random op whose shape is not ``full``.
    """
    out = []
    for k in seeds:
        shape, dtype = inputs[k]
        if dtype != "int64" or len(shape) != 1:
            out.append(f"in{k} is {dtype}{list(shape)}; a seed input is a 1-D int64 vector")
    viewed = dict((k, tuple(s)) for k, s in gathered)
    inputs = [(viewed[k], None) if k in viewed else x for k, x in enumerate(inputs) if k not in set(seeds)]
    if not inputs:
        return out + ["no tensor inputs"]
    for k, (shape, dtype) in enumerate(inputs):
        if dtype is not None and dtype not in KERNEL_DTYPES:
            out.append(f"in{k} is {dtype}; the kernel loads {', '.join(KERNEL_DTYPES)}")
    if out:
        return out
    full = row_shape([s for s, _ in inputs])
    if full is None:
        return ["inputs do not broadcast: " + " ".join(str(list(s)) for s, _ in inputs)]
    n_cols = full[-1]
    for who, shape, dims in reductions:
        nd = len(shape)
        if nd == 0:
            continue
        dims = list(range(nd)) if dims is None or len(dims) == 0 else [d % nd for d in dims]
        if [d for d in dims if shape[d] != 1 or d == nd - 1] != [nd - 1]:
            out.append(f"{who} reduces dims {dims} of {list(shape)}; the kernel reduces the last dim only")
        elif shape[-1] != n_cols:
            out.append(f"{who} reduces {shape[-1]} element(s) per row of {list(shape)}, but the kernel's rows "
                       f"are {n_cols} wide ({list(full)}): it would reduce {n_cols} broadcast copies")
        elif shape[-1] == 1:
            out.append(f"{who} reduces one element per row of {list(shape)}: nothing to reduce (Inductor computes "
                       f"it pointwise), and a norm's gradient through rsqrt(var + eps) over one element is "
                       f"ill-conditioned (var is 0: rounding is amplified by eps^-1.5)")
    for who, shape in randoms:
        if _squeeze_leading(shape) != _squeeze_leading(full):
            out.append(f"{who} draws {list(shape)} random numbers, but the kernel draws one per element of the "
                       f"rows {list(full)}")
    rows = _squeeze_leading(full[:-1])
    for who, shape, kind in outputs:
        shape = _squeeze_leading(shape)
        if kind == "vec" and not same_layout(shape, _squeeze_leading(full)):
            out.append(f"{who} of shape {list(shape)} is per element, but does not fill the rows of {list(full)}")
        elif kind == "row" and not any(same_layout(shape, r) for r in (rows, _squeeze_leading(full[:-1] + (1,)))):
            out.append(f"{who} of shape {list(shape)} is per row, but the kernel's rows are {list(full)}")
    return out


def same_layout(shape: tuple, want: tuple) -> bool:
    """``shape`` holds ``want``'s elements in the same row-major order with the same last dim: equal, or
    (concrete sizes) a reshape of it that merges or splits only the leading dims ([384, 512, 512] of rows
    [16, 24, 512, 512]: a region's output reshaped inside it)."""
    if shape == want:
        return True
    if not shape or not want or shape[-1] != want[-1]:
        return False
    if not all(isinstance(d, int) for d in (*shape, *want)):
        return False  # symbolic sizes: only equal shapes are known to be the same layout
    return math.prod(shape[:-1]) == math.prod(want[:-1])


def _squeeze_leading(shape: Sequence) -> tuple:
    """``shape`` without its leading size-1 dims (equal element layout, row-major)."""
    shape = tuple(shape)
    i = 0
    while i < len(shape) and shape[i] == 1:
        i += 1
    return shape[i:]


BITS_GROUP = 8  # mask elements per byte when a kernel stores a bool output as bits


def bits_contract(shape: Sequence[int], dtype: str, kind: str) -> list[str]:
    """Why a generated row kernel cannot store this output as bits (``miner.runtime.jit.store_mask``): an
    empty list when it can. A byte's eight elements must lie in one row and in one tile of one program, so
    rows hold a multiple of eight elements (the kernel's tiles and chunks then start at multiples of eight;
    a reduction-free pattern re-cut into power-of-two rows keeps that)."""
    reasons = []
    if dtype != "bool" or kind != "vec":
        reasons.append(f"a {dtype} {kind} output: only bool per-element outputs are stored as bits")
    if not shape or shape[-1] % BITS_GROUP:
        reasons.append(f"rows of {shape[-1] if shape else 0} elements: not a multiple of {BITS_GROUP}")
    return reasons
