"""Typed records of the capture stage, and their JSON form.

Every record is a frozen dataclass that round-trips through ``to_json`` / ``from_json``,
so later stages (mining, generation, ranking) run from the workspace without torch.compile.

A graph file is versioned by ``SCHEMA_VERSION``: a reader refuses a file written by a
different schema with an error that names the file (see ``miner.core.workspace``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from miner.core.tensors import TensorSpec

SCHEMA_VERSION = 1

MODES = ("train", "infer")
PHASES = ("forward", "backward", "inference")
KERNEL_KINDS = ("pointwise", "reduction", "persistent_reduction", "extern", "template", "foreach", "other")


@dataclass(frozen=True)
class KernelRef:
    """A generated kernel (or extern call) that an FX node ended up in."""

    name: str
    kind: str  # one of KERNEL_KINDS


@dataclass(frozen=True)
class NodeRecord:
    """One FX node of a post-grad graph.

    ``args``/``kwargs`` are JSON values where a reference to another node is
    ``{"node": name}``, a dtype ``{"dtype": "float32"}``, a device ``{"device": "cpu"}``,
    a layout/memory format ``{"enum": "torch.strided"}``; numbers, strings, bools, None
    and lists stay as they are.
    """

    name: str
    op: str  # FX op: placeholder | call_function | get_attr | output
    target: str  # "aten.exp.default", "operator.getitem", or the placeholder's name
    category: str  # see miner.core.ops.CATEGORIES
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    users: tuple[str, ...] = ()
    meta: tuple[TensorSpec, ...] = ()  # one entry per tensor output (several for var_mean)
    module: str | None = None  # HF module path, e.g. "bert.encoder.layer.0.attention.self"
    kernels: tuple[KernelRef, ...] = ()

    def inputs(self) -> list[tuple[int, str]]:
        """(operand position, producer name) for every node reference in args/kwargs, in order."""
        out: list[tuple[int, str]] = []
        for pos, a in enumerate(self.args):
            for ref in _refs(a):
                out.append((pos, ref))
        for i, (_, v) in enumerate(sorted(self.kwargs.items())):
            for ref in _refs(v):
                out.append((len(self.args) + i, ref))
        return out


def _refs(value: Any) -> list[str]:
    if isinstance(value, dict) and set(value) == {"node"}:
        return [value["node"]]
    if isinstance(value, (list, tuple)):
        return [r for v in value for r in _refs(v)]
    return []


@dataclass(frozen=True)
class GraphKey:
    """Names one captured graph: which model, preset, mode, phase and (for graph breaks) which piece."""

    model: str
    preset: str
    mode: str  # train | infer
    phase: str  # forward | backward | inference
    index: int = 0  # the i-th graph of this phase (more than one after a graph break)

    @property
    def slug(self) -> str:
        return f"{self.mode}-{self.phase}-{self.index}"

    def __str__(self) -> str:
        return f"{self.model}/{self.preset}/{self.slug}"


@dataclass(frozen=True)
class CapturedGraph:
    key: GraphKey
    nodes: tuple[NodeRecord, ...]
    kernels: tuple[KernelRef, ...] = ()  # every kernel call site of this graph, in launch order
    provenance: dict[str, Any] = field(default_factory=dict)  # versions, device, date, seconds

    def node(self, name: str) -> NodeRecord:
        return self._by_name[name]

    @property
    def _by_name(self) -> dict[str, NodeRecord]:
        cache = self.__dict__.get("_by_name_cache")
        if cache is None:
            cache = {n.name: n for n in self.nodes}
            object.__setattr__(self, "_by_name_cache", cache)
        return cache


@dataclass(frozen=True)
class ScanResult:
    """What one (model, preset, mode) scan produced, or why it failed."""

    model: str
    preset: str
    mode: str
    device: str
    ok: bool
    error: str | None = None
    graphs: tuple[GraphKey, ...] = ()
    graph_breaks: int = 0
    seconds: float = 0.0
    nodes_by_category: dict[str, int] = field(default_factory=dict)
    kernels: int = 0
    reused: bool = False
    provenance: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- JSON

_RECORDS = {c.__name__: c for c in (TensorSpec, KernelRef, NodeRecord, GraphKey, CapturedGraph, ScanResult)}


def to_json(record: Any) -> Any:
    """A record (or a structure of records) as plain JSON values (a record's own ``to_json`` wins)."""
    if callable(getattr(record, "to_json", None)) and not isinstance(record, type):
        return record.to_json()
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return {f.name: to_json(getattr(record, f.name)) for f in dataclasses.fields(record)}
    if isinstance(record, (list, tuple)):
        return [to_json(r) for r in record]
    if isinstance(record, dict):
        return {str(k): to_json(v) for k, v in record.items()}
    return record


def from_json(cls: type, data: Any) -> Any:
    """Rebuild a record of type ``cls`` from ``to_json`` output; raises on missing fields."""
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
                continue
            raise ValueError(f"{cls.__name__}: missing field {f.name!r}")
        kwargs[f.name] = _decode(f.type, data[f.name])
    return cls(**kwargs)


def _decode(annotation: Any, value: Any) -> Any:
    ann = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    if value is None:
        return None
    for name, cls in _RECORDS.items():
        if ann == name:
            return from_json(cls, value)
        if ann.startswith(f"tuple[{name},"):
            return tuple(from_json(cls, v) for v in value)
    if ann.startswith("tuple[") and isinstance(value, list):
        return tuple(value)
    return value
