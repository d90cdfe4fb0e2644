"""The kernel table of a step: where the step's device time goes, kernel by kernel.

Public API (also used for per-variant kernel diffs)::

    classify(name) -> str                       gemm | attention | triton_pointwise | triton_reduction |
                                                triton_persistent | triton_other | copy | other_aten
    kernel_times(step, steps=5, device="cuda")  -> list[KernelTime], slowest first
    copy_bandwidth(device="cuda") -> float      bytes/s of a large device-to-device copy

Measured as ``../shared/probes/step_profile.py`` does: ``torch.profiler`` over ``steps`` calls of
``step`` (CUDA activity on a GPU: every kernel's device time; CPU activity on the CPU: every op's
*self* time, so nested ops are not counted twice), summed per kernel name and divided by
``steps``. The copy bandwidth is the median of 10 copies of a 1 GiB buffer (read + write = 2 GiB
per copy), timed with CUDA events; it is the floor any memory-bound kernel can reach.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable

KINDS = ("gemm", "attention", "triton_pointwise", "triton_reduction", "triton_persistent", "triton_other",
         "copy", "other_aten")

_ATTENTION = ("flash", "fmha", "attention", "cudnn", "sdpa", "efficient", "scaled_dot_product")
_GEMM = ("gemm", "sm90", "sm100", "cutlass", "nvjet", "xmma", "cublas", "splitk", "gemv",
         "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear")
_COPY = ("memcpy", "memset", "direct_copy_kernel", "aten::copy_", "aten::fill_", "aten::zero_")


@dataclass(frozen=True)
class KernelTime:
    """One kernel (by name) of a profiled step.

    Attributes
    ----------
    name : str
        Device kernel name as ``torch.profiler`` reports it (an op name on the CPU).
    kind : str
        ``classify(name)``.
    us_per_step : float
        Device time per step, microseconds (CPU: self time).
    calls_per_step : float
        Launches per step.
    """

    name: str
    kind: str
    us_per_step: float
    calls_per_step: float


def classify(name: str) -> str:
    """The class of a kernel from its profiler name.

    Triton kernels by Inductor's prefix (``triton_poi_`` pointwise, ``triton_red_`` reduction,
    ``triton_per_`` persistent reduction, other ``triton_``); then attention (flash / memory-efficient /
    cuDNN SDPA), GEMMs (cuBLAS, cuBLASLt ``nvjet``, CUTLASS, ``sm90_xmma``; ``aten::mm`` and kin on the
    CPU), copies and memsets; everything else is ``other_aten``.
    """
    n = name.lower()
    for prefix, kind in (("triton_poi", "triton_pointwise"), ("triton_red", "triton_reduction"),
                         ("triton_per", "triton_persistent"), ("triton", "triton_other")):
        if n.startswith(prefix):
            return kind
    if any(k in n for k in _ATTENTION):
        return "attention"
    if any(k in n for k in _GEMM):
        return "gemm"
    if any(k in n for k in _COPY):
        return "copy"
    return "other_aten"


def _synchronize(device: str) -> None:
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def kernel_times(step: Callable[[], Any], *, steps: int = 5, device: str = "cuda") -> list[KernelTime]:
    """Run ``step()`` ``steps`` times under ``torch.profiler``; per-kernel time per step, slowest first.

    Parameters
    ----------
    step : callable
        One step (already compiled and warmed up: the first calls of a compiled step compile).
    steps : int
        Profiled calls; times and calls are divided by it.
    device : str
        ``cuda``: CUDA activity, each kernel's device time. ``cpu``: CPU activity, each op's self time.

    Returns
    -------
    list of KernelTime
        Sorted by ``us_per_step`` descending, then name.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    cuda = device.startswith("cuda")
    _synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        _synchronize(device)
    wanted = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    totals: dict[str, list[float]] = {}
    events = prof.events()
    for ev in events:
        if ev.device_type != wanted:
            continue
        if cuda:
            us = ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
        else:
            us = ev.self_cpu_time_total
        t = totals.setdefault(ev.name, [0.0, 0])
        t[0] += us
        t[1] += 1
    if cuda:
        attribute_to_ops(totals, events)
    out = [KernelTime(name, classify(name), us / steps, calls / steps) for name, (us, calls) in totals.items()
           if calls > 0]
    out.sort(key=lambda k: (-k.us_per_step, k.name))
    return out


OWN_OPS = ("miner::",)  # the custom ops whose kernels are named after them


def attribute_to_ops(totals: dict[str, list[float]], events) -> None:
    """Rename in ``totals`` (kernel name -> [us, calls]) each kernel a miner op launched to
    ``<kernel> [miner::c<id>]``: every generated kernel is a ``one_pass_kernel`` or a
    ``reduce_kernel``, so only the op tells one region's kernel from another's (issue 29's kernel diff
    per region). The profiler links a device kernel to the innermost CPU op that launched it
    (``FunctionEvent.kernels``); a kernel replayed inside a CUDA graph is linked to the graph's launch
    and keeps its plain name."""
    for ev in events:
        if not str(getattr(ev, "name", "")).startswith(OWN_OPS):
            continue
        for k in getattr(ev, "kernels", None) or ():
            plain = totals.get(k.name)
            if plain is None or plain[1] <= 0:
                continue
            plain[0] -= k.duration
            plain[1] -= 1
            own = totals.setdefault(f"{k.name} [{ev.name}]", [0.0, 0])
            own[0] += k.duration
            own[1] += 1


def copy_bandwidth(device: str = "cuda", nbytes: int | None = None, repeats: int = 10) -> float:
    """Bytes per second (read + write) of a device-to-device copy: the memory roofline.

    ``nbytes`` defaults to 1 GiB on CUDA (as the probe) and 64 MiB on the CPU; the median of
    ``repeats`` timed copies after 3 warm-up copies (CUDA events on the GPU, wall clock on the CPU).
    """
    import torch

    cuda = device.startswith("cuda")
    n = nbytes or ((1 << 30) if cuda else (64 << 20))
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    _synchronize(device)
    ts = []
    for _ in range(repeats):
        if cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            b.copy_(a)
            e.record()
            torch.cuda.synchronize()
            ts.append(s.elapsed_time(e) / 1e3)
        else:
            t0 = time.perf_counter()
            b.copy_(a)
            ts.append(time.perf_counter() - t0)
    del a, b
    return 2 * n / statistics.median(ts)


# --------------------------------------------------------------------------- Inductor's byte counts

def module_kernel_gb(module: Any) -> dict[str, float]:
    """``{kernel name: GB per call}`` from the Triton kernels held by one compiled wrapper module.

    Each kernel object (a ``CachingAutotuner``) keeps ``inductor_meta["kernel_num_gb"]`` when the
    graph was compiled with ``torch._inductor.config.benchmark_kernel = True``: Inductor's own count
    of the bytes the kernel reads and writes (each buffer once). Per module, so kernels of two
    graphs that share a name keep their own counts.
    """
    out: dict[str, float] = {}
    try:
        items = list(vars(module).items())
    except TypeError:
        return out
    for attr, value in items:
        meta = getattr(value, "inductor_meta", None)
        if isinstance(meta, dict) and meta.get("kernel_num_gb") is not None:
            out[meta.get("kernel_name") or attr] = float(meta["kernel_num_gb"])
    return out


def live_kernel_gb() -> dict[str, float]:
    """``{kernel name: GB per call}`` from every live ``CachingAutotuner`` (the probe's way; by name only)."""
    import gc
    import warnings

    try:
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    except ImportError:  # no triton
        return {}
    out: dict[str, float] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for o in gc.get_objects():
            try:
                if isinstance(o, CachingAutotuner):
                    meta = o.inductor_meta or {}
                    name = meta.get("kernel_name") or getattr(getattr(o, "fn", None), "__name__", None)
                    if name and meta.get("kernel_num_gb") is not None:
                        out[name] = float(meta["kernel_num_gb"])
            except Exception:  # objects half torn down during collection
                continue
    return out


# --------------------------------------------------------------------------- the step profile record

PROFILE_SCHEMA = 1
PROFILE_KIND = "StepProfile"
BYTES_SOURCE = ("Inductor's own count: inductor_meta['kernel_num_gb'] of each Triton kernel, compiled with "
                "torch._inductor.config.benchmark_kernel = True, read from the graph's compiled module "
                "(live CachingAutotuner objects by name where the module had none)")
COMPOSITION = ("gemm", "attention", "triton_floor", "triton_above_floor", "triton_no_bytes", "copy", "other_aten",
               "idle")


@dataclass(frozen=True)
class KernelProfile:
    """One kernel of a profiled step, joined to the captured graph that launches it.

    Attributes
    ----------
    name, kind, us_per_step, calls_per_step
        As :class:`KernelTime` (this graph's share when ``split``).
    graph : str or None
        ``str(GraphKey)`` of the captured graph whose kernel map holds it (None: not a generated
        kernel, or not in any map).
    gb_per_call : float or None
        Inductor's byte count per call (GB), None when unknown (not Triton, or no meta).
    floor_us_per_step : float or None
        ``gb_per_call`` at the copy bandwidth, times ``calls_per_step``.
    sites : tuple of str
        The capture's call sites (``"name:handle"``) of this kernel in ``graph``.
    nodes : tuple of tuple of str
        FX node names each site holds (Inductor's kernel map), parallel to ``sites``.
    split : bool
        True when graphs of the step share this kernel name (forward and backward number their
        kernels separately): the profiler's time is then shared out by call sites x bytes.
    bytes_from : str or None
        Where ``gb_per_call`` was read: ``"module"`` (the graph's compiled module) or ``"live"`` (a
        live ``CachingAutotuner`` of that name, the probe's way); None without a count.
    """

    name: str
    kind: str
    us_per_step: float
    calls_per_step: float
    graph: str | None = None
    gb_per_call: float | None = None
    floor_us_per_step: float | None = None
    sites: tuple[str, ...] = ()
    nodes: tuple[tuple[str, ...], ...] = ()
    split: bool = False
    bytes_from: str | None = None

    @property
    def above_floor_us(self) -> float | None:
        return None if self.floor_us_per_step is None else max(0.0, self.us_per_step - self.floor_us_per_step)


@dataclass(frozen=True)
class StepProfile:
    """Where one (model, preset, mode) step's device time goes, saved as ``profiles/<model>/<preset>/<mode>.profile.json``.

    ``step_ms`` and its p20 / p80 are CUDA-event times of whole steps (wall clock on the CPU);
    ``kernels`` come from ``torch.profiler`` over ``steps_profiled`` further steps; ``copy_bw`` is
    bytes/s measured in the same process just before; ``recompiled`` counts graphs compiled after
    the capture (0 means every profiled kernel name is one the capture mapped).
    """

    model: str
    preset: str
    mode: str
    device: str
    step_ms: float
    step_p20_ms: float
    step_p80_ms: float
    steps_timed: int
    steps_profiled: int
    copy_bw: float
    kernels: tuple[KernelProfile, ...]
    bytes_source: str = BYTES_SOURCE
    recompiled: int = 0
    provenance: dict = field(default_factory=dict)

    def graph_keys(self) -> list[str]:
        """The captured graphs this profile's kernels are joined to."""
        return sorted({k.graph for k in self.kernels if k.graph is not None})

    def site_times(self, graph: Any) -> dict[str, tuple[float, float | None, float]]:
        """``{"name:handle": (us_per_step, floor_us_per_step or None, calls_per_step)}`` for one graph.

        A kernel's time is shared equally among its call sites in the graph (one kernel name is one
        generated source, so every call site does the same work).
        """
        out = {}
        for k in self.kernels:
            if k.graph != str(graph) or not k.sites:
                continue
            n = len(k.sites)
            floor = None if k.floor_us_per_step is None else k.floor_us_per_step / n
            for s in k.sites:
                out[s] = (k.us_per_step / n, floor, k.calls_per_step / n)
        return out

    @property
    def kernel_ms(self) -> float:
        return sum(k.us_per_step for k in self.kernels) / 1e3

    def by_class_ms(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for k in self.kernels:
            out[k.kind] = out.get(k.kind, 0.0) + k.us_per_step / 1e3
        return dict(sorted(out.items()))

    def composition(self) -> dict[str, float]:
        """Milliseconds per step in each of :data:`COMPOSITION`.

        Triton time splits into the part at the floor (``min(time, floor)`` per kernel) and the part
        above it (``max(0, time - floor)``); ``idle``: the step's time not covered by any kernel
        (launch and CPU overhead, gaps), never negative.
        """
        out = dict.fromkeys(COMPOSITION, 0.0)
        for k in self.kernels:
            us = k.us_per_step
            if k.kind.startswith("triton"):
                if k.floor_us_per_step is None:
                    out["triton_no_bytes"] += us
                else:
                    out["triton_floor"] += min(us, k.floor_us_per_step)
                    out["triton_above_floor"] += max(0.0, us - k.floor_us_per_step)
            elif k.kind in out:
                out[k.kind] += us
            else:
                out["other_aten"] += us
        out = {c: v / 1e3 for c, v in out.items()}
        out["idle"] = max(0.0, self.step_ms - self.kernel_ms)
        return out

    def totals(self) -> dict[str, float]:
        """The probe's summary numbers (ms per step): step, gemm, attention, Triton, its floor, gap."""
        tri = [k for k in self.kernels if k.kind.startswith("triton")]
        known = [k for k in tri if k.floor_us_per_step is not None]
        cls = self.by_class_ms()
        return {"step_ms": self.step_ms, "kernel_ms": self.kernel_ms, "gemm_ms": cls.get("gemm", 0.0),
                "attention_ms": cls.get("attention", 0.0),
                "triton_ms": sum(k.us_per_step for k in tri) / 1e3,
                "triton_with_bytes_ms": sum(k.us_per_step for k in known) / 1e3,
                "triton_floor_ms": sum(k.floor_us_per_step for k in known) / 1e3,
                "triton_above_floor_ms": sum(k.above_floor_us for k in known) / 1e3}


# --------------------------------------------------------------------------- measuring and joining

@dataclass
class RawProfile:
    """What :func:`measure` saw, before the join with the captured graphs."""

    step_ms: list[float]
    kernels: list[KernelTime]
    copy_bw: float
    module_gb: list[dict[str, float]]  # per compiled graph, in compile order
    live_gb: dict[str, float]
    steps_profiled: int
    recompiled: int = 0


def time_steps(step: Callable[[], Any], n: int, device: str) -> list[float]:
    """Milliseconds of each of ``n`` calls of ``step`` (CUDA events on a GPU, wall clock on the CPU)."""
    import torch

    out = []
    for _ in range(n):
        if device.startswith("cuda"):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            step()
            e.record()
            torch.cuda.synchronize()
            out.append(s.elapsed_time(e))
        else:
            t0 = time.perf_counter()
            step()
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def measure(step: Callable[[], Any], modules: Callable[[], list], device: str, *, warmup: int = 2,
            steps_timed: int = 20, steps_profiled: int = 5) -> RawProfile:
    """Copy bandwidth, ``warmup`` steps, ``steps_timed`` timed steps, then the kernel table.

    ``modules()`` returns the compiled wrapper modules of the step's graphs in compile order
    (read after the steps, so every kernel has been loaded).
    """
    bw = copy_bandwidth(device)
    for _ in range(warmup):
        step()
    _synchronize(device)
    ts = time_steps(step, steps_timed, device)
    kts = kernel_times(step, steps=steps_profiled, device=device)
    mods = modules()
    module_gb = [module_kernel_gb(m) if m is not None else {} for m in mods]
    have = {n for g in module_gb for n in g}
    missing = any(k.kind.startswith("triton") and k.name not in have for k in kts)
    return RawProfile(ts, kts, bw, module_gb, live_kernel_gb() if missing else {}, steps_profiled)


def _quantiles(ts: list[float]) -> tuple[float, float, float]:
    if len(ts) < 2:
        return ts[0], ts[0], ts[0]
    q = statistics.quantiles(ts, n=5)
    return statistics.median(ts), q[0], q[3]


def _lookup(gb: dict[str, float], name: str) -> float | None:
    if name in gb:
        return gb[name]
    import re
    return gb.get(re.sub(r"_\d+$", "", name))


def build(raw: RawProfile, graphs: list, *, model: str, preset: str, mode: str, device: str,
          provenance: dict | None = None) -> StepProfile:
    """Join the kernel table to the captured graphs' kernel maps (``raw.module_gb[i]`` is ``graphs[i]``'s).

    A profiled kernel name is a capture call site's name without its ``:handle``. A name launched by
    several graphs is split between them by call sites x bytes per call (``KernelProfile.split``).
    """
    bw = raw.copy_bw
    sites: dict[str, dict[int, list[str]]] = {}
    nodes: dict[tuple[int, str], list[str]] = {}
    for gi, g in enumerate(graphs):
        for ref in g.kernels:
            base, sep, tail = ref.name.rpartition(":")
            base = base if sep and tail.isdigit() else ref.name
            sites.setdefault(base, {}).setdefault(gi, []).append(ref.name)
        for r in g.nodes:
            for k in r.kernels:
                nodes.setdefault((gi, k.name), []).append(r.name)

    def gb_of(gi: int | None, name: str) -> tuple[float | None, str | None]:
        got = _lookup(raw.module_gb[gi], name) if gi is not None and gi < len(raw.module_gb) else None
        if got is not None:
            return got, "module"
        if gi is None:  # a kernel in no kernel map: the compiled modules by name, where they agree
            found = {v for g in raw.module_gb if (v := _lookup(g, name)) is not None}
            if len(found) == 1:
                return found.pop(), "module"
        live = _lookup(raw.live_gb, name)
        return live, None if live is None else "live"

    def floor(gb: float | None, calls: float) -> float | None:
        return None if gb is None or not bw else gb * 1e9 / bw * 1e6 * calls

    rows = []
    for kt in raw.kernels:
        where = sites.get(kt.name, {}) if kt.kind.startswith("triton") else {}
        if not where:
            gb, src = gb_of(None, kt.name) if kt.kind.startswith("triton") else (None, None)
            rows.append(KernelProfile(kt.name, kt.kind, kt.us_per_step, kt.calls_per_step, None, gb,
                                      floor(gb, kt.calls_per_step), bytes_from=src))
            continue
        n_all = sum(len(s) for s in where.values())
        found = {gi: gb_of(gi, kt.name) for gi in where}
        gbs = {gi: f[0] for gi, f in found.items()}
        known = all(v is not None for v in gbs.values())
        weight = {gi: len(s) * (gbs[gi] if known else 1.0) for gi, s in where.items()}
        total_w = sum(weight.values()) or 1.0
        for gi, s in where.items():
            share = weight[gi] / total_w if len(where) > 1 else 1.0
            calls = kt.calls_per_step * len(s) / n_all
            rows.append(KernelProfile(kt.name, kt.kind, kt.us_per_step * share, calls, str(graphs[gi].key), gbs[gi],
                                      floor(gbs[gi], calls), tuple(s), tuple(tuple(nodes.get((gi, x), ())) for x in s),
                                      split=len(where) > 1, bytes_from=found[gi][1]))
    rows.sort(key=lambda k: (-k.us_per_step, k.name, k.graph or ""))
    med, p20, p80 = _quantiles(raw.step_ms)
    return StepProfile(model, preset, mode, device, med, p20, p80, len(raw.step_ms), raw.steps_profiled, bw,
                       tuple(rows), recompiled=raw.recompiled, provenance=dict(provenance or {}))


# --------------------------------------------------------------------------- workspace files

def _root(workspace: Any) -> Path:
    return Path(workspace.root) if hasattr(workspace, "captures") else Path(workspace)  # a Workspace or a folder


def profile_path(workspace: Any, model: str, preset: str, mode: str):
    """``<workspace>/profiles/<model>/<preset>/<mode>.profile.json``."""

    from miner.core.workspace import safe_name
    return _root(workspace) / "profiles" / safe_name(model) / preset / f"{mode}.profile.json"


def to_dict(p: StepProfile) -> dict:
    import dataclasses
    d = dataclasses.asdict(p)
    d["kernels"] = [{**dataclasses.asdict(k), "sites": list(k.sites), "nodes": [list(n) for n in k.nodes]}
                    for k in p.kernels]
    d["totals"] = p.totals()  # derived, for readers of the file; ignored on load
    d["composition_ms"] = p.composition()
    return d


def from_dict(d: dict) -> StepProfile:
    import dataclasses
    names = {f.name for f in dataclasses.fields(KernelProfile)}
    kernels = tuple(KernelProfile(**{**{k: v for k, v in row.items() if k in names},
                                     "sites": tuple(row.get("sites", ())),
                                     "nodes": tuple(tuple(n) for n in row.get("nodes", ()))})
                    for row in d["kernels"])
    fields = {f.name for f in dataclasses.fields(StepProfile)}
    return StepProfile(**{**{k: v for k, v in d.items() if k in fields}, "kernels": kernels})


def save(workspace: Any, p: StepProfile):
    """Write the profile atomically in a versioned envelope; returns its path."""
    from miner.core.workspace import write_json
    return write_json(profile_path(workspace, p.model, p.preset, p.mode),
                      {"schema": PROFILE_SCHEMA, "kind": PROFILE_KIND, "profile": to_dict(p)})


def load(path: Any) -> StepProfile:
    """One saved profile; ``WorkspaceError`` naming the file when it is unusable."""
    from miner.core.errors import WorkspaceError
    from miner.core.workspace import read_envelope

    data = read_envelope(path, PROFILE_KIND, PROFILE_SCHEMA, "miner profile")
    try:
        return from_dict(data["profile"])
    except (TypeError, KeyError, ValueError) as e:
        raise WorkspaceError(f"{path}: malformed profile ({e}); re-run `miner profile`") from None


def load_all(workspace: Any, models: list[str] | None = None) -> list[StepProfile]:
    """Every saved profile of the workspace (of ``models`` only, when given), in path order."""

    from miner.core.workspace import safe_name
    root = _root(workspace) / "profiles"
    paths = sorted(root.glob("*/*/*.profile.json"))
    if models is not None:
        wanted = {safe_name(m) for m in models}
        paths = [p for p in paths if p.parts[-3] in wanted]
    return [load(p) for p in paths]
