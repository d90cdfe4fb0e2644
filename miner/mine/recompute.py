"""Values Inductor recomputes per element of a broadcast, in the captured graphs: ``mined/recomputed.json``.

The rule (which small, expensive values to compute once) is ``miner.rules.recompute``; the rewrite
applies it at compile time. Mining (:func:`find`) reports every expensive value (``rule.expensive``)
that the captured node-to-kernel map (``NodeRecord.kernels``, one entry per kernel call site) shows
inside a kernel at least ``rule.RATIO`` times its size, or in two or more kernels, with the rule's
verdict, its family (one candidate each), its kernel call sites and an estimate of what computing it
once would spare (:func:`predicted_us`); ``mined/recomputed.json`` (``kind: Recomputed``) lists them.
The rewrite that follows from this report is the compute-once candidate (``miner generate
--recomputed``; tests/test_recompute.py checks the mechanism on Inductor's CPU backend).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Iterable

from miner.core import dtypes
from miner.core.records import CapturedGraph
from miner.rules.recompute import HEAVY, INT_DIV, KEY_INPUT, LOOKUP, RATIO, check, expensive, family, static_numel

KIND, SCHEMA = "Recomputed", 2
# What one element of a value costs to recompute, in simple ops (a libdevice transcendental is tens of
# instructions; a lookup an index load and a gather), and the H200's CUDA-core rate (67e12 FP32 ops/s,
# NVIDIA's datasheet): ``predicted_us`` is an estimate to rank by, the step measures.
# A lookup also reads its index per element, where computing it once reads the value instead: the bytes
# saved, at the H200's HBM rate (4.8e12 B/s; an upper bound, the index is mostly read from cache).
OP_COST = {**{t: 16 for t in HEAVY}, **{t: 2 for t in LOOKUP}, **{t: 4 for t in INT_DIV}}
OPS_PER_S, BYTES_PER_S = 67e12, 4.8e12
RECOMPUTED_FILE = "recomputed.json"  # under mined/


@dataclass(frozen=True)
class Recomputed:
    """One expensive value of a captured graph recomputed in a broadcast kernel or in several kernels."""

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
    family: str | None = None  # rule.FAMILIES: the candidate it belongs to
    args: int = 1  # the op's positional arguments ...
    kwargs: tuple[str, ...] = ()  # ... and keyword arguments (the pattern's shape)
    key: int = 0  # the input whose size is the value's (the pattern's x0, the gate's signature)
    broadcast_sites: int = 0  # kernel call sites at least RATIO times its size
    predicted_us: float = 0.0  # element-ops those sites recompute / OPS_PER_S + index bytes / BYTES_PER_S


def _site_ops(graph: CapturedGraph, name: str, site: str) -> int:
    """The cost (:data:`OP_COST`, 1 for other ops) of the value's own computation that kernel call site
    ``site`` holds: the value and its producers inlined into the same kernel."""
    seen, stack, cost = {name}, [name], 0
    while stack:
        rec = graph.node(stack.pop())
        if rec.op != "call_function" or site not in {k.name for k in rec.kernels} or rec.category == "view":
            continue
        cost += OP_COST.get(rec.target, 1)
        for _, p in rec.inputs():
            if p not in seen:
                seen.add(p)
                stack.append(p)
    return cost


def _index_bytes(graph: CapturedGraph, rec) -> int:
    """Bytes per element a lookup ``rec`` reads beyond its value (its index's itemsize less the value's;
    0 for other ops)."""
    if rec.target not in LOOKUP:
        return 0
    refs = [p for pos, p in rec.inputs() if pos == KEY_INPUT.get(rec.target, 0)]
    idx = graph.node(refs[0]) if refs else None
    if idx is None or not idx.meta:
        return 0
    return max(0, dtypes.size(idx.meta[0].dtype, 0) - dtypes.size(rec.meta[0].dtype, 0))


def find(graph: CapturedGraph) -> list[Recomputed]:
    """Every expensive value of ``graph`` (``rule.expensive``) the kernel map shows in a kernel call site
    at least ``RATIO`` times its size, or in two or more sites, with the rule's verdict (:func:`check`)."""
    by_kernel: dict[str, list] = defaultdict(list)
    for rec in graph.nodes:
        for k in rec.kernels:
            by_kernel[k.name].append(rec)
    out = []
    for rec in graph.nodes:
        if not expensive(graph, rec.name):
            continue
        numel = static_numel(rec.meta[0].shape)
        sites = tuple(dict.fromkeys(k.name for k in rec.kernels if k.kind != "extern"))
        largest = [max((static_numel(r.meta[0].shape) or 0 for r in by_kernel[s] if r.meta), default=0) for s in sites]
        wide = [(s, n) for s, n in zip(sites, largest) if numel and n >= RATIO * numel]
        if len(sites) < 2 and not wide:
            continue
        d = check(graph, rec.name)
        k = graph.key
        ops = sum(n * _site_ops(graph, rec.name, s) for s, n in wide)
        saved = sum(n for _, n in wide) * _index_bytes(graph, rec)
        out.append(Recomputed(k.model, k.preset, k.mode, k.phase, k.slug, rec.name, rec.target,
                              tuple(rec.meta[0].shape), sites, min(largest), d.ok, d.reasons, rec.module,
                              family(rec.target), len(rec.args), tuple(sorted(rec.kwargs)),
                              KEY_INPUT.get(rec.target, 0), len(wide),
                              round((ops / OPS_PER_S + saved / BYTES_PER_S) * 1e6, 2)))
    return out


def mine(graphs: Iterable[CapturedGraph]) -> dict:
    """``mined/recomputed.json``'s payload: every recomputed expensive value and the rule's verdict."""
    graphs = list(graphs)
    found = [f for g in graphs for f in find(g)]
    return {"schema": SCHEMA, "kind": KIND, "graphs": [str(g.key) for g in graphs],
            "found": [asdict(f) for f in found],
            "counts": {"realizable": sum(f.ok for f in found), "declined": sum(not f.ok for f in found),
                       "kernel_sites": sum(len(f.kernels) for f in found if f.ok),
                       "predicted_us": round(sum(f.predicted_us for f in found if f.ok), 2)}}


def save(workspace, payload: dict):
    """Write ``mined/recomputed.json`` atomically; returns its path."""
    from miner.core.workspace import write_json

    return write_json(workspace.mined / RECOMPUTED_FILE, payload)


def summary(payload: dict) -> str:
    """One line: which small, expensive values are recomputed in how many kernels, and the estimate."""
    ok = [f for f in payload["found"] if f["ok"]]
    if not ok:
        return "recomputed values: none (no small expensive value is recomputed per element of a broadcast)"
    groups: dict[tuple, list] = defaultdict(lambda: [0, 0.0])
    for f in ok:
        g = groups[(f["model"], f["target"].split(".")[1], tuple(f["shape"]))]
        g[0] += len(f["kernels"])
        g[1] += f.get("predicted_us", 0.0)
    parts = [f"{m} {op}{list(s)} in {n} kernels (~{us:g} us)" for (m, op, s), (n, us) in sorted(groups.items())]
    return (f"recomputed values: {len(ok)} small, expensive values recomputed per element in "
            f"{payload['counts']['kernel_sites']} kernel call sites ({'; '.join(parts)}): computed once, "
            f"those kernels would load them (~: element-ops recomputed at the H200's CUDA-core rate, an "
            f"estimate; the step measures)")


def load(path) -> dict:
    """A ``mined/recomputed.json`` (``WorkspaceError`` when missing, corrupt or of another schema)."""
    from miner.core.workspace import read_envelope

    return read_envelope(path, KIND, SCHEMA, "miner mine")


__all__ = ["KIND", "RECOMPUTED_FILE", "Recomputed", "SCHEMA", "find", "load", "mine", "save", "summary"]
