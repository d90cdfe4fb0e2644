"""The GEMM-epilogue candidate kind through the pipeline's own verbs: mined sites -> ``miner generate --epilogues``
-> ``miner validate`` (what runs on a CPU, what is recorded as not run) -> ``miner promote`` (a gated fusion that
fires only where an in-model record measured a win). CPU, fast: graphs are traced on fake CUDA tensors."""

from __future__ import annotations

import json

import pytest
import torch

from miner import kinds
from miner.check import epilogue as checks
from miner.check.validate import validate
from miner.core import candidate as candidates
from miner.core.workspace import Workspace
from miner.generate import epilogue as gen
from miner.mine import epilogue as mined

CID = gen.candidate_id()


def _mined_graph(model="gpt2"):
    """A captured inference graph of one addmm + gelu_new, traced on fake CUDA tensors (the rule takes it)."""
    from miner.core.fxnode import node_record
    from miner.core.records import CapturedGraph, GraphKey

    gm = checks.traced("cuda")  # four GEMMs: two taken, two declined
    return CapturedGraph(GraphKey(model, "base", "infer", "inference"), tuple(node_record(n) for n in gm.graph.nodes))


@pytest.fixture
def ws(tmp_path) -> Workspace:
    """A workspace holding the candidate as ``miner generate --epilogues`` wrote it from mined sites."""
    w = Workspace(tmp_path)
    mined.save(w, mined.mine([_mined_graph()]))
    assert gen.generate(w, "mined/epilogues.json", "miner generate --epilogues mined/epilogues.json").id == CID
    return w


def test_generate_writes_the_candidate_from_the_sites_the_rule_took(ws):
    meta = json.loads((ws.candidates / CID / "candidate.json").read_text())
    assert kinds.kind_of(meta).name == "gemm_epilogue" and CID.startswith("e")
    assert [o["activation"] for o in meta["observed"]] == ["gelu_tanh", "relu"]
    assert meta["counts"]["fired"] == 2 and meta["counts"]["declined"] == 2
    assert meta["occurrences"] == {"gpt2": {"inference": 2}} and meta["source"] == {"epilogues": "mined/epilogues.json"}
    reasons = [r for d in meta["declined"] for r in d["reasons"]]  # the erf GELU, the pre-activation read outside
    assert any("computes none of" in r for r in reasons) and any("read outside the chain" in r for r in reasons)
    src = (ws.candidates / CID / "pattern.py").read_text()
    assert "ACTIVATIONS = ('gelu_tanh', 'relu')" in src and "wins_gate" not in src
    gen.generate(ws, "mined/epilogues.json", "miner generate --epilogues mined/epilogues.json")
    assert (ws.candidates / CID / "pattern.py").read_text() == src  # regenerates byte-identically


def test_generate_command_says_why_it_writes_nothing_where_the_rule_takes_no_gemm(tmp_path, capsys):
    from miner import cli

    w = Workspace(tmp_path)
    payload = mined.mine([_mined_graph()])
    for f in payload["found"]:
        f["ok"] = False
    mined.save(w, payload)
    assert cli.main(["--workspace", str(tmp_path), "generate", "--epilogues", str(tmp_path / "mined/epilogues.json")]) == 1
    assert "no addmm + activation there" in " ".join(capsys.readouterr().err.split()) and not (tmp_path / "candidates").exists()


def test_validate_on_cpu_runs_the_graph_checks_and_marks_the_cuda_ones_not_run(ws):
    v = validate(ws, CID, device="cpu")
    data = json.loads((ws.candidates / CID / "validation.json").read_text())
    assert v.ok and data["ok"] is True and data["model"] is False
    assert [(c["kind"], c["ok"]) for c in data["checks"]] == [("graph", True), ("rewrite", True), ("rewrite", None),
                                                               ("rewrite", None)]
    assert data["checks"][0]["matches"] == 2 and "not run on cpu" in data["checks"][2]["detail"]
    assert candidates.status(ws, candidates.load(ws, CID)) == "validated"


def test_each_check_fails_on_a_planted_bug(ws, monkeypatch):
    """use_gelu inverted in the rewrite: the graph check (the nodes' use_gelu) and the emulated run (the values)
    fail; a rule that takes the erf GELU too: the graph check fails (three matches)."""
    from miner.rules import epilogue as rule
    from miner.runtime import epilogue as runtime

    module = candidates.load(ws, CID).pattern_module
    real = runtime.replace
    monkeypatch.setattr(runtime, "replace", lambda gemm, d: real(gemm, _inverted(d)))
    assert not checks.check_graph(module, CID)[0].ok
    emulated = checks.check_emulated(module, CID)
    assert not emulated.ok and emulated.max_rel > 10 * checks.EMULATED_TOL, emulated.detail  # 0.23 seen
    monkeypatch.setattr(runtime, "replace", real)
    assert checks.check_emulated(module, CID).ok
    monkeypatch.setattr(rule, "RTOL", 1e-2)  # loose enough to call the erf GELU a tanh GELU
    c, _ = checks.check_graph(module, CID)
    assert not c.ok and c.matches == 3, c.detail


def _inverted(d):
    import dataclasses

    return dataclasses.replace(d, activation="relu" if d.activation == "gelu_tanh" else "gelu_tanh")


def _record(verdict: str, speedup: float, contexts: dict | None = None) -> dict:
    """An in-model record of gpt2 inference under CUDA graphs (synthetic)."""
    return {"model": "gpt2", "mode": "infer", "compile": "reduce-overhead", "preset": "base", "speedup": speedup,
            "band": 0.004, "verdict": verdict, "matches": 12, "contexts": contexts or {}, "gpu": "synthetic",
            "date": "2026-12-07T00:00:00+00:00"}


def _promoted(ws):
    """``miner promote`` of the candidate after a CUDA validation and an in-model win (both synthetic)."""
    from miner.check.promotion import write_evidence
    from miner.core.workspace import write_json
    from miner.promote import promote

    checks_ = [{"kind": "graph", "case": "mlp", "ok": True, "device": "cpu (fake cuda tensors)"},
               {"kind": "rewrite", "case": "gpt2/tiny/infer (cuda)", "ok": True, "matches": 2, "device": "cuda"}]
    write_json(ws.candidates / CID / "validation.json",
               {"id": CID, "ok": True, "failure": None, "device": "cuda", "model": True, "checks": checks_,
                "sources": candidates.sources_digest(ws.candidates / CID)})
    write_evidence(ws, CID, [_record("win", 1.04)])
    return promote(ws, CID, "gemm_epilogue")


def test_promote_writes_a_gated_fusion_that_fires_only_where_it_won(ws):
    from miner.runtime import evidence, fusions

    done = _promoted(ws)
    assert {p.name for p in done.files} >= {"pattern.py", "fusion.json", "wins.json", "test_gemm_epilogue.py"}
    module = fusions.load(ws.root, "gemm_epilogue")
    assert module.OP_NAME == "miner::gemm_epilogue" and "rewrite.wins_gate(match, WINS, N_INPUTS)" in \
        (ws.root / "fusions" / "gemm_epilogue" / "pattern.py").read_text()
    c, _ = checks.check_graph(module, "gemm_epilogue")
    assert c.matches == 0  # no in-model record covers the chain's contexts: unmeasured, declined
    assert checks.check_graph(module, "gemm_epilogue", gate_open=True)[0].ok
    from miner.runtime import rewrite

    p = rewrite.FusionPass([rewrite.entry_for(module.__file__, "gemm_epilogue", module)])
    p(checks.traced("cuda").graph)
    sites = {ctx.site: 12 for ctx in p.log.contexts["gemm_epilogue"]}
    records = [_record("win", 1.04, sites), dict(_record("loss", 0.97, sites), compile="default")]
    module.WINS = evidence.with_records(module.WINS, "gemm_epilogue", records)
    for mode, fired in (("reduce-overhead", 2), ("default", 0)):  # a win under CUDA graphs, a loss without them
        p = rewrite.FusionPass([rewrite.entry_for(module.__file__, "gemm_epilogue", module)])
        with _mode(mode):
            p(checks.traced("cuda").graph)
        assert p.counts["gemm_epilogue"] == fired, (mode, dict(p.declined))


def test_the_promoted_fusions_generated_test_passes(ws):
    import os
    import subprocess
    import sys
    from pathlib import Path

    _promoted(ws)
    test = ws.root / "tests" / "fusions" / "test_gemm_epilogue.py"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)], cwd=ws.root,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "2 passed" in run.stdout and "failed" not in run.stdout, run.stdout[-500:]


def _mode(mode: str):
    import torch._inductor.config as config

    return config.patch({"triton.cudagraphs": mode == "reduce-overhead"})


def test_the_kind_is_known_to_every_stage():
    k = kinds.get("gemm_epilogue")
    assert k.generator.endswith(":generate") and k.fusion_files and k.test_cases and k.harness == "gemm_epilogue"
    rows = kinds.resolve(k.test_cases)(None, "gemm_epilogue", {"occurrences": {"gpt2": {"inference": 12}}})
    assert [r[0] for r in rows][-1] == "test_fires_in_its_zoo_model" and rows[-1][2] == {"model": "gpt2",
                                                                                       "mode": "infer"}
    assert torch.ops.aten._addmm_activation.default  # the op the rewrite calls exists in this torch


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA: cuBLASLt's epilogue")
def test_on_cuda_the_compiled_chain_is_as_accurate_as_inductor_and_the_check_fails_on_a_planted_bug(ws, monkeypatch):
    from miner.runtime import epilogue as runtime

    module = candidates.load(ws, CID).pattern_module
    c = checks.check_compiled(module, CID, "cuda")
    assert c.ok and c.matches == 2, c.detail
    real = runtime.replace
    monkeypatch.setattr(runtime, "replace", lambda gemm, d: real(gemm, _inverted(d)))
    assert not checks.check_compiled(module, CID, "cuda").ok


def test_the_fusion_pass_cache_key_follows_the_epilogue_rewrite(tmp_path, monkeypatch):
    """A GEMM-epilogue fusion's pattern.py calls ``miner.runtime.epilogue.replace``: an edit there must change the
    key Inductor's FX graph cache stores the rewritten graphs under (seen failing with the file left out)."""
    from pathlib import Path

    from miner.runtime import rewrite

    before = rewrite.FusionPass([]).uuid()
    edited = tmp_path / "epilogue.py"
    edited.write_text(Path(rewrite.EPILOGUE_FILE).read_text() + "\n# edited\n")
    monkeypatch.setattr(rewrite, "EPILOGUE_FILE", str(edited))
    assert rewrite.FusionPass([]).uuid() != before


COMMITTED_RUN = "reports/gpu/2026-12-07-h100-gpt2-epilogue"  # the H100 scan of gpt2 inference it was mined from


@pytest.mark.parametrize("name", ["pattern.py", "candidate.json"])
def test_committed_candidate_is_what_the_generator_makes_from_the_committed_sites(tmp_path, name):
    import shutil
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    meta = json.loads((repo / "candidates" / CID / "candidate.json").read_text())
    rel = meta["source"]["epilogues"]
    assert rel == f"{COMMITTED_RUN}/mined/epilogues.json"
    w = Workspace(tmp_path)
    (tmp_path / rel).parent.mkdir(parents=True)
    shutil.copy(repo / rel, tmp_path / rel)
    assert gen.generate(w, rel, meta["regenerate"]).id == CID
    assert (w.candidates / CID / name).read_bytes() == (repo / "candidates" / CID / name).read_bytes(), \
        f"candidates/{CID}/{name} is stale: regenerate with `{meta['regenerate']}`"


def test_committed_sites_are_what_mining_writes_from_the_committed_captures(tmp_path):
    import tarfile
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    with tarfile.open(repo / COMMITTED_RUN / "captures.tgz") as tar:
        tar.extractall(tmp_path, filter="data")
    got = mined.mine(Workspace(tmp_path).load_graphs(["gpt2"]))
    want = mined.load(repo / COMMITTED_RUN / "mined" / "epilogues.json")
    assert json.loads(json.dumps(got["found"])) == want["found"] and want["counts"]["taken"] == 12


def test_mining_a_cpu_capture_says_how_many_sites_cuda_would_take():
    """On the CPU every GEMM is declined for the device; the summary tells the ones declined for nothing else (the
    tanh GELU and the ReLU of the chain) from those a CUDA scan would decline too (the erf GELU, the pre-activation
    read outside), and names the commands that take them."""
    from miner.core.fxnode import node_record
    from miner.core.records import CapturedGraph, GraphKey

    gm = checks.traced("cpu")
    graph = CapturedGraph(GraphKey("mine", "tiny", "infer", "inference"), tuple(node_record(n) for n in gm.graph.nodes))
    line = mined.summary(mined.mine([graph]))
    assert "4 addmm + activation, none taken" in line and "2 declined only for the device would be taken on CUDA" in line
    assert "miner scan --device cuda" in line
    taken = mined.summary(mined.mine([_mined_graph()]))
    assert "2 addmm + activation the rule takes" in taken and "miner generate --epilogues" in taken
