"""Pattern -> kernel program: lower a pattern to the values of a row kernel (``emit`` writes the Triton).

The supported class is "pointwise ops + reductions over the last dim".

The supported class: a DAG whose nodes are pointwise aten ops and reductions (``sum``,
``amax``, ``amin``, ``mean``, ``var_mean``, ``var``, ``any``, ``prims.prepare_softmax_online``)
over the *last* dimension of the broadcast shape of the pattern's inputs; a reduction's result is
a per-row value that may broadcast back (keepdim) into later pointwise ops. Besides: ``full``
scalars (a constant of the rows' shape is the constant), and ``aten.embedding(table, index)`` of
a small table by an int64 index input, followed by views (``permute``, ``unsqueeze``, ``expand``,
``squeeze``): a gather whose views are applied to its table and index at launch (``Gather``), so
each element reads ``table[index[...], col]`` at its own coordinates. Everything is computed in float32 and cast on
store. ``miner.generate.emit`` writes two kernels from one lowered program:

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

from miner.core import dtypes, ops
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
    column_inputs: tuple[int, ...] = ()  # observed as per-column vectors [N] only (read once per program)
    rng: str = "inductor"  # the random stream ``inductor_random`` draws: one of RNGS
    # nodes another Inductor kernel also reads (``region.shared_outputs``): not the kernel's outputs; the
    # pattern module's search returns them and its replacement recomputes them outside the kernel
    shared: tuple[int, ...] = ()


# the random streams a kernel can draw ``inductor_random(shape, seed, "rand")`` from, both a function
# of (seed, the element's row-major index L) only:
# - "inductor": Inductor's own numbers, ``tl.rand(seed, L)`` (one Philox4x32-10 call per element,
#   one of its four words used): a replaced dropout keeps Inductor's mask bit for bit;
# - "philox4": word L % 4 of the Philox call at counter L // 4 (``miner.runtime.philox``): a
#   quarter of the Philox work, another (equally distributed) mask.
RNGS = ("philox4", "inductor")


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
    op: str | None = None  # the pattern node's op (``aten.sub``), a trailing comment in the kernel
    random: bool = False  # drawn by ``inductor_random`` (the element's offset is ``lin``)
    index: bool = False  # an int64 input read as an embedding's index (loaded without a float cast)
    gather: "Gather | None" = None  # ``aten.embedding``: the table row ``deps[0]`` at each element


@dataclass(frozen=True)
class Gather:
    """``aten.embedding(x<table>, x<index>)`` and the views its result takes before it is used.

    The kernel reads element ``e`` of the viewed result as ``table[index_v[e], col_v[e]]``, where
    ``index_v`` is the index and ``col_v`` the table's column, each seen through the same views
    (``emit.gather_views`` renders them: the launcher passes the viewed index and table as row inputs,
    and the table's row stride as the runtime int ``x<table>_g``).
    """

    table: int
    index: int
    views: tuple[PatternNode, ...] = ()  # permute / unsqueeze / expand / squeeze, in order


@dataclass
class Program:
    """A lowered pattern: its kernel values in topological order, the inputs, the outputs and the looped kernel's reduction levels."""

    spec: PatternSpec
    values: dict[str, Value]  # in topological order
    inputs: tuple[str, ...]  # value names of the inputs: a0, a1, ...
    input_is_bool: tuple[bool, ...]
    outputs: tuple[str, ...]  # value name per pattern output
    levels: int  # number of reduction passes the looped kernel makes
    seed_inputs: tuple[int, ...] = ()  # inputs read only by inductor_lookup_seed (int64 seed vectors)
    seed_consts: tuple[int, ...] = ()  # const slots that index a seed vector (runtime ints, not constexpr)
    gathers: tuple[Gather, ...] = ()  # embeddings, each read through its views (``Gather``)

    @property
    def random(self) -> bool:
        """Whether the kernel draws random numbers (``inductor_random`` inside)."""
        return any(v.random for v in self.values.values())

    @property
    def rand4(self) -> bool:
        """Whether the kernel draws the four-per-call stream (``RAND4`` flag: whole groups per call)."""
        return self.random and self.spec.rng == "philox4"

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
    "sigmoid": "tl.sigmoid({0})", "tanh": "tanh({0})", "erf": "tl.erf({0})", "sin": "tl.sin({0})",
    "cos": "tl.cos({0})", "reciprocal": "(1.0 / {0})", "relu": "tl.maximum({0}, 0.0)",
    "expm1": "(tl.exp({0}) - 1.0)", "log1p": "tl.log(1.0 + {0})", "clone": "{0}",
    "floor": "tl.floor({0})", "ceil": "tl.ceil({0})",
}
_BINARY = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "rsub": "({1} - {0})", "mul": "({0} * {1})",
    "div": "({0} / {1})", "maximum": "tl.maximum({0}, {1})", "minimum": "tl.minimum({0}, {1})",
    "pow": "pow_rt({0}, {1})", "clamp_min": "tl.maximum({0}, {1})", "clamp_max": "tl.minimum({0}, {1})",
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
    """Bind positional args and kwargs to the op's schema argument names (defaults filled in).

    Parameters
    ----------
    target : str
        The op (``"aten.sum.dim_IntList"``).
    args, kwargs
        The pattern node's arguments, as JSON holds them.

    Returns
    -------
    dict
        Argument name -> value, literal floats decoded (``{"float": "-inf"}`` -> ``-inf``).

    Raises
    ------
    Unsupported
        For an op without a schema, or a required argument missing.
    """
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


def dtype_reason(k: int, dts: set[str]) -> str:
    """Why input ``k`` of dtypes ``dts`` (over the pattern's occurrences) has no kernel."""
    if "bool" in dts and dts & set(FLOAT_DTYPES):
        return (f"input {k} is bool in some occurrences and {'/'.join(sorted(dts - {'bool'}))} in others "
                "(one kernel takes floats or bool)")
    return f"input {k} has dtype {'/'.join(sorted(dts))} (float32, bfloat16, float16 or bool only)"


def lower(spec: PatternSpec) -> Program:
    """Lower a pattern into kernel values.

    Parameters
    ----------
    spec : PatternSpec
        The pattern as codegen sees it (``miner.generate.generate.spec_from_pattern``).

    Returns
    -------
    Program
        The values in topological order (each pointwise value an expression over others, each
        reduction a per-row value of a level), the outputs and the looped kernel's levels.

    Raises
    ------
    Unsupported
        For a pattern outside the class; ``str(e)`` is the reason ``miner generate`` prints.
    """
    values: dict[str, Value] = {}
    input_is_bool = []
    seed_inputs, seed_consts = _seed_slots(spec)
    tables, indices = _gather_slots(spec)
    for k in range(spec.n_inputs):
        dts = set(spec.input_dtypes[k]) if k < len(spec.input_dtypes) else {"float32"}
        if k in indices:
            if not dts <= {"int64", "int32"}:
                raise Unsupported(f"input {k} indexes an embedding but has dtype {'/'.join(sorted(dts))}")
            input_is_bool.append(False)
            values[f"a{k}"] = Value(f"a{k}", "vec", 0, index=True)
            continue
        if k in tables:
            if not dts <= set(FLOAT_DTYPES):
                raise Unsupported(f"input {k} is an embedding table of dtype {'/'.join(sorted(dts))}")
            input_is_bool.append(False)
            values[f"a{k}"] = Value(f"a{k}", "table", 0)
            continue
        if k in seed_inputs:
            if dts != {"int64"}:
                raise Unsupported(f"input {k} is a seed vector of dtype {'/'.join(sorted(dts))} (int64 only)")
            input_is_bool.append(False)
            values[f"a{k}"] = Value(f"a{k}", "seed", 0)
            continue
        if dts <= set(FLOAT_DTYPES):
            is_bool = False
        elif dts == {"bool"}:
            is_bool = True
        else:
            raise Unsupported(dtype_reason(k, dts))
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
            if v.kind == "const":
                return v.expr, None
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
        if base in ("inductor_lookup_seed", "inductor_random"):
            values[name] = _lower_random(name, base, node, operand, spec.rng)
            values[name].op = f"{ns}.{base}"
            node_value.append(name)
            continue
        if base == "embedding":
            values[name] = _lower_embedding(name, node, values)
            node_value.append(name)
            continue
        if base == "expand" and not _reads_gather(node, node_value, values):
            # broadcasting is the identity in the rows' space: every lane already holds its element's
            # value (size-1 dims read at 0, new dims leading), so an expand of an input or a computed
            # value is that value (the launch contract checks the outputs still fill the rows)
            e, v = operand(node.args[0])
            if v is None:
                raise Unsupported(f"{node.target} of a scalar")
            node_value.append(v.name)
            continue
        if base in RESHAPES and not _reads_gather(node, node_value, values):
            # a reshape moves no element of a row-major layout, and every computed value is held in the
            # rows' row-major order: it is the identity here. A reshape that changes the rows (their last
            # dim) leaves an output or a reduction that does not fit them: the contract refuses that.
            e, v = operand(node.args[0])
            if v is None or e.startswith("a"):
                raise Unsupported(f"{node.target} of {'a scalar' if v is None else 'an input'} "
                                  f"(input views are taken out by region.prepare)")
            node_value.append(v.name)
            continue
        if base in GATHER_VIEWS:
            node_value.append(_lower_gather_view(spec, j, node, node_value, values))
            continue
        args = normalize_args(node.target, node.args, node.kwargs)
        if base == "full":
            values[name] = _lower_full(name, node, args, operand)
            node_value.append(name)
            continue
        if base == "prepare_softmax_online":
            _lower_prepare_softmax(spec, values, name, node.target, args, operand)
            node_value.append(name)
            continue
        if base in _REDUCTIONS:
            _lower_reduction(spec, values, name, node.target, base, args, operand)
            for part in (name, f"{name}_mean", f"{name}_var"):
                if part in values:
                    values[part].op = f"{ns}.{base}"
        else:
            values[name] = _lower_pointwise(name, node.target, base, overload, args, operand)
            values[name].op = f"{ns}.{base}"
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
    gathers = tuple(v.gather for v in values.values() if v.gather is not None)
    return Program(spec, values, tuple(f"a{k}" for k in range(spec.n_inputs)), tuple(input_is_bool),
                   tuple(outputs), levels, tuple(sorted(seed_inputs)), tuple(sorted(seed_consts)), gathers)


RESHAPES = ("reshape", "view", "_unsafe_view")  # of a computed value: the identity on the rows (see lower)
# the views a gather's result may take before it is used: applied to its table and index at launch
GATHER_VIEWS = ("permute", "unsqueeze", "expand", "squeeze")


def _gather_slots(spec: PatternSpec) -> tuple[set[int], set[int]]:
    """(tables, indices): the inputs ``aten.embedding`` reads, which nothing else may read (the kernel
    never loads a table per element, and an index is no float value)."""
    tables, indices, other = set(), set(), set()
    for node in spec.nodes:
        refs = [a["input"] for a in _walk(list(node.args) + list(node.kwargs.values()))
                if isinstance(a, dict) and "input" in a]
        if node.target == "aten.embedding.default":
            w, i = (list(node.args) + [None, None])[:2]
            if not (isinstance(w, dict) and "input" in w and isinstance(i, dict) and "input" in i):
                raise Unsupported("aten.embedding of a computed table or index (inputs only)")
            tables.add(w["input"])
            indices.add(i["input"])
        else:
            other.update(refs)
    if (tables | indices) & other:
        raise Unsupported(f"embedding input(s) {sorted((tables | indices) & other)} also read per element")
    if tables & indices:
        raise Unsupported(f"input(s) {sorted(tables & indices)} both an embedding's table and its index")
    return tables, indices


def _lower_embedding(name: str, node: PatternNode, values: dict[str, Value]) -> Value:
    """``embedding(table, index)`` -> a gather: ``table[index, col]`` per element (``Gather``); its
    views follow (``_lower_gather_view``). ``padding_idx`` and ``scale_grad_by_freq`` only matter to
    the backward; ``sparse`` must be False."""
    args = (list(node.args) + [None] * 5)[:5]
    if args[4] not in (None, False) or node.kwargs.get("sparse") not in (None, False):
        raise Unsupported("aten.embedding with sparse=True")
    w, i = args[0]["input"], args[1]["input"]
    return Value(name, "vec", 0, deps=(f"a{i}",), gather=Gather(w, i), op="aten.embedding")


def _reads_gather(node: PatternNode, node_value: list, values: dict) -> bool:
    """Whether ``node``'s first argument is an embedding's (viewed) result."""
    src = node.args[0] if node.args else None
    if not (isinstance(src, dict) and "node" in src):
        return False
    name = node_value[src["node"]]
    return name is not None and values[name].gather is not None


def _lower_gather_view(spec: PatternSpec, j: int, node: PatternNode, node_value: list, values: dict) -> str:
    """A view of a gather's result: recorded on the gather (applied to its table and index at launch).

    A view of any other computed value is outside the class: the kernel holds one element of the
    rows per lane, and a view would move elements between lanes."""
    src = node.args[0] if node.args else None
    if isinstance(src, dict) and "input" in src:
        raise Unsupported(f"{node.target} of input {src['input']} (input views are taken out by region.prepare)")
    name = node_value[src["node"]] if isinstance(src, dict) and "node" in src else None
    val = values.get(name) if name else None
    if val is None or val.gather is None:
        raise Unsupported(f"{node.target} of a computed value (only an embedding's result is viewed in-kernel)")
    users = [n for n in spec.nodes if {"node": src["node"]} in list(_walk(list(n.args) + list(n.kwargs.values())))]
    if len(users) != 1:
        raise Unsupported(f"{node.target} of an embedding result that {len(users)} ops read (one view chain only)")
    val.gather = Gather(val.gather.table, val.gather.index, val.gather.views + (node,))
    return name


def _lower_full(name: str, node: PatternNode, args: dict, operand) -> Value:
    """``full(shape, c)``: the constant ``c`` wherever it is read (its shape broadcasts into the rows:
    region.prepare ties it to an input's shape)."""
    dt = args.get("dtype")
    dname = (dt["dtype"] if isinstance(dt, dict) else str(dt).replace("torch.", "")) if dt is not None else "float32"
    if dname not in FLOAT_DTYPES and dname not in ("float64", "bool"):
        raise Unsupported(f"{node.target} of dtype {dname}")
    e, v = operand(args["fill_value"])
    if v is not None:
        raise Unsupported(f"{node.target} of a tensor value")
    return Value(name, "const", 0, is_bool=dname == "bool", expr=e, op="aten.full")


def _lower_prepare_softmax(spec, values, name, target, args, operand) -> None:
    """``prims.prepare_softmax_online(x, dim)`` -> ``(max, sum(exp(x - max)))`` over the row: the max's
    pass accumulates the sum online (``_mark_online_softmax`` finds the pair)."""
    _reduction_dims(spec, target, args.get("dim"))
    e, v = operand(args["a"])
    if v is None or v.kind != "vec":
        raise Unsupported(f"{target} of a per-row value")
    op = "prims.prepare_softmax_online"
    m = Value(f"{name}_max", "row", v.level + 1, reduce="max", operand=v.name, deps=(v.name,), op=op)
    d = Value(f"{name}_d", "vec", m.level, expr=f"({v.name} - {m.name})", deps=(v.name, m.name), op=op)
    x = Value(f"{name}_e", "vec", m.level, expr=f"tl.exp({d.name})", deps=(d.name,), op=op)
    s = Value(f"{name}_sum", "row", m.level + 1, reduce="sum", operand=x.name, deps=(x.name,), op=op)
    for val in (m, d, x, s):
        values[val.name] = val
    values[name] = Value(name, "tuple", s.level, parts=(m.name, s.name))


def _seed_slots(spec: PatternSpec) -> tuple[set[int], set[int]]:
    """(inputs, const slots) that ``inductor_lookup_seed`` reads: the seed vector and its index.

    A seed vector must be read by nothing else (the kernel never loads it per element).
    """
    seeds, consts, other = set(), set(), set()
    for node in spec.nodes:
        refs = [a["input"] for a in _walk(list(node.args) + list(node.kwargs.values()))
                if isinstance(a, dict) and "input" in a]
        if node.target == "prims.inductor_lookup_seed.default":
            seeds.update(refs[:1])
            idx = node.args[1] if len(node.args) > 1 else None
            if isinstance(idx, dict) and set(idx) & {"const", "int_const"}:
                consts.add(idx.get("const", idx.get("int_const")))
        else:
            other.update(refs)
    if seeds & other:
        raise Unsupported(f"seed input(s) {sorted(seeds & other)} also read per element")
    return seeds, consts


def _walk(xs):
    for x in xs:
        if isinstance(x, (list, tuple)):
            yield from _walk(x)
        else:
            yield x


def _lower_random(name: str, base: str, node: PatternNode, operand, rng: str = "inductor") -> Value:
    """``inductor_lookup_seed(seeds, i)`` -> one seed per program; ``inductor_random(shape, seed, kind)``
    -> one number per element at its row-major offset ``lin`` (the launch contract checks that
    ``shape`` is the rows' full shape), from the stream ``rng`` (``RNGS``): ``uniform_at`` names
    the four-per-call stream, which ``emit`` draws a whole group per call where the tile allows."""
    if base == "inductor_lookup_seed":
        seeds, idx = node.args[0], node.args[1]
        if not (isinstance(seeds, dict) and "input" in seeds):
            raise Unsupported("inductor_lookup_seed of a computed seed vector")
        if isinstance(idx, bool) or not isinstance(idx, (int, dict)):
            raise Unsupported(f"inductor_lookup_seed index {idx!r}")
        i = str(idx) if isinstance(idx, int) else f"c{idx.get('const', idx.get('int_const'))}"
        return Value(name, "seed", 0, expr=f"tl.load(x{seeds['input']}_ptr + {i})")
    shape, seed, kind = (list(node.args) + [None] * 3)[:3]
    kind = node.kwargs.get("generator", kind)
    if kind not in ("rand", "randn"):
        raise Unsupported(f"inductor_random of kind {kind!r} (rand and randn only)")
    e, v = operand(seed)
    if v is None or v.kind != "seed":
        raise Unsupported("inductor_random whose seed is not an inductor_lookup_seed inside the pattern")
    if rng not in RNGS:
        raise Unsupported(f"random stream {rng!r} (one of {', '.join(RNGS)})")
    if rng == "philox4" and kind != "rand":
        raise Unsupported("inductor_random 'randn' with the philox4 stream (dropout's 'rand' only; --rng inductor)")
    fn = "uniform_at" if rng == "philox4" else "uniform" if kind == "rand" else "normal"
    return Value(name, "vec", 0, expr=f"{fn}({e}, lin)", deps=(v.name,), random=True)


def _lower_pointwise(name, target, base, overload, args, operand) -> Value:
    names = list(args)
    if base == "convert_element_type":
        expr, v = operand(args["a"])
        dtype = args["dtype"]
        dname = dtype["dtype"] if isinstance(dtype, dict) else str(dtype).replace("torch.", "")
        if v is None:
            raise Unsupported(f"{target} of a scalar")
        if v.random and dname in ("bfloat16", "float16"):
            # a random number cast to bf16/fp16 before dropout's comparison: Inductor computes such
            # intermediates in float32 and elides the cast (``config.emulate_precision_casts`` is off
            # by default; `to_dtype` emits ``.to(tl.float32)``), so its mask compares the unrounded
            # number. The kernel draws Inductor's mask, so it keeps the number unrounded too (an earlier
            # generator rounded it: that flips the mask for numbers within half a bf16 ulp of the
            # threshold, and its H200 test against Inductor's own kernel failed). The rewrite declines
            # when the config emulates the casts (``safety.check_randomness``).
            return Value(name, v.kind, v.level, False, expr, (v.name,))
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
        # an abstracted exponent is a constexpr kernel parameter: pow_c specializes x ** 2 etc.
        return _combine(name, f"pow_c({e}, {operand(exp)[0]})", [v], is_bool=False)
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
    if any(v.kind == "seed" for v in tensors):
        raise Unsupported(f"{expr}: a seed used as a value")
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


def signature_params(spec: PatternSpec) -> list[str]:
    """The generated functions' parameters: tensor inputs ``x0..``, then scalar slots ``c0..``."""
    return [f"x{k}" for k in range(spec.n_inputs)] + [f"c{c}" for c in range(spec.n_consts)]


__all__ = ["RNGS", "GATHER_VIEWS", "Gather", "PatternSpec", "Program", "Value", "Unsupported", "lower", "normalize_args", "signature_params"]
