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

from miner.core.ops import categorize, target_name
from miner.core.records import NodeRecord
from miner.core.tensors import TensorSpec


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
