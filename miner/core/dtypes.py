"""Dtypes by name: element sizes, which are floating point, short labels, and every tolerance miner checks with.

Dtypes travel through the workspace as names (``"bfloat16"``, as ``str(torch.bfloat16)`` without
``torch.``); this module is the one table of what miner knows about them. Nothing here imports
torch at module level except :func:`torch_dtype`, so readers of JSON stay light.

Tolerances, in one place:

- :data:`ELEMENT_TOL` -- a generated kernel against the float64 evaluation of its pattern, per output
  dtype, element-wise ``(rtol, atol)`` (``miner validate``, the fusion tests);
- :data:`NORM_TOL` -- a timed variant against float64, relative norm error per output dtype
  (``miner bench`` checks every variant before timing it);
- :data:`MODEL_TOL` -- a float32 zoo model compiled with a candidate's rewrite against eager,
  ``(rtol, atol)`` per quantity (``miner validate``'s rewrite check);
- :data:`AUTOCAST_MODEL_TOL` -- the same under bf16 autocast on the GPU, relative norm per quantity
  (``miner verify``: the default compile against the one with the fusions), used where no float32
  reference step was measured; :data:`PARITY_K` / :data:`PARITY_ATOL` -- the A/B's parity against
  the floor the default compile's own error to a float32 step sets.
"""

from __future__ import annotations

from typing import Any

SIZES: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "complex64": 8, "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}
FLOATS = ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
KERNEL_FLOATS = ("float32", "bfloat16", "float16")  # what generated kernels take (computed in float32)
CAST_FLOATS = ("float64",) + KERNEL_FLOATS  # what ``miner bench --dtypes`` may cast float inputs to
SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64"}

ELEMENT_TOL: dict[str, tuple[float, float]] = {"float32": (1e-5, 1e-5), "bfloat16": (1.6e-2, 1e-2),
                                                "float16": (1e-3, 1e-3)}
NORM_TOL: dict[str, float] = {"float64": 1e-9, "float32": 1e-4, "float16": 4e-3, "bfloat16": 2e-2}
MODEL_TOL: dict[str, tuple[float, float]] = {"loss": (1e-4, 1e-5), "logits": (1e-4, 1e-4), "grads": (1e-3, 1e-4)}
AUTOCAST_MODEL_TOL: dict[str, float] = {"loss": 1e-2, "logits": 3e-2, "grads": 5e-2}
# Parity against a measured floor (``miner.check.verify.judge_parity``): a variant's relative error to the
# float32 step may be at most PARITY_K times the default compile's own plus PARITY_ATOL. Two independent
# rounding-level errors of equal size add to sqrt(2) = 1.41 times one; 2 leaves room for that and no more,
# while a wrong result (a 10% scale) exceeds it wherever the default's error is below ~5%.
PARITY_K: float = 2.0
PARITY_ATOL: dict[str, float] = {"loss": 1e-4, "logits": 1e-3, "grads": 1e-3}
PARITY_FLOOR_MAX: float = 0.25  # a default this far from the float32 step: the reference drew other numbers


def name(dtype: Any) -> str:
    """The workspace spelling of a dtype: ``torch.bfloat16`` or ``"torch.bfloat16"`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def size(dtype: Any, default: int | None = None) -> int:
    """Bytes per element of ``dtype`` (a name or a torch dtype).

    Raises
    ------
    ValueError
        For a dtype this table does not know, unless ``default`` is given (then that is returned).
    """
    n = SIZES.get(name(dtype))
    if n is not None:
        return n
    if default is not None:
        return default
    raise ValueError(f"unknown dtype {dtype!r}")


def is_float(dtype: Any) -> bool:
    """True for floating-point dtypes (float8 included)."""
    return name(dtype) in FLOATS


def short(dtype: Any) -> str:
    """A compact label for tables: ``float32`` -> ``fp32``, ``bfloat16`` -> ``bf16``; others unchanged."""
    n = name(dtype)
    return SHORT.get(n, n)


def torch_dtype(dtype: Any):
    """The ``torch.dtype`` of a name (``"bfloat16"`` or ``"torch.bfloat16"``); a torch dtype is returned as is."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, name(dtype), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return value
