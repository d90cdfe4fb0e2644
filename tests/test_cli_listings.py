"""The terminal listings (candidates, candidates show, patterns, patterns show, models): they fit 100
columns, their --json holds the rows the text shows, their --csv parses, a closed pipe ends quietly,
and the decision table's verdicts come from measurements only."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from miner.check import ab, abrun
from miner.check.verify import Parity, StepStats
from miner.cli import main
from miner.core.workspace import write_json
from miner.rank import decision, rank
from miner.report.html import render_html
from miner.rank.decision import ADOPT, NOT_WORTH, ONLY, UNMEASURED, UNSAFE, StepChange, verdict_of
from test_rank import build_workspace, patterns_zoo

REPO = Path(__file__).resolve().parents[1]
ID = re.compile(r"\bp[0-9a-f]{10}\b")


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    return build_workspace(tmp_path_factory.mktemp("listings"))


def run(capsys, ws, *argv: str) -> str:
    assert main(["--workspace", str(ws.root), *argv]) == 0
    return capsys.readouterr().out


def listings(ws) -> dict[str, list[str]]:
    sm = patterns_zoo()["softmax"].id
    return {"candidates": ["candidates"], "candidates --patterns": ["candidates", "--patterns"],
            "candidates --members": ["candidates", "--members", "--top", "0"],
            "candidates show": ["candidates", "show", sm], "patterns": ["patterns", "--top", "0"],
            "patterns show": ["patterns", "show", sm], "models": ["models", "--source", "hand", "--unsupported"]}


# --------------------------------------------------------------------------- width, json, csv

def test_every_listing_fits_100_columns_and_ends_with_a_next_hint(ws, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    for name, argv in listings(ws).items():
        out = run(capsys, ws, *argv)
        widths = [len(line) for line in out.splitlines()]
        assert max(widths) <= 100, f"{name}: {max(widths)} columns: {out.splitlines()[widths.index(max(widths))]!r}"
        assert any(line.startswith("next: ") for line in out.rstrip().splitlines()[-2:]), name  # may wrap once
        assert "\x1b[" not in out, f"{name}: colour codes without a terminal"


def test_narrower_terminal_is_honoured(ws, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "72")
    out = run(capsys, ws, "candidates")
    assert max(len(line) for line in out.splitlines()) <= 72


def test_candidates_text_leads_with_the_decision_table(ws, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    out = run(capsys, ws, "candidates")
    assert out.index("Decision (measured only)") < out.index("Predicted: candidates")
    assert "Adopt: none" in out  # the fixture has no in-model A/B
    assert "measured error" in out  # the cost model's error beside the predicted ranking


def test_candidates_json_holds_the_rows_the_text_shows(ws, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    text = run(capsys, ws, "candidates", "--top", "2")
    data = json.loads(run(capsys, ws, "candidates", "--json", "--top", "2"))
    ranked = text[text.index("Predicted: candidates"):]
    assert [r["id"] for r in data["ranking"]] == ID.findall(ranked.split("families of mined")[0])
    assert len(data["ranking"]) == 2 and data["more_families"] == 1  # --top honoured
    assert [d["id"] for d in data["decisions"]["decisions"]] == ID.findall(text[:text.index("Predicted:")])
    row = next(r for r in data["ranking"] if r["id"] == patterns_zoo()["softmax"].id)
    assert row["calls"] and row["bench"] and row["decision"]["verdict"] in decision.VERDICTS  # per shape, gate
    assert row["bench"][0]["run"] and "times_ms" in row["bench"][0]
    assert row["decision"]["steps"] == []  # end to end: nothing measured in this workspace
    pats = json.loads(run(capsys, ws, "candidates", "--json", "--patterns", "--top", "0"))
    assert pats["kind"] == "patterns" and pats["decisions"] is None
    assert {r["id"] for r in pats["ranking"]} == {f.id for f in rank.review(ws).pattern_families}


def test_show_patterns_and_models_json_match_their_text(ws, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    sm = patterns_zoo()["softmax"].id
    shown = json.loads(run(capsys, ws, "candidates", "show", sm, "--json"))
    text = run(capsys, ws, "candidates", "show", sm)
    assert shown["id"] == sm and len(shown["calls"]) == len(rank.review(ws).find(sm).calls)
    assert all(c["model"] in text for c in shown["calls"]) and shown["validation"]["ok"] is True
    text = run(capsys, ws, "patterns", "--top", "0")
    data = json.loads(run(capsys, ws, "patterns", "--json", "--top", "0"))
    assert [p["id"] for p in data] == ID.findall(text.split("\nnext: ")[0])
    one = json.loads(run(capsys, ws, "patterns", "show", sm, "--json"))
    assert one["id"] == sm and "def pattern" in one["source"] and len(one["occurrences"]) == 4
    text = run(capsys, ws, "models", "--source", "hand")
    names = [m["name"] for m in json.loads(run(capsys, ws, "models", "--source", "hand", "--json"))]
    assert names and all(n in text for n in names) and len(names) == int(re.search(r"(\d+) entries", text)[1])


def test_every_listing_has_a_csv_that_parses(ws, capsys):
    for name, argv in listings(ws).items():
        out = run(capsys, ws, *argv, "--csv")
        rows = list(csv.DictReader(io.StringIO(out)))
        assert rows, name
        header = out.splitlines()[0].split(",")
        assert all(set(r) == set(header) for r in rows), name
    rows = list(csv.DictReader(io.StringIO(run(capsys, ws, "candidates", "--csv"))))
    assert {"name", "verdict", "kernel_speedup_min", "step_speedup_min", "predicted_speedup"} <= set(rows[0])
    with pytest.raises(SystemExit):
        main(["--workspace", str(ws.root), "candidates", "--json", "--csv"])  # one at a time


# --------------------------------------------------------------------------- closed pipe

def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def test_closed_pipe_ends_quietly(ws):
    miner = f"{sys.executable} -m miner.cli --workspace {ws.root}"
    r = subprocess.run(f"{miner} patterns | head -1", shell=True, capture_output=True, text=True, env=_env(),
                       timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr and r.stdout.count("\n") == 1, r.stderr
    # `true` reads nothing and is gone long before the first write: every write of the listing fails
    r = subprocess.run(f"{miner} candidates | true; echo rc=${{PIPESTATUS[0]}} >&2", shell=True, executable="/bin/bash",
                       capture_output=True, text=True, env=_env(), timeout=300)
    assert "rc=141" in r.stderr and "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr


# --------------------------------------------------------------------------- verdicts

def step(verdict: str, speedup: float, model: str = "gpt2", **kw) -> StepChange:
    return StepChange(model, "train", "default", speedup, 0.01, verdict, **kw)


def test_verdicts_from_measurements_only():
    assert verdict_of([step("win", 1.03)])[0] == ADOPT
    assert verdict_of([step("win", 1.03), step("noise", 1.0, "bert")])[0] == ADOPT
    v, why, won = verdict_of([step("win", 1.03), step("loss", 0.95, "t5")])
    assert v == ONLY and won == ("gpt2 train/default",) and "t5" in why  # a loss somewhere: not adopt
    assert verdict_of([step("loss", 0.95)])[0] == NOT_WORTH
    assert verdict_of([step("noise", 1.004)])[0] == NOT_WORTH
    assert verdict_of([step("win", 1.05, parity_ok=False)])[0] == UNSAFE
    assert verdict_of([step("win", 1.05)], failed="validation failed")[0] == UNSAFE
    assert verdict_of([])[0] == UNMEASURED  # predicted-only: never adopt
    fast = decision.KernelRange(1.2, 1.5, 3, "run")
    assert verdict_of([], kernel=fast)[0] == UNMEASURED  # a fast kernel alone decides nothing
    assert verdict_of([], kernel=decision.KernelRange(0.6, 0.9, 3, "run"))[0] == NOT_WORTH


def _ab_result(model: str, speedup: float, band: float = 0.01, date: str = "2026-12-04T10:00:00Z") -> ab.ABResult:
    base = StepStats(10.0, 9.9, 10.1, 15, 1000 * 2**20, 1.0)
    fused = StepStats(10.0 / speedup, 9.95 / speedup, 10.05 / speedup, 15, 1010 * 2**20, 1.0)
    ok = Parity(1.0, 1.0, 0.0, 0.0, 0.0, None, None, True)
    v = ab.verdict(speedup, band)
    return ab.ABResult(model, "train", "default", "base", 16, 512, variants=[
        ab.VariantResult("default", [], "-", step=base, speedup=1.0),
        ab.VariantResult("control", [], "-", step=base, speedup=1.0, verdict="noise"),
        ab.VariantResult("all", ["softmax_like"], "open", step=fused, speedup=speedup, verdict=v, parity=ok,
                         matches={"softmax_like": 3}, contexts={"softmax_like": {"float32[2,4,64,64] | x": 3}})],
        noise_band=band, fires={"softmax_like": 3}, env={"gpu": "NVIDIA H200", "date": date, "device": "cuda"})


def _decisions(ws, results, where="gpu/ab") -> decision.Decisions:
    abrun.save(results, ws.reports / where)
    return decision.decide(rank.review(ws), ws)


def test_a_measured_win_adopts_and_a_loss_elsewhere_does_not(tmp_path, capsys, monkeypatch):
    ws = build_workspace(tmp_path)
    sm = patterns_zoo()["softmax"].id
    dec = _decisions(ws, [_ab_result("gpt2", 1.04)])
    d = next(x for x in dec.rows if x.id == sm)
    assert d.verdict == ADOPT and dec.rows[0] is d and dec.ab_source == "reports/gpu/ab/verify.json"
    s = d.steps[0]
    assert s.lo == pytest.approx(10.0 / (10.05 / 1.04)) and s.mem_mib == pytest.approx(10.0)
    assert d.where == "nowhere"  # not recorded into wins.json: the gate fires nowhere yet
    # every other candidate is predicted or kernel-measured only: never adopted
    assert [x.id for x in dec.rows if x.verdict == ADOPT] == [sm]
    monkeypatch.setenv("COLUMNS", "100")
    out = run(capsys, ws, "candidates")  # measured rows (steps, p20-p80, memory) still fit
    assert max(len(line) for line in out.splitlines()) <= 100 and "Adopt: softmax_like." in out
    assert "gpt2 train 1.040x" in out and "+10 MiB" in out
    html = render_html(rank.review(ws), ws)
    assert "Adopt: <b>softmax_like</b>" in html and "reports/gpu/ab/verify.json" in html
    # a newer run with a loss in another model: the newest file decides, and it is named
    dec = _decisions(ws, [_ab_result("gpt2", 1.04, date="2026-12-05T00:00:00Z"),
                          _ab_result("t5", 0.95, date="2026-12-05T00:00:00Z")], "gpu/ab2")
    d = next(x for x in dec.rows if x.id == sm)
    assert dec.ab_source == "reports/gpu/ab2/verify.json" and d.verdict == ONLY and d.label == f"{ONLY} gpt2 train/default"
    # a run saved per model in several folders: each (model, mode, compile) from its newest file, all files named
    dec = _decisions(ws, [_ab_result("bert", 1.0, date="2026-12-06T00:00:00Z")], "gpu/ab3/bert")
    d = next(x for x in dec.rows if x.id == sm)
    assert dec.ab_source == "reports/gpu/ab2/verify.json, reports/gpu/ab3/bert/verify.json"
    assert sorted(s.where for s in d.steps) == ["bert train/default", "gpt2 train/default", "t5 train/default"]
    assert d.verdict == ONLY and dec.ab_date == "2026-12-06T00:00:00Z"


def test_where_it_fires_follows_the_gates_evidence(tmp_path):
    ws = build_workspace(tmp_path)
    rec = {"model": "bert", "mode": "train", "compile": "default", "preset": "base", "speedup": 1.03, "band": 0.01,
           "verdict": "win", "matches": 2, "contexts": {"float32[2,4,64,64] | producer:none consumer:none": 2}}
    write_json(ws.fusions / "softmax_like" / "wins.json", {"name": "softmax_like", "in_model": {"records": [rec]}})
    d = next(x for x in decision.decide(rank.review(ws), ws).rows if x.name == "softmax_like")
    assert d.verdict == ADOPT and d.fires_in == ("bert train/default",) and d.steps[0].source.endswith("wins.json")
    write_json(ws.fusions / "softmax_like" / "wins.json", {"name": "softmax_like", "in_model": {"records": [
        rec, {**rec, "model": "gpt2", "speedup": 0.9, "verdict": "loss"}]}})
    d = next(x for x in decision.decide(rank.review(ws), ws).rows if x.name == "softmax_like")
    assert d.verdict == ONLY and d.fires_in == ()  # the same site lost in gpt2: the gate declines it everywhere


def test_colour_only_on_a_terminal(ws):
    """On a terminal (a pty here) the listing is coloured; piped (above) it never is."""
    import pty

    master, slave = pty.openpty()
    env = {**_env(), "COLUMNS": "100", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    p = subprocess.Popen([sys.executable, "-m", "miner.cli", "--workspace", str(ws.root), "patterns"],
                         stdout=slave, stderr=subprocess.PIPE, env=env)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the pty
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert p.wait(timeout=300) == 0, p.stderr.read()
    text = out.decode(errors="replace")
    assert "\x1b[" in text and "next: " in text


def test_a_region_candidate_without_a_ranked_row_is_decided_and_shown(tmp_path, capsys):
    """A whole-region candidate comes from no mined pattern: the decision table and `candidates show`
    still list it, with the verdict of its in-model evidence."""
    import json
    import shutil
    from pathlib import Path

    from miner import cli
    from miner.check.promotion import write_evidence

    repo = Path(__file__).resolve().parents[1]
    cid = "p010eaa2cbb"
    (tmp_path / "candidates").mkdir()
    shutil.copytree(repo / "candidates" / cid, tmp_path / "candidates" / cid,
                    ignore=shutil.ignore_patterns("in_model.json", "bench.json"))
    assert cli.main(["--workspace", str(tmp_path), "candidates", "--json"]) == 0
    row = next(r for r in json.loads(capsys.readouterr().out)["decisions"]["decisions"] if r["id"] == cid)
    assert row["verdict"] == "not measured"
    write_evidence(tmp_path, cid, [{"model": "t5", "mode": "train", "compile": "default", "preset": "base",
                                    "batch": None, "seq": None, "speedup": 0.95, "band": 0.006, "verdict": "loss",
                                    "matches": 56, "contexts": {"x": 56}, "gpu": "NVIDIA H200", "date": "2026-12-04"}])
    assert cli.main(["--workspace", str(tmp_path), "candidates", "show", cid]) == 0
    out = capsys.readouterr().out
    assert "not worth it" in out and "where it was observed" in out and "56  t5 forward" in out


def test_show_of_a_compute_once_candidate_lists_its_tables(capsys):
    """A compute-once candidate's sites are tables (a shape, the elements its consumers read), not a GEMM's
    inputs: each observed site shows them, never an empty row counted 0."""
    assert main(["--workspace", str(REPO), "candidates", "show", "re332d220be"]) == 0
    text = capsys.readouterr().out
    assert "where the rule fires (each table, its shape -> the elements of its consumers)" in text
    assert "GEMM" not in text
    assert re.search(r"\b1\s+t5 forward aten\.embedding\.default \[512, 512, 12\] -> 50,331,648 elements", text)
