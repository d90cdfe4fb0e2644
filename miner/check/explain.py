"""Why a variant's step changed: its kernel table against the default's (``miner verify --ab``).

Both tables come from ``miner.scan.profile.kernel_times`` (torch.profiler, per kernel name: time
and calls per step). Inductor numbers its generated kernels per graph (``..._fused_add_mul_12``),
so a kernel split elsewhere renumbers the rest: names are compared without the trailing number,
the same-named kernels summed. The result lists the kernels the variant removed, the kernels it
added, and the neighbours whose time per step changed beyond ``min_us`` and ``min_rel``; so a loss
reads "removed triton_per_fused__log_softmax (-310.2 us/step); added log_softmax_kernel
(+250.1); neighbours: triton_red_fused_nll_loss (+95.3)".
"""

from __future__ import annotations

import re
from typing import Any, Iterable

_NUMBER = re.compile(r"_\d+$")
_IDS = ((re.compile(r"Torch-Compiled Region: \d+/\d+"), "Torch-Compiled Region"),  # CPU profiles: frame/compile ids
        (re.compile(r"CompiledFxGraph \w+"), "CompiledFxGraph"))


def base_name(name: str) -> str:
    """A kernel's name without Inductor's per-graph number (``triton_poi_fused_add_3`` -> ``..._add``)."""
    for pattern, repl in _IDS:
        name = pattern.sub(repl, name)
    return _NUMBER.sub("", name)


def _field(k: Any, name: str):
    return k[name] if isinstance(k, dict) else getattr(k, name)


def table(kernels: Iterable[Any]) -> dict[str, tuple[float, float]]:
    """base name -> (us per step, calls per step), from ``KernelTime`` rows (or dicts with their fields)."""
    out: dict[str, tuple[float, float]] = {}
    for k in kernels:
        name = base_name(_field(k, "name"))
        us, calls = out.get(name, (0.0, 0.0))
        out[name] = (us + float(_field(k, "us_per_step")), calls + float(_field(k, "calls_per_step")))
    return out


def diff(before: Iterable[Any], after: Iterable[Any], *, min_us: float = 2.0, min_rel: float = 0.05,
         top: int = 8) -> dict:
    """The kernels ``after`` removed, added and changed relative to ``before`` (per step).

    Returns ``{"removed": [[name, us, calls]], "added": [[name, us, calls]], "changed": [[name,
    us_before, us_after, delta_us]], "total_us_before", "total_us_after", "delta_us"}``, each list
    largest first and cut to ``top`` (the totals cover every kernel). A kernel counts as changed
    when its time moved by more than ``min_us`` and ``min_rel`` of its time before.
    """
    a, b = table(before), table(after)
    removed = sorted(([n, round(us, 1), calls] for n, (us, calls) in a.items() if n not in b), key=lambda r: -r[1])
    added = sorted(([n, round(us, 1), calls] for n, (us, calls) in b.items() if n not in a), key=lambda r: -r[1])
    changed = []
    for n in a.keys() & b.keys():
        u0, u1 = a[n][0], b[n][0]
        if abs(u1 - u0) > min_us and abs(u1 - u0) > min_rel * max(u0, 1e-9):
            changed.append([n, round(u0, 1), round(u1, 1), round(u1 - u0, 1)])
    changed.sort(key=lambda r: -abs(r[3]))
    t0, t1 = sum(us for us, _ in a.values()), sum(us for us, _ in b.values())
    return {"removed": removed[:top], "added": added[:top], "changed": changed[:top],
            "total_us_before": round(t0, 1), "total_us_after": round(t1, 1), "delta_us": round(t1 - t0, 1)}


def describe(d: dict | None, n: int = 3) -> str:
    """One line: ``removed K (-X us/step); added A (+Y); neighbours: N +Z; kernels +T us/step in all``."""
    if not d:
        return "-"
    parts = []
    if d["removed"]:
        parts.append("removed " + ", ".join(f"{k} (-{us:.1f})" for k, us, _ in d["removed"][:n]))
    if d["added"]:
        parts.append("added " + ", ".join(f"{k} (+{us:.1f})" for k, us, _ in d["added"][:n]))
    if d["changed"]:
        parts.append("neighbours " + ", ".join(f"{k} {dl:+.1f}" for k, _, _, dl in d["changed"][:n]))
    parts.append(f"all kernels {d['delta_us']:+.1f} us/step")
    return "; ".join(parts)
