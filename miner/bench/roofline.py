"""Bytes moved, the memory roofline and timing statistics: the arithmetic behind ``miner bench``.

Everything here but ``measure_copy_bandwidth`` is pure Python and runs in CI.

The memory roofline of a kernel is the time the device needs to move the fewest bytes the
kernel must move (each input read once, each output written once) at the bandwidth measured
in the same run with a large device-to-device copy (bytes read plus bytes written, like
the kernel's count). A kernel at 100% runs as fast as a plain copy of the same bytes.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

from miner.core.tensors import TensorSpec

QUANTILES = (0.5, 0.2, 0.8)  # median first, then the 20% and 80% quantiles (as Liger reports them)

def tensor_bytes(shape: Sequence[int], dtype: str, stride: Sequence[int] | None = None) -> int:
    """Bytes of the memory a tensor spans (``miner.core.tensors.TensorSpec.nbytes``)."""
    return TensorSpec(tuple(shape), dtype, None if stride is None else tuple(stride)).nbytes


def bytes_moved(inputs: Iterable[tuple[Sequence[int], str, Sequence[int] | None]],
                outputs: Iterable[tuple[Sequence[int], str, Sequence[int] | None]]) -> int:
    """The fewest bytes a fused kernel must move: each input read once, each output written once.

    ``inputs`` and ``outputs`` are ``(shape, dtype, stride)`` triples (stride may be None for
    contiguous). A broadcast input (stride 0, e.g. a layer-norm weight) counts its storage once.
    """
    return sum(tensor_bytes(*t) for t in inputs) + sum(tensor_bytes(*t) for t in outputs)


def roofline_ms(nbytes: int, bandwidth_gbps: float) -> float:
    """Time to move ``nbytes`` at ``bandwidth_gbps`` (GB/s, 1e9 bytes), in milliseconds."""
    if bandwidth_gbps <= 0:
        raise ValueError("bandwidth must be positive")
    return nbytes / (bandwidth_gbps * 1e9) * 1e3


def achieved_gbps(nbytes: int, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9 if ms > 0 else float("nan")


def roofline_share(nbytes: int, ms: float, bandwidth_gbps: float) -> float:
    """Fraction of the measured memory roofline reached (1.0 = as fast as a copy of the same bytes)."""
    if ms <= 0 or not math.isfinite(ms):
        return float("nan")
    return roofline_ms(nbytes, bandwidth_gbps) / ms


def quantile(samples: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (same as ``numpy.quantile``'s default and ``torch.quantile``)."""
    if not samples:
        raise ValueError("no samples")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} outside [0, 1]")
    xs = sorted(samples)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(samples: Sequence[float], quantiles: Sequence[float] = QUANTILES) -> tuple[float, ...]:
    return tuple(quantile(samples, q) for q in quantiles)


def rotation_count(bytes_per_set: int, l2_bytes: int, *, factor: float = 3.0, max_sets: int = 64) -> int:
    """How many input/output sets to cycle through so that the working set is ``factor`` x L2.

    A kernel timed over one buffer that fits in L2 measures the cache, not HBM. With ``n`` sets
    touched round-robin, the set a call reads was last touched ``n - 1`` calls ago, after
    ``(n - 1) * bytes_per_set`` other bytes went through the cache.
    """
    if bytes_per_set <= 0:
        return 1
    need = math.ceil(factor * l2_bytes / bytes_per_set) + 1
    return max(2, min(max_sets, need)) if need > 1 else 2


def measure_copy_bandwidth(device: str = "cuda", nbytes: int = 1 << 30, replays: int = 20) -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read + bytes written), median of ``replays``.

    The buffer (default 1 GiB each way) is far larger than any L2, so this is the HBM ceiling
    a memory-bound kernel can hope for on this device, measured with the same timer as the kernels.
    """
    import torch

    n = nbytes // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    if device.startswith("cuda"):
        times = []
        for _ in range(replays):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dst.copy_(src)
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
    else:
        import time
        times = []
        for _ in range(max(3, replays // 4)):
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append((time.perf_counter() - t0) * 1e3)
    ms = quantile(times, 0.5)
    return achieved_gbps(2 * n * 4, ms)
