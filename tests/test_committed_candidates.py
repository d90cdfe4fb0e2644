"""The committed candidates/ are what today's generator makes, and their kernels still pass numerics.

`candidates/<id>/` are generated files: regenerating them from the committed mined/patterns.json
must give the same pattern.py and kernel.py (else the committed files, their validation and the
GPU numbers filed into them describe some other generator), and each kernel must still match the
float64 reference on every observed shape plus the odd ones, under the Triton interpreter.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from miner.core import candidate as candidates
from miner.generate.generate import generate_one
from miner.core.pattern import load_patterns
from miner.check.validate import validate
from miner.core.workspace import Workspace

REPO = Path(__file__).resolve().parents[1]
COMMITTED = sorted(p.parent.name for p in (REPO / "candidates").glob("p*/candidate.json"))


def _body(path: Path) -> str:
    """The file without its header lines (they name the command and version, not the content)."""
    return "\n".join(ln for ln in path.read_text().splitlines() if not ln.startswith("# "))


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> Workspace:
    ws = Workspace(tmp_path_factory.mktemp("regen"))
    shutil.copytree(REPO / "mined", ws.root / "mined")
    for p in load_patterns(ws):
        if p.id in COMMITTED:
            generate_one(p, ws, "test")
    from miner.mine import regions

    for cid in COMMITTED:  # region candidates: from the regions.json their candidate.json names
        meta = json.loads((REPO / "candidates" / cid / "candidate.json").read_text())
        source = meta.get("source")
        if source and source.get("regions"):  # the pattern's id (a candidate <id>_x4 draws another stream)
            rps = {rp.id: rp for rp in regions.load((REPO / source["regions"]).parent.parent)}
            generate_one(rps[meta["pattern"]["id"]].pattern, ws, "test", source)
    return ws


def test_there_are_committed_candidates():
    assert len(COMMITTED) >= 4


@pytest.mark.parametrize("cid", COMMITTED)
def test_committed_candidate_is_what_the_generator_makes(regenerated, cid):
    for name in ("pattern.py", "kernel.py"):
        assert _body(regenerated.candidates / cid / name) == _body(REPO / "candidates" / cid / name), \
            f"candidates/{cid}/{name} is stale: regenerate with its header's command"


@pytest.mark.parametrize("cid", COMMITTED)
def test_committed_candidate_json_says_what_the_generator_says(regenerated, cid):
    """The fields a later stage reads back: a region's lowering (what `miner promote` renders from), the safety
    summary, the signature."""
    new = json.loads((regenerated.candidates / cid / "candidate.json").read_text())
    old = json.loads((REPO / "candidates" / cid / "candidate.json").read_text())
    for key in ("lowering", "safety", "signature"):
        assert new.get(key) == old.get(key), f"candidates/{cid}/candidate.json: {key} is stale"


PROMOTED = candidates.fusions_by_candidate(Workspace(REPO))  # candidate id -> its fusion


@pytest.mark.parametrize("cid", [
    pytest.param(c, marks=pytest.mark.slow) if c in PROMOTED else c for c in COMMITTED])  # slow: run by `-m slow`
def test_committed_candidate_kernel_passes_numerics(tmp_path, cid):
    """Each kernel against float64 on its observed and odd shapes. A promoted candidate's kernel is checked in the
    default run by its fusion's own module (``tests/fusions/test_<name>.py``: the kind's cases on the kernel
    ``miner promote`` rendered from this candidate), so here it runs with the slow tests."""
    ws = Workspace(tmp_path)
    shutil.copytree(REPO / "candidates" / cid, ws.candidates / cid)
    (ws.candidates / cid / "bench.json").unlink(missing_ok=True)
    v = validate(ws, cid, device="cuda" if torch.cuda.is_available() else "cpu", model=False)
    assert v.ok, v.failure
    status = candidates.status(Workspace(REPO), candidates.at(REPO / "candidates" / cid))
    assert status in ("validated", "benchmarked", "promoted"), f"{cid} is committed as {status}"
