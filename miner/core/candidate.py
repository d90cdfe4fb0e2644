"""A fusion candidate: ``candidates/<id>/`` and what each stage left there.

Each stage writes only its own files, and a candidate's status is a pure function of which
files exist (:func:`status`):

============================  =====================  ===========================================
file                          written by             status it gives
============================  =====================  ===========================================
``pattern.py``, ``kernel.py``, ``miner generate``     ``generated``
``candidate.json``
``validation.json``           ``miner validate``     ``validated`` or ``failed`` (its ``ok``),
                                                     while it names the sources it checked
``bench.json``                ``miner bench``        ``benchmarked`` (a timed row, not failed)
``fusions/<name>/fusion.json``  ``miner promote``    ``promoted`` (its ``pattern_id`` is the id)
============================  =====================  ===========================================

``candidate.json`` is written once, by ``miner generate``; nothing else rewrites it. A
``validation.json`` records a digest of the pattern.py and kernel.py it checked
(:func:`sources_digest`): after ``miner generate`` rewrites them it no longer counts (one
without a digest, from an older miner, does).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from miner.core.errors import UsageError, WorkspaceError
from miner.core.modules import load_module, module_name
from miner.core.workspace import read_json

STATUSES = ("generated", "failed", "validated", "benchmarked", "promoted")


@dataclass(frozen=True)
class Candidate:
    """One candidate folder: its id, path and ``candidate.json``; its modules are imported on first use.

    Attributes
    ----------
    id : str
        The pattern id (``candidate.json``'s ``id``).
    path : Path
        The folder.
    meta : dict
        ``candidate.json`` (see docs/architecture.md, "Candidate API").
    """

    id: str
    path: Path
    meta: dict = field(repr=False)

    @property
    def label(self) -> str:
        """A readable name (``softmax_like``, ``fused_mul_add``), or the id."""
        return str(self.meta.get("label") or self.id)

    @property
    def pattern_module(self):
        """``pattern.py``, imported once per process (``pattern``, ``replacement``, ``register``)."""
        return self._module("pattern.py", "pattern")

    @property
    def kernel_module(self):
        """``kernel.py``, imported once per process (``launch``), the same module pattern.py loads."""
        return self._module("kernel.py", "kernel")

    def _module(self, filename: str, role: str):
        path = self.path / filename
        try:
            return load_module(path, module_name(path, role))
        except FileNotFoundError:
            raise UsageError(f"{path}: missing; regenerate with `miner generate --only {self.id}`") from None
        except Exception as e:
            raise UsageError(f"{path}: import failed: {type(e).__name__}: {e}") from e


def folders(workspace) -> list[Path]:
    """Every candidate folder of ``workspace`` (one holding a ``candidate.json``), sorted."""
    return sorted(p.parent for p in workspace.candidates.glob("*/candidate.json"))


def find(workspace, ident: str) -> Path:
    """The folder of candidate ``ident``: an exact id, or a prefix of exactly one.

    Raises
    ------
    UsageError
        When no candidate matches (the message lists them) or several do (it names those).
    """
    found = folders(workspace)
    exact = [p for p in found if p.name == ident]
    matches = exact or [p for p in found if p.name.startswith(ident)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise UsageError(f"ambiguous candidate {ident!r}: {', '.join(p.name for p in matches)}")
    raise UsageError(f"unknown candidate {ident!r}; candidates: "
                     f"{', '.join(p.name for p in found) or '(none: run miner generate)'}")


def at(path: Path) -> Candidate:
    """The candidate in folder ``path``."""
    path = Path(path)
    if not (path / "candidate.json").exists():
        raise UsageError(f"{path}: not a candidate (no candidate.json)")
    meta = read_json(path / "candidate.json")
    return Candidate(str(meta.get("id", path.name)), path, meta)


def load(workspace, ident: str) -> Candidate:
    """Candidate ``ident`` (an id or a unique prefix) of ``workspace``."""
    return at(find(workspace, ident))


def load_all(workspace, idents: list[str] | None = None) -> list[Candidate]:
    """The candidates named by ``idents`` (ids or unique prefixes, in that order), or all of them."""
    if idents is None:
        return [at(p) for p in folders(workspace)]
    paths = list(dict.fromkeys(find(workspace, i) for i in idents))
    return [at(p) for p in paths]


# --------------------------------------------------------------------------- status, from files

def sources_digest(path: Path) -> str:
    """SHA-1 of the candidate's pattern.py and kernel.py: which sources a validation checked."""
    h = hashlib.sha1()
    for name in ("pattern.py", "kernel.py"):
        f = Path(path) / name
        h.update(f.read_bytes() if f.exists() else b"")
    return h.hexdigest()


def validation(path: Path) -> dict | None:
    """``validation.json`` when it checked the current sources; None when absent or stale."""
    f = Path(path) / "validation.json"
    if not f.exists():
        return None
    data = read_json(f)
    digest = data.get("sources") if isinstance(data, dict) else None
    return data if digest is None or digest == sources_digest(path) else None


def promoted_as(workspace, cid: str) -> str | None:
    """The fusion ``cid`` was promoted as (``fusions/<name>/fusion.json``), or None."""
    return fusions_by_candidate(workspace).get(cid)


def fusions_by_candidate(workspace) -> dict[str, str]:
    """candidate id -> fusion name, for every ``fusions/<name>/fusion.json`` of the workspace."""
    out: dict[str, str] = {}
    for f in sorted(workspace.fusions.glob("*/fusion.json")):
        try:
            pid = read_json(f).get("pattern_id")
        except (WorkspaceError, AttributeError):
            continue
        if pid:
            out.setdefault(str(pid), f.parent.name)
    return out


def timed(path: Path) -> bool:
    """True when ``bench.json`` holds at least one timed candidate row."""
    f = Path(path) / "bench.json"
    if not f.exists():
        return False
    try:
        runs = read_json(f).get("runs", [])
    except (WorkspaceError, AttributeError):
        return False
    return any(v.get("name") == "candidate" and v.get("timing") for r in runs for row in r.get("rows", [])
               for v in row.get("variants", []))


def status(workspace, cand: Candidate) -> str:
    """One of :data:`STATUSES`, from the files present (see the module docstring)."""
    return status_of(validation(cand.path), promoted_as(workspace, cand.id), timed(cand.path))


def status_of(validation: dict | None, fusion: str | None, timed: bool) -> str:
    """The status rule itself: promoted, else failed, else benchmarked, else validated, else generated."""
    if fusion:
        return "promoted"
    if validation is not None and not validation.get("ok"):
        return "failed"
    if timed:
        return "benchmarked"
    return "validated" if validation is not None else "generated"


def failure(cand: Candidate) -> str | None:
    """Why the current validation failed (None when it passed or there is none)."""
    v = validation(cand.path)
    return None if v is None or v.get("ok") else str(v.get("failure"))
