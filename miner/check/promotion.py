"""The promotion rule: a candidate is promoted only on a measured in-model step win.

``miner promote`` calls :func:`require_in_model_win`: the candidate needs, from ``miner verify
--ab`` on a CUDA machine, a step faster beyond the control's noise band on at least one zoo model
with the fusion alone, and no model where it fires and the step is slower. Otherwise it refuses
with the numbers, or, without any GPU evidence, names the ``miner verify`` command that produces it.

Evidence for candidate ``<id>``: ``candidates/<id>/in_model.json`` (``miner verify --ab --candidates
<id> --record``, or ``--record-from`` a saved run) and the ``in_model`` records of a promoted
fusion made from the same pattern (``fusions/<name>/wins.json``, re-promotion).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from miner.core.errors import UsageError


def evidence_path(workspace: Any, cid: str) -> Path:
    """``candidates/<cid>/in_model.json`` of ``workspace`` (``miner.runtime.evidence.evidence_file``)."""
    from miner.runtime.evidence import evidence_file

    return evidence_file(_root(workspace), cid, fusion=False)


def write_evidence(workspace: Any, cid: str, records: list) -> Path:
    """Merge ``records`` into ``candidates/<cid>/in_model.json`` (``miner.runtime.evidence.write``)."""
    from miner.runtime import evidence

    return evidence.write(evidence_path(workspace, cid), cid, records)


def records_for(workspace: Any, cid: str) -> list:
    """Every in-model record (``InModelRecord``) for candidate ``cid``: its own file, and fusions promoted from it."""
    from miner.runtime import evidence
    from miner.runtime.fusions import promoted_from

    root = _root(workspace)
    records = evidence.read(evidence_path(root, cid))
    for name in promoted_from(root, cid):
        records += evidence.read(evidence.evidence_file(root, name, fusion=True))
    return records


def require_in_model_win(workspace: Any, cid: str) -> list:
    """The records that allow promoting ``cid``; ``UsageError`` (with the numbers) when they do not."""
    records = [r for r in records_for(workspace, cid) if r.matches is None or r.matches]
    if not records:
        models, modes = observed_in(workspace, cid)
        raise UsageError(
            f"candidate {cid} has no in-model GPU evidence; on a CUDA machine run `miner verify --ab --candidates "
            f"{cid} --models {models} --mode {modes} --record` (or `--out DIR`, then here "
            f"`miner verify --record-from DIR/verify.json`)")
    # per compile mode, as the gate decides (miner.runtime.evidence.decide): a loss vetoes its own mode only
    losses = [r for r in records if r.verdict == "loss"]
    losing = {r.compile for r in losses}
    if not any(r.verdict == "win" and r.compile not in losing for r in records):
        if losses:
            raise UsageError(f"candidate {cid} makes the step slower where it fires: "
                             + "; ".join(r.describe(full=True) for r in losses) + " (in-model A/B, fusion alone)"
                             + " and wins in no other compile mode")
        raise UsageError(f"candidate {cid} has no step win beyond noise on any zoo model: "
                         + "; ".join(r.describe(full=True) for r in records))
    return records


def observed_in(workspace: Any, cid: str) -> tuple[str, str]:
    """(``--models``, ``--mode``) of the graphs candidate ``cid`` was mined from (its
    ``candidate.json`` occurrences: a backward or forward graph is a training step); the four zoo
    models in both modes when it records none."""
    from miner.check.checks import phase_modes
    from miner.core import candidate as candidates

    try:
        occ = candidates.at(_root(workspace) / "candidates" / cid).meta.get("occurrences") or {}
    except Exception:  # noqa: BLE001 - a hint only: the error it belongs to says what is missing
        occ = {}
    if not occ:
        return "bert,gpt2,llama,t5", "train,infer"
    return ",".join(sorted(occ)), ",".join(phase_modes(ph for per in occ.values() for ph in per))


def carry_into(wins_path: Path, name: str, records: list) -> Path:
    """Merge ``records`` into the promoted fusion's ``wins.json`` (the gate's evidence)."""
    from miner.runtime import evidence

    return evidence.write(wins_path, name, records)


def _root(workspace: Any) -> Path:
    """A workspace's root folder (a ``Workspace`` or a path)."""
    from miner.core.workspace import Workspace

    return Path(workspace.root if isinstance(workspace, Workspace) else workspace)
