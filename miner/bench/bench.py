"""Benchmark fusion candidates fairly against eager and Inductor (``miner bench``).

For each candidate and each (shape, dtype) it occurs with, four variants run on the same inputs:

* ``eager``        the original subgraph (the candidate's pattern function) in PyTorch eager;
* ``inductor``     that subgraph compiled by Inductor for this one shape (``dynamic=False``,
                   default mode, a fresh Dynamo cache per shape: a reused dynamic compile is
                   not a fair baseline);
* ``max-autotune`` the same with ``mode="max-autotune-no-cudagraphs"``;
* ``candidate``    the generated Triton kernel through its launcher.

Every variant's outputs are checked against a float64 evaluation of the subgraph on the same
inputs *before* it is timed; a variant that fails the check is not timed. Timing captures a CUDA
graph of many calls that cycle through enough input sets to leave L2 out (see
``miner.bench.roofline.rotation_count``) and times whole replays with CUDA events: per-call median and
20/80% quantiles. Bytes moved count each input read once and each output written once; the
roofline share divides that by the device-to-device copy bandwidth measured in the same run.
docs/benchmarking.md explains the method.

Shapes come from ``candidate.json`` (what the scan observed, usually on the tiny preset) and
from those shapes scaled to the published model sizes (``derive_case``); a derived shape says
so in its ``source`` and names the role it gave each dimension.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import itertools
import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from miner import __version__
from miner.bench import roofline as rl
from miner.core.errors import MinerError, UsageError

VARIANTS = ("eager", "inductor", "max-autotune", "candidate")
EXTRA_VARIANTS = ("candidate-looped",)  # the candidate's looped kernel forced (launch(..., variant="looped"))
BASELINE = "inductor"
COPY = "copy"  # a plain copy of the same number of bytes, same harness: the size-matched ceiling

# Relative error ||out - ref|| / ||ref|| allowed against the float64 evaluation, by output dtype.
TOLERANCE = {"float64": 1e-9, "float32": 1e-4, "float16": 4e-3, "bfloat16": 2e-2}

BENCH_SCHEMA = 1


class NoDeviceError(MinerError):
    """A GPU command ran where torch sees no CUDA device."""


def require_cuda(verb: str, allow_cpu: bool = False) -> str:
    """The device to run on: ``"cuda"``, or ``"cpu"`` with ``allow_cpu``; else a one-line error."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if allow_cpu:
        return "cpu"
    raise NoDeviceError(f"{verb} needs a CUDA GPU and torch {torch.__version__} sees none on this machine "
                        f"(use --allow-cpu for a smoke run of the harness on the CPU; its times mean nothing)")


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str
    stride: tuple[int, ...] | None = None  # None: contiguous

    @property
    def nbytes(self) -> int:
        return rl.tensor_bytes(self.shape, self.dtype, self.stride)

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


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


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    samples: int
    calls_per_sample: int

    @classmethod
    def of(cls, samples: Sequence[float], calls_per_sample: int = 1) -> "Timing":
        m, lo, hi = rl.summarize(samples)
        return cls(m, lo, hi, len(samples), calls_per_sample)


@dataclass(frozen=True)
class VariantResult:
    name: str
    timing: Timing | None = None
    rel_err: float | None = None  # ||out - ref64|| / ||ref64|| over all outputs
    max_abs_err: float | None = None
    numerics_ok: bool | None = None
    error: str | None = None
    compile_s: float | None = None


@dataclass(frozen=True)
class Env:
    device: str
    gpu: str
    torch: str
    triton: str
    date: str
    copy_gbps: float
    l2_bytes: int
    sm_count: int = 0
    cuda: str | None = None
    interpret: bool = False
    miner: str = __version__


@dataclass(frozen=True)
class BenchRow:
    candidate: str
    name: str
    case: BenchCase
    outputs: tuple[TensorSpec, ...]
    bytes_moved: int
    roofline_ms: float
    rotation: int
    variants: tuple[VariantResult, ...]
    env: Env

    @property
    def l2_resident(self) -> bool:
        """True when even the rotation's whole working set fits in twice the L2 (tiny shapes)."""
        return self.rotation * self.bytes_moved < 2 * self.env.l2_bytes

    def variant(self, name: str) -> VariantResult | None:
        return next((v for v in self.variants if v.name == name), None)

    def ms(self, name: str) -> float | None:
        v = self.variant(name)
        return v.timing.median_ms if v is not None and v.timing is not None else None

    def roofline_pct(self, name: str = "candidate") -> float | None:
        ms = self.ms(name)
        return None if ms is None else 100.0 * rl.roofline_share(self.bytes_moved, ms, self.env.copy_gbps)

    def speedup(self, name: str = "candidate", over: str = BASELINE) -> float | None:
        a, b = self.ms(name), self.ms(over)
        return None if a is None or b is None or a <= 0 else b / a

    def wins(self) -> bool | None:
        """Candidate at least as fast as Inductor (median), beyond the two 20/80 spreads' overlap."""
        s = self.speedup()
        return None if s is None else s >= 1.0


# ---- JSON (every record round-trips)

def row_to_json(row: BenchRow) -> dict:
    d = asdict(row)
    d["speedup_vs_inductor"] = row.speedup()
    d["speedup_vs_max_autotune"] = row.speedup(over="max-autotune")
    d["roofline_pct"] = {v.name: row.roofline_pct(v.name) for v in row.variants}
    return d


def _tuple(x):
    return tuple(_tuple(v) for v in x) if isinstance(x, list) else x


def _spec(d: dict) -> TensorSpec:
    return TensorSpec(tuple(d["shape"]), d["dtype"], None if d.get("stride") is None else tuple(d["stride"]))


def row_from_json(d: dict) -> BenchRow:
    c = d["case"]
    case = BenchCase(inputs=tuple(_spec(s) for s in c["inputs"]), scalars=_tuple(c.get("scalars", [])),
                     models=tuple(c.get("models", ())), source=c.get("source", "captured"),
                     preset=c.get("preset", "tiny"), roles=tuple(c.get("roles", ())),
                     derived_from=tuple(_spec(s) for s in c.get("derived_from", ())),
                     phases=tuple(c.get("phases", ())), count=c.get("count", 0), cast=c.get("cast"))
    variants = tuple(VariantResult(**{**v, "timing": Timing(**v["timing"]) if v.get("timing") else None})
                     for v in d["variants"])
    return BenchRow(candidate=d["candidate"], name=d.get("name", d["candidate"]), case=case,
                    outputs=tuple(_spec(s) for s in d["outputs"]), bytes_moved=d["bytes_moved"],
                    roofline_ms=d["roofline_ms"], rotation=d["rotation"], variants=variants, env=Env(**d["env"]))


# --------------------------------------------------------------------------- shapes

@dataclass(frozen=True)
class ModelDims:
    batch: int
    seq: int
    hidden: int
    heads: int
    inter: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def _tiny_dims() -> ModelDims:
    try:
        from miner_models.base import SHAPES, TINY
        b, s = SHAPES["tiny"]
        return ModelDims(b, s, TINY["hidden"], TINY["heads"], TINY["inter"], TINY["vocab"])
    except Exception:  # the zoo's layout is another issue's: fall back to its documented sizes
        return ModelDims(2, 64, 128, 4, 512, 1000)


# Published sizes, trained at batch 16 x sequence 512 (the ``base`` preset's batch and length).
BASE_DIMS: dict[str, ModelDims] = {
    "bert": ModelDims(16, 512, 768, 12, 3072, 30522),
    "roberta": ModelDims(16, 512, 768, 12, 3072, 50265),
    "distilbert": ModelDims(16, 512, 768, 12, 3072, 30522),
    "gpt2": ModelDims(16, 512, 768, 12, 3072, 50257),
    "llama": ModelDims(16, 512, 2048, 32, 8192, 32000),  # the zoo's ~1B base: Llama-3.2-1B's shape
    "t5": ModelDims(16, 512, 768, 12, 3072, 32128),
    "bart": ModelDims(16, 512, 768, 12, 3072, 50265),
    "opt": ModelDims(16, 512, 768, 12, 3072, 50272),
}


def _dim_roles(d: ModelDims, leading: bool) -> dict[str, int]:
    """Named sizes a dimension can stand for. Activation roles come first: they win a tie."""
    b, s, h = d.batch, d.seq, d.heads
    if leading:
        roles = {"B": b, "S": s, "S-1": s - 1, "B*S": b * s, "B*(S-1)": b * (s - 1), "H": h, "B*H": b * h,
                 "B*H*S": b * h * s, "head_dim": d.head_dim, "hidden": d.hidden, "inter": d.inter,
                 "vocab": d.vocab}
    else:
        roles = {"hidden": d.hidden, "inter": d.inter, "vocab": d.vocab, "S": s, "S-1": s - 1,
                 "head_dim": d.head_dim, "B": b, "H": h}
    return roles


def derive_shape(shape: Sequence[int], model: str, tiny: ModelDims | None = None) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Scale a shape captured on the tiny preset to ``model``'s published size.

    Each dimension is matched by value to a role of the tiny configuration (``B*S``, ``hidden``,
    ``vocab``, ...; the last dimension prefers model-width roles, the others activation roles)
    and replaced by that role's size in ``BASE_DIMS[model]``. Returns the new shape and the
    roles, e.g. ``((16, 12, 512, 512), ("B", "H", "S", "S"))``. Raises ``ValueError`` for a
    size no role explains.
    """
    tiny = tiny or _tiny_dims()
    try:
        base = BASE_DIMS[model]
    except KeyError:
        raise ValueError(f"no published size known for model {model!r}") from None
    out, roles = [], []
    for i, size in enumerate(shape):
        if size == 1:
            out.append(1)
            roles.append("1")
            continue
        leading = i < len(shape) - 1
        tiny_roles, base_roles = _dim_roles(tiny, leading), _dim_roles(base, leading)
        role = next((r for r, v in tiny_roles.items() if v == size), None)
        if role is None:
            raise ValueError(f"size {size} (dim {i} of {tuple(shape)}) matches no role of the tiny preset")
        out.append(base_roles[role])
        roles.append(role)
    return tuple(out), tuple(roles)


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    st, acc = [], 1
    for s in reversed(shape):
        st.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(st))


def _scale_stride(spec: TensorSpec, new_shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """Keep the captured layout: same order of strides (contiguous, transposed or broadcast)."""
    if spec.stride is None or tuple(spec.stride) == _contiguous_strides(spec.shape):
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


def derive_case(case: BenchCase, model: str, tiny: ModelDims | None = None) -> BenchCase:
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


# --------------------------------------------------------------------------- candidates

@dataclass
class Candidate:
    """What ``miner bench`` needs from ``candidates/<id>/``."""

    id: str
    name: str
    path: Path | None
    reference: Callable  # the original subgraph (aten ops): eager reference and Inductor's input
    kernel: Callable  # launcher of the generated Triton kernel: same arguments, same outputs
    cases: list[BenchCase]
    meta: dict = field(default_factory=dict)


def _import_file(path: Path, role: str):
    """Import a candidate file under the one module name ``miner.runtime.rewrite`` gives it (imported once)."""
    from miner.runtime import rewrite

    try:
        return rewrite.load_module(path, rewrite.module_name(path, role))
    except Exception as e:
        raise UsageError(f"{path}: import failed: {type(e).__name__}: {e}") from e


def _first_attr(module, names: Sequence[str], what: str, path: Path) -> Callable:
    for n in names:
        f = getattr(module, n, None)
        if callable(f):
            return f
    raise UsageError(f"{path}: no {what} (looked for {', '.join(names)})")


REFERENCE_NAMES = ("pattern",)  # docs/architecture.md, "Candidate API"
KERNEL_NAMES = ("launch",)


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
        inputs = tuple(_spec(s) for s in ob["inputs"])
        models = (ob["model"],) if ob.get("model") else tuple(ob.get("models", ()))
        preset = ob.get("preset") or next((presets[m] for m in models if m in presets), "tiny")
        case = BenchCase(inputs=inputs, scalars=_tuple(list(ob.get("scalars", []))), models=models,
                         source="captured", preset=preset,
                         phases=(ob["phase"],) if ob.get("phase") else (), count=int(ob.get("count", 1)))
        k = (case.key, preset)
        if k in merged:
            old = merged[k]
            case = replace(old, models=tuple(dict.fromkeys(old.models + models)),
                           phases=tuple(dict.fromkeys(old.phases + case.phases)), count=old.count + case.count)
        merged[k] = case
    return list(merged.values())


def load_candidate(path: Path) -> Candidate:
    path = Path(path)
    meta_path = path / "candidate.json"
    if not meta_path.exists():
        raise UsageError(f"{path}: not a candidate (no candidate.json)")
    from miner.core.workspace import read_json

    meta = read_json(meta_path)
    cid = str(meta.get("id", path.name))
    pattern = _import_file(path / "pattern.py", "pattern")
    kernel = _import_file(path / "kernel.py", "kernel")
    return Candidate(id=cid, name=str(meta.get("label") or meta.get("name") or cid), path=path,
                     reference=_first_attr(pattern, REFERENCE_NAMES, "reference subgraph function", path / "pattern.py"),
                     kernel=_first_attr(kernel, KERNEL_NAMES, "kernel launcher", path / "kernel.py"),
                     cases=cases_from_meta(meta), meta=meta)


def find_candidates(root: Path, ids: Sequence[str] | None = None) -> list[Path]:
    root = Path(root)
    found = sorted(p.parent for p in root.glob("*/candidate.json"))
    if ids is None:
        return found
    by_id = {p.name: p for p in found}
    missing = [i for i in ids if i not in by_id and not any(p.name.startswith(i) for p in found)]
    if missing:
        raise UsageError(f"unknown candidate(s) {', '.join(missing)}; candidates in {root}: "
                         f"{', '.join(by_id) or '(none)'}")
    ordered = []  # in the order asked for
    for i in ids:
        ordered += [p for p in found if (p.name == i or p.name.startswith(i)) and p not in ordered]
    return ordered


FLOAT_DTYPES = ("float64", "float32", "bfloat16", "float16")


def cast_case(case: BenchCase, dtype: str) -> BenchCase:
    """``case`` with its floating-point inputs in ``dtype`` (bool and integer inputs kept).

    The captures of a CPU scan are float32; under bf16 autocast on a GPU the same chains see
    bf16 (activations) or keep float32 (norms, softmax): ``--dtypes float32,bfloat16`` times both.
    """
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"not a floating dtype: {dtype!r} (one of {', '.join(FLOAT_DTYPES)})")
    inputs = tuple(replace(s, dtype=dtype) if s.dtype in FLOAT_DTYPES else s for s in case.inputs)
    return case if inputs == case.inputs else replace(case, inputs=inputs, cast=dtype)


def plan_cases(cand: Candidate, shapes: str = "all", models: Sequence[str] | None = None,
               dtypes: Sequence[str] = ("captured",)) -> list[BenchCase]:
    """The cases to time: observed ones (``captured``), their base-size scaling (``derived``), or both.

    A model whose base-preset shapes were captured gets those instead of derived ones. Each case
    is timed once per entry of ``dtypes``: ``captured`` as observed, a dtype name with its
    floating inputs cast to it.
    """
    captured = [c for c in cand.cases if models is None or set(c.models) & set(models)]
    out: list[BenchCase] = []
    if shapes in ("captured", "all"):
        out += captured
    if shapes in ("base", "all"):
        have_base = {m for c in captured if c.preset == "base" for m in c.models}
        out += [c for c in captured if c.preset == "base" and c not in out]
        tiny = _tiny_dims()
        for c in captured:
            if c.preset != "tiny":
                continue
            for m in c.models:
                if m in have_base or (models is not None and m not in models) or m not in BASE_DIMS:
                    continue
                try:
                    out.append(derive_case(c, m, tiny))
                except ValueError:
                    continue
    out = [c if d == "captured" else cast_case(c, d) for d in dtypes for c in out]
    return merge_cases(out)


# --------------------------------------------------------------------------- inputs and numerics

def _torch_dtype(name: str):
    import torch
    return getattr(torch, name.removeprefix("torch."))


def make_inputs(case: BenchCase, device: str, seed: int = 0) -> list:
    """Random inputs of the case's shapes, dtypes and strides (never zeros), then its scalars."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    args = []
    for spec in case.inputs:
        dt = _torch_dtype(spec.dtype)
        n = rl.storage_elements(spec.shape, spec.stride)
        if dt == torch.bool:
            flat = torch.rand(n, generator=g, device=device) > 0.5
        elif dt.is_floating_point:
            flat = torch.randn(n, generator=g, device=device, dtype=torch.float32).to(dt)
        else:
            flat = torch.randint(0, 2, (n,), generator=g, device=device, dtype=dt)
        stride = spec.stride if spec.stride is not None else _contiguous_strides(spec.shape)
        args.append(flat.as_strided(tuple(spec.shape), tuple(stride)) if spec.shape else flat.reshape(()))
    return args + list(case.scalars)


def as_tuple(out) -> tuple:
    import torch
    if torch.is_tensor(out):
        return (out,)
    if isinstance(out, (tuple, list)):
        return tuple(t for t in out if torch.is_tensor(t))
    raise TypeError(f"expected tensor outputs, got {type(out).__name__}")


def upcast(args: Sequence) -> list:
    import torch
    return [a.to(torch.float64) if torch.is_tensor(a) and a.is_floating_point() else a for a in args]


def _float64_mode():
    """A dispatch mode that turns every floating dtype an op asks for into float64.

    Patterns captured under autocast convert bf16 inputs to float32 and back
    (``prims.convert_element_type``); run plainly on float64 inputs they would still round to
    float32 and bf16 on the way. Under this mode the whole chain stays in float64.
    """
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    def widen(v):
        if isinstance(v, torch.dtype) and v.is_floating_point:
            return torch.float64
        if isinstance(v, (list, tuple)):
            return type(v)(widen(x) for x in v)
        return v

    class Float64(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*widen(tuple(args)), **{k: widen(v) for k, v in (kwargs or {}).items()})

    return Float64()


def reference64(fn: Callable, args: Sequence) -> tuple:
    """``fn`` evaluated in float64 on float64 copies of ``args`` (the numerics reference)."""
    import torch

    with torch.no_grad(), _float64_mode():
        return as_tuple(fn(*upcast(args)))


def compare(outs: Sequence, refs: Sequence) -> tuple[float, float, bool]:
    """(relative norm error, max abs error, ok) of ``outs`` against float64 ``refs``.

    NaN/inf must sit where the reference has them; the errors are taken over finite elements.
    ``ok`` uses ``TOLERANCE`` of each output's dtype.
    """
    import torch

    if len(outs) != len(refs):
        return float("inf"), float("inf"), False
    num = den = 0.0
    max_abs, ok = 0.0, True
    for o, r in zip(outs, refs):
        if tuple(o.shape) != tuple(r.shape):
            return float("inf"), float("inf"), False
        o64, r64 = o.detach().to(torch.float64), r.detach().to(torch.float64)
        if o.dtype == torch.bool or not o.is_floating_point():
            bad = (o64 != r64).sum().item()
            ok &= bad == 0
            num += float(bad)
            den += float(o.numel())
            continue
        fin = torch.isfinite(r64)
        if not torch.equal(torch.isfinite(o64), fin) or not torch.equal(torch.isnan(o64), torch.isnan(r64)):
            ok = False
        d = (o64 - r64)[fin & torch.isfinite(o64)]
        e = d.norm().item()
        rn = r64[fin].norm().item()
        num += e * e
        den += rn * rn
        if d.numel():
            max_abs = max(max_abs, d.abs().max().item())
        rel = e / rn if rn > 0 else e
        ok &= rel <= TOLERANCE.get(str(o.dtype).removeprefix("torch."), 1e-4)
    rel = math.sqrt(num) / math.sqrt(den) if den > 0 else math.sqrt(num)
    return rel, max_abs, bool(ok)


# --------------------------------------------------------------------------- timing

@contextlib.contextmanager
def gpu_timing_lock():
    """Hold the file lock named by ``$MINER_GPU_LOCK`` (if set) while timing on the GPU.

    Lets ``miner bench`` and ``miner verify`` share one GPU: their compiles overlap on the CPU,
    their timed regions never do. Without the variable this does nothing.
    """
    path = os.environ.get("MINER_GPU_LOCK")
    if not path:
        yield
        return
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch
        torch.cuda.synchronize()


def time_cuda_graph(fn: Callable, arg_sets: Sequence[Sequence], *, replays: int = 25,
                    target_ms: float = 20.0) -> Timing:
    """Median and 20/80% quantiles of one call of ``fn``, from CUDA-graph replays.

    One graph holds ``calls`` unrolled calls that cycle through ``arg_sets`` (so consecutive calls
    touch different buffers); each replay is timed with CUDA events and divided by ``calls``.
    ``calls`` is chosen so that one replay lasts about ``target_ms``, which makes launch gaps and
    event resolution negligible (this is ``triton.testing.do_bench_cudagraph``'s method, plus the
    rotation of buffers).
    """
    import torch

    k = len(arg_sets)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up on a side stream, as graph capture wants
        for args in arg_sets:
            fn(*args)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for i in range(2 * k):
        fn(*arg_sets[i % k])
    b.record()
    torch.cuda.synchronize()
    est = max(a.elapsed_time(b) / (2 * k), 1e-4)
    calls = k * max(1, min(2000 // k, math.ceil(target_ms / est / k)))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(*arg_sets[i % k])
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        samples.append(a.elapsed_time(b) / calls)
    del graph
    return Timing.of(samples, calls)


def time_host(fn: Callable, arg_sets: Sequence[Sequence], *, replays: int = 5) -> Timing:
    """Wall-clock timing for the CPU smoke mode (the interpreter's times mean nothing)."""
    k = len(arg_sets)
    fn(*arg_sets[0])
    samples = []
    for i in range(replays):
        t0 = time.perf_counter()
        fn(*arg_sets[i % k])
        samples.append((time.perf_counter() - t0) * 1e3)
    return Timing.of(samples, 1)


# --------------------------------------------------------------------------- variants

def compile_variant(fn: Callable, mode: str | None):
    """``fn`` compiled by Inductor for static shapes, with a clean Dynamo cache and no custom passes."""
    import torch

    torch._dynamo.reset()  # a previous shape's compile must not be reused (nor count toward the recompile limit)
    options = {"post_grad_custom_pre_pass": None, "post_grad_custom_post_pass": None}
    if mode is None:
        return torch.compile(fn, dynamic=False, fullgraph=True, options=options)
    # mode and options are exclusive in torch.compile: apply the mode's options explicitly
    opts = dict(torch._inductor.list_mode_options(mode))
    opts.update(options)
    return torch.compile(fn, dynamic=False, fullgraph=True, options=opts)


def build_variant(name: str, cand: Candidate) -> Callable:
    if name == "eager":
        return cand.reference
    if name == "inductor":
        return compile_variant(cand.reference, None)
    if name == "max-autotune":
        return compile_variant(cand.reference, "max-autotune-no-cudagraphs")
    if name == "candidate":
        return cand.kernel
    if name == "candidate-looped":
        kernel = cand.kernel
        return lambda *args: kernel(*args, variant="looped")
    raise UsageError(f"unknown variant {name!r}; variants: {', '.join(VARIANTS + EXTRA_VARIANTS)}")


def time_copy(nbytes: int, env: Env, *, replays: int = 25, max_sets: int = 1024) -> Timing:
    """A device-to-device copy of ``nbytes`` in total (half read, half written), timed like the variants.

    Small kernels cannot reach the bandwidth of a 1 GiB copy (launch and tail effects): this is
    what a perfect kernel of the same size could do, and it tells a kernel's overhead from the size's.
    """
    import torch

    n = max(1, nbytes // 2 // 4)
    k = rl.rotation_count(8 * n, env.l2_bytes, max_sets=max_sets)
    sets = [(torch.empty(n, device=env.device, dtype=torch.float32).normal_(), torch.empty(n, device=env.device))
            for _ in range(k)]
    timing = time_cuda_graph(lambda src, dst: dst.copy_(src), sets, replays=replays)
    del sets
    return timing


def environment(device: str, copy_gbps: float | None = None) -> Env:
    import torch

    try:
        import triton
        triton_v = triton.__version__
    except ImportError:
        triton_v = "none"
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        l2 = int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)
        bw = copy_gbps if copy_gbps is not None else rl.measure_copy_bandwidth(device)
        return Env(device=device, gpu=props.name, torch=torch.__version__, triton=triton_v, date=date,
                   copy_gbps=bw, l2_bytes=l2, sm_count=props.multi_processor_count, cuda=torch.version.cuda,
                   interpret=os.environ.get("TRITON_INTERPRET") == "1")
    bw = copy_gbps if copy_gbps is not None else rl.measure_copy_bandwidth("cpu", nbytes=64 << 20)
    return Env(device="cpu", gpu="cpu", torch=torch.__version__, triton=triton_v, date=date, copy_gbps=bw,
               l2_bytes=8 << 20, interpret=os.environ.get("TRITON_INTERPRET") == "1")


def bench_case(cand: Candidate, case: BenchCase, env: Env, *, variants: Sequence[str] = VARIANTS,
               replays: int = 25, max_sets: int = 1024, log: Callable[[str], None] = lambda s: None) -> BenchRow:
    """Check every variant's numerics on one case, then time those that pass."""
    import torch

    device = env.device
    first = make_inputs(case, device, seed=0)
    with torch.no_grad():
        ref = reference64(cand.reference, first)
        meta_out = as_tuple(cand.reference(*first))
    outputs = tuple(TensorSpec(tuple(o.shape), str(o.dtype).removeprefix("torch."),
                               None if o.is_contiguous() else tuple(o.stride())) for o in meta_out)
    del meta_out
    nbytes = rl.bytes_moved([(s.shape, s.dtype, s.stride) for s in case.inputs],
                            [(s.shape, s.dtype, s.stride) for s in outputs])
    k = rl.rotation_count(nbytes, env.l2_bytes, max_sets=max_sets) if device.startswith("cuda") else 1
    arg_sets = [first] + [make_inputs(case, device, seed=i) for i in range(1, k)]
    results = []
    for name in variants:
        t0 = time.perf_counter()
        try:
            with torch.no_grad(), gpu_timing_lock():
                fn = build_variant(name, cand)
                out = as_tuple(fn(*first))  # compiles, for the compiled variants
                _sync(device)
                compile_s = time.perf_counter() - t0
                rel, mx, ok = compare(out, ref)
                del out
                if not ok:
                    results.append(VariantResult(name, None, rel, mx, False,
                                                 f"numerics: rel err {rel:.3g} over tolerance; not timed", compile_s))
                    log(f"  {name:13s} numerics FAILED (rel err {rel:.3g})")
                    continue
                timing = (time_cuda_graph(fn, arg_sets, replays=replays) if device.startswith("cuda")
                          else time_host(fn, arg_sets, replays=min(replays, 5)))
            results.append(VariantResult(name, timing, rel, mx, True, None, compile_s))
            log(f"  {name:13s} {timing.median_ms * 1e3:10.2f} us  (rel err {rel:.2g})")
        except MinerError:
            raise
        except Exception as e:  # one variant failing must not lose the others' numbers
            msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            results.append(VariantResult(name, error=msg, compile_s=time.perf_counter() - t0))
            log(f"  {name:13s} ERROR {msg}")
        finally:
            if name in ("inductor", "max-autotune"):
                torch._dynamo.reset()
    del arg_sets, first, ref
    if device.startswith("cuda"):
        try:
            with gpu_timing_lock():
                results.append(VariantResult(COPY, time_copy(nbytes, env, replays=replays)))
        except Exception as e:
            results.append(VariantResult(COPY, error=f"{type(e).__name__}: {e}"[:300]))
        torch.cuda.empty_cache()
    return BenchRow(candidate=cand.id, name=cand.name, case=case, outputs=outputs, bytes_moved=nbytes,
                    roofline_ms=rl.roofline_ms(nbytes, env.copy_gbps), rotation=k, variants=tuple(results), env=env)


# --------------------------------------------------------------------------- results

def wins_table(rows: Sequence[BenchRow]) -> dict:
    """Per candidate: the shapes where it is at least as fast as Inductor, and where it loses.

    Meant for a fusion's extra check: fire only on a (shapes, dtypes) listed under ``wins``,
    or, more loosely, on rows no longer than ``max_winning_row``.
    """
    out: dict[str, dict] = {}
    for r in rows:
        s = r.speedup()
        if s is None:
            continue
        entry = out.setdefault(r.candidate, {"name": r.name, "wins": [], "loses": [], "gpu": r.env.gpu})
        item = {"inputs": [asdict(i) for i in r.case.inputs], "row_length": r.case.row_length,
                "speedup_vs_inductor": round(s, 4), "source": r.case.source, "models": list(r.case.models)}
        (entry["wins"] if s >= 1.0 else entry["loses"]).append(item)
    for entry in out.values():
        win_rows = [w["row_length"] for w in entry["wins"] if w["row_length"]]
        lose_rows = [w["row_length"] for w in entry["loses"] if w["row_length"]]
        entry["max_winning_row"] = max(win_rows) if win_rows else None
        entry["min_losing_row"] = min(lose_rows) if lose_rows else None
    return out


def _fmt_us(ms: float | None) -> str:
    return "-" if ms is None else f"{ms * 1e3:.1f}"


def _fmt_pct(p: float | None) -> str:
    return "-" if p is None or not math.isfinite(p) else f"{p:.0f}%"


def markdown_table(rows: Sequence[BenchRow]) -> str:
    lines = ["| candidate | models | shape (inputs) | source | eager us | inductor us | max-autotune us | candidate us | "
             "roofline us | same-size copy us | cand. % roofline | ind. % roofline | vs inductor | vs max-autotune | notes |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        notes = "; ".join(f"{v.name}: {v.error}" for v in r.variants if v.error)
        if r.l2_resident and r.env.device.startswith("cuda"):
            notes = f"working set {r.rotation} x {r.bytes_moved / 1e3:.0f} kB stays in L2" + (f"; {notes}" if notes else "")
        if r.case.source == "derived":
            notes = (f"derived from {' '.join(map(str, r.case.derived_from))} as {' '.join(r.case.roles)}"
                     + (f"; {notes}" if notes else ""))
        sp, spm = r.speedup(), r.speedup(over="max-autotune")
        lines.append(
            f"| {r.name} | {','.join(r.case.models)} | {r.case.label} | {r.case.source} | {_fmt_us(r.ms('eager'))} | "
            f"{_fmt_us(r.ms('inductor'))} | {_fmt_us(r.ms('max-autotune'))} | {_fmt_us(r.ms('candidate'))} | "
            f"{_fmt_us(r.roofline_ms)} | {_fmt_us(r.ms(COPY))} | {_fmt_pct(r.roofline_pct('candidate'))} | {_fmt_pct(r.roofline_pct('inductor'))} | "
            f"{'-' if sp is None else f'{sp:.2f}x'} | {'-' if spm is None else f'{spm:.2f}x'} | {notes} |")
    return "\n".join(lines) + "\n"


ROOFLINE_TARGET = 0.90  # share of the memory roofline, for rows up to ROOFLINE_ROWS elements
ROOFLINE_ROWS = 8192


def targets(rows: Sequence[BenchRow]) -> list[str]:
    """The issue's targets checked on measured rows, one line per miss (and a summary line).

    * the candidate at least as fast as Inductor on every shape (median);
    * at least 90% of the memory roofline for rows up to 8192 elements (rows whose working set
      stays in L2 are left out). A miss names the size-matched copy's share too: when a plain copy
      of the same bytes also falls short, the size, not the kernel, sets the limit.
    """
    lines, n_speed, n_roof, n_roof_ok, n_speed_ok = [], 0, 0, 0, 0
    for r in rows:
        s = r.speedup()
        where = f"{r.name} [{','.join(r.case.models)}] {r.case.label} ({r.case.source})"
        if s is not None:
            n_speed += 1
            if s >= 1.0:
                n_speed_ok += 1
            else:
                lines.append(f"- slower than Inductor: {where}: {s:.2f}x ({_fmt_us(r.ms('candidate'))} us vs "
                             f"{_fmt_us(r.ms('inductor'))} us, {100 * (1 / s - 1):.0f}% more time)")
        pct = r.roofline_pct("candidate")
        if pct is None or r.case.row_length is None or r.case.row_length > ROOFLINE_ROWS or r.l2_resident:
            continue
        n_roof += 1
        if pct >= 100 * ROOFLINE_TARGET:
            n_roof_ok += 1
            continue
        copy_ms = r.ms(COPY)
        copy_pct = None if copy_ms is None else 100 * r.roofline_ms / copy_ms
        lines.append(f"- under {100 * ROOFLINE_TARGET:.0f}% of the roofline: {where}: {pct:.0f}% "
                     f"({100 * ROOFLINE_TARGET - pct:.0f} points short); a copy of the same bytes reaches "
                     f"{_fmt_pct(copy_pct)}, Inductor {_fmt_pct(r.roofline_pct('inductor'))}")
    head = [f"- at least 1.0x Inductor: {n_speed_ok} of {n_speed} timed shapes",
            f"- at least {100 * ROOFLINE_TARGET:.0f}% of the memory roofline (rows <= {ROOFLINE_ROWS}, working set "
            f"beyond L2): {n_roof_ok} of {n_roof}"]
    return head + lines


def env_header(env: Env) -> str:
    return (f"GPU {env.gpu} ({env.sm_count} SMs, L2 {env.l2_bytes / 2**20:.0f} MiB), torch {env.torch}, "
            f"triton {env.triton}, CUDA {env.cuda}, date {env.date}; measured device-to-device copy "
            f"{env.copy_gbps:.0f} GB/s (read + write), the roofline's bandwidth; miner {env.miner}"
            + ("; TRITON_INTERPRET=1 (CPU smoke run: times mean nothing)" if env.interpret else ""))


def plot(rows: Sequence[BenchRow], path: Path) -> Path | None:
    """Per shape, bars of each variant's median time and the roofline (log scale, us)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    if not rows:
        return None
    names = list(VARIANTS) + ["roofline"]
    colors = {"eager": "#999999", "inductor": "#1f77b4", "max-autotune": "#17becf", "candidate": "#d62728",
              "roofline": "#2ca02c"}
    fig_h = max(3.0, 0.45 * len(rows) + 1.5)
    fig, ax = plt.subplots(figsize=(12, fig_h))
    width = 0.8 / len(names)
    labels = []
    for i, r in enumerate(rows):
        labels.append(f"{r.name} {','.join(r.case.models)} {r.case.label}"[:90])
        for j, n in enumerate(names):
            ms = r.roofline_ms if n == "roofline" else r.ms(n)
            if ms is not None:
                ax.barh(i + j * width - 0.4 + width / 2, ms * 1e3, height=width, color=colors[n],
                        label=n if i == 0 or n not in ax.get_legend_handles_labels()[1] else None)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels, fontsize=6)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("median time per call, us (log)")
    env = rows[0].env
    ax.set_title(f"miner bench: {env.gpu}, torch {env.torch}, triton {env.triton}, {env.date[:10]}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def gpu_slug(env: Env) -> str:
    name = env.gpu.lower().replace("nvidia", "").strip()
    return "".join(c if c.isalnum() else "-" for c in name).strip("-") or "cpu"


def save_results(rows: Sequence[BenchRow], env: Env, *, candidate_dirs: dict[str, Path] | None,
                 report_dir: Path | None, json_only: bool = False) -> list[Path]:
    """``candidates/<id>/bench.json`` per candidate (its rows replace that GPU's earlier ones) and the run table.

    ``candidate_dirs`` maps a candidate id to its folder.
    """
    from miner.core.workspace import read_json, write_json, write_text

    written = []
    by_cand: dict[str, list[BenchRow]] = {}
    for r in rows:
        by_cand.setdefault(r.candidate, []).append(r)
    if candidate_dirs:
        for cid, rs in by_cand.items():
            if cid not in candidate_dirs:
                continue
            path = Path(candidate_dirs[cid]) / "bench.json"
            old = read_json(path) if path.exists() else {}
            runs = [x for x in old.get("runs", []) if x.get("env", {}).get("gpu") != env.gpu]
            runs.append({"env": asdict(env), "rows": [row_to_json(r) for r in rs],
                         "where_it_wins": wins_table(rs).get(cid)})
            written.append(write_json(path, {"schema": BENCH_SCHEMA, "kind": "BenchResults", "candidate": cid,
                                             "runs": runs}))
    if report_dir is not None:
        report_dir = Path(report_dir)
        data = {"schema": BENCH_SCHEMA, "kind": "BenchRun", "env": asdict(env),
                "rows": [row_to_json(r) for r in rows], "where_it_wins": wins_table(rows)}
        written.append(write_json(report_dir / "bench.json", data))
        if json_only:
            return written
        written.append(write_json(report_dir / "wins.json", wins_table(rows)))
        md = (f"# miner bench\n\n{env_header(env)}\n\n"
              "Times are medians per call from CUDA-graph replays over rotating input sets (20/80% quantiles "
              "in bench.json). `derived` shapes were scaled from a tiny-preset capture to the published "
              "model size (the roles are named); `captured` shapes were observed by a scan.\n\n"
              + markdown_table(rows) + "\n## Targets\n\n" + "\n".join(targets(rows)) + "\n")
        written.append(write_text(report_dir / "bench.md", md))
        png = plot(rows, report_dir / "bench.png")
        if png:
            written.append(png)
    return written


def load_rows(path: Path) -> list[BenchRow]:
    from miner.core.workspace import read_json
    data = read_json(path)
    if data.get("kind") == "BenchRun":
        return [row_from_json(r) for r in data["rows"]]
    if data.get("kind") == "BenchResults":
        return [row_from_json(r) for run in data["runs"] for r in run["rows"]]
    raise MinerError(f"{path}: not a miner bench file")


def run_bench(cands: Sequence[Candidate], *, device: str, variants: Sequence[str] = VARIANTS,
              shapes: str = "all", models: Sequence[str] | None = None, replays: int = 25,
              dtypes: Sequence[str] = ("captured",),
              copy_gbps: float | None = None, time_budget_s: float | None = None,
              on_row: Callable[[BenchRow], None] | None = None,
              log: Callable[[str], None] = print) -> tuple[Env, list[BenchRow]]:
    """Time every planned case of every candidate; returns the environment and the rows.

    Base-size cases (derived or captured on the base preset) of all candidates go first, the
    tiny captured ones after: with ``time_budget_s`` no new case starts once that many seconds
    have passed, and the cases left out are listed in the log.
    """
    env = environment(device, copy_gbps)
    log(env_header(env))
    plan = []
    for cand in cands:
        cases = plan_cases(cand, shapes, models, dtypes)
        if not cases:
            log(f"{cand.id} ({cand.name}): no observed shapes to time")
        plan += [(cand, c) for c in cases]
    order = {d: i for i, d in enumerate(dtypes)}
    # stable: base-size cases first, then in the order of ``dtypes``; candidates keep their order
    plan.sort(key=lambda cc: (0 if cc[1].preset == "base" else 1, order.get(cc[1].cast or "captured", 0)))
    t0 = time.perf_counter()
    rows, skipped = [], []
    for cand, case in plan:
        if time_budget_s is not None and time.perf_counter() - t0 > time_budget_s:
            skipped.append((cand, case))
            continue
        log(f"{cand.name} ({cand.id}) [{','.join(case.models)}] {case.label} ({case.source})")
        row = bench_case(cand, case, env, variants=variants, replays=replays, log=log)
        rows.append(row)
        if on_row is not None:
            on_row(row)
    for cand, case in skipped:
        log(f"not timed (time budget): {cand.name} ({cand.id}) [{','.join(case.models)}] {case.label} ({case.source})")
    return env, rows


def today_dir(env: Env, reports_root: Path) -> Path:
    return Path(reports_root) / "gpu" / f"{env.date[:10]}-{gpu_slug(env)}"


__all__ = [n for n in dir() if not n.startswith("_") and n not in {"annotations", "itertools"}]
