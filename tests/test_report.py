"""`miner report`: a self-contained page that renders in headless Chromium, predictions marked as such."""

from __future__ import annotations

import json
import re
from html import escape as _e
import shutil
import subprocess
from pathlib import Path

import pytest

from miner.rank import rank
from miner.cli import main
from miner.report.report import render_html, write_report
from test_rank import build_workspace, patterns_zoo

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)

# Injected into a copy of the page: after load, write what rendered into a <pre> that --dump-dom prints.
PROBE = """<script>
window.addEventListener('load', () => {
  const imgs = [...document.images];
  const ids = sel => [...document.querySelectorAll(sel + ' > tbody > tr.family')].map(r => r.dataset.id);
  const root = document.documentElement;
  const out = {images: imgs.length,
               broken: imgs.filter(i => !i.complete || i.naturalWidth === 0).map(i => i.alt),
               rows: ids('#ranked'), patternRows: ids('#patterns-table'),
               decisionRows: [...document.querySelectorAll('#decision-table tr.decision')].map(r => r.dataset.decision),
               firstTable: document.querySelector('table').id,
               detailSections: document.querySelectorAll('#details > section').length,
               charts: [...document.querySelectorAll('.chart img')].map(i => [i.alt, i.clientWidth / i.naturalWidth]),
               viewport: root.clientWidth, width: Math.max(root.scrollWidth, document.body.scrollWidth)};
  const pre = document.createElement('pre'); pre.id = 'probe'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def _chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--no-first-run", "--hide-scrollbars", f"--user-data-dir={tmp / 'profile'}",
           "--virtual-time-budget=10000", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


def chromium_probe(page: Path, tmp: Path, width: int = 1400) -> dict:
    """What the page rendered at a window ``width`` px wide (images, rows, overflow, chart scales)."""
    probed = tmp / "probed.html"
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    out = _chromium(tmp, f"--window-size={width},1200", "--dump-dom", probed.as_uri())
    m = re.search(r'<pre id="probe">(.*?)</pre>', out.stdout, re.S)
    assert m, f"chromium printed no probe (rc {out.returncode}): {out.stderr[-2000:]}"
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def screenshot(page: Path, out: Path, width: int, height: int, tmp: Path) -> Path:
    """A PNG of the page's first ``height`` px at a window ``width`` px wide."""
    out.parent.mkdir(parents=True, exist_ok=True)
    r = _chromium(tmp, f"--window-size={width},{height}", f"--screenshot={out}", page.as_uri())
    assert out.exists(), r.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    return build_workspace(tmp_path_factory.mktemp("ws"))


@pytest.fixture(scope="module")
def page(ws) -> Path:
    return write_report(rank.review(ws), ws, "test-run")


def test_page_is_self_contained(page):
    text = page.read_text()
    assert page == page.parent.parent / "test-run" / "index.html"
    assert not re.search(r'(src|href)="(https?:|//|file:)', text), "external resource in the page"
    assert text.count('src="data:image/png;base64,') >= 5
    assert "<style>" in text and "<details" in text


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (CI installs it: apt-get install -y chromium)")
@pytest.mark.parametrize("width", [900, 1440])
def test_page_renders_in_headless_chromium(page, ws, tmp_path, width):
    from miner.rank.decision import decide
    from miner.report.figures import FONT_PT

    rv = rank.review(ws)
    probe = chromium_probe(page, tmp_path, width)
    assert probe["broken"] == [], f"broken images: {probe['broken']}"
    # a drawing per detailed pattern, a chart per benchmarked candidate, speedup-vs-shape and roofline figures
    n_bench = sum(1 for r in rv.rows if r.candidate and r.candidate.bench)
    assert probe["images"] == probe["detailSections"] + n_bench + 2
    assert {"speedup vs shape", "roofline share"} <= {alt for alt, _ in probe["charts"]}
    assert probe["firstTable"] == "decision-table"  # the first screen is the decision
    assert probe["decisionRows"] == [d.id for d in decide(rv, ws).rows]
    assert probe["rows"] == [f.id for f in rv.candidate_families]
    assert probe["patternRows"] == [f.id for f in rv.pattern_families]
    assert set(probe["rows"]) >= {patterns_zoo()["softmax"].id, patterns_zoo()["rmsnorm"].id}
    assert probe["width"] <= probe["viewport"], f"the page overflows horizontally at {width} px: {probe}"
    for alt, scale in probe["charts"]:  # tick labels are FONT_PT - 1 points at 110 dpi, shown at this scale
        assert (FONT_PT - 1) * 110 / 72 * scale >= 10, f"{alt}: tick labels below 10 px at {width} px"


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed")
def test_screenshots_at_900_and_1440(page, tmp_path):
    for w, h in ((900, 1400), (1440, 1000)):
        png = screenshot(page, tmp_path / f"report-{w}.png", w, h, tmp_path)
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


def test_the_page_leads_with_the_measured_decision(ws, page):
    text = page.read_text()
    assert text.index('id="decision"') < text.index('id="ranking"') < text.index('id="patterns"')
    assert "Adopt: <b>none</b>" in text  # no in-model A/B in this workspace: predicted numbers never adopt
    assert "measured error" in text[text.index('id="ranking"'):text.index('id="patterns"')]
    # the promoted fusion's gate fires nowhere (no in-model evidence): its badge is not the green one
    assert "promoted · fires nowhere" in text and '<span class="badge promoted">' not in text


def _cells(text: str, row_id: str) -> str:
    m = re.search(rf'<tr class="family" data-id="{row_id}">(.*?)</tr>', text, re.S)
    assert m, row_id
    return m.group(1)


def test_predicted_numbers_are_never_shown_as_measured(tmp_path):
    ws = build_workspace(tmp_path, bench=False)
    text = render_html(rank.review(ws), ws)
    assert "No GPU benchmark results" in text and "nothing on this page is measured" in text
    assert 'class="meas"' not in text  # no benchmark: not one number styled as measured
    for p in patterns_zoo().values():
        if f'data-id="{p.id}"' in text:
            row = _cells(text, p.id)
            assert row.count('class="pred"') == 2  # speedup and saving
    assert "Benchmark (measured)" not in text
    assert "too little benchmark data" in text


def test_measured_rows_are_marked_measured(ws, page):
    text = page.read_text()
    row = _cells(text, patterns_zoo()["softmax"].id)
    assert 'class="meas"' in row and 'class="pred"' not in row
    gelu = _cells(text, patterns_zoo()["gelu"].id)
    assert 'class="pred"' in gelu and 'class="meas"' not in gelu
    assert "NVIDIA H200" in text and "torch 2.11.0" in text and "2026-12-02T11:00:00Z" in text
    assert "2026-12-02-h200-rmsnorm" in text  # the run tables under reports/gpu/
    assert "Why occurrences were rejected" in text and "users: n1 is used outside" in text
    assert "bfloat16 max_abs_err 0.2" in text  # the failed candidate's validation


def test_cli_report_prints_the_path(ws, capsys):
    assert main(["--workspace", str(ws.root), "report", "--run", "cli"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].endswith("reports/cli/index.html") and Path(out[0]).exists() and out[-1].startswith("next: ")
    assert main(["--workspace", str(ws.root), "report", "--run", "../x"]) == 2


def test_report_of_an_empty_workspace(tmp_path, capsys):
    assert main(["--workspace", str(tmp_path), "report"]) == 2  # issue 33: it wrote an empty report and exited 0
    assert "nothing to report" in capsys.readouterr().err and not (tmp_path / "reports").exists()
    from miner.core.workspace import Workspace

    ws = Workspace(tmp_path)
    text = render_html(rank.review(ws), ws)  # the page's own empty state stays
    assert "Nothing to rank yet" in text and "No scan results" in text


def test_cost_model_accuracy_is_reported_when_there_is_enough_data(tmp_path):
    ws = build_workspace(tmp_path, more_bench=True)
    rv = rank.review(ws)
    acc = rv.model.accuracy
    assert acc.ok and acc.n_points >= 10 and acc.n_candidates == 4
    text = render_html(rv, ws)
    assert f"{acc.spearman:.2f}" in text and acc.scheme in text and "Spearman" in text
    assert 'alt="cost model accuracy"' in text and len(acc.held_out) == acc.n_points
    # the fixture's times follow the roofline exactly: the forest cannot beat it, so it is not used
    assert acc.baseline_mae < acc.mae and rv.model.source == "analytical" and "no better than" in rv.model.note
    assert _e(rv.model.note) in text
    add_tanh = next(r for r in rv.rows if r.id == patterns_zoo()["add_tanh"].id)
    assert add_tanh.saved_ms.source == "analytical" and 'title="predicted (analytical)"' in _cells(text, add_tanh.id)


def test_end_to_end_section_shows_the_latest_verify_run_and_gate(tmp_path):
    from miner.check import verify
    from miner.report.report import verify_html
    from miner.core.workspace import Workspace

    ws = Workspace(tmp_path)
    assert "No <code>miner verify</code> run" in verify_html(ws)
    env = {"gpu": "NVIDIA H200", "torch": "2.11.0", "date": "2026-12-02T14:00:00Z"}
    step = verify.StepStats(26.4, 25.3, 28.6, 20, 5 << 30, 30.0)
    fused = verify.StepStats(26.7, 24.9, 29.8, 20, 5 << 30, 21.0)
    parity = verify.Parity(1.0, 1.0, 0.0, 0.0, 1e-3, "w", 1e-2, True)
    new = verify.VerifyResult("bert", "train", "base", 16, 512, step, fused, parity, {"log_softmax": 1},
                              {"log_softmax fire float32[8192,30522]: measured on these shapes: 1.00x Inductor": 1}, env=env)
    old = verify.VerifyResult("gpt2", "train", "base", 16, 512, step, step, parity, {}, {}, env={**env, "date": "2026-11-01"})
    verify.save([old], ws.reports / "gpu" / "old")
    verify.save([new], ws.reports / "gpu" / "new")
    html = verify_html(ws)
    assert "reports/gpu/new/verify.json" in html and "gpt2" not in html  # the newest run only
    assert "B16 S512" in html and "0.989×" in html and "log_softmax×1" in html
    assert "log_softmax fire float32[8192,30522]" in html
