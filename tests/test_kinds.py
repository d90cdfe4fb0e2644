"""The registry of candidate kinds (miner/kinds.py): every committed candidate has one, every name it gives resolves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from miner import kinds
from miner.core.errors import UsageError
from miner.core.workspace import Workspace

REPO = Path(__file__).resolve().parents[1]
ROLES = ("generator", "checks", "fusion_files", "test_cases")


@pytest.mark.parametrize("name", sorted(kinds.KINDS))
def test_every_function_a_kind_names_exists(name):
    kind = kinds.get(name)
    for role in ROLES:
        ref = getattr(kind, role)
        assert ref is None or callable(kinds.resolve(ref)), (name, role, ref)
    assert (kind.test_cases is None) == (kind.harness is None) == (kind.fusion_files is None)
    if kind.harness:
        assert (REPO / "tests" / "harness" / f"{kind.harness}.py").is_file()


def test_an_unknown_kind_is_refused_naming_the_known_ones():
    with pytest.raises(UsageError, match="known kinds: row_kernel, region_kernel, reduce_region"):
        kinds.get("no_such_kind")


def _kind(cid: str) -> str:
    return kinds.kind_of(json.loads((REPO / "candidates" / cid / "candidate.json").read_text())).name


def test_each_committed_candidate_has_its_kind():
    found = {p.parent.name: _kind(p.parent.name) for p in (REPO / "candidates").glob("*/candidate.json")}
    assert found["p0a74f99f77"] == "row_kernel" and found["p010eaa2cbb"] == "region_kernel"
    assert found["p4a7fd15d60_x4"] == "region_kernel" and found["p86f4808f37"] == "reduce_region"
    assert found["u14efa34ee3"] == "upcast_matmul" and found["d5aa0b7b520"] == "demote_matmul"
    assert found["r539936e2f4"] == "compute_once"
    assert set(found.values()) == set(kinds.KINDS)


def test_promote_refuses_a_kind_it_cannot_render_yet(monkeypatch):
    import dataclasses

    from miner.promote import promote

    cid = "p86f4808f37"  # every kind renders its fusion today: one made not to, as a new kind starts
    unrendered = dataclasses.replace(kinds.get(_kind(cid)), fusion_files=None, test_cases=None, harness=None)
    monkeypatch.setitem(kinds.KINDS, unrendered.name, unrendered)
    with pytest.raises(UsageError, match=f"is a {_kind(cid)} .*cannot render its fusion yet"):
        promote(Workspace(REPO), cid, "never_written")
    assert not (REPO / "fusions" / "never_written").exists()


def test_a_kind_that_renders_asks_for_the_in_model_evidence_first(tmp_path):
    import shutil

    from miner.promote import promote

    ws = Workspace(tmp_path)  # the committed reduction, without the in-model record it was promoted on
    shutil.copytree(REPO / "candidates" / "p86f4808f37", ws.candidates / "p86f4808f37")
    (ws.candidates / "p86f4808f37" / "in_model.json").unlink(missing_ok=True)
    with pytest.raises(UsageError, match="p86f4808f37 has no in-model GPU evidence.*--record"):
        promote(ws, "p86f4808f37", "never_written")
    assert not (ws.fusions / "never_written").exists()


def test_each_fusion_test_module_names_its_kinds_harness():
    for path in sorted((REPO / "tests" / "fusions").glob("test_*.py")):
        name = path.stem.removeprefix("test_")
        fusion = json.loads((REPO / "fusions" / name / "fusion.json").read_text())
        kind = kinds.kind_of(json.loads((REPO / "candidates" / fusion["pattern_id"] / "candidate.json").read_text()))
        assert f'globals().update(bind("{kind.harness}", CASES))' in path.read_text(), path
