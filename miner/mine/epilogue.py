"""GEMMs whose activation cuBLASLt's epilogue could apply, in the captured graphs: ``mined/epilogues.json``.

The rule (which ``addmm`` + activation chains may run as one ``aten._addmm_activation``) is
``miner.rules.epilogue``; the ``gemm_epilogues`` knob applies it at compile time (``miner.runtime.epilogue``).
Mining (:func:`find`) reports every addmm the rule applies to (one followed by an activation) with its verdict
and the bytes the epilogue would spare: the GEMM's output written, read back and the activation written again
by Inductor's kernel, against one activated write (:func:`spared_bytes`). ``miner mine`` prints the summary,
which names the knob that takes them and the command that measures it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable

from miner.core import dtypes
from miner.core.records import CapturedGraph
from miner.rules.epilogue import DEVICE_REASON, TARGET, check

KIND, SCHEMA = "Epilogues", 1
EPILOGUES_FILE = "epilogues.json"  # under mined/


@dataclass(frozen=True)
class Epilogue:
    """One addmm followed by an activation in a captured graph, with the rule's verdict."""

    model: str
    preset: str
    mode: str
    phase: str
    graph: str
    node: str
    shape: tuple
    dtype: str
    ok: bool
    reasons: tuple[str, ...] = ()
    activation: str | None = None
    chain: int = 0  # ops the epilogue would take over
    spared_bytes: int = 0  # what the rewrite would not move (ok only)
    module: str | None = None


def spared_bytes(shape, dtype: str) -> int:
    """Bytes one rewrite spares: Inductor's activation kernel reads the GEMM's output and writes the activation
    (two passes over the output) where the epilogue writes it activated once: one read and one write saved."""
    return 2 * math.prod(int(n) for n in shape) * dtypes.size(dtype, 0)


def find(graph: CapturedGraph) -> list[Epilogue]:
    """Every addmm of ``graph`` the rule applies to (followed by an activation), with its verdict."""
    out = []
    for rec in graph.nodes:
        if rec.target != TARGET:
            continue
        d = check(graph, rec.name)
        if not d.applies:
            continue
        meta = rec.meta[0]
        k = graph.key
        out.append(Epilogue(k.model, k.preset, k.mode, k.phase, k.slug, rec.name, tuple(meta.shape), meta.dtype,
                            d.ok, d.reasons, d.activation, len(d.chain),
                            spared_bytes(meta.shape, meta.dtype) if d.ok else 0, rec.module))  # ok: concrete sizes
    return out


def mine(graphs: Iterable[CapturedGraph]) -> dict:
    """``mined/epilogues.json``'s payload: every addmm + activation and the rule's verdict."""
    graphs = list(graphs)
    found = [f for g in graphs for f in find(g)]
    return {"schema": SCHEMA, "kind": KIND, "graphs": [str(g.key) for g in graphs],
            "found": [asdict(f) for f in found],
            "counts": {"taken": sum(f.ok for f in found), "declined": sum(not f.ok for f in found),
                       "spared_bytes": sum(f.spared_bytes for f in found)}}


def save(workspace, payload: dict):
    """Write ``mined/epilogues.json`` atomically; returns its path."""
    from miner.core.workspace import write_json

    return write_json(workspace.mined / EPILOGUES_FILE, payload)


def load(path) -> dict:
    """A ``mined/epilogues.json`` (``WorkspaceError`` when missing, corrupt or of another schema)."""
    from miner.core.workspace import read_envelope

    return read_envelope(path, KIND, SCHEMA, "miner mine")


def summary(payload: dict) -> str:
    """One line: where the rule takes GEMM + activation pairs, what they would spare, and how to measure it; or why
    it declines the ones it found."""
    found = payload["found"]
    if not found:
        return "GEMM epilogues: none (no addmm followed by an activation)"
    ok = [f for f in found if f["ok"]]
    groups: dict[tuple, list] = {}
    for f in ok:
        g = groups.setdefault((f["model"], f["mode"], f["activation"]), [0, 0])
        g[0] += 1
        g[1] += f["spared_bytes"]
    reasons: dict[str, int] = {}
    for f in found:
        if not f["ok"]:
            for r in f["reasons"]:
                reasons[r] = reasons.get(r, 0) + 1
    top = sorted(reasons.items(), key=lambda kv: -kv[1])[:2]
    declined = (f"; declined {len(found) - len(ok)}: " + "; ".join(f"{n}x {r[:100]}" for r, n in top)) if top else ""
    if not ok:
        device_only = sum(1 for f in found if len(f["reasons"]) == 1 and f["reasons"][0].startswith(DEVICE_REASON))
        cuda = (f"; {device_only} declined only for the device would be taken on CUDA (`miner scan --device cuda`, "
                f"then `miner mine` and `miner generate --epilogues mined/epilogues.json`)") if device_only else ""
        return f"GEMM epilogues: {len(found)} addmm + activation, none taken{declined}{cuda}"
    parts = [f"{m} {mode} {a} x{n} ({b / 1e6:.0f} MB)" for (m, mode, a), (n, b) in sorted(groups.items())]
    return (f"GEMM epilogues: {len(ok)} addmm + activation the rule takes ({'; '.join(parts)} spared per step)"
            f"{declined}; make them a candidate: `miner generate --epilogues mined/epilogues.json` (or measure the "
            f"knob: `miner verify --ab --models <model> --mode infer --knobs gemm_epilogues`)")


__all__ = ["EPILOGUES_FILE", "Epilogue", "KIND", "SCHEMA", "find", "load", "mine", "save", "spared_bytes",
           "summary"]
