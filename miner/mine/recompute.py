"""Values Inductor recomputes in several kernels, in the captured graphs: ``mined/recomputed.json``.

The rule (which small transcendental values to compute once) is ``miner.rules.recompute``; the
rewrite applies it at compile time. Mining (:func:`find`) reports the values the captured
node-to-kernel map (``NodeRecord.kernels``, one entry per kernel call site) shows in two or more
kernels, with the rule's verdict; ``mined/recomputed.json`` (``kind: Recomputed``) lists them with
their kernels. The rewrite that follows from this report is the compute-once candidate
(``miner generate --recomputed``; tests/test_recompute.py checks the mechanism on Inductor's CPU
backend).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Iterable

from miner.core.records import CapturedGraph
from miner.rules.recompute import HEAVY, check, static_numel

KIND, SCHEMA = "Recomputed", 1
RECOMPUTED_FILE = "recomputed.json"  # under mined/


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


def find(graph: CapturedGraph) -> list[Recomputed]:
    """Every :data:`HEAVY` value of ``graph`` the kernel map shows in two or more kernel call sites,
    with the rule's verdict (:func:`check`)."""
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
        d = check(graph, rec.name)
        largest = [max((static_numel(r.meta[0].shape) or 0 for r in by_kernel[s] if r.meta), default=0) for s in sites]
        k = graph.key
        out.append(Recomputed(k.model, k.preset, k.mode, k.phase, k.slug, rec.name, rec.target,
                              tuple(rec.meta[0].shape), sites, min(largest), d.ok, d.reasons, rec.module))
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


def load(path) -> dict:
    """A ``mined/recomputed.json`` (``WorkspaceError`` when missing, corrupt or of another schema)."""
    from miner.core.workspace import read_envelope

    return read_envelope(path, KIND, SCHEMA, "miner mine")


__all__ = ["KIND", "RECOMPUTED_FILE", "Recomputed", "SCHEMA", "find", "load", "mine", "save", "summary"]
