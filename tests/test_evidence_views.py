"""One table, one run kind per row, the setup named (issue 31): the decision and the report on A/B results."""

from __future__ import annotations

import re
from pathlib import Path

from miner.check import abrun
from miner.check.ab import ABResult, VariantResult
from miner.check.verify import Parity, StepStats
from miner.core.workspace import Workspace
from miner.rank import decision
from miner.rank.decision import MARGINAL, model_step_cells, model_steps, step_label

ROOT = Path(__file__).resolve().parents[1]
OK = Parity(1.0, 1.0, 0.0, 0.0, 0.0, None, None, True)


def stats(ms: float) -> StepStats:
    return StepStats(ms, ms * 0.99, ms * 1.01, 15, 2**30, 1.0)


def llama(device: str, *, gated_speedup: float = 1.009, gpu: str = "NVIDIA H200", preset: str = "base") -> ABResult:
    """llama with compute_once: alone a win, the gated variant (the same graph) timed again: noise."""
    r = ABResult("llama", "infer", "reduce-overhead", preset, None, None, noise_band=0.02,
                 fires={"compute_once": 2, "rms_norm": 33},
                 env={"device": device, "gpu": gpu, "date": "2026-12-04T00:25:44Z"})
    r.variants = [VariantResult("default", [], "-", stats(32.2)),
                  VariantResult("control", [], "-", stats(32.3), 0.99, "noise", OK),
                  VariantResult("all", ["compute_once", "rms_norm"], "open", stats(33.0), 0.971, "loss", OK,
                                {"compute_once": 2, "rms_norm": 33}),
                  VariantResult("alone:compute_once", ["compute_once"], "open", stats(31.3), 1.025, "win", OK,
                                {"compute_once": 2}, speedup_p20=1.005, speedup_p80=1.05),
                  VariantResult("alone:rms_norm", ["rms_norm"], "open", stats(34.0), 0.947, "loss", OK,
                                {"rms_norm": 33}),
                  VariantResult("gated", ["compute_once", "rms_norm"], "on", stats(31.9), gated_speedup, "noise", OK,
                                {"compute_once": 2, "rms_norm": 0}, speedup_p20=0.99, speedup_p80=1.03)]
    return r


def test_one_graph_one_measurement_one_verdict():
    """The gated variant fires only compute_once: it is the alone:compute_once graph, so the step table
    shows that measurement (win), as the per-fusion table does, not a second timing saying noise."""
    (row,) = model_steps([("a.json", llama("cuda"))])
    assert row.variant == "alone:compute_once" and row.verdict == "win" and row.speedup == 1.025
    (step,) = decision.ab_steps([("a.json", llama("cuda"))])["compute_once"]
    assert step.shown == row.verdict


def test_a_win_whose_interval_reaches_below_one_is_marginal_everywhere():
    assert step_label("win", 0.981) == MARGINAL and step_label("win", 1.001) == "win"
    assert step_label("loss", 0.9) == "loss" and step_label(None, None) == "-"
    r = llama("cuda")
    r.variants[3].speedup_p20 = 0.98
    (row,) = model_steps([("a.json", r)])
    assert model_step_cells(row)[4].startswith("marginal win")
    (step,) = decision.ab_steps([("a.json", r)])["compute_once"]
    from miner.report.listings import step_text
    assert " marginal win " in step_text(step) and " win " not in step_text(step).replace("marginal win", "")
    # and the line `miner verify --ab` prints as the phase is measured (a llama run printed "win" at p20 0.988)
    from miner.check import ab
    v = r.variants[3]
    lines = []
    ab._log_phase([ab._Live(v, None, None)], lines.append, "  llama train/default")
    assert " marginal win" in lines[0] and " win;" not in lines[0].replace("marginal win", ""), lines[0]


def test_cpu_interpreter_rows_never_sit_beside_gpu_rows(tmp_path):
    ws = Workspace(tmp_path)
    abrun.save([llama("cuda")], tmp_path / "reports" / "gpu" / "h200")
    abrun.save([llama("cpu", gpu="cpu", preset="tiny")], tmp_path / "reports" / "gpu" / "cpu-tiny")
    paths, results = decision.latest_ab(ws)
    assert [str(p.parent.name) for p in paths] == ["h200"]
    assert all(decision.is_gpu_run(r) for _, r in results)
    assert decision.cpu_runs(ws) == ("reports/gpu/cpu-tiny/verify.json",)


def test_rows_name_their_setup_where_it_differs():
    tiny = llama("cuda", preset="tiny")
    rows = model_steps([("a.json", llama("cuda")), ("b.json", tiny)])
    headline = decision.setup_of(llama("cuda"))
    assert headline == "NVIDIA H200, base B16 S512, bf16 autocast"
    cells = sorted(model_step_cells(m, headline)[0] for m in rows)
    assert cells == ["llama infer/reduce-overhead", "llama infer/reduce-overhead [tiny B2 S64]"]


def _page() -> str:
    return (ROOT / "reports" / "latest" / "index.html").read_text()


def test_the_committed_report_links_only_to_anchors_that_exist():
    page = _page()
    ids = set(re.findall(r'\bid="([^"]+)"', page))
    missing = set(re.findall(r'href="#([^"]+)"', page)) - ids
    assert not missing, missing


def test_the_committed_report_is_current():
    """reports/latest/ records a digest of the workspace data it was made from; regenerate it with
    `python3 -m miner report` whenever the data change."""
    from miner.report.html import inputs_digest

    found = re.search(r'<meta name="miner-inputs" content="([0-9a-f]+)">', _page())
    assert found, "reports/latest/index.html has no input digest: regenerate it (python3 -m miner report)"
    assert found.group(1) == inputs_digest(Workspace(ROOT)), \
        "reports/latest/ is older than the workspace data: regenerate it (python3 -m miner report)"


def test_the_committed_report_shows_no_cpu_rows_and_names_the_setup():
    page = _page()
    assert "Setup: <b>NVIDIA H200, base B16 S512, bf16 autocast</b>" in page
    decision_section = page[page.index('id="decision"'):page.index('id="endtoend"')]
    assert "119.89" not in decision_section  # the CPU-interpreter llama row
    assert "[tiny B2 S64]" in decision_section  # the GPU tiny-preset t5 row names its preset
    end = page[page.index('id="endtoend"'):page.index('id="endtoend"') + 3000]
    # the newest in-model A/B under reports/gpu/ is the one shown (it once showed the run of 2026-12-02)
    assert _newest_ab_date()[:10] in end


def _newest_ab_date() -> str:
    """The env date of the newest ``miner verify --ab`` run committed under reports/gpu/."""
    dates = []
    for path in (ROOT / "reports" / "gpu").rglob("verify.json"):
        try:
            results, _ = abrun.load(path)
        except Exception:  # a plain ``miner verify`` run: no A/B
            continue
        dates += [str(r.env.get("date", "")) for r in results if r.variants]
    return max(dates)
