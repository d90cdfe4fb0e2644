"""An FX node as a ``NodeRecord``: what ``miner scan`` records of each node, and what the rules read.

``miner.scan.capture`` summarizes every post-grad graph with :func:`node_record` (kernels filled in
later); at compile time the rules see the FX graph being rewritten through the same function
(``miner.rules.graph.FxNodes``), so mining and the rewrite read identical records.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch
import torch.fx

from miner.core.ops import categorize, resolve_target, target_name
from miner.core.records import CapturedGraph, NodeRecord
from miner.core.source import literal_value
from miner.core.tensors import TensorSpec, contiguous_strides


def encode_arg(value: Any) -> Any:
    """An FX argument as a JSON value (see ``NodeRecord``)."""
    if isinstance(value, torch.fx.Node):
        return {"node": value.name}
    if isinstance(value, (list, tuple)):
        return [encode_arg(v) for v in value]
    if isinstance(value, dict):
        return {str(k): encode_arg(v) for k, v in value.items()}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, (torch.layout, torch.memory_format)):
        return {"enum": str(value)}
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": str(value)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return {"sym": str(value)}
    return {"repr": repr(value)}


def decode_arg(value: Any, env: dict[str, torch.fx.Node], device: str | None = None) -> Any:
    """The inverse of :func:`encode_arg`: node references looked up in ``env``; a device is ``device`` where
    given, else the recorded one."""
    if isinstance(value, list):
        return [decode_arg(v, env, device) for v in value]
    if not isinstance(value, dict):
        return value
    if set(value) == {"node"}:
        return env[value["node"]]
    if set(value) == {"dtype"} and isinstance(value["dtype"], str):
        return getattr(torch, value["dtype"])
    if set(value) == {"device"}:
        return torch.device(device or value["device"])
    if set(value) == {"enum"}:
        return getattr(torch, value["enum"].removeprefix("torch."))
    if set(value) == {"float"}:
        return literal_value(value)
    if set(value) & {"sym", "repr"}:
        raise ValueError(f"a captured argument that cannot be rebuilt: {value}")
    return {k: decode_arg(v, env, device) for k, v in value.items()}


def to_fx(graph: CapturedGraph, device: str | None = None) -> torch.fx.GraphModule:
    """The captured post-grad graph rebuilt as an FX graph, each node's ``meta['val']`` a fake tensor of
    the recorded shape, stride, dtype and device (``device`` where given): what a pattern is matched on at
    compile time, so a candidate's matches in the graph it was mined from can be counted offline, at the
    captured sizes, on any machine (fake CUDA tensors need no GPU): ``miner.check.validate``'s ``captured``
    check.

    Raises
    ------
    ValueError
        For a node a rebuilt graph cannot hold (symbolic sizes, an unknown target).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)

    def val(metas: tuple[TensorSpec, ...]) -> Any:
        def one(m: TensorSpec):
            if any(not isinstance(d, int) for d in m.shape):
                raise ValueError(f"symbolic sizes {m.shape}: a rebuilt graph holds concrete sizes only")
            with mode:
                return torch.empty_strided(m.shape, m.stride or contiguous_strides(m.shape),
                                           dtype=getattr(torch, m.dtype), device=device or m.device or "cpu")
        if not metas:
            return None
        return one(metas[0]) if len(metas) == 1 else tuple(one(m) for m in metas)

    g = torch.fx.Graph()
    env: dict[str, torch.fx.Node] = {}
    for rec in graph.nodes:
        if rec.op == "placeholder":
            node = g.placeholder(rec.name)
        elif rec.op == "output":
            g.output(decode_arg(list(rec.args), env, device)[0])
            continue
        elif rec.op == "call_function":
            node = g.create_node("call_function", _op(rec.target),
                                 tuple(decode_arg(list(rec.args), env, device)),
                                 {k: decode_arg(v, env, device) for k, v in rec.kwargs.items()}, name=rec.name)
        else:
            raise ValueError(f"{rec.name}: FX op {rec.op} cannot be rebuilt")
        if node.name != rec.name:  # the graph's namespace gave it another (a name taken): matching needs none
            raise ValueError(f"{rec.name}: the rebuilt graph named it {node.name}")
        node.meta["val"] = val(rec.meta)
        env[rec.name] = node
    return torch.fx.GraphModule(torch.nn.Module(), g)


def _op(name: str) -> Any:
    """``miner.core.ops.resolve_target``, refusing a name this torch has no operator for."""
    op = resolve_target(name)
    if op is None:
        raise ValueError(f"target {name!r}: not an operator this torch has")
    return op


def tensor_metas(val: Any) -> tuple[TensorSpec, ...]:
    """TensorSpec for each tensor in a node's ``meta['val']`` (a tensor, or a tuple of them)."""
    if isinstance(val, torch.Tensor):
        def dims(xs):
            return tuple(int(s) if isinstance(s, int) or not hasattr(s, "node") else str(s) for s in xs)
        try:
            stride = dims(val.stride())
        except (RuntimeError, NotImplementedError):  # sparse or otherwise stride-less
            stride = None
        return (TensorSpec(dims(val.shape), str(val.dtype).removeprefix("torch."), stride, val.device.type),)
    if isinstance(val, (list, tuple)):
        return tuple(m for v in val for m in tensor_metas(v))
    return ()


_INDEX = re.compile(r"\[(\d+)\]")


def module_path(node: torch.fx.Node) -> str | None:
    """The innermost HF module a node came from, as a dotted path (``bert.encoder.layer.0.output``)."""
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")
    if not stack:
        return None
    path = list(stack.values())[-1][0]
    path = _INDEX.sub(r".\1", str(path))
    path = re.sub(r"^L\['self'\]\.?|^L__self__\.?", "", path)
    return path.replace("._modules['", ".").replace("']", "") or None


def node_record(n: torch.fx.Node) -> NodeRecord:
    """The NodeRecord of one FX node (kernels filled in later); also the rewrite's view of a node
    at compile time (``miner.rules.graph.FxNodes``)."""
    if n.op == "call_function":
        target, category = target_name(n.target), categorize(n.target)
    elif n.op == "placeholder":
        target, category = n.name, "input"
    elif n.op == "output":
        target, category = "output", "output"
    else:
        target, category = str(n.target), "other"
    return NodeRecord(
        name=n.name, op=n.op, target=target, category=category,
        args=tuple(encode_arg(a) for a in n.args),
        kwargs={k: encode_arg(v) for k, v in n.kwargs.items()},
        users=tuple(u.name for u in n.users),
        meta=tensor_metas(n.meta.get("val")),
        module=module_path(n),
    )
