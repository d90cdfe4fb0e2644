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
  const out = {images: imgs.length,
               broken: imgs.filter(i => !i.complete || i.naturalWidth === 0).map(i => i.alt),
               rows: ids('#ranked'), patternRows: ids('#patterns-table'),
               detailSections: document.querySelectorAll('#details > section').length,
               width: document.body.scrollWidth};
  const pre = document.createElement('pre'); pre.id = 'probe'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def chromium_probe(page: Path, tmp: Path) -> dict:
    probed = tmp / "probed.html"
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--no-first-run", f"--user-data-dir={tmp / 'profile'}",
           "--virtual-time-budget=10000", "--dump-dom", probed.as_uri()]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    m = re.search(r'<pre id="probe">(.*?)</pre>', out.stdout, re.S)
    assert m, f"chromium printed no probe (rc {out.returncode}): {out.stderr[-2000:]}"
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))


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
def test_page_renders_in_headless_chromium(page, ws, tmp_path):
    rv = rank.review(ws)
    probe = chromium_probe(page, tmp_path)
    assert probe["broken"] == [], f"broken images: {probe['broken']}"
    # a drawing per detailed pattern, a chart per benchmarked candidate
    n_bench = sum(1 for r in rv.rows if r.candidate and r.candidate.bench)
    assert probe["images"] == probe["detailSections"] + n_bench
    assert probe["rows"] == [f.id for f in rv.candidate_families]
    assert probe["patternRows"] == [f.id for f in rv.pattern_families]
    assert set(probe["rows"]) >= {patterns_zoo()["softmax"].id, patterns_zoo()["rmsnorm"].id}
    assert probe["width"] <= 1400, "the page overflows horizontally"


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
    out = capsys.readouterr().out.strip()
    assert out.endswith("reports/cli/index.html") and Path(out).exists()
    assert main(["--workspace", str(ws.root), "report", "--run", "../x"]) == 2


def test_report_of_an_empty_workspace(tmp_path, capsys):
    assert main(["--workspace", str(tmp_path), "report"]) == 0
    text = (tmp_path / "reports" / "latest" / "index.html").read_text()
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
