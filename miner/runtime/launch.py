"""Launch-time half of a generated kernel: row layout, tile configs, per-shape tuning.

Every generated ``kernel.py`` (``candidates/<id>/``, ``fusions/<name>/``) holds the parts that
depend on its pattern -- ``reference``, ``one_pass_kernel``, ``looped_kernel``, gathered in its
``KERNEL`` (a :class:`KernelSpec`) -- and calls ``run(KERNEL, ...)`` for the rest, which is the same
for all of them:

- **rows**: the last dim of the inputs' broadcast shape is the row; leading dims are coalesced
  into at most three (``layout``) so broadcast and strided inputs are read in place. A pattern
  without reductions whose inputs are all contiguous and full-size is row-agnostic: it is
  re-cut into power-of-two rows (``flat_rows``), so a 3072-wide activation is not padded to 4096.
- **variant**: rows up to ``ONE_PASS_MAX`` take ``one_pass_kernel`` (whole rows in one tile);
  longer ones ``looped_kernel`` (chunks of columns, one row per program).
- **config**: (ROWS, BLOCK, num_warps). On a GPU the candidates of ``configs`` are timed once per
  (kernel, shape, dtypes) with ``triton.testing.do_bench`` and the fastest is kept for the
  process (``TUNED``), as Inductor autotunes its own kernels; under ``TRITON_INTERPRET=1``, or
  while a CUDA graph is being captured, the first (heuristic) config is used untimed (and not
  cached, so the shape is tuned at its next launch outside a capture).
- **contract** (``miner.rules.contract.shape_contract``): what a row kernel can compute, checked before
  the first launch of each (shapes, strides, dtypes) (``ContractError`` names the violated clause).
  Compile-time checks (``miner.rules.safety``'s ``kernel`` rule) apply the same function to the
  match's metas, so a compiled model declines the match instead of reaching the raise.
- **plan** (``PLANS``): what the first call of a (shapes, strides, dtypes) derived -- outputs'
  metas, layout, kernel, grid, tile -- so later calls only allocate and launch. The fused op runs
  on the host between Inductor's kernels: on the H200 (2026-12-03) bert's 26 layer-norm calls cost
  ~5 ms of host time per step. With the plan (and the op registered through ``torch.library.Library``
  rather than ``custom_op``, ``miner.runtime.rewrite.define_op``) a call's host path went from ~260
  to ~32 us on this CPU (kernels stubbed out). On the H200 a region call still cost ~100 us of host
  time (2026-12-06), much of it Triton binding ~45 arguments per launch: on CUDA a plan's later
  calls launch the compiled kernel directly once that was shown safe and checked bit for bit against
  Triton's own launch (``miner.runtime.direct``).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from miner.rules.contract import BITS_GROUP, bits_contract, row_shape, shape_contract
from miner.runtime import direct as _direct

ONE_PASS_MAX = 8192  # longest row the one-pass kernel holds; longer rows take the looped kernel
LOOP_BLOCK = 4096  # default column chunk of the looped kernel
ALIGN = 16  # row starts are rounded down to this many elements in the looped kernel

# (kernel name, n_rows, n_cols, dtypes, aligned flags) -> (ROWS, BLOCK, num_warps)
TUNED: dict[tuple, tuple[int, int, int]] = {}


class ContractError(ValueError):
    """A launch whose inputs the generated kernel cannot compute (see :func:`shape_contract`)."""


def _reduction_dims(func, args, kwargs):
    """The ``dim`` argument of an aten reduction call (None: all dims)."""
    names = [a.name for a in func._schema.arguments]
    if "dim" in kwargs:
        dims = kwargs["dim"]
    elif "dim" in names and names.index("dim") < len(args):
        dims = args[names.index("dim")]
    else:
        return None
    return [dims] if isinstance(dims, int) else (list(dims) if dims is not None else None)


@functools.lru_cache(maxsize=1024)
def traced_contract(reference: Callable, shapes: tuple, dtypes: tuple, scalars: tuple,
                    output_kinds: tuple, seeds: tuple = (), gathered: tuple = ()) -> tuple[str, ...]:
    """:func:`shape_contract` of ``reference`` (the pattern) on inputs of these shapes and dtypes.

    Runs ``reference`` on meta tensors (no device work, safe inside a CUDA-graph capture) and
    records each reduction's operand shape and dims.
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    reductions, randoms = [], []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func.__name__.startswith("inductor_random"):
                randoms.append((f"inductor_random#{len(randoms)}", tuple(args[0])))
            if torch.Tag.reduction in func.tags and args and isinstance(args[0], torch.Tensor):
                reductions.append((f"{func.__name__}#{len(reductions)}", tuple(args[0].shape),
                                   _reduction_dims(func, args, kwargs)))
            return func(*args, **kwargs)

    xs = [torch.empty(s, dtype=getattr(torch, d), device="meta") for s, d in zip(shapes, dtypes)]
    with Record():
        outs = reference(*xs, *scalars)
    outputs = [(f"out{i}", tuple(o.shape), kind) for i, (o, kind) in enumerate(zip(outs, output_kinds))]
    return tuple(shape_contract(list(zip(shapes, dtypes)), reductions, outputs, seeds=seeds, randoms=randoms,
                                gathered=gathered))


def check_contract(pattern_id: str, reference: Callable, xs: Sequence, scalars: Sequence,
                   output_kinds: Sequence[str], seeds: Sequence[int] = (), gathered: Sequence = ()) -> None:
    """Raise :class:`ContractError` when the kernel of ``pattern_id`` cannot compute these inputs
    (``gathered``: :func:`shape_contract`'s, the embedding inputs' shapes in the rows' space)."""
    devices = {x.device for x in xs}
    if len(devices) > 1:
        raise ContractError(f"{pattern_id}: inputs on several devices {sorted(map(str, devices))}")
    reasons = traced_contract(reference, tuple(tuple(x.shape) for x in xs),
                              tuple(str(x.dtype).removeprefix("torch.") for x in xs),
                              tuple(scalars), tuple(output_kinds), tuple(seeds), tuple(gathered))
    if reasons:
        raise ContractError(f"{pattern_id}: the kernel cannot compute these inputs: " + "; ".join(reasons))


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
    # a chunk is at least ALIGN wide: the head chunk must cover the row's lead (< ALIGN) before full chunks start
    block0 = max(ALIGN, min(triton.next_power_of_2(n_cols), LOOP_BLOCK))
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


@dataclass(frozen=True)
class Drawn:
    """One launch of a kernel that draws random numbers, as :func:`recording` keeps it: copies of
    its seed vectors (by input position) and of its bool outputs (the keep masks), and its scalars."""
    pattern_id: str
    seeds: dict  # input position -> a copy of the seed vector
    scalars: tuple
    # per output, a copy of each bool one (Inductor may reuse its storage once its last reader ran), else None:
    # only the masks are injected, and DeBERTa-v2's attention region's other outputs (an fp32 and a bf16
    # [16, 12, 512, 512] per launch) made ~7 GB of copies beside the judge's eager step, which then ran out of
    # an H100's memory (2026-12-06)
    outputs: tuple


RECORDERS: list[list] = []  # the active ``recording()`` lists


@contextlib.contextmanager
def recording():
    """Within it, every :func:`run` of a kernel with seed inputs (a dropout region) appends a
    :class:`Drawn` to the yielded list, in call order (``miner.check.masks`` injects the masks it
    drew into an eager reference step). Costs a copy of each output: for parity steps only."""
    calls: list = []
    RECORDERS.append(calls)
    try:
        yield calls
    finally:
        RECORDERS.remove(calls)


@dataclass(frozen=True)
class KernelSpec:
    """What :func:`run` knows of one generated kernel.py before any call: built once per kernel.py
    (its ``KERNEL``), the same for every shape.

    ``seeds``: the inputs that are dropout seed vectors: passed as plain pointers (the kernel reads
    one seed per program), outside the rows' layout and strides. ``columns``: inputs the one-pass
    kernel can read once per program as a ``[1, BLOCK]`` per-column vector (flag ``X<k>_COL``, set
    when the input is broadcast over every row: a norm's weight). ``rand4``: the kernel draws the
    four-per-call stream and takes the ``RAND4`` flag (:func:`rand4_flag`). ``views``: the kernel.py's
    ``_gather_views`` when the pattern holds embeddings: ``views(xs) -> (xs with each table and index
    replaced by its view in the rows' space, the tables' row strides)``; the rows are laid out over the
    views, and the strides follow the scalars as runtime ints.
    """

    one_pass_kernel: Any  # @triton.jit: whole rows in one tile
    looped_kernel: Any  # @triton.jit: reduction passes over column chunks, then a storing pass
    reference: Callable  # the pattern in torch ops (the shape contract; float64 numerics)
    output_kinds: tuple  # per output: vec (one value per element) or row (one per row)
    pattern_id: str
    levels: int  # reduction passes of the looped kernel (0: pointwise only)
    out_meta: Callable  # (shapes, dtypes, scalars) -> ((shape, dtype) per output)
    seeds: tuple = ()
    columns: tuple = ()
    rand4: bool = False
    views: Callable | None = None


def run(spec: KernelSpec, xs: Sequence, scalars: Sequence, *, variant: str | None = None,
        config: tuple[int, int, int] | None = None, bits: Sequence[int] = ()) -> tuple:
    """Run a generated pattern (``spec``: its kernel.py's ``KERNEL``) on ``xs`` (tensors) and ``scalars``;
    returns fresh contiguous outputs.

    ``variant`` forces ``one_pass`` or ``looped``; ``config`` forces (ROWS, BLOCK, num_warps); ``bits``: the
    bool outputs the kernel stores as bits (uint8, ``miner.runtime.bits.pack``'s layout; what the backward
    saves of a dropout mask), each within :func:`bits_contract` (else :class:`ContractError`).
    """
    outs = _run(spec, xs, scalars, variant, config, tuple(bits))
    if RECORDERS and spec.seeds:
        import torch

        from miner.runtime import bits as _bits

        shapes = spec.out_meta(tuple(tuple(x.shape) for x in xs), tuple(x.dtype for x in xs), tuple(scalars))
        record(Drawn(spec.pattern_id, {k: xs[k].clone() for k in spec.seeds}, tuple(scalars),
                     tuple(_bits.unpack(o, shapes[k][0]) if k in bits else o.clone() if o.dtype == torch.bool
                           else None for k, o in enumerate(outs))))
    return outs


def record(drawn: "Drawn") -> None:
    """``drawn`` appended to every active :func:`recording` (a region kernel's launch, or
    ``miner.runtime.keep_bits``'s op)."""
    for calls in RECORDERS:
        calls.append(drawn)


def _run(spec: KernelSpec, xs, scalars, variant, config, bits: tuple) -> tuple:
    """:func:`run` without the recording."""
    import torch

    device = xs[0].device
    if device.type == "cpu" and not interpreting():
        raise RuntimeError(f"{spec.pattern_id}: CPU tensors need TRITON_INTERPRET=1 set before triton is imported")
    key = (spec.pattern_id, id(spec.one_pass_kernel), variant, config, spec.levels, tuple(spec.seeds),
           tuple(spec.columns), spec.rand4, device, tuple((x.shape, x.stride(), x.dtype) for x in xs),
           tuple(s for s in scalars if not isinstance(s, int)), bits)
    plan = PLANS.get(key)
    if plan is None:
        outs, plan = _first_launch(spec, xs, scalars, variant, config, bits)
        _direct.LAUNCHES["triton"] += 1
        if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            PLANS[key] = plan  # a tile picked untimed inside a capture is not kept (see ``pick``)
        return outs
    # the same shapes, strides and dtypes as a call before: only allocate and launch
    outs = tuple(torch.empty(s, dtype=d, device=device) for s, d in plan.metas)
    if plan.kernel is None:
        return outs
    xs, extra = spec.views(xs) if spec.views is not None else (xs, ())
    inputs = [xs[k] for k in plan.seeds]
    rows = [xs[k] for k in plan.rows]
    if plan.copy_shape is not None:
        rows = [x.expand(plan.copy_shape).contiguous() for x in rows]
    inputs += rows
    args = (*inputs, *outs, *scalars, *extra, *plan.sizes, *plan.strides)

    def jit_launch(a):
        return plan.kernel[plan.grid](*a, **plan.constexprs)

    if plan.direct is None or torch.cuda.is_current_stream_capturing() or _direct.hooked():
        jit_launch(args)
        _direct.LAUNCHES["triton"] += 1
    else:  # Triton's binding skipped (``miner.runtime.direct``); the fresh outputs need no alignment check
        at = len(inputs) + len(outs)
        ints = [at + k for k, s in enumerate(scalars) if isinstance(s, int)]  # a dropout layer's seed index
        _direct.LAUNCHES[plan.direct.launch(
            _direct.specialization(inputs, [args[k] for k in ints]), args, outs, jit_launch,
            lambda compiled: _direct.launcher(plan.kernel, compiled, args, plan.constexprs, plan.grid, device.index,
                                              ints))] += 1
    return outs


@dataclass(frozen=True)
class Plan:
    """What :func:`run` derived from a call's shapes, strides and dtypes, reused by later calls
    with the same ones (the contract was checked and the tile picked on the first)."""
    metas: tuple  # (shape, dtype) per output
    kernel: Any  # the chosen @triton.jit kernel; None when there is nothing to compute
    grid: tuple = ()
    seeds: tuple = ()  # indices of the seed inputs, passed first
    rows: tuple = ()  # indices of the row inputs
    copy_shape: tuple | None = None  # row inputs copied contiguous at this shape (layout could not coalesce)
    sizes: tuple = ()  # n_rows, n_cols, d1, d2
    strides: tuple = ()
    constexprs: dict = field(default_factory=dict)
    direct: Any = None  # a ``miner.runtime.direct.Direct`` on CUDA: launches without Triton's per-call binding


PLANS: dict[tuple, Plan] = {}


def _first_launch(spec: KernelSpec, xs, scalars, variant, config, bits: tuple = ()) -> tuple[tuple, Plan]:
    """:func:`run` for shapes not seen before: check the contract, lay the rows out, pick the tile,
    launch; returns the outputs and the :class:`Plan` later calls reuse."""
    import torch
    import triton

    pattern_id, levels, seeds, columns, rand4, views = (spec.pattern_id, spec.levels, spec.seeds, spec.columns,
                                                        spec.rand4, spec.views)

    device = xs[0].device
    viewed, gather_ints = views(xs) if views is not None else (xs, ())
    gathered = tuple((k, tuple(v.shape)) for k, (v, x) in enumerate(zip(viewed, xs)) if v is not x)
    check_contract(pattern_id, spec.reference, xs, scalars, spec.output_kinds, seeds, gathered)
    metas = spec.out_meta(tuple(tuple(x.shape) for x in xs), tuple(x.dtype for x in xs), tuple(scalars))
    metas = _packed_metas(pattern_id, metas, spec.output_kinds, bits)
    xs = viewed
    outs = tuple(torch.empty(s, dtype=d, device=device) for s, d in metas)
    seed_idx = tuple(k for k in range(len(xs)) if k in set(seeds))
    row_idx = tuple(k for k in range(len(xs)) if k not in set(seeds))
    seed_ptrs = [xs[k] for k in seed_idx]
    xs = [xs[k] for k in row_idx]
    shape = row_shape([x.shape for x in xs])
    n_cols = shape[-1]
    n_rows = math.prod(shape[:-1])
    if n_rows * n_cols == 0:
        return outs, Plan(tuple(metas), None)
    if bits and n_cols % BITS_GROUP:  # the outputs' rows were checked; the kernel's rows are the inputs'
        raise ContractError(f"{pattern_id}: bits asked for rows of {n_cols} elements (a multiple of {BITS_GROUP})")
    if levels == 0 and variant is None:
        flat = flat_rows(shape, xs, n_rows * n_cols)
        if flat is not None:
            shape, (n_rows, n_cols) = flat, flat
            xs = [x.view(flat) for x in xs]
    before = [x.data_ptr() for x in xs]
    (d1, d2), strides, xs = layout(shape, xs)
    copy_shape = tuple(shape) if [x.data_ptr() for x in xs] != before else None
    variant = variant or ("one_pass" if n_cols <= ONE_PASS_MAX else "looped")
    dtypes = tuple(str(x.dtype) for x in xs)
    keep = [k for k in range(len(xs) + len(seed_ptrs)) if k not in set(seeds)]  # kernel names: original k
    if variant == "one_pass":
        cols = {f"X{k}_COL": strides[4 * i:4 * i + 3] == [0, 0, 0] for i, k in enumerate(keep) if k in set(columns)}

        kernel, extra = spec.one_pass_kernel, cols

        def grid_of(cfg):
            return (triton.cdiv(n_rows, cfg[0]),)
        flags: tuple = tuple(cols.values())
    else:
        # inputs laid out exactly like the rows (contiguous, full shape) are read from the row's
        # ALIGN-aligned start, so their loads vectorize even when n_cols is not a multiple of 16
        aligned = {f"X{keep[i]}_ALIGNED": tuple(x.shape) == shape and x.is_contiguous() for i, x in enumerate(xs)}
        flags = tuple(aligned.values())
        kernel, extra = spec.looped_kernel, aligned

        def grid_of(cfg):
            return (n_rows,)

    def constexprs(cfg):
        rows, block, warps = cfg
        flag = {"RAND4": rand4_flag(variant, n_cols, block)} if rand4 else {}
        return {"ROWS": rows if variant == "one_pass" else 1, "BLOCK": block, "num_warps": warps, **extra, **flag}

    def launch(cfg):
        kernel[grid_of(cfg)](*seed_ptrs, *xs, *outs, *scalars, *gather_ints, n_rows, n_cols, d1, d2, *strides,
                             **constexprs(cfg))
    # int scalars are runtime seed indices (one per dropout layer): they do not change the best tile
    key = (pattern_id, variant, n_rows, n_cols, dtypes, flags, tuple(s for s in scalars if not isinstance(s, int)))
    cfg = config or pick(key, configs(n_rows, n_cols, variant), launch, device.type)
    if variant == "looped" and cfg[1] < ALIGN:
        raise ValueError(f"{pattern_id}: looped BLOCK {cfg[1]} < {ALIGN}: a chunk must cover the row's aligned lead")
    launch(cfg)
    return outs, Plan(tuple(metas), kernel, grid_of(cfg), seed_idx, row_idx, copy_shape, (n_rows, n_cols, d1, d2),
                      tuple(strides), constexprs(cfg), _direct.Direct() if device.type == "cuda" else None)


def _packed_metas(pattern_id: str, metas: tuple, kinds: Sequence[str], bits: tuple) -> tuple:
    """``metas`` with each output of ``bits`` a uint8 vector of its packed bytes (:func:`bits_contract`)."""
    import torch

    from miner.runtime import bits as _bits

    if not bits:
        return metas
    out = list(metas)
    for k in bits:
        shape, dtype = metas[k]
        reasons = bits_contract(shape, str(dtype).removeprefix("torch."), kinds[k])
        if reasons:
            raise ContractError(f"{pattern_id}: output {k} cannot be stored as bits: " + "; ".join(reasons))
        out[k] = ((_bits.packed_size(math.prod(shape)),), torch.uint8)
    return tuple(out)


def rand4_flag(variant: str, n_cols: int, block: int) -> bool:
    """Whether a tile of the four-per-call stream covers whole aligned groups of four elements
    (``RAND4``: one Philox call per group; else one per element, the same numbers).

    The looped kernel's chunks start at a 16-aligned row offset plus a multiple of ``block``; the
    one-pass kernel's row ``r`` starts at element ``r * n_cols``: aligned when ``n_cols % 4 == 0``.
    """
    return block % 4 == 0 and (variant == "looped" or n_cols % 4 == 0)


def triton_rand(shape: Sequence[int], seed, kind: str = "rand"):
    """``prims.inductor_random(shape, seed, kind)`` drawn as a generated kernel draws it (float32).

    Element ``i`` of the row-major ``shape`` is ``tl.rand(seed, i)`` (``tl.randn`` for "randn"):
    the numbers Inductor's own Triton kernels draw for ``inductor_random`` (``tl.rand(seed,
    offset.to(tl.uint32))``). The generated kernel.py's ``reference`` calls this instead of the
    prim, so a float64 reference sees the kernel's random numbers. On meta tensors it is the prim
    itself (shapes only; ``traced_contract`` records it there).
    """
    import torch

    if seed.device.type == "meta":
        return torch.ops.prims.inductor_random.default(list(shape), seed, kind)
    if kind not in ("rand", "randn"):
        raise ContractError(f"inductor_random of kind {kind!r}: the kernel draws rand and randn only")
    if seed.device.type == "cpu" and not interpreting():
        raise RuntimeError("triton_rand on CPU tensors needs TRITON_INTERPRET=1 set before triton is imported")
    out = torch.empty(tuple(shape), dtype=torch.float32, device=seed.device)
    n = out.numel()
    if n:
        import triton

        from miner.runtime.jit import fill_random

        seeds = seed.reshape(1).to(torch.int64)
        fill_random[(triton.cdiv(n, 1024),)](seeds, out, n, NORMAL=kind == "randn", BLOCK=1024)
    return out


def elided_cast(x, dtype):
    """``x`` itself: a random number cast to bf16/fp16 (``dtype``) in the graph, as Inductor computes
    it: in float32, the cast elided (``torch._inductor.config.emulate_precision_casts`` off, its
    default), so dropout's comparison sees the unrounded number (eager would round it).

    On meta tensors (``_out_meta``: the outputs' shapes and dtypes) the cast is kept: the kernel
    computes in float32 but stores each output in the pattern's dtype, and an output reached from
    the cast through a dtype-keeping op (``where(mask, full(bf16), cast)``, a softmax under
    ``sdpa_reduced_math``) has the cast's dtype in the pattern."""
    return x.to(dtype) if x.device.type == "meta" else x
