"""miner tune: its stages, resume after an interruption, the time budget, the CPU refusal (CPU)."""

from __future__ import annotations

import json

import pytest

from miner import cli
from miner.commands import tune


def _fake_stages(calls: list, interrupt: str | None = None):
    """Stages that record their calls and write a file each (its output); ``interrupt``: that one raises Ctrl-C."""
    def make(name):
        def run(r):
            calls.append(name)
            if name == interrupt:
                raise KeyboardInterrupt
            (r.out / f"{name}.out").write_text(name)
            return {"file": f"{name}.out"}

        def done(r, out):
            return (r.out / out["file"]).is_file()
        return tune.Stage(name, run, done, f"fake {name}")
    return tuple(make(n) for n in ("profile", "mine", "generate", "validate", "ab"))


def _tune(tmp_path, *extra):
    return cli.main(["--workspace", str(tmp_path), "tune", "--models", "bert", "--allow-cpu", "--out",
                     str(tmp_path / "t"), *extra])


def test_resume_after_an_interruption_skips_the_finished_stages(tmp_path, monkeypatch, capsys):
    calls: list = []
    (tmp_path / "t").mkdir()
    monkeypatch.setattr(tune, "STAGES", _fake_stages(calls, interrupt="validate"))
    assert _tune(tmp_path) == 130  # Ctrl-C in the fourth stage
    err_out = capsys.readouterr()
    assert "the same command goes on from there" in err_out.out
    state = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert sorted(state["stages"]) == ["generate", "mine", "profile"] and calls[-1] == "validate"

    calls.clear()
    monkeypatch.setattr(tune, "STAGES", _fake_stages(calls))
    (tmp_path / "t" / "mine.out").unlink()  # an output that no longer reads back: that stage runs again
    assert _tune(tmp_path) == 0
    out = capsys.readouterr().out
    assert calls == ["mine", "validate", "ab"]
    assert "stage 1/5 profile: done earlier" in out and "skipped" in out
    assert "stage 3/5 generate: done earlier" in out
    assert "no A/B yet" in out  # the fake ab wrote no verify.json: no decision, said so

    calls.clear()
    assert _tune(tmp_path, "--fresh") == 0  # --fresh: every stage again
    assert calls == ["profile", "mine", "generate", "validate", "ab"]
    calls.clear()
    assert _tune(tmp_path, "--mode", "infer") == 0  # other settings: not the saved run's stages
    assert calls == ["profile", "mine", "generate", "validate", "ab"]


def test_time_budget_names_the_skipped_stages(tmp_path, monkeypatch, capsys):
    calls: list = []
    (tmp_path / "t").mkdir()
    monkeypatch.setattr(tune, "STAGES", _fake_stages(calls))
    assert _tune(tmp_path, "--time-budget", "0") == 0
    out = capsys.readouterr().out
    assert calls == [] and "--time-budget 0 s spent: skipped profile, mine, generate, validate, ab" in out


def test_refuses_on_the_cpu_and_unknown_knobs(tmp_path, capsys):
    import torch

    if not torch.cuda.is_available():
        assert cli.main(["--workspace", str(tmp_path), "tune", "--models", "bert"]) == 2
        assert "miner tune needs a CUDA GPU" in capsys.readouterr().err
    assert _tune(tmp_path, "--knobs", "sdpa_reduced_math,warp_speed") == 2
    assert "unknown knob 'warp_speed'; knobs: sdpa_reduced_math" in capsys.readouterr().err


@pytest.mark.slow
def test_smoke_tiny_bert_on_the_cpu_then_resume(tmp_path, monkeypatch, capsys):
    """The real stages on the CPU (tiny bert inference, one row candidate, one knob): interrupted in the A/B,
    then resumed: profile, mine, generate and validate are not run again."""
    real = tune.STAGES
    hit = []

    def boom(r):
        hit.append(1)
        raise KeyboardInterrupt
    monkeypatch.setattr(tune, "STAGES", real[:4] + (tune.Stage("ab", boom, real[4].done, "interrupted"),))
    args = ["--mode", "infer", "--top", "1", "--regions", "0", "--knobs", "coordinate_descent", "--rounds", "2",
            "--warmup", "1"]
    assert _tune(tmp_path, *args) == 130 and hit
    state = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert list(state["stages"]) == ["profile", "mine", "generate", "validate"]
    capsys.readouterr()
    monkeypatch.setattr(tune, "STAGES", real)
    assert _tune(tmp_path, *args) == 0
    out = capsys.readouterr().out
    for i, name in enumerate(["profile", "mine", "generate", "validate"]):
        assert f"stage {i + 1}/5 {name}: done earlier" in out
    assert "stage 5/5 ab: the candidates and the knobs" in out
    assert "bert infer/default: run " in out  # the decision, printed
    data = json.loads((tmp_path / "t" / "ab" / "verify.json").read_text())
    names = [v["name"] for v in data["results"][0]["variants"]]
    assert "knob:coordinate_descent" in names and "knob:coordinate_descent+fusions" in names
    assert (tmp_path / "reports" / "tune-bert" / "index.html").is_file()


def test_the_decision_lists_each_candidate_alone(tmp_path):
    """The printed decision reads the alone records (typed ``InModelRecord``s) of the A/B's verify.json:
    the CPU smoke run on DebertaV2 crashed here once the records were typed."""
    import types

    from miner.check import abrun
    from test_ab import result

    abrun.save([result(1.03)], tmp_path / "ab")
    lines = tune.decision_lines(types.SimpleNamespace(out=tmp_path))
    assert any("candidate layer_norm alone: 1.030x win" in line for line in lines), lines
    assert any("candidate log_softmax alone: 0.952x loss" in line for line in lines), lines
