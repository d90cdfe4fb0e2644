"""Values Inductor recomputes in several kernels: small transcendental values broadcast into larger ones.

Inductor inlines a pointwise value into every kernel that reads it unless a heuristic realizes it
(``ir.StorageBox.should_realize_on_reuse``: on CUDA, many reads or a large inner function; the
transcendental-op rule applies to CPU kernels only). A value such as llama's RoPE ``cos``/``sin``
table (``[1, 512, 64]``, computed from the positions and the inverse frequencies) is then recomputed
in each of the 32 RoPE kernels of a 16-layer forward, per element of the ``[16, 32, 512, 64]`` q or k
it multiplies: two libdevice transcendentals per element where a load of a 128 KiB table would do.

The rule (:func:`check`) reads a captured graph's node-to-kernel map (``NodeRecord.kernels``, one
entry per kernel call site the node ended up in). A value is reported when

- its op is a transcendental (:data:`HEAVY`) with a known, static output size;
- it ended up in at least two kernel call sites (it is recomputed in each);
- in every one of them some node's output has at least :data:`RATIO` times its elements (it is
  broadcast into larger work: computing it once and loading it is cheaper than recomputing it per
  element; a value as large as its kernels, e.g. bert's GELU ``erf`` in the backward, is recomputed
  more cheaply than written and read back, and is declined with that reason).

``mined/recomputed.json`` (``kind: Recomputed``) lists each such value with its kernels. Inductor
realizes a value once when it passes through ``prims.inductor_force_stride_order`` (its lowering
copies an unrealized input into a buffer, ``ir.ExternKernel.require_strides``): the rewrite that
follows from this report, measured in a model step, is the next step (tests/test_recompute.py
checks the mechanism on Inductor's CPU backend).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Iterable

from miner.core.records import CapturedGraph

KIND, SCHEMA = "Recomputed", 1
RECOMPUTED_FILE = "recomputed.json"  # under mined/
HEAVY = frozenset({"aten.sin.default", "aten.cos.default", "aten.tan.default", "aten.exp.default",
                   "aten.exp2.default", "aten.log.default", "aten.tanh.default", "aten.erf.default",
                   "aten.sigmoid.default"})
RATIO = 8  # a consumer kernel must do at least this many times the value's elements


@dataclass(frozen=True)
class Recomputed:
    """One transcendental value of a captured graph that ended up in several kernel call sites."""

    model: str
    preset: str
    mode: str
    phase: str
    graph: str
    node: str
    target: str
    shape: tuple
    kernels: tuple[str, ...]  # the kernel call sites it is computed in
    consumer_numel: int | None  # the smallest, over those kernels, of the largest output numel in the kernel
    ok: bool  # realizing it once would spare each kernel its recomputation
    reasons: tuple[str, ...] = ()
    module: str | None = None


def _numel(shape) -> int | None:
    return math.prod(shape) if all(isinstance(s, int) for s in shape) else None


def find(graph: CapturedGraph) -> list[Recomputed]:
    """Every :data:`HEAVY` value of ``graph`` computed in two or more kernel call sites, with the rule's verdict."""
    by_kernel: dict[str, list] = defaultdict(list)
    for rec in graph.nodes:
        for k in rec.kernels:
            by_kernel[k.name].append(rec)
    out = []
    for rec in graph.nodes:
        if rec.op != "call_function" or rec.target not in HEAVY or not rec.meta:
            continue
        sites = tuple(dict.fromkeys(k.name for k in rec.kernels if k.kind != "extern"))
        if len(sites) < 2:
            continue
        shape = tuple(rec.meta[0].shape)
        numel = _numel(shape)
        reasons = []
        consumer = None
        if numel is None:
            reasons.append(f"symbolic size {list(shape)}")
        else:
            largest = [max((_numel(r.meta[0].shape) or 0 for r in by_kernel[s] if r.meta), default=0) for s in sites]
            consumer = min(largest)
            if consumer < RATIO * numel:
                reasons.append(f"as large as a kernel it is computed in ({numel} vs {consumer} elements): "
                               f"recomputing is cheaper than a round trip through memory")
        k = graph.key
        out.append(Recomputed(k.model, k.preset, k.mode, k.phase, k.slug, rec.name, rec.target, shape, sites,
                              consumer, not reasons, tuple(reasons), rec.module))
    return out


def mine(graphs: Iterable[CapturedGraph]) -> dict:
    """``mined/recomputed.json``'s payload: every recomputed transcendental value and the rule's verdict."""
    graphs = list(graphs)
    found = [f for g in graphs for f in find(g)]
    return {"schema": SCHEMA, "kind": KIND, "graphs": [str(g.key) for g in graphs],
            "found": [asdict(f) for f in found],
            "counts": {"realizable": sum(f.ok for f in found), "declined": sum(not f.ok for f in found),
                       "kernel_sites": sum(len(f.kernels) for f in found if f.ok)}}


def save(workspace, payload: dict):
    """Write ``mined/recomputed.json`` atomically; returns its path."""
    from miner.core.workspace import write_json

    return write_json(workspace.mined / RECOMPUTED_FILE, payload)


def summary(payload: dict) -> str:
    """One line: which small transcendental values are recomputed in how many kernels."""
    ok = [f for f in payload["found"] if f["ok"]]
    if not ok:
        return "recomputed values: none (no small transcendental value is computed in several kernels)"
    groups: dict[tuple, int] = defaultdict(int)
    for f in ok:
        groups[(f["model"], f["target"].split(".")[1], tuple(f["shape"]))] += len(f["kernels"])
    parts = [f"{m} {op}{list(s)} in {n} kernels" for (m, op, s), n in sorted(groups.items())]
    return (f"recomputed values: {len(ok)} small transcendental values recomputed per element in "
            f"{payload['counts']['kernel_sites']} kernel call sites ({'; '.join(parts)}): computed once, "
            f"those kernels would load them")


__all__ = ["HEAVY", "KIND", "RATIO", "RECOMPUTED_FILE", "Recomputed", "SCHEMA", "find", "mine", "save", "summary"]
