"""validate: numeric cases, pass/fail bookkeeping, and the rewrite firing inside torch.compile."""

import json

import pytest
import torch

import test_codegen_fixtures as F
from miner.runtime import rewrite
from miner.core import candidate as candidates
from miner.generate.generate import generate_one
from miner.check.cases import numeric_cases
from miner.check.validate import check_rewrite, validate
from miner.core.workspace import Workspace


@pytest.fixture()
def ws(tmp_path):
    return Workspace(tmp_path)


def test_numeric_cases_cover_observed_and_odd_shapes(ws):
    meta = json.loads((generate_one(F.layer_norm(), ws, "x").path / "candidate.json").read_text())
    cases = {label: (entry, variant) for label, entry, variant in numeric_cases(meta, on_cpu=True)}
    labels = " | ".join(cases)
    for want in ("observed bert/forward", "looped", "odd row length 37", "one row", "long row 8229", "bfloat16"):
        assert want in labels
    entry, variant = cases["odd row length 37"]
    assert [i["shape"] for i in entry["inputs"]] == [[2, 8, 37], [37], [37]]  # weight/bias follow the row
    entry, _ = cases["one row"]
    assert entry["inputs"][0]["shape"] == [1, 1, 32]


def test_validate_numerics_only_marks_validated(ws):
    r = generate_one(F.rms_norm(), ws, "x")
    written = (r.path / "candidate.json").read_bytes()
    v = validate(ws, r.id, device="cpu", model=False)
    assert v.ok, v.failure
    assert (r.path / "candidate.json").read_bytes() == written  # generate's file: validate writes its own
    saved = json.loads((r.path / "validation.json").read_text())
    assert candidates.status(ws, candidates.load(ws, r.id)) == "validated"
    assert saved["ok"] and saved["model"] is False and len(saved["checks"]) >= 8
    assert all(c["kind"] == "numerics" and c["ok"] for c in saved["checks"])


def test_a_wrong_kernel_fails_with_the_reason(ws):
    r = generate_one(F.exp_softmax(), ws, "x")
    kernel = r.path / "kernel.py"
    kernel.write_text(kernel.read_text().replace("v2 = (v0 / v1)", "v2 = (v0 / v1) * 1.001"))
    v = validate(ws, r.id, device="cpu", model=False)
    assert not v.ok and "elements outside rtol=1e-05" in v.failure
    cand = candidates.load(ws, r.id)
    assert candidates.status(ws, cand) == "failed" and candidates.failure(cand) == v.failure
    generate_one(F.exp_softmax(), ws, "x")  # regenerated: that validation checked other sources
    assert candidates.status(ws, cand) == "generated" and candidates.failure(cand) is None


def test_rewrite_fires_in_torch_compile_and_matches_eager(ws):
    cand = candidates.load(ws, generate_one(F.softmax(), ws, "x").id)
    graph_pass = rewrite.FusionPass([rewrite.entry_for(cand.path / "pattern.py", cand.id, cand.pattern_module)])
    x = torch.randn(2, 4, 8, 8)
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True):
        f = torch.compile(lambda t: torch.softmax(t, -1), options=rewrite.inductor_options(graph_pass), dynamic=False)
        out = f(x)
    torch._dynamo.reset()
    assert graph_pass.counts[cand.id] == 1
    torch.testing.assert_close(out, torch.softmax(x, -1))


def test_pass_uuid_hashes_the_sources(ws):
    cand = candidates.load(ws, generate_one(F.silu_mul(), ws, "x").id)
    entry = rewrite.entry_for(cand.path / "pattern.py", cand.id, cand.pattern_module)
    before = rewrite.FusionPass([entry]).uuid()
    (cand.path / "kernel.py").write_text((cand.path / "kernel.py").read_text() + "\n# edited\n")
    assert rewrite.FusionPass([entry]).uuid() != before


def test_extra_check_declines_cpu_without_the_interpreter(monkeypatch):
    t = torch.empty(2, 8)
    assert rewrite.device_reasons([t]) == []
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert rewrite.device_reasons([t]) == ["device: CPU tensors need the Triton interpreter (TRITON_INTERPRET=1)"]
    assert rewrite.device_reasons([t, torch.empty(2, 8, device="meta")])[0].startswith("device: inputs on several")


@pytest.mark.slow
def test_rewrite_proven_on_a_zoo_model(ws):
    cand = candidates.load(ws, generate_one(F.layer_norm(shape=(2, 64, 128)), ws, "x").id)
    check = check_rewrite(cand, "bert", "train")
    assert check.ok, check.detail
    assert check.matches > 0
