"""promote: refuses what is not validated, writes the fusion folder, its test and the registry."""

import json

import pytest

import test_codegen_fixtures as F
from miner.errors import UsageError
from miner.generate import generate_one
from miner.promote import promote
from miner.validate import validate
from miner.workspace import Workspace


@pytest.fixture()
def ws(tmp_path):
    return Workspace(tmp_path)


def test_refuses_a_generated_candidate(ws):
    r = generate_one(F.exp_softmax(), ws, "x")
    with pytest.raises(UsageError, match=f"candidate {r.id} is not validated \\(status generated\\)"):
        promote(ws, r.id, "softmax_like")


def test_refuses_a_failed_candidate_with_its_reason(ws):
    r = generate_one(F.exp_softmax(), ws, "x")
    kernel = r.path / "kernel.py"
    kernel.write_text(kernel.read_text().replace("v2 = (v0 / v1)", "v2 = (v0 / v1) * 2.0"))
    validate(ws, r.id, device="cpu", model=False)
    with pytest.raises(UsageError, match="status failed: numerics"):
        promote(ws, r.id, "softmax_like")


def test_refuses_numerics_only_validation(ws):
    r = generate_one(F.exp_softmax(), ws, "x")
    validate(ws, r.id, device="cpu", model=False)
    with pytest.raises(UsageError, match="without proving the rewrite"):
        promote(ws, r.id, "softmax_like")


def test_refuses_bad_names_and_unknown_ids(ws):
    with pytest.raises(UsageError, match="lower_snake_case"):
        promote(ws, "p0", "Softmax")
    with pytest.raises(UsageError, match="unknown candidate"):
        promote(ws, "p0", "softmax_like")


def test_promote_writes_fusion_test_and_registry(ws):
    r = generate_one(F.exp_softmax(), ws, "x")
    v = validate(ws, r.id, device="cpu", model=False)
    # The model check is slow (tests/test_validate.py covers it); record one as validate would.
    saved = json.loads((r.path / "validation.json").read_text())
    saved["checks"].append({"kind": "rewrite", "case": "bert/tiny/train", "ok": True, "detail": "1 match(es)"})
    (r.path / "validation.json").write_text(json.dumps(saved))
    assert v.ok
    out = promote(ws, r.id, "softmax_like")
    folder = ws.fusions / "softmax_like"
    pattern = (folder / "pattern.py").read_text()
    assert 'OP_NAME = "miner::softmax_like"' in pattern
    assert "from fusions.softmax_like import kernel as _kernel_module" in pattern
    assert pattern.splitlines()[1] == f"# Do not edit; regenerate with: miner promote {r.id} --name softmax_like"
    assert "def launch(x0, *, variant=None)" in (folder / "kernel.py").read_text()
    registry = (ws.fusions / "__init__.py").read_text()
    assert '"softmax_like": "fusions.softmax_like"' in registry
    test = (ws.root / "tests" / "fusions" / "test_softmax_like.py").read_text()
    assert "@pytest.mark.gpu" in test and "@pytest.mark.slow" in test
    compile(test, "test_softmax_like.py", "exec")
    assert json.loads((r.path / "candidate.json").read_text())["promoted_as"] == "softmax_like"
    assert len(out.files) == 6
