"""Pattern -> Triton source: a row kernel for "pointwise ops + reductions over the last dim".

The supported class: a DAG whose nodes are pointwise aten ops and reductions (``sum``,
``amax``, ``amin``, ``mean``, ``var_mean``, ``var``, ``any``) over the *last* dimension of the
broadcast shape of the pattern's inputs; a reduction's result is a per-row value that may
broadcast back (keepdim) into later pointwise ops. Everything is computed in float32 and cast on
store. Two kernels are emitted from one lowered program:

- ``one_pass_kernel``: a ``[ROWS, BLOCK]`` tile holds whole rows (``BLOCK >= n_cols``); every
  input is loaded once, reductions are ``tl.sum``/``tl.max`` along axis 1.
- ``looped_kernel``: one row block, a loop over column chunks per *reduction level* (a
  reduction of level k needs the per-row values of levels < k), then a last loop that stores.
  ``sum(exp(v - amax(v)))`` pairs are computed in ONE pass with an online (rescaled) sum, so a
  softmax reads its row twice instead of three times.

``lower(spec)`` raises ``Unsupported(reason)`` for a pattern outside the class; the reason is
what ``miner generate`` prints (e.g. ``unsupported op aten.cat.default``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from miner.core import dtypes, ops, source
from miner.core.pattern import PatternNode
from miner.core.source import literal_value

FLOAT_DTYPES = dtypes.KERNEL_FLOATS


class Unsupported(Exception):
    """The pattern is outside the generator's class; ``str(e)`` is the reason."""


# --------------------------------------------------------------------------- the pattern, as codegen sees it

@dataclass(frozen=True)
class PatternSpec:
    """What codegen needs from a mined pattern (see ``spec_from_pattern``).

    ``input_dtypes[k]``: the dtypes observed for input k (decides float vs bool loads);
    ``rank``: the rank of the broadcast shape (to tell ``dim=[rank-1]`` is the last dim).
    """

    id: str
    nodes: tuple[PatternNode, ...]
    n_inputs: int
    n_consts: int
    outputs: tuple[int, ...]
    input_dtypes: tuple[tuple[str, ...], ...] = ()
    rank: int | None = None


# --------------------------------------------------------------------------- lowered program

@dataclass
class Value:
    """A value in the kernel: ``vec`` = one element per (row, col), ``row`` = one per row."""

    name: str
    kind: str  # vec | row | tuple
    level: int  # vec: highest reduction level it needs; row: the pass that produces it
    is_bool: bool = False
    expr: str | None = None  # pointwise expression over other value names
    deps: tuple[str, ...] = ()
    reduce: str | None = None  # sum | max | min | any | mean | m2 (sum of squared deviations)
    operand: str | None = None  # the reduced vec value
    center: str | None = None  # m2: the row mean it is centred on
    divisor: str | None = None  # mean / var: "n_cols" or "(n_cols - 1.0)"
    online_max: str | None = None  # sum(exp(v - m)) computed online together with m = max(v)
    keepdim: bool = True
    parts: tuple[str, ...] = ()  # tuple values (var_mean): the part names


@dataclass
class Program:
    spec: PatternSpec
    values: dict[str, Value]  # in topological order
    inputs: tuple[str, ...]  # value names of the inputs: a0, a1, ...
    input_is_bool: tuple[bool, ...]
    outputs: tuple[str, ...]  # value name per pattern output
    levels: int  # number of reduction passes the looped kernel makes

    @property
    def output_kinds(self) -> tuple[str, ...]:
        return tuple(self.values[o].kind for o in self.outputs)

    @property
    def online_softmax(self) -> bool:
        return any(v.online_max for v in self.values.values())


# pointwise op -> (expression template over positional operand strings, result is bool)
_UNARY = {
    "neg": "(-{0})", "exp": "tl.exp({0})", "exp2": "tl.exp2({0})", "log": "tl.log({0})",
    "log2": "tl.log2({0})", "sqrt": "tl.sqrt({0})", "rsqrt": "tl.rsqrt({0})", "abs": "tl.abs({0})",
    "sigmoid": "tl.sigmoid({0})", "tanh": "_tanh({0})", "erf": "tl.erf({0})", "sin": "tl.sin({0})",
    "cos": "tl.cos({0})", "reciprocal": "(1.0 / {0})", "relu": "tl.maximum({0}, 0.0)",
    "expm1": "(tl.exp({0}) - 1.0)", "log1p": "tl.log(1.0 + {0})", "clone": "{0}",
    "floor": "tl.floor({0})", "ceil": "tl.ceil({0})",
}
_BINARY = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "rsub": "({1} - {0})", "mul": "({0} * {1})",
    "div": "({0} / {1})", "maximum": "tl.maximum({0}, {1})", "minimum": "tl.minimum({0}, {1})",
    "pow": "_pow({0}, {1})", "clamp_min": "tl.maximum({0}, {1})", "clamp_max": "tl.minimum({0}, {1})",
}
_COMPARE = {"eq": "==", "ne": "!=", "gt": ">", "ge": ">=", "lt": "<", "le": "<="}
_LOGICAL = {"logical_and": "({0} & {1})", "logical_or": "({0} | {1})", "logical_xor": "({0} ^ {1})",
            "bitwise_and": "({0} & {1})", "bitwise_or": "({0} | {1})", "bitwise_xor": "({0} ^ {1})"}
_REDUCTIONS = {"sum": "sum", "mean": "mean", "amax": "max", "amin": "min", "any": "any",
               "var_mean": "var_mean", "var": "var"}
_POW_SPECIAL = {2: "({0} * {0})", 3: "({0} * {0} * {0})", 1: "{0}", 0.5: "tl.sqrt({0})",
                -1: "(1.0 / {0})", -0.5: "tl.rsqrt({0})"}


def _split_target(target: str) -> tuple[str, str, str]:
    parts = target.split(".")
    if len(parts) != 3:
        raise Unsupported(f"unsupported op {target}")
    return parts[0], parts[1], parts[2]


def normalize_args(target: str, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Bind positional args and kwargs to the op's schema argument names (defaults filled in)."""
    if ops.schema_arguments(target) is None:
        raise Unsupported(f"unsupported op {target}")
    bound = ops.bind(target, args, kwargs)
    for name in ops.missing(target, bound):
        raise Unsupported(f"{target}: missing argument {name!r}")
    return {k: _decode(v) for k, v in bound.items()}


def _decode(v: Any) -> Any:
    """Literal floats as numbers (JSON holds non-finite ones as ``{"float": "-inf"}``), recursively."""
    if isinstance(v, (list, tuple)):
        return [_decode(x) for x in v]
    return literal_value(v)


def _literal(x: Any) -> str:
    if isinstance(x, bool):
        return "1" if x else "0"
    if isinstance(x, (int, float)):
        f = float(x)
        if math.isinf(f):
            return 'float("inf")' if f > 0 else 'float("-inf")'
        if math.isnan(f):
            return 'float("nan")'
        return repr(f)
    raise Unsupported(f"non-scalar literal operand {x!r}")


def lower(spec: PatternSpec) -> Program:
    """Lower a pattern into kernel values, or raise ``Unsupported`` with the reason."""
    values: dict[str, Value] = {}
    input_is_bool = []
    for k in range(spec.n_inputs):
        dts = set(spec.input_dtypes[k]) if k < len(spec.input_dtypes) else {"float32"}
        if dts <= set(FLOAT_DTYPES):
            is_bool = False
        elif dts == {"bool"}:
            is_bool = True
        else:
            raise Unsupported(f"input {k} has dtype {'/'.join(sorted(dts))} (float32/bfloat16/float16/bool only)")
        input_is_bool.append(is_bool)
        values[f"a{k}"] = Value(f"a{k}", "vec", 0, is_bool=is_bool)
    node_value: list[str | None] = []

    def operand(a: Any) -> tuple[str, Value | None]:
        """(expression, the Value it names or None for scalars)."""
        if isinstance(a, dict) and "input" in a:
            return f"a{a['input']}", values[f"a{a['input']}"]
        if isinstance(a, dict) and "node" in a:
            name = node_value[a["node"]]
            if name is None:
                raise Unsupported(f"node {a['node']} has no tensor value")
            v = values[name]
            if v.kind == "tuple":
                raise Unsupported("a multi-output op used without getitem")
            return name, v
        if isinstance(a, dict) and "const" in a:
            return f"c{a['const']}", None
        return _literal(a), None

    for j, node in enumerate(spec.nodes):
        name = f"v{j}"
        if node.target == "operator.getitem":
            src, idx = node.args[0], node.args[1]
            tup = values[node_value[src["node"]]]
            if tup.kind != "tuple":
                raise Unsupported("getitem of a single-output op")
            node_value.append(tup.parts[idx])
            continue
        ns, base, overload = _split_target(node.target)
        if ns not in ("aten", "prims"):
            raise Unsupported(f"unsupported op {node.target}")
        args = normalize_args(node.target, node.args, node.kwargs)
        if base in _REDUCTIONS:
            _lower_reduction(spec, values, name, node.target, base, args, operand)
        else:
            values[name] = _lower_pointwise(name, node.target, base, overload, args, operand)
        node_value.append(name)

    outputs = []
    for o in spec.outputs:
        name = node_value[o]
        if name is None or values[name].kind == "tuple":
            raise Unsupported(f"output {o} is not a single tensor")
        if name.startswith("a"):
            raise Unsupported("an input is also an output (would alias)")
        outputs.append(name)
    for v in values.values():
        if v.kind == "row" and not v.keepdim and v.reduce:
            users = [u for u in values.values() if v.name in u.deps or u.operand == v.name or u.center == v.name]
            if users:
                raise Unsupported("a keepdim=False reduction feeds further ops (broadcast would not be per row)")
    _mark_online_softmax(values)
    levels = max((v.level for v in values.values() if v.kind == "row"), default=0)
    return Program(spec, values, tuple(f"a{k}" for k in range(spec.n_inputs)), tuple(input_is_bool),
                   tuple(outputs), levels)


def _lower_pointwise(name, target, base, overload, args, operand) -> Value:
    names = list(args)
    if base == "convert_element_type":
        expr, v = operand(args["a"])
        dtype = args["dtype"]
        dname = dtype["dtype"] if isinstance(dtype, dict) else str(dtype).replace("torch.", "")
        if v is None:
            raise Unsupported(f"{target} of a scalar")
        if dname in FLOAT_DTYPES or dname == "float64":
            e = f"{expr}.to(tl.float32)" if v.is_bool else expr  # compute stays fp32, cast on store
            return Value(name, v.kind, v.level, False, e, (v.name,))
        if dname == "bool":
            return Value(name, v.kind, v.level, True, expr if v.is_bool else f"({expr} != 0)", (v.name,))
        raise Unsupported(f"{target} to {dname}")
    if base == "where":
        ops = [operand(args[n]) for n in ("condition", "self", "other")]
        expr = f"tl.where({ops[0][0]}, {ops[1][0]}, {ops[2][0]})"
        return _combine(name, expr, [o[1] for o in ops], is_bool=False)
    if base in _UNARY and len(names) == 1:
        e, v = operand(args[names[0]])
        if v is None:
            raise Unsupported(f"{target} of a scalar")
        return _combine(name, _UNARY[base].format(e), [v], is_bool=False)
    if base in ("logical_not", "bitwise_not"):
        e, v = operand(args[names[0]])
        return _combine(name, f"({e} == 0)", [v], is_bool=True)
    if base in _COMPARE:
        (e0, v0), (e1, v1) = operand(args["self"]), operand(args["other"])
        return _combine(name, f"({e0} {_COMPARE[base]} {e1})", [v0, v1], is_bool=True)
    if base in _LOGICAL:
        (e0, v0), (e1, v1) = operand(args["self"]), operand(args["other"])
        if base.startswith("bitwise") and not all(v is None or v.is_bool for v in (v0, v1)):
            raise Unsupported(f"{target} on non-bool values")
        return _combine(name, _LOGICAL[base].format(e0, e1), [v0, v1], is_bool=True)
    if base == "pow" and overload == "Tensor_Scalar":
        e, v = operand(args["self"])
        exp = args["exponent"]
        if not isinstance(exp, dict) and float(exp) in _POW_SPECIAL:
            return _combine(name, _POW_SPECIAL[float(exp)].format(e), [v], is_bool=False)
        # an abstracted exponent is a constexpr kernel parameter: _pow_c specializes x ** 2 etc.
        return _combine(name, f"_pow_c({e}, {operand(exp)[0]})", [v], is_bool=False)
    if base == "clamp" and overload == "default":
        e, v = operand(args["self"])
        expr = e
        if args.get("min") is not None:
            expr = f"tl.maximum({expr}, {operand(args['min'])[0]})"
        if args.get("max") is not None:
            expr = f"tl.minimum({expr}, {operand(args['max'])[0]})"
        return _combine(name, expr, [v], is_bool=False)
    if base in _BINARY and {"self", "other"} <= set(names) or base == "pow" and overload == "Tensor_Tensor":
        second = "other" if "other" in args else "exponent"
        (e0, v0), (e1, v1) = operand(args["self"]), operand(args[second])
        alpha = args.get("alpha", 1)
        if base in ("add", "sub", "rsub") and alpha not in (1, None):
            e1 = f"({operand(alpha)[0]} * {e1})"
        if base == "div" and args.get("rounding_mode") is not None:
            raise Unsupported(f"{target} with rounding_mode")
        return _combine(name, _BINARY[base].format(e0, e1), [v0, v1], is_bool=False)
    raise Unsupported(f"unsupported op {target}")


def _combine(name: str, expr: str, operands: list[Value | None], is_bool: bool) -> Value:
    tensors = [v for v in operands if v is not None]
    if not tensors:
        raise Unsupported(f"{expr}: an op on scalars only")
    kind = "vec" if any(v.kind == "vec" for v in tensors) else "row"
    level = max(v.level for v in tensors)
    return Value(name, kind, level, is_bool, expr, tuple(v.name for v in tensors))


def _reduction_dims(spec: PatternSpec, target: str, dims: Any) -> None:
    dims = [dims] if isinstance(dims, int) else list(dims or [])
    if dims == [-1]:
        return
    if spec.rank is not None and dims == [spec.rank - 1]:
        return
    raise Unsupported(f"{target} over dims {dims}: only the last dim is supported")


def _lower_reduction(spec, values, name, target, base, args, operand) -> None:
    _reduction_dims(spec, target, args.get("dim"))
    e, v = operand(args["self"])
    if v is None or v.kind != "vec":
        raise Unsupported(f"{target} of a per-row value")
    if args.get("dtype") not in (None,) and base in ("sum", "mean"):
        dt = args["dtype"]
        dname = dt["dtype"] if isinstance(dt, dict) else str(dt)
        if dname.replace("torch.", "") not in FLOAT_DTYPES:
            raise Unsupported(f"{target} with dtype {dname}")
    keepdim = bool(args.get("keepdim", False))
    level = v.level + 1
    kind = _REDUCTIONS[base]
    if kind in ("var_mean", "var"):
        corr = args.get("correction")
        corr = 1.0 if corr is None else corr
        if isinstance(corr, dict):
            raise Unsupported(f"{target}: abstracted correction")
        mean = Value(f"{name}_mean", "row", level, reduce="mean", operand=v.name, divisor="n_cols",
                     keepdim=keepdim, deps=(v.name,))
        var = Value(f"{name}_var", "row", level + 1, reduce="m2", operand=v.name, center=mean.name,
                    divisor=f"(n_cols - {float(corr)!r})", keepdim=keepdim, deps=(v.name, mean.name))
        values[mean.name] = mean
        values[var.name] = var
        if kind == "var":
            values[name] = Value(name, "row", var.level, expr=var.name, deps=(var.name,), keepdim=keepdim)
        else:
            values[name] = Value(name, "tuple", var.level, parts=(var.name, mean.name), keepdim=keepdim)
        return
    values[name] = Value(name, "row", level, is_bool=(kind == "any"), reduce=kind, operand=v.name,
                         divisor="n_cols" if kind == "mean" else None, keepdim=keepdim, deps=(v.name,))


def _mark_online_softmax(values: dict[str, Value]) -> None:
    """Find s = sum(exp(v - m)) with m = amax(v): compute s in m's pass with a rescaled sum."""
    for s in values.values():
        if s.reduce != "sum":
            continue
        e = values[s.operand]
        if not (e.expr and e.expr.startswith("tl.exp(") and len(e.deps) == 1):
            continue
        d = values[e.deps[0]]
        if not d.expr or len(d.deps) != 2 or d.expr != f"({d.deps[0]} - {d.deps[1]})":
            continue
        v_name, m_name = d.deps
        m = values[m_name]
        if m.reduce == "max" and m.operand == v_name:
            s.online_max = m_name
            s.level = m.level
            _relevel(values)


def _relevel(values: dict[str, Value]) -> None:
    for v in values.values():
        if v.reduce or v.kind == "tuple" or not v.deps:
            continue
        v.level = max(values[d].level for d in v.deps)


# --------------------------------------------------------------------------- emission

_HELPERS = '''
@triton.jit
def _tanh(x):
    # tanh without libdevice (not available under TRITON_INTERPRET); series near 0 keeps the
    # relative error small where (1 - e) / (1 + e) would cancel.
    ax = tl.abs(x)
    e = tl.exp(-2.0 * ax)
    big = (1.0 - e) / (1.0 + e)
    x2 = ax * ax
    small = ax * (1.0 - x2 * (0.3333333333333333 - x2 * (0.13333333333333333 - x2 * 0.05396825396825397)))
    t = tl.where(ax < 0.0625, small, big)
    return tl.where(x < 0, -t, t)


@triton.jit
def _pow(x, e):
    # x ** e for a runtime exponent: |x| ** e, signed for odd integer e, nan for x < 0 and
    # non-integer e, 1 for e == 0 (as torch.pow).
    r = tl.exp2(e * tl.log2(tl.abs(x)))
    e_int = tl.floor(e) == e
    odd = e_int & (tl.floor(e * 0.5) * 2.0 != e)
    r = tl.where(x < 0, tl.where(e_int, tl.where(odd, -r, r), float("nan")), r)
    return tl.where(e == 0, 1.0, r)


@triton.jit
def _pow_c(x, E: tl.constexpr):
    # x ** E for a compile-time exponent: small integer and half powers without exp/log
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
        r = _pow(x, x * 0.0 + E)
    return r
'''


class _Emitter:
    """Emits the kernel bodies for one Program."""

    def __init__(self, prog: Program):
        self.p = prog
        self.v = prog.values

    # -- which vec values a set of targets needs (recomputed per pass)
    def _vec_closure(self, roots: list[str]) -> list[str]:
        need: set[str] = set()
        stack = list(roots)
        while stack:
            n = stack.pop()
            val = self.v[n]
            if val.kind != "vec" or n in need:
                continue
            need.add(n)
            stack.extend(val.deps)
        return [n for n in self.v if n in need]  # topological order

    def _vec_lines(self, names: list[str], aligned: bool = False, masked: bool = True) -> list[str]:
        """Loads and pointwise lines. ``aligned`` (looped kernel): ``cols`` count from the row's
        16-aligned start ``abase``; an input laid out like the rows (``X{k}_ALIGNED``) is read at
        ``abase + cols`` (vectorizable), any other at its logical column ``cols - lead``."""
        lines = []
        for n in names:
            val = self.v[n]
            if n in self.p.inputs:
                k = self.p.inputs.index(n)
                cast = "" if val.is_bool else ".to(tl.float32)"
                m = ", mask=mask, other=0" if masked else ""
                if aligned:
                    lines += [f"if X{k}_ALIGNED:",
                              f"    {n} = tl.load(x{k}_ptr + abase + cols{m}){cast}",
                              "else:",
                              f"    {n} = tl.load(x{k}_row + (cols - lead) * x{k}_sc{m}){cast}"]
                else:
                    lines.append(f"{n} = tl.load(x{k}_row + cols * x{k}_sc, mask=mask, other=0){cast}")
            else:
                lines.append(f"{n} = {val.expr}")
        return lines

    def _row_pointwise_after(self, level: int, done: set[str]) -> list[str]:
        lines = []
        for n, val in self.v.items():
            if val.kind == "row" and val.reduce is None and val.expr and n not in done \
                    and all(d in done for d in val.deps):
                lines.append(f"{n} = {val.expr}")
                done.add(n)
        return lines

    def _finalize(self, r: Value, acc: str) -> str:
        if r.reduce == "sum":
            return f"{r.name} = tl.sum({acc}, axis=1)[:, None]"
        if r.reduce == "max":
            return f"{r.name} = tl.max({acc}, axis=1)[:, None]"
        if r.reduce == "min":
            return f"{r.name} = tl.min({acc}, axis=1)[:, None]"
        if r.reduce == "any":
            return f"{r.name} = tl.max({acc}, axis=1)[:, None] != 0"
        if r.reduce == "mean":
            return f"{r.name} = tl.sum({acc}, axis=1)[:, None] / n_cols"
        if r.reduce == "m2":
            return f"{r.name} = tl.sum({acc}, axis=1)[:, None] / {r.divisor}"
        raise AssertionError(r.reduce)

    def _masked(self, r: Value, masked: bool = True) -> str:
        x = r.operand
        if not masked:  # a full chunk: every lane is a real column
            return {"m2": f"({x} - {r.center}) * ({x} - {r.center})", "any": f"{x}.to(tl.int32)"}.get(r.reduce, x)
        if r.reduce in ("sum", "mean"):
            return f"tl.where(mask, {x}, 0.0)"
        if r.reduce == "m2":
            return f"tl.where(mask, ({x} - {r.center}) * ({x} - {r.center}), 0.0)"
        if r.reduce == "max":
            return f"tl.where(mask, {x}, float(\"-inf\"))"
        if r.reduce == "min":
            return f"tl.where(mask, {x}, float(\"inf\"))"
        if r.reduce == "any":
            return f"tl.where(mask, {x}, 0).to(tl.int32)"
        raise AssertionError(r.reduce)

    def _stores(self, kinds: str, aligned: bool = False, masked: bool = True) -> list[str]:
        lines = []
        for i, o in enumerate(self.p.outputs):
            val = self.v[o]
            if val.kind != kinds:
                continue
            if kinds == "vec":
                at = "abase + cols" if aligned else "rows * n_cols + cols"
                m = ", mask=mask" if masked else ""
                lines.append(f"tl.store(out{i}_ptr + {at}, {o}.to(out{i}_ptr.dtype.element_ty){m})")
            else:
                lines.append(f"tl.store(out{i}_ptr + rows, {o}.to(out{i}_ptr.dtype.element_ty), mask=row_mask)")
        return lines

    # -- signature and prologue shared by both kernels
    def signature(self, name: str, aligned: bool = False) -> str:
        n_in, n_out = len(self.p.inputs), len(self.p.outputs)
        params = [f"x{k}_ptr" for k in range(n_in)] + [f"out{i}_ptr" for i in range(n_out)]
        # scalar constants are compile-time: one specialization per value (eps, scales and
        # exponents are fixed per model), folded into the arithmetic
        params += [f"c{c}: tl.constexpr" for c in range(self.p.spec.n_consts)]
        params += ["n_rows", "n_cols", "d1", "d2"]
        params += [f"x{k}_s{d}" for k in range(n_in) for d in ("0", "1", "2", "c")]
        params += ["ROWS: tl.constexpr", "BLOCK: tl.constexpr"]
        if aligned:
            params += [f"X{k}_ALIGNED: tl.constexpr" for k in range(n_in)]
        return f"@triton.jit\ndef {name}(\n    " + ",\n    ".join(
            ", ".join(params[i:i + 6]) for i in range(0, len(params), 6)) + ",\n):"

    def prologue(self) -> list[str]:
        lines = [
            "rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]).to(tl.int64)",
            "row_mask = rows < n_rows",
            "i0 = rows // (d1 * d2)",
            "i1 = (rows // d2) % d1",
            "i2 = rows % d2",
        ]
        for k in range(len(self.p.inputs)):
            lines.append(f"x{k}_row = x{k}_ptr + i0 * x{k}_s0 + i1 * x{k}_s1 + i2 * x{k}_s2")
        return lines

    def one_pass(self) -> str:
        body = self.prologue() + [
            "cols = tl.arange(0, BLOCK)[None, :]",
            "mask = row_mask & (cols < n_cols)",
        ]
        done: set[str] = set()
        for n, val in self.v.items():
            if val.kind == "vec":
                body += self._vec_lines([n])
            elif val.kind == "row" and val.reduce:
                if val.online_max:
                    body.append(f"{n} = tl.sum({self._masked(val)}, axis=1)[:, None]")
                else:
                    body.append(self._finalize(val, self._masked(val)))
                done.add(n)
            elif val.kind == "row":
                body.append(f"{n} = {val.expr}")
                done.add(n)
        body += self._stores("vec") + self._stores("row")
        return self.signature("one_pass_kernel") + "\n" + _indent(body)

    def _chunked(self, lines) -> list[str]:
        """``lines(masked)`` over one row in BLOCK chunks of columns counted from the row's 16-aligned start.

        The row [lead, end) is read as a masked head chunk, full chunks without masks whose
        loads and stores start on 16-element boundaries (so Triton vectorizes them even when
        n_cols is odd, e.g. a 50257-word vocabulary), and a masked tail chunk.
        """
        body = ["cols = tl.arange(0, BLOCK)[None, :]",
                "mask = row_mask & (cols >= lead) & (cols < end)"] + lines(True)
        body += ["for start in range(BLOCK, n_main, BLOCK):",
                 "    cols = start + tl.arange(0, BLOCK)[None, :]"] + ["    " + ln for ln in lines(False)]
        body += ["if tail < end:",
                 "    cols = tail + tl.arange(0, BLOCK)[None, :]",
                 "    mask = row_mask & (cols < end)"] + ["    " + ln for ln in lines(True)]
        return body

    def looped(self) -> str:
        body = self.prologue() + [
            "# one row per program (ROWS == 1); columns are counted from the row's 16-aligned start",
            "row_start = tl.program_id(0).to(tl.int64) * n_cols",
            "abase = (row_start // 16) * 16",
            "lead = (row_start - abase).to(tl.int32)",
            "end = lead + n_cols",
            "n_main = (end // BLOCK) * BLOCK",
            "tail = tl.maximum(n_main, BLOCK)",
        ]
        done: set[str] = set()
        for level in range(1, self.p.levels + 1):
            reds = [v for v in self.v.values() if v.kind == "row" and v.reduce and v.level == level]
            if not reds:
                continue
            body.append(f"# pass {level}: {', '.join(r.name for r in reds)}")
            inits, finals, roots = [], [], []
            # the online sum computed in the same pass as each max (None: a plain reduction)
            partners = {r.name: next((s for s in reds if s.online_max == r.name), None) for r in reds}
            for r in reds:
                acc = f"acc_{r.name}"
                if r.online_max:
                    continue  # accumulated together with its max below
                roots.append(r.operand)
                if r.center:
                    roots.append(r.center)
                partner = partners[r.name]
                if r.reduce == "max" and partner is not None:
                    inits += [f'{acc} = tl.full([ROWS, BLOCK], float("-inf"), tl.float32)',
                              f"acc_{partner.name} = tl.zeros([ROWS, BLOCK], tl.float32)"]
                    finals += [self._finalize(r, acc),
                               f'{r.name}_safe = tl.where({r.name} == float("-inf"), 0.0, {r.name})',
                               f"{partner.name} = tl.sum(acc_{partner.name} * tl.exp({acc} - {r.name}_safe), axis=1)[:, None]"]
                    continue
                init = {"max": 'tl.full([ROWS, BLOCK], float("-inf"), tl.float32)',
                        "min": 'tl.full([ROWS, BLOCK], float("inf"), tl.float32)',
                        "any": "tl.zeros([ROWS, BLOCK], tl.int32)"}.get(r.reduce, "tl.zeros([ROWS, BLOCK], tl.float32)")
                inits.append(f"{acc} = {init}")
                finals.append(self._finalize(r, acc))

            def pass_lines(masked: bool, reds=reds, roots=roots, partners=partners) -> list[str]:
                lines = self._vec_lines(self._vec_closure(roots), aligned=True, masked=masked)
                for r in reds:
                    acc = f"acc_{r.name}"
                    if r.online_max:
                        continue
                    partner = partners[r.name]
                    if r.reduce == "max" and partner is not None:
                        sacc, x = f"acc_{partner.name}", r.operand
                        lines += [f'xm = tl.where(mask, {x}, float("-inf"))' if masked else f"xm = {x}",
                                  "# online sum of exp(x - max) per lane with ONE exp: the larger of x and the",
                                  "# running max gets exp(0) = 1, the other exp(-|x - max|); -inf lanes add 0",
                                  f'd = tl.exp(-tl.abs(tl.where(xm == float("-inf"), float("-inf"), xm - {acc})))',
                                  f"{sacc} = tl.where(xm > {acc}, {sacc} * d + 1.0, {sacc} + d)",
                                  f"{acc} = tl.maximum({acc}, xm)"]
                        continue
                    combine = {"max": "tl.maximum({a}, {x})", "min": "tl.minimum({a}, {x})",
                               "any": "tl.maximum({a}, {x})"}.get(r.reduce, "{a} + {x}")
                    lines.append(f"{acc} = " + combine.format(a=acc, x=self._masked(r, masked)))
                return lines

            body += inits + self._chunked(pass_lines) + finals
            done.update(r.name for r in reds)
            body += self._row_pointwise_after(level, done)
        vec_outs = [o for o in self.p.outputs if self.v[o].kind == "vec"]
        if vec_outs:
            body.append("# last pass: recompute and store the full-row outputs")
            body += self._chunked(lambda masked: self._vec_lines(self._vec_closure(vec_outs), aligned=True, masked=masked)
                                  + self._stores("vec", aligned=True, masked=masked))
        body += self._stores("row")
        return self.signature("looped_kernel", aligned=True) + "\n" + _indent(body)


def _indent(lines: list[str]) -> str:
    return "\n".join("    " + ln for ln in lines) + "\n"


def reference_source(spec: PatternSpec, name: str = "pattern") -> str:
    """The pattern as a plain function of aten/prims ops (the eager reference and search function)."""
    return source.render(spec.nodes, spec.n_inputs, spec.n_consts, spec.outputs, name)


def kernel_source(prog: Program) -> str:
    """The Triton part of kernel.py: helpers, one_pass_kernel, looped_kernel."""
    em = _Emitter(prog)
    return _HELPERS + "\n\n" + em.one_pass() + "\n\n" + em.looped()


def signature_params(spec: PatternSpec) -> list[str]:
    return [f"x{k}" for k in range(spec.n_inputs)] + [f"c{c}" for c in range(spec.n_consts)]


__all__ = ["PatternSpec", "Program", "Unsupported", "lower", "kernel_source", "reference_source",
           "normalize_args"]
