"""`miner scan` end to end through the CLI: isolation of bad models, reuse, clear errors."""

import json
import os

import pytest

from miner.cli import main
from miner.core.errors import WorkspaceError
from miner.core.workspace import Workspace

GOOD = "tests.zoo_fixtures:good"


def test_unknown_model_fails_at_once_with_valid_names(tmp_path, capsys):
    assert main(["--workspace", str(tmp_path), "scan", "--models", "bert,nosuchmodel"]) == 2
    err = capsys.readouterr().err
    assert "nosuchmodel" in err and "bert" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "captures").exists()


def test_bad_models_are_recorded_and_the_rest_go_on(tmp_path, capsys):
    models = f"tests.zoo_fixtures:raises,tests.zoo_fixtures:crashes,{GOOD}"
    code = main(["--workspace", str(tmp_path), "scan", "--models", models, "--mode", "train", "--jobs", "2"])
    assert code == 1
    captured = capsys.readouterr()
    out, err = captured.out, captured.err
    assert "FAILED" in out and "1/3 scans ok" in out
    # each failure's whole reason and its log below the table (the table's status column is cut)
    reasons = " ".join(err.split())
    assert "tests.zoo_fixtures:raises/train:" in reasons and "broken on purpose" in reasons
    assert "exited with code 3" in reasons and "(log: " in reasons and "tests.zoo_fixtures_raises.tiny.log" in reasons
    assert main(["--workspace", str(tmp_path), "scan", "--models", "tests.zoo_fixtures:hangs", "--timeout", "5"]) == 1
    ws = Workspace(tmp_path)
    by_model = {r.model: r for r in ws.scans()}
    assert by_model[GOOD].ok and [k.phase for k in by_model[GOOD].graphs] == ["forward", "backward"]
    assert "broken on purpose" in by_model["tests.zoo_fixtures:raises"].error
    assert "exited with code 3" in by_model["tests.zoo_fixtures:crashes"].error
    assert "timed out after 5s" in by_model["tests.zoo_fixtures:hangs"].error

    # the good model's graphs are reused by a second scan, which recompiles nothing
    assert main(["--workspace", str(tmp_path), "scan", "--models", GOOD]) == 0
    assert "reused" in capsys.readouterr().out
    graphs = ws.load_graphs([GOOD])
    assert {g.key.phase for g in graphs} == {"forward", "backward"}
    assert any(n.target == "aten.exp.default" for g in graphs for n in g.nodes)


def test_corrupt_graph_file_names_the_file(tmp_path):
    ws = Workspace(tmp_path)
    bad = ws.captures / "bert" / "tiny" / "train-forward-0.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"schema": 1, "kind": "CapturedGraph", "graph": {"key"')
    with pytest.raises(WorkspaceError, match="train-forward-0.json: corrupt JSON"):
        ws.load_graphs()
    bad.write_text(json.dumps({"schema": 999, "kind": "CapturedGraph", "graph": {}}))
    with pytest.raises(WorkspaceError, match="schema 999"):
        ws.load_graphs()


def test_corrupt_scan_file_is_captured_again_and_said_so(tmp_path, capsys, monkeypatch):
    from miner.core.records import ScanResult
    from miner.scan import scan as S

    ws = Workspace(tmp_path)
    path = ws.scan_path(GOOD, "tiny", "train")
    path.parent.mkdir(parents=True)
    path.write_text("not json")
    monkeypatch.setattr(S, "_run_worker", lambda req, *a, **k: [ScanResult(req.model, req.preset, m, req.device, True)
                                                                 for m in req.modes])
    assert main(["--workspace", str(tmp_path), "scan", "--models", GOOD]) == 0
    out = " ".join(capsys.readouterr().out.split())  # lines are wrapped to the terminal's width
    assert "capturing train again" in out and "train.scan.json: corrupt JSON" in out


def test_models_share_the_cpus(monkeypatch):
    # one model per CPU (at most 4, at most the models), the CPUs split among them for Inductor's
    # compile workers: on 2 cores bert + gpt2 go side by side with one compile thread each
    from miner.scan import scan as S
    from miner.commands.scan import default_jobs

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert default_jobs(2) == 2 and default_jobs(1) == 1 and default_jobs(55) == 2
    assert S.compile_threads(2) == 1 and S.compile_threads(1) == 2
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert default_jobs(55) == 4 and S.compile_threads(4) == 4 and S.compile_threads(2) == 8
