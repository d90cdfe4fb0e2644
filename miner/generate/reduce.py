"""A region whose reductions run over outer dims, as a candidate of its own kind (``reduce_region``, issue 30).

The row kernels (``lower`` / ``emit``) reduce over the last dim. A region (``mined/regions.json``)
whose ``sum``/``mean``/``amax``/``amin`` reduce other dims and keep the last one (t5's position-bias
gradient: twelve ``where(mask, fma(-P, s, dP * m * scale * P), 0)`` of ``[B, H, S, S]`` each summed
over the batch, added, permuted to ``[S, S, H]`` and scattered into the bias embedding's gradient
by ``index_put(full([32, H], 0), [bucket], values, accumulate=True)``) needs another shape: a
program per block of contiguous *kept* elements, a loop over the reduced ones, then the epilogue
(``miner.runtime.reduce`` runs it). ``miner generate --regions FILE --only ID`` picks this kind
when :func:`applies` (a reduction whose dims leave the last one), else the row kernel.

How a region lowers (:func:`plan`). Each pattern value lives in one *space*:

- ``free``: computed from inputs only (``eq(bucket, -1)``, ``convert(dP)``); it carries, per
  input, the views on its way (``reshape``, ``expand``, ``unsqueeze``, ...): the launcher applies
  them to the input, so the kernel reads a strided view.
- ``full``: per element of the reduced operand (shape ``F``); a free value that meets a reduction
  (or a full value) is *closed* there: its inputs are read per reduced element, inside the loop.
- ``kept``: a reduction's result, with the views applied since (``chain``: squeeze, permute,
  unsqueeze); a free value meeting it is closed there: its inputs are read once per kept element,
  after the loop, through ``kept_view`` (the chain inverted).

An ``index_put(full(shape, c), [idx], values, True)`` output becomes a store of ``values`` and
``miner.runtime.reduce.index_put_acc``. Anything else (a reduction of a reduced value, a view of a
full value, an output per full element, ...) raises ``Unsupported`` with its reason.

View shapes in the pattern are literals of the observed shape (``reshape(x, [16, 12, 512, 512])``):
:func:`tie_shapes` ties each size to the input dim observed with it (``{"dim_of": [k, d]}``), so the
pattern, its fake implementation and the kernel follow the shapes they are called with.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from miner.core import source
from miner.core.pattern import Pattern, PatternNode
from miner.generate.lower import Unsupported, Value, _lower_pointwise, normalize_args
from miner.generate.region import tie_size

KIND = "reduce_region"
REDUCTIONS = {"sum": "sum", "mean": "sum", "amax": "max", "amin": "min"}
VIEWS = {"reshape": "reshape", "view": "reshape", "_unsafe_view": "reshape", "expand": "expand",
         "unsqueeze": "unsqueeze", "squeeze": "squeeze", "permute": "permute"}
SHAPE_ARG = {"reshape": 1, "expand": 1}
_INIT = {"sum": "0.0", "max": 'float("-inf")', "min": 'float("inf")'}
_COMBINE = {"sum": "{a} + {x}", "max": "tl.maximum({a}, {x})", "min": "tl.minimum({a}, {x})"}


def _base(target: str) -> str:
    return target.split(".")[1] if target.count(".") == 2 else target


def reduced_dims(node: PatternNode, rank: int) -> tuple[int, ...] | None:
    """The dims a reduction node reduces, non-negative (None: not a reduction of this kind's ops)."""
    if _base(node.target) not in REDUCTIONS:
        return None
    dims = normalize_args(node.target, node.args, node.kwargs).get("dim")
    dims = [dims] if isinstance(dims, int) else list(dims or range(rank))
    return tuple(sorted(d % rank for d in dims))


def applies(pattern: Pattern, metas: list) -> bool:
    """Whether ``pattern`` (with node ``metas``: (shape, dtype) per node) reduces dims that leave its last one."""
    for j, node in enumerate(pattern.nodes):
        src = _first_node_arg(node)
        rank = len(metas[src][0]) if src is not None and metas[src] else len(metas[j][0]) if metas[j] else None
        if rank and (dims := reduced_dims(node, rank)) is not None and rank - 1 not in dims:
            return True
    return False


def wants(pattern: Pattern) -> bool:
    """Whether a region pattern is this kind's (``applies`` on the metas of its first observed occurrence)."""
    from miner.generate import generate as gen

    occ = next((o for o in pattern.occurrences if all(m is not None for m in o.input_meta)), None)
    if occ is None or not any(_base(n.target) in REDUCTIONS for n in pattern.nodes):
        return False
    pattern = tie_shapes(pattern, [list(m.shape) for m in occ.input_meta])
    spec = gen.spec_from_pattern(pattern)
    try:
        metas = gen.node_metas(spec, [{"shape": list(m.shape), "dtype": m.dtype} for m in occ.input_meta],
                               [source.literal_value(c) for c in occ.scalars])
    except Exception:  # noqa: BLE001 - a pattern the meta run cannot replay is not this kind's
        return False
    return applies(replace(pattern, nodes=spec.nodes), metas)


def _first_node_arg(node: PatternNode) -> int | None:
    a = node.args[0] if node.args else None
    return a["node"] if isinstance(a, dict) and set(a) == {"node"} else None


# --------------------------------------------------------------------------- literal shapes tied to inputs

def tie_shapes(pattern: Pattern, input_shapes: list[list[int]]) -> Pattern:
    """``pattern`` with literal view / ``full`` shapes tied to input dims, ``full``'s device to input 0's.

    A size ``s > 1`` at position ``d`` becomes ``{"dim_of": [k, e]}``: the first input ``k`` of the same
    rank with ``s`` at ``d``, else the first input dim ``e`` of size ``s``; sizes no input has stay literal,
    and so do the indexed dims of a table an ``index_put`` fills (DeBERTa's 512 position embeddings are
    no sequence length, though its sequence was 512 long).
    """
    indexed = {}  # a full that an index_put fills: its first len(indices) dims are the table's rows
    for node in pattern.nodes:
        if _base(node.target) in ("index_put", "index_put_") and isinstance(node.args[0], dict) \
                and "node" in node.args[0] and isinstance(node.args[1], (list, tuple)):
            indexed[node.args[0]["node"]] = len(node.args[1])
    nodes = []
    for j, node in enumerate(pattern.nodes):
        base = _base(node.target)
        args, kwargs = list(node.args), dict(node.kwargs)
        pos = 0 if base == "full" else SHAPE_ARG.get(VIEWS.get(base, ""), None)
        if pos is not None and len(args) > pos and isinstance(args[pos], (list, tuple)):
            rows = indexed.get(j, 0) if base == "full" else 0  # an embedding's row count is no batch size
            args[pos] = [s if d < rows else tie_size(s, d, len(args[pos]), input_shapes)
                         for d, s in enumerate(args[pos])]
        if base == "full" and "device" in kwargs:
            kwargs["device"] = {"device_of": 0}
        nodes.append(replace(node, args=tuple(args), kwargs=kwargs))
    return replace(pattern, nodes=tuple(nodes))


# --------------------------------------------------------------------------- the plan

@dataclass
class _T:
    """A tensor value during planning (see the module docstring for the spaces)."""

    name: str
    space: str  # free | full | kept
    is_bool: bool = False
    paths: dict = field(default_factory=dict)  # free: input -> view steps (source suffixes)
    lines: tuple = ()  # free: (name, expr, op) to emit where the value is closed
    chain: tuple = ()  # kept: the views since the reduction


@dataclass
class Plan:
    """What the kernel and its launcher compute (``render_kernel`` writes them)."""

    rank: int = 0
    reduced: tuple[int, ...] = ()
    f_inputs: dict = field(default_factory=dict)  # input -> view steps (read per reduced element)
    k_inputs: dict = field(default_factory=dict)  # input -> (view steps, chain) (read per kept element)
    input_kind: dict = field(default_factory=dict)  # input -> float | bool | index
    loop: list = field(default_factory=list)  # (name, expr, op) inside the loop
    accs: list = field(default_factory=list)  # (name, combine kind, operand, divide by the reduced count)
    post: list = field(default_factory=list)  # (name, expr, op) after the loop
    stores: list = field(default_factory=list)  # (value name, chain, dtype, role: out<i> | buf<i>)
    outputs: list = field(default_factory=list)  # per pattern output: ("store", i) | ("scatter", i, idx, table)


def plan(pattern: Pattern, metas: list, input_dtypes: list[str]) -> Plan:
    """Lower a reduction region (nodes in graph order) into a :class:`Plan`, or raise ``Unsupported``."""
    import torch._inductor.inductor_prims  # noqa: F401 - registers prims.fma & co.

    p = Plan()
    vals: dict[int, Any] = {}
    for k, dt in enumerate(input_dtypes):
        kind = "bool" if dt == "bool" else "index" if dt in ("int64", "int32") else "float"
        if kind == "float" and dt not in ("float32", "bfloat16", "float16"):
            raise Unsupported(f"input {k} has dtype {dt}")
        p.input_kind[k] = kind
    closed: dict[tuple[str, int], Any] = {}
    emitted: dict[str, set] = {"full": set(), "kept": set()}
    values: dict[str, Value] = {}

    def inp(k):
        values.setdefault(f"a{k}", Value(f"a{k}", "vec", 0, is_bool=p.input_kind[k] == "bool"))
        return _T(f"a{k}", "free", p.input_kind[k] == "bool", {k: ()})

    def close(t: _T, space: str, chain: tuple = ()) -> None:
        for k, path in t.paths.items():
            key = ("kept" if space == "kept" else "full", k)
            other = ("full" if space == "kept" else "kept", k)
            if other in closed:
                raise Unsupported(f"input {k} is read both per reduced and per kept element")
            want = (path, chain) if space == "kept" else path
            if closed.setdefault(key, want) != want:
                raise Unsupported(f"input {k} is read through two different views")
            (p.k_inputs if space == "kept" else p.f_inputs)[k] = want
        section = p.post if space == "kept" else p.loop
        for line in t.lines:
            if line[0] not in emitted[space]:
                emitted[space].add(line[0])
                section.append(line)

    def operand(a):
        if isinstance(a, dict) and "input" in a:
            return f"a{a['input']}", values.setdefault(f"a{a['input']}", Value(
                f"a{a['input']}", "vec", 0, is_bool=p.input_kind[a["input"]] == "bool"))
        if isinstance(a, dict) and "node" in a:
            v = vals.get(a["node"])
            if isinstance(v, str):  # a scalar full([])
                return v, None
            if not isinstance(v, _T):
                raise Unsupported(f"node {a['node']} is no tensor value the kernel computes")
            return v.name, values[v.name]
        if isinstance(a, dict) and "const" in a:
            return f"c{a['const']}", None
        return source.literal_source(a), None

    def tensor_of(a) -> _T | None:
        if isinstance(a, dict) and "input" in a:
            return inp(a["input"])
        if isinstance(a, dict) and "node" in a and isinstance(vals.get(a["node"]), _T):
            return vals[a["node"]]
        return None

    for j, node in enumerate(pattern.nodes):
        base, name = _base(node.target), f"v{j}"
        op = ".".join(node.target.split(".")[:2])
        if base == "full":
            shape = node.args[0]
            if isinstance(shape, (list, tuple)) and len(shape) == 0:
                vals[j] = operand(node.args[1])[0]
            else:
                vals[j] = ("table", shape, node.args[1])
            continue
        if base in VIEWS:
            vals[j] = _view(tensor_of(node.args[0]), VIEWS[base], node, metas, j)
            continue
        if base in REDUCTIONS:
            t = tensor_of(node.args[0])
            src = _first_node_arg(node)
            rank = len(metas[src][0]) if src is not None else len(metas[j][0])
            dims = reduced_dims(node, rank)
            if t is None or t.space == "kept":
                raise Unsupported(f"{node.target} of a reduced value")
            if rank - 1 in dims:
                raise Unsupported(f"{node.target} over the last dim (a row kernel's pattern)")
            if p.reduced and (p.reduced, p.rank) != (dims, rank):
                raise Unsupported(f"reductions over different dims ({p.reduced} and {dims})")
            p.reduced, p.rank = dims, rank
            if t.space == "free":
                close(t, "full")
            args = normalize_args(node.target, node.args, node.kwargs)
            chain = () if args.get("keepdim") else (("squeeze", dims),)
            p.accs.append((name, REDUCTIONS[base], t.name, base == "mean", op))
            vals[j] = _T(name, "kept", False, chain=chain)
            values[name] = Value(name, "vec", 0)
            continue
        if base == "clone":  # a copy: the kernel's stores make fresh tensors anyway
            vals[j] = tensor_of(node.args[0])
            continue
        if base == "index_put":
            vals[j] = _index_put(node, vals, tensor_of, p, j)
            continue
        args = normalize_args(node.target, node.args, node.kwargs)
        if base == "fma":  # prims.fma(a, b, c) = a * b + c, one rounding (Inductor's softmax backward)
            ops3 = [operand(args[n]) for n in ("a", "b", "c")]
            deps = tuple(v.name for _, v in ops3 if v is not None)
            v = Value(name, "vec", 0, False, "tl.fma({}, {}, {})".format(*(e for e, _ in ops3)), deps)
        else:
            v = _lower_pointwise(name, node.target, base, node.target.split(".")[2], args, operand)
        values[name] = v
        ts = [x for x in (tensor_of(a) for a in _tensor_args(node)) if x is not None]
        vals[j] = _combine(v, op, ts, close)
    for o in pattern.all_outputs:
        v = vals.get(o)
        if isinstance(v, tuple) and v and v[0] == "scatter":
            _, buf, idx, table = v
            p.stores.append(buf)
            p.outputs.append(("scatter", len(p.stores) - 1, idx, table))
        elif isinstance(v, _T) and v.space == "kept":
            p.stores.append((v.name, v.chain, metas[o][1], "out"))
            p.outputs.append(("store", len(p.stores) - 1))
        else:
            raise Unsupported(f"output {o} is not a reduced value (per full element or an input)")
    if not p.accs:
        raise Unsupported("no reduction")
    return p


def _tensor_args(node: PatternNode) -> list:
    out = []
    for a in list(node.args) + list(node.kwargs.values()):
        if isinstance(a, dict) and set(a) & {"input", "node"}:
            out.append(a)
    return out


def _combine(v: Value, op: str, ts: list[_T], close) -> _T:
    spaces = {t.space for t in ts}
    if {"full", "kept"} <= spaces:
        raise Unsupported(f"{op}: a reduced value meets a per-element one (a two-level reduction)")
    line = (v.name, v.expr, op)
    if "kept" in spaces:
        chains = {t.chain for t in ts if t.space == "kept"}
        if len(chains) > 1:
            raise Unsupported(f"{op} of reduced values viewed differently")
        chain = chains.pop()
        for t in ts:
            if t.space == "free":
                close(t, "kept", chain)
        close(_T(v.name, "free", lines=(line,)), "kept", chain)  # computed after the loop
        return _T(v.name, "kept", v.is_bool, chain=chain)
    if "full" in spaces:
        for t in ts:
            if t.space == "free":
                close(t, "full")
        close(_T(v.name, "free", lines=(line,)), "full")  # computed per reduced element
        return _T(v.name, "full", v.is_bool)
    paths: dict = {}
    lines: list = []
    for t in ts:
        for k, path in t.paths.items():
            if paths.setdefault(k, path) != path:
                raise Unsupported(f"input {k} is read through two different views")
        lines += [x for x in t.lines if x not in lines]
    return _T(v.name, "free", v.is_bool, paths, tuple(lines) + (line,))


def _view(t: _T | None, kind: str, node: PatternNode, metas: list, j: int) -> _T:
    if t is None:
        raise Unsupported(f"{node.target} of a scalar")
    args = normalize_args(node.target, node.args, node.kwargs)
    out_rank = len(metas[j][0])
    in_rank = out_rank + (1 if kind == "squeeze" else -1 if kind == "unsqueeze" else 0)
    if t.space == "free":
        # pointwise ops commute with views: the view is applied to the inputs instead
        arg = node.args[1] if len(node.args) > 1 else None
        step = f".{kind}({source.arg_source(arg)})" if kind != "squeeze" or arg is not None else ".squeeze()"
        return replace(t, paths={k: path + (step,) for k, path in t.paths.items()})
    if t.space == "full":
        raise Unsupported(f"{node.target} of a per-element value")
    if kind == "squeeze":
        d = args.get("dim")
        dims = tuple(sorted(x % in_rank for x in ([d] if isinstance(d, int) else d)))
        step = ("squeeze", dims)
    elif kind == "unsqueeze":
        step = ("unsqueeze", args["dim"] % out_rank)
    elif kind == "permute":
        step = ("permute", tuple(x % in_rank for x in args["dims"]))
    else:
        raise Unsupported(f"{node.target} of a reduced value")
    return replace(t, chain=t.chain + (step,))


def _index_put(node: PatternNode, vals: dict, tensor_of, p: Plan, j: int):
    args = normalize_args(node.target, node.args, node.kwargs)
    table = vals.get(args["self"].get("node")) if isinstance(args["self"], dict) else None
    if not (isinstance(table, tuple) and table[0] == "table"):
        raise Unsupported("index_put into anything but a constant full() table")
    if not args.get("accumulate"):
        raise Unsupported("index_put without accumulate")
    idx = args["indices"]
    if len(idx) != 1 or tensor_of(idx[0]) is None:
        raise Unsupported("index_put with other than one index tensor")
    it, vt = tensor_of(idx[0]), tensor_of(args["values"])
    if it.space != "free" or it.lines or len(it.paths) != 1:
        raise Unsupported("index_put whose index is computed")
    if vt is None or vt.space != "kept":
        raise Unsupported("index_put of values that are not a reduced value")
    (k, path), = it.paths.items()
    return ("scatter", (vt.name, vt.chain, "float32", "buf"), (k, path), table[1:])


# --------------------------------------------------------------------------- rendering

def _strided(ptr: str, k: str, dims: list[int], extra: str = "") -> str:
    terms = " + ".join(f"k{d} * S{k}_{d}" for d in dims) or "0"
    return f"{ptr} + ({terms}{extra})"


VARIANTS = ("loop", "tile", "split")
DEFAULT_VARIANT = "split"  # what the launcher runs unless told (see the module docstring of miner.runtime.reduce)
KERNEL_NAMES = {"loop": "reduce_kernel", "tile": "reduce_tile_kernel", "split": "reduce_split_kernel",
                "epilogue": "reduce_epilogue_kernel"}


def kernel_source(pl: Plan, consts: list[int]) -> str:
    """The ``@triton.jit`` kernels of a plan, one per variant (``VARIANTS``) plus the split's epilogue.

    All take the same parameters (:func:`_params`), so ``miner.runtime.reduce.run`` passes one set:

    - ``loop``: a program per ``XB`` kept elements, a loop over the reduced elements (unrolled by
      ``RB``: the loads of ``RB`` of them can be issued together), every reduction's accumulator a
      ``[XB]`` vector in registers (each thread sums its own elements: no exchange between threads).
      When ``XB`` divides the last dim (``ONE_ROW``), an input with stride 0 along it (t5's softmax
      row sums ``[B, H, S, 1]``) is one scalar load per program, not one per element.
    - ``tile``: the same program, the reduced elements ``RB`` at a time as ``[RB, XB]`` tiles (every
      load of a chunk issued together), ``[RB, XB]`` accumulators summed across the ``RB`` rows at the
      end; an input whose strides along the reduced dims are all 0 (``INV<k>``) is read once per chunk
      as ``[1, XB]``.
    - ``split``: ``loop`` with a second grid axis over the reductions: program ``(b, i)`` computes only
      reduction ``i`` (the inputs and lines it needs: few registers, many programs per SM) and stores
      it in a float32 buffer of partials ``[n_reductions, n_kept]`` (written and read once more:
      t5's 12 x 3.1M floats, 7% over its 4.2 GB); ``reduce_epilogue_kernel`` reads them back and runs
      the epilogue.
    """
    kept = [d for d in range(pl.rank) if d not in pl.reduced]
    params = _wrap(_params(pl, consts))
    out = []
    for name, body in (("loop", _loop_body(pl, kept)), ("tile", _tile_body(pl, kept)),
                       ("split", _split_body(pl, kept)), ("epilogue", _epilogue_body(pl, kept))):
        out.append(f"@triton.jit\ndef {KERNEL_NAMES[name]}(\n{params}\n):\n" + "\n".join("    " + b for b in body) + "\n")
    return "\n\n".join(out)


def _params(pl: Plan, consts: list[int]) -> list[str]:
    ins = sorted(set(pl.f_inputs) | set(pl.k_inputs))
    params = [f"x{k}_ptr" for k in ins] + [f"o{i}_ptr" for i in range(len(pl.stores))] + ["p_ptr", "n_kept"]
    params += [f"c{c}: tl.constexpr" for c in consts]
    params += [f"N{d}: tl.constexpr" for d in range(pl.rank)]
    params += [f"SX{k}_{d}: tl.constexpr" for k in ins for d in range(pl.rank)]
    params += [f"SO{i}_{d}: tl.constexpr" for i in range(len(pl.stores)) for d in range(pl.rank)]
    params += [f"INV{k}: tl.constexpr" for k in sorted(pl.f_inputs)]
    return params + ["RB: tl.constexpr", "XB: tl.constexpr", "ONE_ROW: tl.constexpr", "WIDE: tl.constexpr"]


def _n_red(pl: Plan) -> str:
    return " * ".join(f"N{d}" for d in pl.reduced)


def _kept_coords(kept: list[int], two_d: bool, suffix: str = "") -> list[str]:
    """``kid`` (this program's kept elements, ``[1, XB]`` when ``two_d``), its mask and coordinates."""
    ar = "tl.arange(0, XB)[None, :]" if two_d else "tl.arange(0, XB)"
    out = [f"kid{suffix} = tl.program_id(0) * XB + {ar}", "if WIDE:", f"    kid{suffix} = kid{suffix}.to(tl.int64)",
           f"km{suffix} = kid{suffix} < n_kept"]
    if suffix:
        return out
    out.append("rest = kid")
    for d in reversed(kept[1:]):
        out += [f"k{d} = rest % N{d}", f"rest = rest // N{d}"]
    out.append(f"k{kept[0]} = rest")
    if two_d:
        return out
    # the row of the program's first element: its coordinates when ONE_ROW (XB divides the last dim)
    out += ["base = tl.program_id(0) * XB", "if WIDE:", "    base = base.to(tl.int64)", f"rest = base // N{kept[-1]}"]
    for d in reversed(kept[1:-1]):
        out += [f"k{d}s = rest % N{d}", f"rest = rest // N{d}"]
    return out + ([f"k{kept[0]}s = rest"] if len(kept) > 1 else [])


def _reduced_coords(reduced: tuple[int, ...], r: str) -> list[str]:
    out, rest = [], r
    for d in reversed(reduced[1:]):
        out += [f"k{d} = {rest} % N{d}", f"rr = {rest} // N{d}"]
        rest = "rr"
    return out + [f"k{reduced[0]} = {rest}"]


def _needed(pl: Plan, accs: list) -> tuple[list[int], list]:
    """The inputs and loop lines the reductions ``accs`` read (the lines in their order)."""
    want = {x for _, _, x, _, _ in accs}
    lines = []
    for line in reversed(pl.loop):
        if line[0] in want:
            lines.append(line)
            want |= set(re.findall(r"\b[av]\d+\b", line[1]))
    loads = sorted(k for k in pl.f_inputs if f"a{k}" in want)
    return loads, lines[::-1]


def _acc_lines(pl: Plan, accs: list, tiled: bool) -> list[str]:
    """Accumulator init, the loop over the reduced elements, and each reduction's value after it."""
    shape = "[RB, XB]" if tiled else "[XB]"
    out = [f"acc_{n} = tl.full({shape}, {_INIT[kind]}, tl.float32)" for n, kind, _, _, _ in accs]
    loads, lines = _needed(pl, accs)
    dims = list(range(pl.rank))
    if tiled:
        out.append(f"for r0 in range(0, {_n_red(pl)}, RB):  # the reduced elements, RB at a time")
        body = ["r = r0 + tl.arange(0, RB)[:, None]", f"fm = km & (r < {_n_red(pl)})"]
        body += _reduced_coords(pl.reduced, "r")
        for k in loads:
            kept_dims = [d for d in dims if d not in pl.reduced]
            body += [f"if INV{k}:  # the same for every reduced element: read once per chunk",
                     f"    a{k} = {_load(k, pl.input_kind[k], kept_dims, 'km')}", "else:",
                     f"    a{k} = {_load(k, pl.input_kind[k], dims, 'fm')}"]
    else:
        out += [f"for r0 in range(0, {_n_red(pl)}, RB):  # the reduced elements, unrolled by RB",
                "    for j in tl.static_range(RB):"]
        body = ["r = r0 + j", f"fm = km & (kid * 0 + r < {_n_red(pl)})"] + _reduced_coords(pl.reduced, "r")
        if loads:
            body.append(f"sm = (base < n_kept) & (base * 0 + r < {_n_red(pl)})  # the mask of a per-row value")
        last = pl.rank - 1
        row = [d for d in dims if d != last]
        for k in loads:
            body += [f"if ONE_ROW and SX{k}_{last} == 0:  # the same along the row: one load per program",
                     f"    a{k} = {_load(k, pl.input_kind[k], row, 'sm', scalar=[d for d in row if d not in pl.reduced])}",
                     "else:", f"    a{k} = {_load(k, pl.input_kind[k], dims, 'fm')}"]
    body += [f"{n} = {e}  # {op}" for n, e, op in lines]
    for n, kind, x, _, op in accs:
        masked = f"tl.where(fm, {x}, {_INIT[kind]})"
        body.append(f"acc_{n} = {_COMBINE[kind].format(a=f'acc_{n}', x=masked)}  # {op}")
    out += [("    " if tiled else "        ") + b for b in body]
    for n, kind, _, mean, _ in accs:
        total = f"tl.{kind}(acc_{n}, axis=0)" if tiled else f"acc_{n}"
        out.append(f"{n} = {total}" + (f" / ({_n_red(pl)})" if mean else ""))
    return out


def _post(pl: Plan, kept: list[int]) -> list[str]:
    """After the reductions: the per-kept-element loads, the epilogue's lines, the stores."""
    out = [f"a{k} = {_load(k, pl.input_kind[k], kept, 'km')}" for k in sorted(pl.k_inputs)]
    out += [f"{n} = {e}  # {op}" for n, e, op in pl.post]
    for i, (n, _, dtype, _) in enumerate(pl.stores):
        offs = " + ".join(f"k{d} * SO{i}_{d}" for d in kept)
        out.append(f"tl.store(o{i}_ptr + ({offs}), {n}.to(tl.{dtype}), mask=km)")
    return out


def _loop_body(pl: Plan, kept: list[int]) -> list[str]:
    return _kept_coords(kept, False) + _acc_lines(pl, pl.accs, False) + _post(pl, kept)


def _tile_body(pl: Plan, kept: list[int]) -> list[str]:
    out = _kept_coords(kept, True) + _acc_lines(pl, pl.accs, True)
    return out + ["# the epilogue, per kept element"] + _kept_coords(kept, False) + _post(pl, kept)


def _split_body(pl: Plan, kept: list[int]) -> list[str]:
    out = _kept_coords(kept, False) + ["i = tl.program_id(1)"]
    for i, acc in enumerate(pl.accs):
        out.append(f"if i == {i}:  # reduction {acc[0]} ({acc[4]})")
        body = _acc_lines(pl, [acc], False)
        body.append(f"tl.store(p_ptr + ({i} * n_kept + kid), {acc[0]}, mask=km)")
        out += ["    " + b for b in body]
    return out


def _epilogue_body(pl: Plan, kept: list[int]) -> list[str]:
    out = _kept_coords(kept, False)
    out += [f"{n} = tl.load(p_ptr + ({i} * n_kept + kid), mask=km, other=0)" for i, (n, *_) in enumerate(pl.accs)]
    return out + _post(pl, kept)


def _load(k: int, kind: str, dims: list[int], mask: str, scalar: tuple = ()) -> str:
    """``tl.load`` of input ``k`` at the coordinates ``dims`` (``k<d>``, ``k<d>s`` for the ``scalar``
    ones: the program's row)."""
    terms = " + ".join(f"k{d}{'s' if d in scalar else ''} * SX{k}_{d}" for d in dims) or "0"
    load = f"tl.load(x{k}_ptr + ({terms}), mask={mask}, other=0)"
    return load + ".to(tl.float32)" if kind == "float" else load


def _wrap(params: list[str], width: int = 100) -> str:
    lines, cur = [], "    "
    for prm in params:
        piece = prm + ", "
        if len(cur) + len(piece) > width and cur.strip():
            lines.append(cur.rstrip())
            cur = "    "
        cur += piece
    lines.append(cur.rstrip())
    return "\n".join(lines)


def kernel_consts(pl: Plan) -> list[int]:
    """The const slots the kernel's expressions read (compiled in as ``tl.constexpr``)."""
    text = " ".join(e for _, e, _ in pl.loop + pl.post)
    return sorted({int(m) for m in re.findall(r"\bc(\d+)\b", text)})


def launcher_source(pl: Plan, n_inputs: int, n_consts: int) -> str:
    """``KERNELS``, ``VARIANT`` and ``launch(x0, ..., c0, ..., *, variant=None, config=None)``: the views,
    the kernel(s), the scatter."""
    params = ", ".join([f"x{k}" for k in range(n_inputs)] + [f"c{c}" for c in range(n_consts)])
    consts = kernel_consts(pl)
    first = min(pl.f_inputs)
    body = ["f_views = {" + ", ".join(f"{k}: x{k}{''.join(path)}" for k, path in sorted(pl.f_inputs.items())) + "}",
            "full = _reduce.full_shape(f_views)",
            "f_views = {k: v.expand(full) for k, v in f_views.items()}",
            "kept = _reduce.kept_shape(full, REDUCED)",
            "k_views = {" + ", ".join(f"{k}: _reduce.kept_view(x{k}{''.join(path)}, kept, {chain!r})"
                                      for k, (path, chain) in sorted(pl.k_inputs.items())) + "}"]
    stores = []
    for i, (_, chain, dtype, role) in enumerate(pl.stores):
        if role == "buf":
            body.append(f"s{i} = torch.empty(kept, dtype=torch.{dtype}, device=x{first}.device)")
            stores.append(f"s{i}")
        else:
            body.append(f"s{i} = torch.empty(_reduce.apply_chain(torch.empty(kept, device='meta'), {chain!r}).shape, "
                        f"dtype=torch.{dtype}, device=x{first}.device)")
            stores.append(f"_reduce.kept_view(s{i}, kept, {chain!r})")
    cdict = "{" + ", ".join(f'"c{c}": c{c}' for c in consts) + "}"
    body.append(f"views = _reduce.Views(f_views, k_views, stores=[{', '.join(stores)}], full=full, reduced=REDUCED)")
    body.append(f"_reduce.run(KERNELS, views, consts={cdict}, key=PATTERN_ID, n_acc={len(pl.accs)},")
    body.append("            variant=variant or VARIANT, config=config)")
    outs = []
    for o in pl.outputs:
        if o[0] == "store":
            outs.append(f"s{o[1]}")
            continue
        _, i, (k, path), (shape, fill) = o
        chain = pl.stores[i][1]
        body.append(f"t{i} = torch.full({source.arg_source(shape)}, {source.arg_source(fill)}, dtype=torch.float32, "
                    f"device=x{first}.device)")
        body.append(f"_reduce.index_put_acc(t{i}, x{k}{''.join(path)}, _reduce.apply_chain(s{i}, {chain!r}))")
        outs.append(f"t{i}")
    body.append(f"return ({', '.join(outs)},)")
    kernels = ", ".join(f'"{v}": {KERNEL_NAMES[v]}' for v in VARIANTS)
    return (f'KERNELS = {{{kernels}, "epilogue": {KERNEL_NAMES["epilogue"]}}}\n'
            f'VARIANT = "{DEFAULT_VARIANT}"  # the default; launch(..., variant=...) picks another of {VARIANTS}\n\n\n'
            f"def launch({params}, *, variant=None, config=None):\n"
            '    """The pattern\'s outputs (fresh tensors); ``variant`` one of ``KERNELS`` (default ``VARIANT``),\n'
            '    ``config=(RB, XB, num_warps)`` forces a tile (default: timed once per shape on a GPU)."""\n'
            + "\n".join("    " + b for b in body) + "\n")


# --------------------------------------------------------------------------- the stage

PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47)


def recomputed_elsewhere(pattern: Pattern) -> list[int]:
    """Nodes of the region another Inductor kernel also holds and reads there (``region._read_elsewhere``),
    other than constants (``miner.rules.safety.is_constant``: the matcher lets them be shared) and the
    region's outputs. In the FX graph each has users outside the region, so the pattern cannot match
    (t5's default-compile bias-gradient regions: the softmax gradient's ``fma`` of every layer, also
    computed by the softmax-backward kernel)."""
    from miner.generate import region
    from miner.rules.safety import CONSTANT_OPS

    outputs = set(pattern.occurrences[0].outputs) if pattern.occurrences else set()

    def constant(n: PatternNode) -> bool:
        return n.target in CONSTANT_OPS and not any(
            isinstance(a, dict) and ("node" in a or "input" in a) for a in list(n.args) + list(n.kwargs.values()))

    return [j for j in sorted(region._read_elsewhere(pattern)) if j not in outputs and not constant(pattern.nodes[j])]


def small_sizes(shapes: list[list[int]], primes: tuple[int, ...] = PRIMES) -> dict[int, int]:
    """A consistent map of the observed sizes to small ones (for traces and CPU checks): each size
    that is no product of two other observed sizes gets the next of ``primes`` (so no size divides
    a block), a product (t5's ``B * H`` = 192) the product of its factors' sizes; 1 stays 1."""
    sizes = sorted({s for shape in shapes for s in shape if s > 1})
    out: dict[int, int] = {1: 1, 0: 0}
    it = iter(primes)
    for s in sizes:
        f = next(((a, s // a) for a in sizes if a < s and s % a == 0 and s // a in out and a in out), None)
        out[s] = out[f[0]] * out[f[1]] if f else next(it)
    return out


def generate_one(pattern: Pattern, workspace, command: str, source_info: dict | None):
    """Write ``candidates/<id>/`` of kind ``reduce_region`` (pattern.py, kernel.py, candidate.json).

    Returns ``Generated``, or ``Skipped`` with the reason the plan gave."""
    from miner import __version__
    from miner.core.pattern import to_json as pattern_json
    from miner.core.workspace import write_json, write_text
    from miner.generate import generate as gen

    occ = next(o for o in pattern.occurrences if o.verdict.ok and all(m is not None for m in o.input_meta))
    recomputed = recomputed_elsewhere(pattern)
    if recomputed:
        return gen.Skipped(pattern.id, pattern.ops, (
            f"not generated: {len(recomputed)} of its nodes ({', '.join(f'n{j}' for j in recomputed[:4])}"
            f"{', ...' if len(recomputed) > 4 else ''}) are also computed in another Inductor kernel that reads "
            "them there; the region would never match in the graph (a reduction region does not recompute "
            "shared nodes outside its kernel)"))
    shapes = [list(m.shape) for m in occ.input_meta]
    tied = tie_shapes(pattern, shapes)
    spec = gen.spec_from_pattern(tied)
    tied = replace(tied, nodes=spec.nodes)
    try:
        pl = _plan_of(spec, tied, occ)
    except Unsupported as e:
        return gen.Skipped(pattern.id, pattern.ops, f"not generated: {e}")
    observed = gen.observed_entries(tied, spec)
    sizes = small_sizes(shapes)
    label = _label(pl)
    folder = workspace.candidates / pattern.id
    kernel_py = _kernel_text(pattern.id, spec, pl, gen.header(pattern.id, command, "Triton kernel + launcher"))
    pattern_py = _pattern_text(spec, pl, occ, gen.header(pattern.id, command, "search pattern, replacement, extra check"),
                               f"miner::c{pattern.id}", f"Fusion candidate {pattern.id} ({label}, kind {KIND}): "
                               f"{pattern.ops}.")
    write_text(folder / "kernel.py", kernel_py)
    write_text(folder / "pattern.py", pattern_py)
    kinds = tuple(pl.input_kind[k] for k in range(spec.n_inputs))
    meta = {
        "id": pattern.id, "kind": KIND, "miner_version": __version__, "regenerate": command,
        "op": f"miner::c{pattern.id}", "label": label, "ops": pattern.ops,
        "signature": {"inputs": spec.n_inputs, "scalars": spec.n_consts, "outputs": len(spec.outputs),
                      "input_kinds": list(kinds)},
        "kernel": {"reduced": list(pl.reduced), "rank": pl.rank, "f_inputs": sorted(pl.f_inputs),
                   "k_inputs": sorted(pl.k_inputs), "scatter": [o[0] == "scatter" for o in pl.outputs]},
        "sizes": {str(k): v for k, v in sizes.items() if k > 1},
        "observed": observed, "occurrences": gen.occurrences_by_model(tied),
        "counts": {"non_overlapping": pattern.counts.non_overlapping, "safe": pattern.counts.safe,
                   "by_phase": dict(pattern.counts.by_phase)},
        "safety": gen.safety_summary(pattern), "pattern": pattern_json(tied),
    }
    if source_info:
        meta["source"] = source_info
    write_json(folder / "candidate.json", meta)
    return gen.Generated(pattern.id, label, folder, len(observed))


def _plan_of(spec, tied: Pattern, occ) -> "Plan":
    """The plan of a tied region (``Unsupported`` with the reason): node metas from the occurrence ``occ``."""
    from miner.generate import generate as gen

    inputs = [{"shape": list(m.shape), "dtype": m.dtype} for m in occ.input_meta]
    metas = gen.node_metas(spec, inputs, [source.literal_value(c) for c in occ.scalars])
    return plan(tied, metas, [m.dtype for m in occ.input_meta])


def _label(pl: "Plan") -> str:
    return "reduce_" + ("index_put" if any(o[0] == "scatter" for o in pl.outputs) else "sum")


def _signature(spec) -> str:
    """``x0, ..., c0, ...``: the pattern's parameters."""
    return ", ".join([f"x{k}" for k in range(spec.n_inputs)] + [f"c{c}" for c in range(spec.n_consts)])


def _kernel_text(pid: str, spec, pl: "Plan", head: str) -> str:
    """kernel.py of a reduction region (the candidate's or a fusion's: ``head`` differs)."""
    from miner.generate import emit

    return emit.fill_template(
        "reduce_kernel.py.tmpl", head=head, id=pid, reduced=repr(pl.reduced), rank=pl.rank, params=_signature(spec),
        reference=emit.reference_source(spec, name="reference"),
        kernel=kernel_source(pl, kernel_consts(pl)), launcher=launcher_source(pl, spec.n_inputs, spec.n_consts))


def _pattern_text(spec, pl: "Plan", occ, head: str, op_name: str, doc: str, gated: bool = False) -> str:
    """pattern.py of a reduction region: the candidate's, or (``gated``) a promoted fusion's, whose extra
    check also asks the in-model gate (``wins.json`` beside it, as every promoted fusion's)."""
    from miner.generate import emit
    from miner.generate import generate as gen

    pid = spec.id
    params = _signature(spec)
    n_out = len(spec.outputs)
    sizes = small_sizes([list(m.shape) for m in occ.input_meta])
    examples = [([sizes[s] for s in m.shape], m.dtype) for m in occ.input_meta]
    kinds = tuple(pl.input_kind[k] for k in range(spec.n_inputs))
    check = ("(_reduce.match_ok(match, OP_NAME, N_INPUTS, INPUT_KINDS)\n"
             "            and _reduce.structure_ok(match, STRUCTURE, OP_NAME, N_INPUTS)"
             + ("\n            and rewrite.wins_gate(match, WINS, N_INPUTS))" if gated else ")"))
    return emit.fill_template(
        "reduce_pattern.py.tmpl", head=head, doc=doc, op_name=op_name,
        gate_doc=gen.GATE_DOC if gated else "", gate_import="from pathlib import Path\n\n" if gated else "",
        wins=("\n" + gen.WINS_LINE.rstrip("\n")) if gated else "",
        id=pid, n_inputs=spec.n_inputs, n_consts=spec.n_consts, n_outputs=n_out, input_kinds=repr(kinds),
        examples=repr(examples), trace_values="rewrite.scalar_trace_values(N_SCALARS)",
        structure=repr(structure(spec, examples, len(occ.scalars))),
        reference=emit.reference_source(spec, name="pattern"), kernel_import=gen.KERNEL_IMPORT, params=params,
        search_return=("pattern({0})[0]" if n_out == 1 else "pattern({0})").format(params),
        op_attr=op_name.split("::")[1], check=check, xs=", ".join(f"x{k}" for k in range(spec.n_inputs)),
        cs=", ".join(f"c{c}" for c in range(spec.n_consts)))


def render_fusion(folder, name: str, meta: dict, head: str) -> list:
    """kernel.py and pattern.py of the fusion ``name`` promoted from reduction-region candidate ``meta``,
    rendered again from its tied pattern (candidate.json's ``pattern``: the validated kernel) with the
    fusion's names and the in-model gate."""
    from miner.core.pattern import pattern_from_json
    from miner.core.workspace import write_text
    from miner.generate import generate as gen

    tied = pattern_from_json(meta["pattern"], prepared=True)
    occ = next(o for o in tied.occurrences if o.verdict.ok and all(m is not None for m in o.input_meta))
    spec = gen.spec_from_pattern(tied)
    pl = _plan_of(spec, replace(tied, nodes=spec.nodes), occ)
    return [write_text(folder / "kernel.py", _kernel_text(meta["id"], spec, pl, head)),
            write_text(folder / "pattern.py", _pattern_text(spec, pl, occ, head, f"miner::{name}",
                                                            f"Fusion {name}: {meta['ops']}.", gated=True))]


def structure(spec, examples, n_consts: int) -> list[tuple]:
    """``miner.runtime.reduce.structure_of`` of the pattern traced on ``examples`` (the extra check's reference)."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from miner.generate.generate import reference_function

    fn = reference_function(spec)
    xs = [torch.zeros(s, dtype=getattr(torch, d)) for s, d in examples]
    cs = [0.5] * n_consts
    try:
        gm = make_fx(lambda *xs: fn(*xs, *cs))(*xs)
    except RuntimeError as e:  # e.g. llama's GQA gradient: [B, 32, S, D] viewed [B, 8, 4, S, D], the 4 no input's dim
        raise Unsupported(f"its view sizes do not follow the inputs at other sizes "
                          f"({str(e).splitlines()[0][:100]})") from None
    from miner.runtime.reduce import structure_of

    return sorted(structure_of(gm.graph.nodes))


__all__ = ["KIND", "applies", "tie_shapes", "plan", "Plan", "kernel_source", "launcher_source", "kernel_consts",
           "reduced_dims", "generate_one", "small_sizes", "structure"]
