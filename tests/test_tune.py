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
    from miner.core.workspace import Workspace

    lines = tune.decision_lines(types.SimpleNamespace(out=tmp_path, ws=Workspace(tmp_path)))
    assert any("candidate layer_norm alone: 1.030x win" in line for line in lines), lines
    assert any("candidate log_softmax alone: 0.952x loss" in line for line in lines), lines
    # DebertaV2 (H100, 2026-12-06): its attention region fired 0 times and the decision only said "run the
    # default": a fusion that matched nothing in the step is named (here rms_norm, held by `all`, 0 matches)
    assert any(line.strip() == "rms_norm: matched nothing in this step (0 matches in every variant): not measured"
               for line in lines), lines
    assert not any("layer_norm: matched nothing" in line for line in lines)


def _run(tmp_path, **args):
    import types

    from miner.core.workspace import Workspace

    defaults = dict(knobs="sdpa_reduced_math,reduce_overhead,sdpa_reduced_math+reduce_overhead", regions=2)
    return tune.Run(types.SimpleNamespace(**{**defaults, **args}), Workspace(tmp_path), "cuda", "base",
                    ["DebertaV2ForMaskedLM"], ["train"], tmp_path / "t")


def test_knobs_that_cannot_change_the_step_are_left_out_with_why(tmp_path, capsys):
    # DebertaV2 (2026-12-06, H100): its attention is written out, no SDPA anywhere; the SDPA flag's two
    # variants would have cost two compiles of the ten-minute call and could change nothing
    from miner.check import knobs

    graph = tmp_path / "captures" / "DebertaV2ForMaskedLM" / "base" / "train-forward-0.json"
    graph.parent.mkdir(parents=True)
    graph.write_text('{"nodes": [{"target": "aten._softmax.default"}, {"target": "aten.bmm.default"}]}')
    assert tune._knobs_that_apply(_run(tmp_path)) == "reduce_overhead"
    out = capsys.readouterr().out
    assert "knob sdpa_reduced_math left out: no scaled_dot_product or _safe_softmax in the step's graphs" in out
    assert "knob sdpa_reduced_math+reduce_overhead left out" in out

    profile = tmp_path / "profiles" / "DebertaV2ForMaskedLM" / "base" / "train.profile.json"
    profile.parent.mkdir(parents=True)
    profile.write_text('{"kernels": [{"name": "triton_per_fused__safe_softmax_exp_7"}]}')  # SDPA's math path
    every = "sdpa_reduced_math,reduce_overhead,sdpa_reduced_math+reduce_overhead"
    assert tune._knobs_that_apply(_run(tmp_path)) == every
    assert tune._knobs_that_apply(_run(tmp_path / "empty")) == every  # nothing to read: kept (measured, not guessed)
    assert knobs.get("reduce_overhead").applies("") and not knobs.get("sdpa_reduced_math").applies("bmm softmax")


def test_a_knob_mining_found_sites_for_joins_the_ab_with_why(tmp_path, capsys):
    # gemm_epilogues is no default knob: it joins where `miner mine` found an addmm + activation its rule takes
    from miner.core.workspace import Workspace
    from miner.mine import epilogue

    def found(model, ok):
        return {"model": model, "mode": "infer", "ok": ok, "reasons": [] if ok else ["x"]}

    ws = Workspace(tmp_path)
    epilogue.save(ws, {"schema": epilogue.SCHEMA, "kind": epilogue.KIND, "graphs": [], "counts": {},
                       "found": [found("DebertaV2ForMaskedLM", False), found("gpt2", True)]})
    assert tune._knobs_that_apply(_run(tmp_path, knobs="reduce_overhead")) == "reduce_overhead"  # another model's
    epilogue.save(ws, {"schema": epilogue.SCHEMA, "kind": epilogue.KIND, "graphs": [], "counts": {},
                       "found": [found("DebertaV2ForMaskedLM", True)]})
    assert tune._knobs_that_apply(_run(tmp_path, knobs="reduce_overhead")) == "reduce_overhead,gemm_epilogues"
    assert "knob gemm_epilogues added: mining found 1 addmm + activation its rule takes" in capsys.readouterr().out
    assert tune._knobs_that_apply(_run(tmp_path, knobs="")) == ""  # --knobs '': none
    from miner.generate import epilogue as generated

    (ws.candidates / generated.candidate_id()).mkdir(parents=True)
    (ws.candidates / generated.candidate_id() / "candidate.json").write_text("{}")  # the candidate measures it
    assert tune._knobs_that_apply(_run(tmp_path, knobs="reduce_overhead")) == "reduce_overhead"
    (ws.candidates / generated.candidate_id() / "candidate.json").unlink()
    (tmp_path / "mined" / epilogue.EPILOGUES_FILE).write_text("{broken")
    assert tune._knobs_that_apply(_run(tmp_path, knobs="reduce_overhead")) == "reduce_overhead"


def test_regions_go_down_the_measured_list_past_refusals_as_philox4(tmp_path, monkeypatch, capsys):
    # DebertaV2 (2026-12-06): its largest region (7.1 ms/step above floor) was refused and tune went on
    # with one region instead of two, drawn with Inductor's numbers instead of four per Philox call
    import types

    from miner.generate import generate as gen
    from miner.mine import regions

    def rp(pid, above):
        pat = types.SimpleNamespace(id=pid, support=types.SimpleNamespace(models=("DebertaV2ForMaskedLM",)))
        return types.SimpleNamespace(id=pid, pattern=pat, measured=1, above_floor_us=above)

    listed = [rp("psmall", 300.0), rp("pbig", 7093.0), rp("pmid", 2129.0), rp("pnext", 679.0)]
    calls = []

    def generate(ws, chosen, command, source):
        [p] = chosen
        calls.append((p.id, command, source))
        if p.id == "pbig":
            return [], [types.SimpleNamespace(reason="not generated: unsupported op aten.reshape.default")]
        return [types.SimpleNamespace(id=p.id + "_x4")], []

    monkeypatch.setattr(regions, "load", lambda ws: listed)
    monkeypatch.setattr(gen, "generate", generate)
    got = tune._regions(_run(tmp_path))
    assert [g.id for g in got] == ["pmid_x4", "pnext_x4"]  # the two largest that generate, largest first
    assert [c[0] for c in calls] == ["pbig", "pmid", "pnext"]
    assert all(c[2] == {"regions": "mined/regions.json", "rng": "philox4"} and c[1].endswith("--rng philox4")
               for c in calls)
    assert "region pbig (7.1 ms/step above floor): not generated: unsupported op aten.reshape.default" in \
        capsys.readouterr().out


def test_validation_leaves_the_ab_the_time_its_compiles_need(tmp_path, monkeypatch, capsys):
    # DebertaV2 (2026-12-06, H100): validation took 263 of the 400 s and the A/B never started
    import types

    import miner.check.validate as V

    run = _run(tmp_path, knobs="reduce_overhead", fusion_variants="gated", time_budget=400.0)
    monkeypatch.setattr(run.ws, "load_scan", lambda m, p, mode: types.SimpleNamespace(seconds=91.0))
    per = 91.0 * tune.A_B_COMPILE_SHARE  # an A/B compile: 48 of the profile's 74.6 s (DeBERTa, H100)
    # the float32 reference, the default, the knob, the knob with the candidates (no gate, no `gated`)
    assert tune._ab_estimate(run, 1) == pytest.approx(per * 4)
    assert tune._ab_estimate(run, 0) == pytest.approx(per * 5)  # no candidate: promoted fusions, gated
    run.args.fusion_variants = "all,alone,gated"
    # ... and all, and each of two candidates alone, over the default and over the knob
    assert tune._ab_estimate(run, 2) == pytest.approx(per * 9)
    run.args.fusion_variants = "gated"
    run.state = {"stages": {"generate": {"outputs": {"candidates": ["p1", "p2"]}}}}
    validated = []

    def validate(ws, cid, **kw):
        validated.append(cid)
        run.start -= 8  # a validation of 8 s
        return types.SimpleNamespace(ok=True, failure=None)

    monkeypatch.setattr(V, "validate", validate)
    need = per * 4
    run.start -= 400 - need - 10  # 10 s over what the A/B with one candidate needs; then 2 s over, < 8
    out = tune._validate(run)
    assert validated == ["p1"] and out == {"validated": ["p1"], "failed": []}
    assert "p2: not validated (--time-budget:" in capsys.readouterr().out
    monkeypatch.setattr(run.ws, "load_scan", lambda m, p, mode: None)  # no scan: only the budget itself stops it
    assert tune._ab_estimate(run, 1) is None


def test_an_ab_cut_mid_way_still_prints_the_decision_from_what_it_measured(tmp_path, monkeypatch, capsys):
    """MegatronBert on the H100 (2026-12-06): `timeout` cut the A/B in its second phase; its first phase had
    measured a 1.056x win with parity ok, and the run printed no decision."""
    from miner.check import abrun
    from test_ab import result

    calls: list = []
    stages = list(_fake_stages(calls))

    def cut(r):  # the A/B saves its first model's row (verify's on_result), then the signal comes
        abrun.save([result(1.03)], r.out / "ab")
        raise KeyboardInterrupt
    stages[4] = tune.Stage("ab", cut, stages[4].done, "cut")
    (tmp_path / "t").mkdir()
    monkeypatch.setattr(tune, "STAGES", tuple(stages))
    assert _tune(tmp_path) == 130
    out = capsys.readouterr().out
    assert "Decision so far (the A/B was interrupted" in out and "candidate layer_norm alone: 1.030x win" in out
    state = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert "ab" not in state["stages"]  # not done: the same command runs the A/B again


def test_sigterm_is_an_interrupt_inside_a_command_and_the_handler_comes_back():
    import os
    import signal

    before = signal.getsignal(signal.SIGTERM)
    seen: list = []
    with pytest.raises(KeyboardInterrupt):
        with cli.terminate_as_interrupt(seen):
            os.kill(os.getpid(), signal.SIGTERM)  # delivered to this (main) thread: the handler raises
            for _ in range(10_000):  # Python runs the handler between bytecodes
                pass
    assert seen == [signal.SIGTERM] and signal.getsignal(signal.SIGTERM) is before
