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
from dataclasses import dataclass
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
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
        _synchronize(device)
    wanted = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    totals: dict[str, list[float]] = {}
    for ev in prof.events():
        if ev.device_type != wanted:
            continue
        if cuda:
            us = ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
        else:
            us = ev.self_cpu_time_total
        t = totals.setdefault(ev.name, [0.0, 0])
        t[0] += us
        t[1] += 1
    out = [KernelTime(name, classify(name), us / steps, calls / steps) for name, (us, calls) in totals.items()]
    out.sort(key=lambda k: (-k.us_per_step, k.name))
    return out


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
