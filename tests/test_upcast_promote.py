"""The upcast-matmul candidate through the pipeline's own verbs: ``miner validate`` (what runs on a CPU,
what is recorded as not run), ``miner promote`` (refused without an in-model win, a gated fusion with
one), and the review's decision table (``miner candidates``). CPU, fast; the CUDA half of ``validate``
is ``test_validate_on_cuda`` (``-m gpu``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from miner.check import upcast as checks
from miner.check.validate import validate
from miner.core import candidate as candidates
from miner.core.workspace import Workspace
from miner.generate import upcast as gen
from miner.rules import upcast

REPO = Path(__file__).resolve().parents[1]
CID = gen.candidate_id()


@pytest.fixture
def ws(tmp_path) -> Workspace:
    """A workspace holding the committed upcast candidate as ``miner generate`` wrote it (nothing else:
    not the validation, GPU evidence or bench files later stages added in the checkout)."""
    (tmp_path / "candidates").mkdir()
    shutil.copytree(REPO / "candidates" / CID, tmp_path / "candidates" / CID,
                    ignore=shutil.ignore_patterns("validation.json", "in_model.json", "bench.json"))
    return Workspace(tmp_path)


# --------------------------------------------------------------------------- validate

def test_validate_on_cpu_runs_the_graph_checks_and_marks_the_cuda_ones_not_run(ws):
    v = validate(ws, CID, device="cpu")
    data = json.loads((ws.candidates / CID / "validation.json").read_text())
    assert data["ok"] is True and data["model"] is False and data["device"] == "cpu" and data["failure"] is None
    by_kind = {}
    for c in data["checks"]:
        by_kind.setdefault(c["kind"], []).append(c)
    # no CUDA check claimed on the CPU: the .dtype GEMM and the compiled model did not run
    assert by_kind["numerics"] and all(c["ok"] is None and c["device"] == "cpu" for c in by_kind["numerics"])
    assert [c["ok"] for c in by_kind["rewrite"]] == [None] and "not proven on cpu" in by_kind["rewrite"][0]["detail"]
    graph = by_kind["graph"]
    assert [c["ok"] for c in graph] == [True, True], graph
    assert graph[0]["matches"] == 1 and "is not exact" in graph[0]["detail"]  # QK^T fires, PV declines
    assert graph[1]["max_abs"] == 0.0  # the emulated GEMM computes exactly what the chain did
    assert candidates.status(ws, candidates.load(ws, CID)) == "validated" and v.ok


def test_validate_fails_when_the_rewrite_does_not_fire_on_the_mined_chain(ws, monkeypatch):
    monkeypatch.setattr(upcast, "UNIT_MULS", frozenset())  # k's multiplication by 1.0 no longer passes the rule
    v = validate(ws, CID, device="cpu", model=False)
    assert not v.ok and v.failure.startswith("graph ") and "0 matches, expected 1" in v.failure
    assert candidates.status(ws, candidates.load(ws, CID)) == "failed"


def test_validate_command_validates_the_upcast_candidate(ws, capsys):
    from miner import cli

    assert cli.main(["--workspace", str(ws.root), "validate", CID, "--device", "cpu", "--no-model"]) == 0
    out = capsys.readouterr().out
    assert "skip numerics" in out and "ok   graph" in out and "not run on cpu" in out
    assert "is not validated here" not in out


def test_gemm_verdict_allows_the_replaced_gemms_error_and_no_more():
    ref = torch.linspace(-1, 1, 64, dtype=torch.float64).reshape(8, 8)
    exact = ref.float()
    assert checks.compare_gemm(exact, exact, ref)[0]
    fp32 = ref.float() + 1e-4  # the float32 GEMM it replaces is off by 1e-4
    assert checks.compare_gemm(ref.float() + 1.5e-4, fp32, ref)[0]
    ok, max_abs, _, detail = checks.compare_gemm(ref.float() + 5e-4, fp32, ref)
    assert not ok and max_abs == pytest.approx(5e-4, rel=1e-2) and "max abs 1.00e-04" in detail
    assert not checks.compare_gemm(ref.double(), fp32, ref)[0]  # a float64 output is not what the rewrite makes


def test_numeric_entries_cover_observed_fp16_and_mm():
    meta = candidates.at(REPO / "candidates" / CID).meta
    labels = [label for label, _ in checks.numeric_entries(meta)]
    assert len(labels) == len(meta["observed"]) + 2
    assert labels[-2].endswith("float16") and labels[-1].startswith("mm [512,64]x[64,512]")


def test_a_chain_the_shapes_do_not_describe_is_not_run():
    entry = {"sources": [{"shape": [2, 3], "dtype": "bfloat16"}] * 2, "float32_inputs": [{"shape": [2, 3]}] * 2}
    assert checks.attention_chain(entry) is None
    cand = candidates.at(REPO / "candidates" / CID)
    assert checks.check_graph(cand.pattern_module, CID, entry).ok is None


def test_model_check_compiles_steps_and_compares_and_fails_when_nothing_fires(monkeypatch):
    """check_model's plumbing on the CPU (the CUDA path with a stand-in model): the candidate declines every
    CPU matmul, so 0 matches is a failed check, while the two compiled steps agree."""
    import warnings

    from miner_models.base import Built

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(2, 4, 3))

        def forward(self, q):
            return torch.bmm(q.float(), self.w)

    torch.manual_seed(0)
    built = Built(Tiny(), {"q": torch.randn(2, 5, 4).to(torch.bfloat16)}, lambda out: out.float().square().mean())
    monkeypatch.setattr(checks, "models_build", lambda model, mode, device: built)
    cand = candidates.at(REPO / "candidates" / CID)
    with warnings.catch_warnings():  # CUDA autocast asked for on CPU tensors (or without CUDA): no effect
        warnings.simplefilter("ignore")
        c = checks.check_model(cand.pattern_module, CID, "tiny", "train", "cuda")
    assert c.ok is False and c.matches == 0 and c.detail.startswith("the rewrite did not fire (0 matches)")
    assert c.max_rel == 0.0 and c.device == "cuda"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_validate_on_cuda(ws):
    v = validate(ws, CID, device="cuda")
    assert v.ok and v.model, v.failure
    assert all(c.ok is True for c in v.checks), [(c.case, c.detail) for c in v.checks if c.ok is not True]


# --------------------------------------------------------------------------- promote

def _cuda_validation(ws: Workspace) -> None:
    """A validation.json as `miner validate --device cuda` writes it when every check passed (synthetic)."""
    from miner.core.workspace import write_json

    checks_ = [{"kind": "numerics", "case": "t5 forward", "ok": True, "device": "cuda"},
               {"kind": "graph", "case": "t5 attention chain", "ok": True, "device": "cpu (fake cuda tensors)"},
               {"kind": "rewrite", "case": "t5/tiny/train (cuda)", "ok": True, "matches": 4, "device": "cuda"}]
    write_json(ws.candidates / CID / "validation.json",
               {"id": CID, "ok": True, "failure": None, "device": "cuda", "model": True, "checks": checks_,
                "sources": candidates.sources_digest(ws.candidates / CID)})


def _record(verdict: str, speedup: float, contexts: dict | None = None, model: str = "t5") -> dict:
    return {"model": model, "mode": "train", "compile": "default", "preset": "base", "speedup": speedup,
            "band": 0.004, "verdict": verdict, "matches": 24, "contexts": contexts or {}, "gpu": "synthetic",
            "date": "2026-12-03T00:00:00+00:00"}


def test_promote_refuses_a_cpu_validation_naming_the_cuda_command(ws):
    from miner.core.errors import UsageError
    from miner.promote import promote

    validate(ws, CID, device="cpu")
    with pytest.raises(UsageError, match=rf"not proven on cpu.*miner validate {CID} --device cuda"):
        promote(ws, CID, "upcast_matmul")
    assert not (ws.root / "fusions").exists()


def test_promote_refuses_without_in_model_evidence_and_with_a_loss(ws):
    from miner.check.promotion import write_evidence
    from miner.core.errors import UsageError
    from miner.promote import promote

    _cuda_validation(ws)
    with pytest.raises(UsageError, match=rf"no in-model GPU evidence.*--candidates {CID}"):
        promote(ws, CID, "upcast_matmul")
    write_evidence(ws, CID, [_record("win", 1.04), _record("loss", 0.97, model="llama")])
    with pytest.raises(UsageError, match=r"makes the step slower where it fires: llama train/default B16 S512 0.970x"):
        promote(ws, CID, "upcast_matmul")
    assert not (ws.root / "fusions").exists()


def _fusion_context(module, entry, gate_open: bool = False) -> tuple:
    """(Context the gate saw for the chain's QK^T match, fired) running the promoted fusion on the chain."""
    _, p, _, _ = checks.rewrite_chain(module, "upcast_matmul", entry, gate_open=gate_open)
    (ctx,) = p.log.contexts["upcast_matmul"]
    return ctx, p.counts["upcast_matmul"]


def test_promote_refuses_a_name_whose_test_module_name_is_taken(ws):
    from miner.check.promotion import write_evidence
    from miner.core.errors import UsageError
    from miner.promote import promote

    _cuda_validation(ws)
    write_evidence(ws, CID, [_record("win", 1.04)])
    (ws.root / "tests").mkdir()
    (ws.root / "tests" / "test_upcast_matmul.py").write_text("")
    with pytest.raises(UsageError, match=r"would share its module name with .*tests/test_upcast_matmul.py"):
        promote(ws, CID, "upcast_matmul")
    assert not (ws.root / "fusions").exists()
    assert promote(ws, CID, "upcast_gemm").name == "upcast_gemm"


def test_promote_with_a_win_writes_a_gated_fusion_that_fires_only_where_it_won(ws):
    from miner.check.promotion import write_evidence
    from miner.promote import promote
    from miner.runtime import evidence, fusions, rewrite

    _cuda_validation(ws)
    write_evidence(ws, CID, [_record("win", 1.04)])  # a win, no context measured yet
    done = promote(ws, CID, "upcast_matmul")
    folder = ws.root / "fusions" / "upcast_matmul"
    assert {p.name for p in done.files} >= {"pattern.py", "kernel.py", "fusion.json", "wins.json", "__init__.py",
                                            "test_upcast_matmul.py"}
    fusion = json.loads((folder / "fusion.json").read_text())
    assert fusion["pattern_id"] == CID and fusion["validation"]["device"] == "cuda"
    assert rewrite.load_wins(folder / "wins.json")["in_model"]["records"][0]["speedup"] == 1.04
    assert candidates.status(ws, candidates.load(ws, CID)) == "promoted"
    module = fusions.load(ws.root, "upcast_matmul")
    assert module.OP_NAME == "miner::upcast_matmul" and module.PATTERN_ID == CID
    assert module.WINS["in_model"]["records"][0]["verdict"] == "win"
    # the candidate's own pattern.py stays ungated: the fusion differs from it by the gate alone
    cand_src = (ws.candidates / CID / "pattern.py").read_text()
    assert "wins_gate" not in cand_src and "rewrite.wins_gate(match, WINS, N_INPUTS)" in (folder / "pattern.py").read_text()

    entry = candidates.load(ws, CID).meta["observed"][0]
    ctx, fired = _fusion_context(module, entry)
    assert fired == 0  # no in-model record covers this context: unmeasured, declined
    module.WINS = evidence.with_records(module.WINS, "upcast_matmul", [_record("win", 1.04, {ctx.site: 24})])
    assert _fusion_context(module, entry)[1] == 1  # measured as a win there: fires
    module.WINS = evidence.with_records(module.WINS, "upcast_matmul", [_record("loss", 0.98, {ctx.site: 24})])
    assert _fusion_context(module, entry)[1] == 0  # re-measured as a loss: declines again
    assert _fusion_context(module, entry, gate_open=True)[1] == 1


def test_promoted_fusion_is_cache_safe_and_its_generated_test_passes(ws, tmp_path):
    import subprocess
    import sys

    from miner.check.promotion import write_evidence
    from miner.promote import promote
    from miner.runtime import fusions

    _cuda_validation(ws)
    write_evidence(ws, CID, [_record("win", 1.04)])
    promote(ws, CID, "upcast_matmul")
    uuid = fusions.graph_pass(ws.root).uuid()
    write_evidence(ws, CID, [_record("win", 1.06)])
    promote(ws, CID, "upcast_matmul")  # re-measured: new evidence in wins.json, so a new cache key
    assert fusions.graph_pass(ws.root).uuid() != uuid
    test = ws.root / "tests" / "fusions" / "test_upcast_matmul.py"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
                         cwd=ws.root, capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "failed" not in run.stdout


# --------------------------------------------------------------------------- review

def _ab(model: str, speedup: float, band: float = 0.004, date: str = "2026-12-04T10:00:00Z"):
    """A `miner verify --ab --candidates <id>` result (synthetic): the candidate alone (``all``) in a t5 step."""
    from miner.check import ab
    from miner.check.verify import Parity, StepStats

    base = StepStats(100.0, 99.5, 100.5, 15, 10 * 2**30, 1.0)
    fused = StepStats(100.0 / speedup, 99.5 / speedup, 100.5 / speedup, 15, 10 * 2**30, 1.0)
    return ab.ABResult(model, "train", "default", "base", 16, 512, variants=[
        ab.VariantResult("default", [], "-", step=base, speedup=1.0),
        ab.VariantResult("control", [], "-", step=base, speedup=1.0, verdict="noise"),
        ab.VariantResult("all", [CID], "open", step=fused, speedup=speedup, verdict=ab.verdict(speedup, band),
                         parity=Parity(1.0, 1.0, 0.0, 0.0, 0.0, None, None, True), matches={CID: 24},
                         contexts={CID: {"float32[192,512,64] float32[192,64,512] | x": 24}})],
        noise_band=band, fires={CID: 24}, env={"gpu": "NVIDIA H200", "date": date, "device": "cuda"})


def _row(ws: Workspace):
    from miner.rank import decision, rank

    dec = decision.decide(rank.review(ws), ws)
    rows = [d for d in dec.rows if d.id == CID or d.name == "upcast_matmul"]
    assert len(rows) == 1, rows
    return rows[0]


def test_review_lists_the_upcast_candidate_with_its_in_model_verdict(ws, capsys):
    from miner import cli
    from miner.check import abrun
    from miner.rank.decision import ADOPT, ONLY, UNMEASURED

    d = _row(ws)
    assert (d.verdict, d.name, d.promoted, d.status) == (UNMEASURED, "upcast_matmul", False, "generated")
    abrun.save([_ab("t5", 1.06)], ws.reports / "gpu" / "ab-t5")
    d = _row(ws)
    assert d.verdict == ADOPT and [s.where for s in d.steps] == ["t5 train/default"]
    assert d.steps[0].speedup == pytest.approx(1.06) and d.steps[0].source == "reports/gpu/ab-t5/verify.json"
    assert d.where == "not promoted (won in t5 train/default)"
    abrun.save([_ab("llama", 0.97, date="2026-12-04T11:00:00Z")], ws.reports / "gpu" / "ab-llama")
    assert _row(ws).verdict == ONLY
    assert cli.main(["--workspace", str(ws.root), "candidates"]) == 0
    out = capsys.readouterr().out
    assert CID in out and "upcast_matmul" in out and "t5 train 1.060x" in out
    assert cli.main(["--workspace", str(ws.root), "candidates", "--csv"]) == 0
    row = next(r for r in __import__("csv").DictReader(__import__("io").StringIO(capsys.readouterr().out))
               if r["id"] == CID)
    assert row["verdict"] == ONLY and row["status"] == "generated"


def test_review_marks_a_failed_validation_unsafe_and_a_promoted_fusion_once(ws, monkeypatch):
    from miner.check.promotion import write_evidence
    from miner.promote import promote
    from miner.rank.decision import ADOPT, UNSAFE

    monkeypatch.setattr(upcast, "UNIT_MULS", frozenset())
    validate(ws, CID, device="cpu", model=False)
    monkeypatch.undo()
    assert _row(ws).verdict == UNSAFE and "0 matches, expected 1" in _row(ws).reason
    _cuda_validation(ws)
    write_evidence(ws, CID, [_record("win", 1.04)])
    promote(ws, CID, "upcast_matmul")
    d = _row(ws)  # the fusion's row, from its wins.json (no A/B file here): one row, not two
    assert (d.verdict, d.name, d.promoted, d.status) == (ADOPT, "upcast_matmul", True, "promoted")
    assert d.steps[0].source == "fusions/upcast_matmul/wins.json" and d.where == "nowhere"  # no context measured


def test_candidates_show_explains_the_upcast_candidate(ws, capsys):
    from miner import cli

    validate(ws, CID, device="cpu")
    assert cli.main(["--workspace", str(ws.root), "candidates", "show", CID[:5]]) == 0
    out = capsys.readouterr().out
    assert "not measured" in out and "24  t5 forward aten.bmm.default" in out and "is not exact" in out
    assert "overall: ok (4 check(s) not run: marked ? below)" in out and "not proven on cpu" in out
    assert cli.main(["--workspace", str(ws.root), "candidates", "show", CID, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["decision"]["verdict"] == "not measured"
