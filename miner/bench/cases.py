"""What ``miner bench`` times: a candidate's observed input sets, and the same scaled to published model sizes.

Shapes come from ``candidate.json`` (what the scan observed, usually on the tiny preset) and
from those shapes scaled to the published model sizes (``derive_case``, ``miner.core.sizes``); a
derived shape says so in its ``source`` and names the role it gave each dimension.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

from miner.core import dtypes
from miner.core.sizes import derive_shape
from miner.core.tensors import TensorSpec, contiguous_strides


@dataclass(frozen=True)
class BenchCase:
    """One set of inputs a candidate is timed on.

    ``source`` is ``captured`` (shapes as a scan observed them, ``preset`` says which) or
    ``derived`` (a captured tiny shape scaled to ``model``'s published size; ``roles`` names
    the dimension each size stands for, ``derived_from`` the captured shapes).
    """

    inputs: tuple[TensorSpec, ...]
    scalars: tuple[Any, ...] = ()
    models: tuple[str, ...] = ()
    source: str = "captured"
    preset: str = "tiny"
    roles: tuple[str, ...] = ()
    derived_from: tuple[TensorSpec, ...] = ()
    phases: tuple[str, ...] = ()
    count: int = 0  # occurrences with this signature in the scanned graphs
    cast: str | None = None  # floating inputs cast to this dtype (``--dtypes``); None: as observed

    @property
    def key(self) -> tuple:
        return (tuple((s.shape, s.dtype, s.stride) for s in self.inputs), tuple(map(repr, self.scalars)))

    @property
    def label(self) -> str:
        return " ".join(str(s) for s in self.inputs)

    @property
    def row_length(self) -> int | None:
        """Length of the last dimension of the largest input (the reduced row, for row kernels)."""
        big = max(self.inputs, key=lambda s: math.prod(s.shape) if s.shape else 1, default=None)
        return big.shape[-1] if big is not None and big.shape else None


def _scale_stride(spec: TensorSpec, new_shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """Keep the captured layout: same order of strides (contiguous, transposed or broadcast)."""
    if spec.stride is None or tuple(spec.stride) == contiguous_strides(spec.shape):
        return None
    order = sorted(range(len(spec.shape)), key=lambda i: (spec.stride[i], -i))  # innermost first
    new = [0] * len(new_shape)
    acc = 1
    for i in order:
        if spec.stride[i] == 0:
            new[i] = 0
            continue
        new[i] = acc
        acc *= new_shape[i]
    return tuple(new)


def derive_case(case: BenchCase, model: str, tiny: Any = None) -> BenchCase:
    """``case`` (captured on the tiny preset) with every input scaled to ``model``'s published size."""
    specs, roles = [], []
    for spec in case.inputs:
        shape, r = derive_shape(spec.shape, model, tiny)
        specs.append(TensorSpec(shape, spec.dtype, _scale_stride(spec, shape)))
        roles.append("[" + ",".join(r) + "]")
    return BenchCase(inputs=tuple(specs), scalars=case.scalars, models=(model,), source="derived",
                     preset="base", roles=tuple(roles), derived_from=case.inputs, phases=case.phases,
                     count=case.count)


def merge_cases(cases: Sequence[BenchCase]) -> list[BenchCase]:
    """One case per distinct inputs (and scalars), with the models that share it."""
    merged: dict[tuple, BenchCase] = {}
    for c in cases:
        k = (c.key, c.source, c.preset)
        if k in merged:
            old = merged[k]
            merged[k] = replace(old, models=tuple(dict.fromkeys(old.models + c.models)),
                                phases=tuple(dict.fromkeys(old.phases + c.phases)), count=old.count + c.count)
        else:
            merged[k] = c
    return list(merged.values())


def _presets_by_model(meta: dict) -> dict[str, str]:
    """Which preset each model's occurrences were captured on (from the mined pattern's graph keys)."""
    out: dict[str, str] = {}
    for occ in (meta.get("pattern") or {}).get("occurrences", []) or []:
        g = occ.get("graph") if isinstance(occ, dict) else None
        if isinstance(g, dict) and g.get("model") and g.get("preset"):
            out.setdefault(g["model"], g["preset"])
    return out


def cases_from_meta(meta: dict) -> list[BenchCase]:
    """The observed (inputs, scalars) of a candidate.json, one case per distinct set, models merged.

    Reads ``observed``: a list of ``{"model", "phase", "count", "inputs": [{"shape", "dtype",
    "stride"}], "scalars": [...]}`` (docs/architecture.md, "Candidate API"). The preset is the
    entry's ``preset`` if any, else the one the model's occurrences were captured on, else tiny.
    """
    presets = _presets_by_model(meta)
    merged: dict[tuple, BenchCase] = {}
    for ob in meta.get("observed", []):
        inputs = tuple(TensorSpec.from_json(s) for s in ob["inputs"])
        models = (ob["model"],) if ob.get("model") else tuple(ob.get("models", ()))
        preset = ob.get("preset") or next((presets[m] for m in models if m in presets), "tiny")
        case = BenchCase(inputs=inputs, scalars=tuple(ob.get("scalars", [])), models=models,
                         source="captured", preset=preset,
                         phases=(ob["phase"],) if ob.get("phase") else (), count=int(ob.get("count", 1)))
        k = (case.key, preset)
        if k in merged:
            old = merged[k]
            case = replace(old, models=tuple(dict.fromkeys(old.models + models)),
                           phases=tuple(dict.fromkeys(old.phases + case.phases)), count=old.count + case.count)
        merged[k] = case
    return list(merged.values())


def cast_case(case: BenchCase, dtype: str) -> BenchCase:
    """``case`` with its floating-point inputs in ``dtype`` (bool and integer inputs kept).

    The captures of a CPU scan are float32; under bf16 autocast on a GPU the same chains see
    bf16 (activations) or keep float32 (norms, softmax): ``--dtypes float32,bfloat16`` times both.
    """
    if dtype not in dtypes.CAST_FLOATS:
        raise ValueError(f"not a floating dtype: {dtype!r} (one of {', '.join(dtypes.CAST_FLOATS)})")
    inputs = tuple(replace(s, dtype=dtype) if dtypes.is_float(s.dtype) else s for s in case.inputs)
    return case if inputs == case.inputs else replace(case, inputs=inputs, cast=dtype)


def plan_cases(meta: dict, shapes: str = "all", models: Sequence[str] | None = None,
               casts: Sequence[str] = ("captured",)) -> list[BenchCase]:
    """The cases to time: observed ones (``captured``), their base-size scaling (``derived``), or both.

    A model whose base-preset shapes were captured gets those instead of derived ones. Each case
    is timed once per entry of ``casts``: ``captured`` as observed, a dtype name with its
    floating inputs cast to it. ``meta`` is the candidate's candidate.json.
    """
    captured = [c for c in cases_from_meta(meta) if models is None or set(c.models) & set(models)]
    out: list[BenchCase] = []
    if shapes in ("captured", "all"):
        out += captured
    if shapes in ("base", "all"):
        have_base = {m for c in captured if c.preset == "base" for m in c.models}
        out += [c for c in captured if c.preset == "base" and c not in out]
        for c in captured:
            if c.preset != "tiny":
                continue
            for m in c.models:
                if m in have_base or (models is not None and m not in models):
                    continue
                try:
                    out.append(derive_case(c, m))
                except ValueError:  # no published size for this model, or a size no role explains
                    continue
    out = [c if d == "captured" else cast_case(c, d) for d in casts for c in out]
    return merge_cases(out)

