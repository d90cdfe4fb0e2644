"""Upcast matmuls in the captured graphs: ``mined/upcasts.json``, the rule's decision on each float32 bmm/mm.

The rule itself (exact bf16/fp16 upcasts, and the demoting variant) is ``miner.rules.upcast``: the
rewrite applies it at compile time, mining here. :func:`mine` finds every float32 matmul of the
captured graphs and records the rule's decision (``mined/upcasts.json``, ``kind: UpcastMatmuls``);
``miner generate --upcasts`` turns it into a candidate.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Iterable

from miner.core.records import CapturedGraph, NodeRecord
from miner.rules.graph import Graph
from miner.rules.upcast import MATMULS, Decision, check, node_ref

KIND, SCHEMA = "UpcastMatmuls", 1
UPCASTS_FILE = "upcasts.json"  # under mined/
LABEL = "upcast_matmul"


@dataclass(frozen=True)
class Found:
    """One float32 matmul of a captured graph and the rule's decision on it."""

    model: str
    preset: str
    mode: str
    phase: str
    graph: str  # the graph's slug, e.g. train-forward-0
    node: str
    target: str
    inputs: tuple[dict, ...]  # the matmul's operands: {shape, dtype, stride}
    output: dict  # {shape, dtype}
    sources: tuple[dict | None, ...]  # per operand: {node, dtype, shape, steps} of its upcast source
    ok: bool
    reasons: tuple[str, ...] = field(default=())
    module: str | None = None
    # the demoting rule's decision where it applies (one exact operand): {"ok", "reasons", "sources"}
    demote: dict | None = None


def _spec(rec: NodeRecord) -> dict:
    m = rec.meta[0]
    return {"shape": list(m.shape), "dtype": m.dtype, "stride": list(m.stride)}


def find(graph: CapturedGraph) -> list[Found]:
    """Every bmm/mm with a float32 output in ``graph``, with the rule's decision (low-precision ones are
    not candidates and are left out)."""
    out = []
    for rec in graph.nodes:
        if rec.op != "call_function" or rec.target not in MATMULS:
            continue
        d = check(graph, rec.name)
        if not d.applies:
            continue
        ins = tuple(_spec(graph.node(node_ref(a))) for a in rec.args[:2] if node_ref(a) is not None)
        dd = check(graph, rec.name, demote=True)
        demote = {"ok": dd.ok, "reasons": list(dd.reasons), "sources": _sources(graph, dd)} if dd.applies else None
        k = graph.key
        out.append(Found(k.model, k.preset, k.mode, k.phase, k.slug, rec.name, rec.target, ins,
                         {"shape": list(rec.meta[0].shape), "dtype": "float32"}, _sources(graph, d), d.ok,
                         d.reasons, rec.module, demote))
    return out


def _sources(graph: Graph, d: Decision) -> list[dict | None]:
    """Per operand of ``d``: {node, dtype, steps, shape[, demote]} of its upcast source (None: no upcast)."""
    out = []
    for u in d.operands:
        if u is None:
            out.append(None)
            continue
        s = {"node": u.source, "dtype": u.dtype, "steps": list(u.steps), "shape": list(graph.node(u.source).meta[0].shape)}
        if u.demote:
            s["demote"] = u.demote
        out.append(s)
    return out


def mine(graphs: Iterable[CapturedGraph]) -> dict:
    """``mined/upcasts.json``'s payload for ``graphs``: every float32 matmul and its decision.

    Returns
    -------
    dict
        ``{"schema", "kind", "graphs": [slug paths], "found": [Found as dict], "counts": {"fired",
        "declined"}, "reasons": {reason: n}}``; the same graphs give the same payload.
    """
    graphs = list(graphs)
    found = [f for g in graphs for f in find(g)]
    reasons: dict[str, int] = {}
    for f in found:
        for r in f.reasons:
            reasons[r] = reasons.get(r, 0) + 1
    return {"schema": SCHEMA, "kind": KIND, "graphs": [str(g.key) for g in graphs],
            "found": [asdict(f) for f in found],
            "counts": {"fired": sum(f.ok for f in found), "declined": sum(not f.ok for f in found),
                       "demote_fired": sum(bool(f.demote and f.demote["ok"]) for f in found)},
            "reasons": dict(sorted(reasons.items()))}


def save(workspace, payload: dict):
    """Write ``mined/upcasts.json`` atomically; returns its path."""
    from miner.core.workspace import write_json

    return write_json(workspace.mined / UPCASTS_FILE, payload)


def load(path) -> dict:
    """A ``mined/upcasts.json`` (``WorkspaceError`` when missing, corrupt or of another schema)."""
    from miner.core.workspace import read_envelope

    return read_envelope(path, KIND, SCHEMA, "miner mine --upcasts-only")


def summary(payload: dict) -> str:
    """One line: how many float32 matmuls may become bf16/fp16 GEMMs, and the commonest refusal."""
    c = payload["counts"]
    top = max(payload["reasons"].items(), key=lambda kv: kv[1], default=None)
    return (f"upcast matmuls: {c['fired']} of {c['fired'] + c['declined']} float32 bmm/mm are exact bf16/fp16 "
            f"upcasts" + (f", {c['demote_fired']} more with one operand rounded (the demoting rule)"
                          if c.get("demote_fired") else "") + (f"; commonest refusal ({top[1]}x): {top[0]}" if top else ""))


__all__ = ["Found", "KIND", "LABEL", "SCHEMA", "UPCASTS_FILE", "find", "load", "mine", "save", "summary"]
