"""Run-time half of the outer-reduction region kind (``miner.generate.reduce``, issue 30).

A generated ``kernel.py`` of this kind has three ``@triton.jit`` variants of one computation (the
reductions over the *reduced* dims, e.g. t5's batch, then the pointwise epilogue and the stores, per
*kept* element, in the order of the reduced input's dims so loads along the last dim are coalesced),
all with the same parameters (:func:`kernel_args`), and ``KERNELS`` / ``VARIANT`` naming them:

- ``loop``: a program per ``XB`` kept elements, a loop over the reduced elements unrolled by ``RB``,
  every accumulator a ``[XB]`` register vector (each thread sums its own elements);
- ``tile``: ``[RB, XB]`` tiles of reduced x kept elements (Inductor's layout), summed across rows;
- ``split`` (the default): ``loop`` with one program per (block, reduction): each reads only its
  reduction's inputs (few registers, full occupancy) and stores a float32 partial; an epilogue
  kernel reads the partials back (t5: 0.3 GB more over 4.2 GB) and runs the epilogue.

Its launcher builds the views the kernels read and calls :func:`run`, which passes every size and
stride as a ``tl.constexpr`` (one compile per shape, as Inductor's static shapes) and picks the tile
``(RB, XB, num_warps)`` by timing ``CONFIGS[variant]`` on the first call per (variant, shapes,
strides, dtypes) (``miner.runtime.launch.pick``: cached for the process; inside a CUDA-graph capture,
on the CPU and under the interpreter the first config, untimed and not cached). ``python3 -m
miner.check.reduce`` times every variant x config on a GPU.

A region that ends in an embedding's dense backward (``index_put(full(0), [idx], values,
accumulate=True)``) stores ``values`` in the kept order and calls :func:`index_put_acc`: a program
per ``BLOCK`` index positions and table column, which sums its values per table row first (a
one-hot ``[rows, BLOCK]`` reduction when the table has at most ``ONE_HOT_MAX`` rows) and then adds
one atomic per row, instead of one atomic per element into a few hundred slots.

Views (``chain``): the epilogue of a reduction may squeeze, permute and unsqueeze its kept result
(t5: ``[1, H, S, S] -> [S, S, H]``). A chain is a tuple of steps ``("squeeze", dims)``,
``("unsqueeze", dim)``, ``("permute", perm)``; :func:`kept_view` maps a tensor of the chain's end
shape (or one broadcasting to it) back onto the kept shape, so the kernel indexes every tensor by
the kept coordinates.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import torch
import triton
import triton.language as tl

from miner.runtime import launch as _launch
from miner.runtime.rewrite import trace_keeping_reshape  # noqa: F401 - committed reduce patterns call it here

# (RB, XB, num_warps) per variant, the first the untimed default; RB is unused by ``loop``
CONFIGS = {  # registers per thread on sm_90 (ptxas, triton 3.9) in the comments: none spills
    "loop": ((1, 512, 4), (1, 256, 2), (2, 256, 2), (1, 512, 8)),  # 130, 128, 254, 64
    "tile": ((16, 64, 4), (16, 32, 4), (16, 128, 8), (4, 256, 4), (2, 512, 4)),  # 162, 126, 172, 180, 182
    "split": ((2, 512, 2), (1, 512, 2), (4, 512, 2), (1, 512, 4), (2, 512, 4), (1, 256, 1)),  # 48, 40, 78, 32, -, 51
}
EPILOGUE = (1, 1024, 4)  # the split variant's epilogue kernel
ONE_HOT_MAX = 64  # table rows up to which index_put_acc sums per row inside a program


def apply_chain(t: torch.Tensor, chain: Sequence) -> torch.Tensor:
    """``t`` viewed through ``chain`` (the epilogue's squeeze / unsqueeze / permute steps)."""
    for op, arg in chain:
        if op == "squeeze":
            for d in arg:
                if t.shape[d] != 1:
                    raise ValueError(f"chain: squeeze of dim {d} of size {t.shape[d]}")
            t = t.squeeze(tuple(arg)) if arg else t
        elif op == "unsqueeze":
            t = t.unsqueeze(arg)
        elif op == "permute":
            t = t.permute(tuple(arg))
        else:
            raise ValueError(f"chain: unknown step {op!r}")
    return t


def invert_chain(t: torch.Tensor, chain: Sequence) -> torch.Tensor:
    """The inverse of :func:`apply_chain`: ``t`` (of the chain's end shape) on the chain's start shape."""
    for op, arg in reversed(chain):
        if op == "squeeze":
            for d in sorted(arg):
                t = t.unsqueeze(d)
        elif op == "unsqueeze":
            if t.shape[arg] != 1:
                raise ValueError(f"chain: dim {arg} of size {t.shape[arg]} where an unsqueeze put 1")
            t = t.squeeze(arg)
        elif op == "permute":
            t = t.permute(tuple(sorted(range(len(arg)), key=lambda i: arg[i])))
        else:
            raise ValueError(f"chain: unknown step {op!r}")
    return t


def kept_shape(full: Sequence[int], reduced: Sequence[int]) -> tuple[int, ...]:
    """The reduction's keepdim shape: ``full`` with the ``reduced`` dims set to 1."""
    return tuple(1 if d in reduced else int(s) for d, s in enumerate(full))


def kept_view(t: torch.Tensor, kept: Sequence[int], chain: Sequence) -> torch.Tensor:
    """``t`` (broadcasting to the end shape of ``chain`` applied to ``kept``) as a view of the kept shape."""
    end = apply_chain(torch.empty(tuple(kept), device="meta"), chain).shape
    return invert_chain(t.expand(end), chain)


def full_shape(views: dict) -> tuple[int, ...]:
    """The broadcast shape of the views the kernel reads per reduced element."""
    return tuple(torch.broadcast_shapes(*(v.shape for v in views.values())))


def _max_offset(shape: Sequence[int], stride: Sequence[int]) -> int:
    return sum((s - 1) * abs(st) for s, st in zip(shape, stride) if s > 0)


@dataclass(frozen=True)
class Views:
    """What a launch reads and writes, in the kept coordinates (see :func:`run`).

    Attributes
    ----------
    f_views, k_views : dict
        Input index -> its view of the full shape (read per reduced element) / of the kept shape
        (read once per kept element, after the reductions).
    stores : sequence of Tensor
        Views of the kept shape the kernel writes.
    full, reduced
        The reduced operand's shape and the reduced dims.
    """

    f_views: dict
    k_views: dict
    stores: Sequence[torch.Tensor]
    full: Sequence[int]
    reduced: Sequence[int]


@dataclass(frozen=True)
class Args:
    """What every kernel of a region takes (one parameter list for all variants): the pointers in
    order (inputs by index, then the stores), the kept count, and the ``tl.constexpr`` values."""

    ptrs: tuple
    n_kept: int
    cexpr: dict
    wide: bool
    last: int  # the size of the last dim (a program's XB kept elements lie in one row when XB divides it)


def kernel_args(views: Views, consts: dict) -> Args:
    """The :class:`Args` of a launch: sizes ``N<d>``, strides ``SX<k>_<d>`` / ``SO<i>_<d>``, ``INV<k>``
    (input k has stride 0 along every reduced dim), ``c<i>`` (``consts``)."""
    tensors = {**views.f_views, **views.k_views}
    if set(views.f_views) & set(views.k_views):
        raise ValueError("an input read both per reduced element and per kept element")
    ptrs = tuple(tensors[k] for k in sorted(tensors)) + tuple(views.stores)
    layout = (tuple(map(int, views.full)), tuple(views.reduced), tuple(sorted(views.f_views)),
              tuple(sorted(views.k_views)), tuple((tuple(v.shape), tuple(v.stride())) for v in ptrs),
              tuple(sorted(consts.items())))
    n_kept, cexpr, wide = _layout_args(layout)
    return Args(ptrs, n_kept, dict(cexpr), wide, int(views.full[-1]))


@functools.lru_cache(maxsize=256)
def _layout_args(layout: tuple) -> tuple[int, tuple, bool]:
    """(kept count, constexpr items, 64-bit offsets) of a launch's sizes and strides: computed once per
    layout (a region of 50 inputs has ~270 of them; the launcher runs each step)."""
    full, reduced, f_keys, k_keys, tensors, consts = layout
    n_kept = math.prod(kept_shape(full, reduced))
    cexpr = {f"N{d}": s for d, s in enumerate(full)}
    keys = sorted(f_keys + k_keys)
    for k, (_, stride) in zip(keys, tensors):
        cexpr.update({f"SX{k}_{d}": int(st) for d, st in enumerate(stride)})
    for i, (_, stride) in enumerate(tensors[len(keys):]):
        cexpr.update({f"SO{i}_{d}": int(st) for d, st in enumerate(stride)})
    by_key = dict(zip(keys, tensors))
    for k in f_keys:
        shape, stride = by_key[k]
        cexpr[f"INV{k}"] = all(stride[d] == 0 or shape[d] == 1 for d in reduced)
    cexpr.update(consts)
    wide = max([_max_offset(shape, stride) for shape, stride in tensors] + [n_kept]) >= 2 ** 31 - 4096
    return n_kept, tuple(cexpr.items()), wide


def run(kernels: dict, views: Views, *, consts: dict, key: str, n_acc: int, variant: str,
        config: tuple[int, int, int] | None = None) -> None:
    """Launch a generated region's kernel(s) of ``variant``.

    Parameters
    ----------
    kernels : dict
        Variant -> ``@triton.jit`` kernel (``loop``, ``tile``, ``split``, and ``epilogue``, which
        ``split`` runs after it); all take the pointers of :func:`kernel_args`, then ``p_ptr`` (the
        ``split`` partials, else unused) and ``n_kept``.
    views : Views
        The inputs' views, the stores, the full shape and the reduced dims.
    consts : dict
        The scalar slots the kernel reads (``c<i>``), compiled in.
    key : str
        The pattern id (with the variant, shapes, strides and dtypes, the tuning cache's key).
    n_acc : int
        The region's reductions (rows of the ``split`` partials).
    variant : str
        A key of ``kernels`` other than ``epilogue``.
    config : (int, int, int), optional
        Force ``(RB, XB, num_warps)``; default: the fastest of ``CONFIGS[variant]``, timed once per
        tuning key on a GPU outside CUDA-graph capture (``miner.runtime.launch.pick``), else the first.
    """
    if variant not in CONFIGS or variant not in kernels:
        raise ValueError(f"{key}: variant {variant!r}, expected one of {sorted(CONFIGS)}")
    a = kernel_args(views, consts)
    if a.n_kept == 0:
        return
    partials = None
    if variant == "split":
        partials = torch.empty((n_acc, a.n_kept), dtype=torch.float32, device=a.ptrs[0].device)
        if n_acc * a.n_kept >= 2 ** 31 - 4096:  # the partials' offsets need 64 bits
            a = Args(a.ptrs, a.n_kept, a.cexpr, True, a.last)
    launcher = _launcher(kernels, variant, a, partials, n_acc)
    device = a.ptrs[0].device.type
    tune_key = ("reduce", key, variant, tuple(views.full),
                tuple((tuple(v.shape), tuple(v.stride()), str(v.dtype)) for v in a.ptrs))
    launcher(config or _launch.pick(tune_key, list(CONFIGS[variant]), launcher, device))


def _launcher(kernels: dict, variant: str, a: Args, partials, n_acc: int):
    """``go(config)``: one launch of ``variant`` (for ``split``, the partials and then the epilogue)."""
    p = partials if partials is not None else a.ptrs[-1]

    def go(cfg):
        rb, xb, warps = cfg
        grid = (triton.cdiv(a.n_kept, xb), n_acc) if variant == "split" else (triton.cdiv(a.n_kept, xb),)
        kernels[variant][grid](*a.ptrs, p, a.n_kept, **a.cexpr, RB=rb, XB=xb, ONE_ROW=a.last % xb == 0,
                               WIDE=a.wide, num_warps=warps)
        if variant == "split":
            erb, exb, ewarps = EPILOGUE
            kernels["epilogue"][(triton.cdiv(a.n_kept, exb),)](*a.ptrs, p, a.n_kept, **a.cexpr, RB=erb, XB=exb,
                                                                ONE_ROW=False, WIDE=a.wide, num_warps=ewarps)
    return go


@triton.jit
def _index_put_acc_kernel(table_ptr, idx_ptr, val_ptr, n_pos, n_rows, v_sp, v_sc, T: tl.constexpr,
                          NB: tl.constexpr, BLOCK: tl.constexpr, ONE_HOT: tl.constexpr):
    """table[idx[p], t] += values[p, t] for a block of positions p and one column t."""
    pos = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    t = tl.program_id(1)
    m = pos < n_pos
    idx = tl.load(idx_ptr + pos, mask=m, other=0).to(tl.int64)
    idx = tl.where(idx < 0, idx + n_rows, idx)  # a negative index counts from the end, as index_put's
    ok = m & (idx >= 0) & (idx < n_rows)
    v = tl.load(val_ptr + pos.to(tl.int64) * v_sp + t * v_sc, mask=ok, other=0.0).to(tl.float32)
    if ONE_HOT:
        rows = tl.arange(0, NB)
        hit = (idx[None, :] == rows[:, None]) & ok[None, :]
        per_row = tl.sum(tl.where(hit, v[None, :], 0.0), axis=1)
        tl.atomic_add(table_ptr + rows * T + t, per_row, mask=rows < n_rows)
    else:
        tl.atomic_add(table_ptr + idx * T + t, v, mask=ok)


def index_put_acc(table: torch.Tensor, idx: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``table.index_put_([idx], values, accumulate=True)`` for a float32 table; returns ``table``.

    ``values`` has the shape ``idx.shape + table.shape[1:]`` (any strides). An index outside
    ``[-rows, rows)`` adds nothing (torch raises there; Inductor's kernel asserts on the device).
    """
    if table.dtype != torch.float32 or not table.is_contiguous():
        raise ValueError(f"index_put_acc: a contiguous float32 table, got {table.dtype}")
    if tuple(values.shape) != tuple(idx.shape) + tuple(table.shape[1:]):
        raise ValueError(f"index_put_acc: values {list(values.shape)} for indices {list(idx.shape)} "
                         f"into a table {list(table.shape)}")
    n_pos, n_rows, cols = idx.numel(), table.shape[0], math.prod(table.shape[1:])
    if n_pos == 0 or cols == 0:
        return table
    vals = values.reshape(n_pos, cols)
    nb = triton.next_power_of_2(max(n_rows, 1))
    one_hot = nb <= ONE_HOT_MAX
    block = max(16, 8192 // nb) if one_hot else 1024
    _index_put_acc_kernel[(triton.cdiv(n_pos, block), cols)](
        table, idx.reshape(n_pos), vals, n_pos, n_rows, vals.stride(0), vals.stride(1), T=cols, NB=nb,
        BLOCK=block, ONE_HOT=one_hot, num_warps=4)
    return table


_OPS: dict = {}


def define_list_op(qualname: str, n_outputs: int, impl, fake):
    """The custom op ``qualname`` as ``(Tensor[] xs, float[] cs) -> outputs``: a region of 50 inputs and
    15 scalars passes the 64 arguments a schema may have (``rewrite.define_op`` takes them one by one).
    ``impl(*xs, *cs)`` runs the kernel, ``fake(*xs, *cs)`` gives the metas (fresh contiguous outputs)."""
    from miner.runtime import rewrite

    if qualname in _OPS:
        return _OPS[qualname]
    ns, name = qualname.split("::")
    rets = "Tensor" if n_outputs == 1 else "(" + ", ".join(["Tensor"] * n_outputs) + ")"

    def fresh(outs):
        return outs[0] if n_outputs == 1 else tuple(outs)

    def _impl(xs, cs):
        return fresh(tuple(impl(*xs, *cs)))

    def _fake(xs, cs):
        return fresh(tuple(torch.empty_like(o, memory_format=torch.contiguous_format) for o in fake(*xs, *cs)))

    if not hasattr(getattr(torch.ops, ns), name):
        lib = rewrite._LIBS.setdefault(ns, torch.library.Library(ns, "FRAGMENT"))
        lib.define(f"{name}(Tensor[] xs, float[] cs) -> {rets}")
        lib.impl(name, _impl, "CompositeExplicitAutograd")
        torch.library.register_fake(qualname, _fake, lib=lib)
    _OPS[qualname] = getattr(getattr(torch.ops, ns), name).default
    return _OPS[qualname]


def _any_broadcast(reason: str) -> bool:
    """A ``meta`` reason of the row-kernel layout (an operand broadcast neither per row nor per column):
    this kind reads every tensor through its own strides, so any broadcast is in its class."""
    return reason.startswith("meta: ") and " broadcasts operand " in reason


def match_ok(match, op_name: str, n_inputs: int, input_kinds: Sequence[str]) -> bool:
    """``rewrite.match_ok(..., region=True)`` less the row-layout broadcast reasons (:func:`_any_broadcast`)."""
    from miner.runtime import rewrite

    reasons = [r for r in rewrite.match_reasons(match, n_inputs, input_kinds, False, True) if not _any_broadcast(r)]
    rewrite.record_declines(match, op_name, n_inputs, reasons)
    return not reasons


def structure_ok(match, expected: Sequence, op_name: str, n_inputs: int) -> bool:
    """The extra check's structural part: :func:`structure_reasons`, a decline counted with its reason."""
    from miner.runtime import rewrite

    reasons = structure_reasons(match, expected)
    rewrite.record_declines(match, op_name, n_inputs, reasons)
    return not reasons


def structure_reasons(match, expected: Sequence) -> list[str]:
    """Why a match's structural arguments (reduced dims, views' dims, accumulate) differ from the
    pattern's (``expected``, as :func:`structure_of` gives them); [] when they agree.

    The pattern matcher ignores int and list arguments (it matches a ``sum`` over any dims), and the
    kernel computes exactly the dims it was generated for."""
    got = structure_of(match.nodes)
    return [] if sorted(got) == sorted(map(tuple, expected)) else [
        f"kernel: reduced dims / views {sorted(got)[:4]} differ from the pattern's {sorted(map(tuple, expected))[:4]}"]


_STRUCTURAL = {"sum": ("dim", "keepdim"), "mean": ("dim", "keepdim"), "amax": ("dim", "keepdim"),
               "amin": ("dim", "keepdim"), "permute": ("dims",), "squeeze": ("dim",),
               "unsqueeze": ("dim",), "index_put": ("accumulate",)}


def structure_of(nodes) -> list[tuple]:
    """(op, args...) of each node with structural arguments, dims made non-negative by the operand's rank."""
    out = []
    for n in nodes:
        if getattr(n, "op", None) != "call_function" or not hasattr(n.target, "_schema"):
            continue
        base = n.target._schema.name.split("::")[-1]
        if base not in _STRUCTURAL:
            continue
        names = [a.name for a in n.target._schema.arguments]
        bound = dict(zip(names, n.args)) | dict(n.kwargs)
        src = n.args[0].meta.get("val") if n.args and hasattr(n.args[0], "meta") else None
        rank = src.dim() + (1 if base == "unsqueeze" else 0) if src is not None else None
        row = [base]
        for a in _STRUCTURAL[base]:
            v = bound.get(a)
            v = False if v is None and a in ("keepdim", "accumulate") else v
            if a in ("dim", "dims") and rank is not None and v is not None:
                v = [d % rank for d in v] if isinstance(v, (list, tuple)) else v % rank
            row.append(tuple(v) if isinstance(v, (list, tuple)) else v)
        out.append(tuple(row))
    return out


__all__ = ["trace_keeping_reshape", "define_list_op", "apply_chain", "invert_chain", "kept_shape", "kept_view", "full_shape", "run", "index_put_acc", "kernel_args", "Args", "Views", "EPILOGUE",
           "match_ok", "structure_ok", "structure_reasons", "structure_of", "CONFIGS", "ONE_HOT_MAX"]
