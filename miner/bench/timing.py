"""Timing on the GPU: CUDA-graph replays over rotating input sets, a same-size copy, the run's environment.

Timing captures a CUDA graph of many calls that cycle through enough input sets to leave L2 out
(``miner.bench.roofline.rotation_count``) and times whole replays with CUDA events: per-call
median and 20/80% quantiles. docs/benchmarking.md explains the method.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from miner import __version__
from miner.bench import roofline as rl
from miner.core.errors import MinerError


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


def sync(device: str) -> None:
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

