"""One description of a tensor value (``TensorSpec``) and the random inputs made from it.

A captured node's outputs, a pattern occurrence's inputs, a benchmark case's inputs and a
ranked call's tensors are all ``TensorSpec``: a shape, a dtype name (see ``miner.core.dtypes``),
a stride (None: contiguous) and, where it was recorded, a device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from miner.core import dtypes


@dataclass(frozen=True)
class TensorSpec:
    """Shape, dtype and stride of one tensor value (sizes may be symbolic strings in captures).

    Attributes
    ----------
    shape : tuple
        Sizes; ints, or strings for symbolic sizes.
    dtype : str
        A dtype name, e.g. ``"float32"``, ``"bfloat16"``.
    stride : tuple or None
        Strides in elements; None when unknown or contiguous.
    device : str or None
        Where it was recorded (``"cpu"``, ``"cuda:0"``); None when it does not matter.
    """

    shape: tuple[int | str, ...]
    dtype: str
    stride: tuple[int | str, ...] | None = None
    device: str | None = None

    @property
    def numel(self) -> int | None:
        """Number of elements (1 for a scalar); None when a size is symbolic."""
        if not all(isinstance(s, int) for s in self.shape):
            return None
        return math.prod(self.shape)

    @property
    def contiguous(self) -> bool | None:
        """True when ``stride`` is the row-major layout of ``shape``; None when unknown or symbolic."""
        if self.stride is None or not all(isinstance(s, int) for s in self.shape + self.stride):
            return None
        return all(st == want for size, st, want in zip(self.shape, self.stride, contiguous_strides(self.shape))
                   if size != 1)

    @property
    def nbytes(self) -> int:
        """Bytes of the memory it spans (a broadcast, stride-0 dim counts once)."""
        return storage_elements(self.shape, self.stride) * dtypes.size(self.dtype)

    @property
    def short(self) -> str:
        """``fp32[2,64]``: the compact label of report tables."""
        return f"{dtypes.short(self.dtype)}[{','.join(map(str, self.shape))}]"

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"

    def to_json(self) -> dict[str, Any]:
        """``{"shape", "dtype", "stride"}`` (and ``"device"`` when recorded)."""
        out: dict[str, Any] = {"shape": list(self.shape), "dtype": self.dtype,
                               "stride": None if self.stride is None else list(self.stride)}
        if self.device is not None:
            out["device"] = self.device
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "TensorSpec":
        return cls(tuple(d["shape"]), d["dtype"], None if d.get("stride") is None else tuple(d["stride"]),
                   d.get("device"))


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides of ``shape`` (a size-0 dim counts as 1)."""
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(out))


def storage_elements(shape: Sequence[int], stride: Sequence[int] | None = None) -> int:
    """Elements a tensor's memory spans: numel when contiguous, less when broadcast (stride 0)."""
    if any(s == 0 for s in shape):
        return 0
    if stride is None:
        return math.prod(shape)
    return 1 + sum((s - 1) * abs(st) for s, st in zip(shape, stride))


def make_inputs(specs: Iterable[TensorSpec | dict], device: str = "cpu", seed: int = 0) -> list:
    """Random tensors of the specs' shapes, dtypes and strides (never all zeros).

    Floats are ``randn`` drawn in float32 and cast, bools a fair coin, integers 0 or 1; a strided
    spec gets a tensor over exactly the storage its strides span (broadcast dims share elements).

    Parameters
    ----------
    specs : iterable of TensorSpec or dict
        The inputs; dicts as in ``candidate.json`` (``{"shape", "dtype", "stride"}``).
    device : str
        Where the tensors are made (the generator lives there too).
    seed : int
        Same seed, same specs, same device: the same values.
    """
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    out = []
    for spec in specs:
        spec = spec if isinstance(spec, TensorSpec) else TensorSpec.from_json(spec)
        dt = dtypes.torch_dtype(spec.dtype)
        stride = spec.stride if spec.stride is not None else contiguous_strides(spec.shape)
        n = storage_elements(spec.shape, stride)
        if dt == torch.bool:
            flat = torch.rand(n, generator=g, device=device) < 0.5
        elif dt.is_floating_point:
            flat = torch.randn(n, generator=g, device=device, dtype=torch.float32).to(dt)
        else:
            flat = torch.randint(0, 2, (n,), generator=g, device=device, dtype=dt)
        out.append(flat.as_strided(tuple(spec.shape), tuple(stride)) if spec.shape else flat.reshape(()))
    return out
