"""Pattern nodes as Python source: the one renderer behind ``Pattern.to_source`` and every generated file.

A pattern node's arguments are encoded as in ``miner.core.pattern``: ``{"input": k}``,
``{"node": j}``, ``{"const": c}`` or a literal structural constant (``{"dtype": ...}``,
``{"device": ...}``, ``{"enum": ...}``, ``{"float": "-inf"}``, numbers, lists). Rendered::

    def pattern(x0, x1, c0):
        v0 = torch.ops.aten.mul.Tensor(x0, c0)
        v1 = torch.ops.aten.exp.default(v0)
        v2 = v1[0]                                  # operator.getitem
        return (v1,)

Inputs are ``x<k>``, abstracted scalars ``c<c>`` (or inlined literals), node values ``v<j>``;
the outputs are always returned as a tuple. The source names ``torch`` (``operator`` too, for
other ``operator.*`` targets).
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable, Container, Iterable, Sequence


def render(nodes: Sequence[Any], n_inputs: int, n_consts: int, outputs: Iterable[int], name: str = "pattern",
           scalars: Sequence[Any] | None = None, only: Container[int] | None = None) -> str:
    """The source of a function computing ``outputs`` of the pattern ``nodes``.

    Parameters
    ----------
    nodes : sequence
        Pattern nodes (anything with ``target``, ``args``, ``kwargs``), in topological order.
    n_inputs, n_consts : int
        Number of ``{"input": k}`` and ``{"const": c}`` slots.
    outputs : iterable of int
        The nodes whose values the function returns, in order (always as a tuple).
    name : str
        The function's name.
    scalars : sequence, optional
        Values for the const slots, inlined as literals; when None the slots are trailing
        parameters ``c0, c1, ...``.
    only : container of int, optional
        The nodes to compute (the ones ``outputs`` depend on); None: every node.

    Raises
    ------
    ValueError
        When ``scalars`` does not hold ``n_consts`` values.
    """
    if scalars is not None and len(scalars) != n_consts:
        raise ValueError(f"{n_consts} scalars expected, got {len(scalars)}")
    params = [f"x{k}" for k in range(n_inputs)] + ([f"c{c}" for c in range(n_consts)] if scalars is None else [])
    lines = [f"def {name}({', '.join(params)}):"]
    for j, node in enumerate(nodes):
        if only is not None and j not in only:
            continue
        if node.target == "operator.getitem":
            lines.append(f"    v{j} = {arg_source(node.args[0], scalars)}[{node.args[1]}]")
            continue
        parts = [arg_source(a, scalars) for a in node.args]
        parts += [f"{k}={arg_source(v, scalars)}" for k, v in node.kwargs.items()]
        lines.append(f"    v{j} = {callable_source(node.target)}({', '.join(parts)})")
    lines.append(f"    return ({', '.join(f'v{o}' for o in outputs)},)")
    return "\n".join(lines) + "\n"


def compile_function(source: str, name: str, filename: str) -> Callable:
    """The function ``name`` defined by ``source`` (from :func:`render`), with ``torch`` in scope."""
    import torch  # here: rendering source must not need torch

    namespace: dict[str, Any] = {"torch": torch, "operator": operator}
    exec(compile(source, filename, "exec"), namespace)
    return namespace[name]


def callable_source(target: str) -> str:
    """``"aten.exp.default"`` -> ``"torch.ops.aten.exp.default"`` (``operator.*`` kept as is)."""
    if target.startswith("operator."):
        return target
    parts = target.split(".")
    if len(parts) == 2:
        parts.append("default")
    return "torch.ops." + ".".join(parts)


def arg_source(v: Any, scalars: Sequence[Any] | None = None) -> str:
    """One encoded argument as source (``scalars``: inline const slots as literals)."""
    if isinstance(v, dict) and len(v) == 1:
        (k, x), = v.items()
        if k == "input":
            return f"x{x}"
        if k == "node":
            return f"v{x}"
        if k == "shape_of":  # the shape of input k (a region's random op: miner.generate.region)
            return f"list(x{x}.shape)"
        if k == "device_of":  # the device of input k (a region's constant tensor: miner.generate.reduce)
            return f"x{x}.device"
        if k == "dim_of":  # size d of input k (a reduction region's view shape: miner.generate.reduce)
            return f"x{x[0]}.shape[{x[1]}]"
        if k == "int_const":  # a const slot an op takes as an int (a seed index; slots are passed as floats)
            return f"int(c{x})" if scalars is None else literal_source(int(literal_value(scalars[x])))
        if k == "const":
            return f"c{x}" if scalars is None else literal_source(scalars[x])
        if k == "dtype":
            return f"torch.{x}"
        if k == "device":
            return f"torch.device({x!r})"
        if k == "enum":
            return str(x)  # "torch.contiguous_format"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(arg_source(x, scalars) for x in v) + "]"
    return literal_source(v)


def literal_source(v: Any) -> str:
    """A number (or ``{"float": "-inf"}``, how JSON holds non-finite floats) as source."""
    v = literal_value(v)
    if isinstance(v, float) and not math.isfinite(v):
        return f"float({str(v)!r})"
    return repr(v)


def literal_value(v: Any) -> Any:
    """``{"float": "-inf"}`` -> ``-inf``; any other value unchanged."""
    if isinstance(v, dict) and set(v) == {"float"}:
        return float(v["float"])
    return v
