"""A new user's terminal (issue 33): every verb fits 100 columns when piped, ends with the next
command, and the verbs that say "top" share one ranking.

Each test fails on the code before issue 33: ``mine`` printed 171 columns, ``generate`` 177 and one
"skipped" line per pattern, ``scan`` 104 and the old compile seconds of reused graphs, ``validate``
158; ``patterns`` pointed at ``candidates`` (skipping ``generate``) and listed patterns in mining
order; ``generate --top`` ranked by occurrences x ops while ``candidates`` ranked by est. us/step.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from test_newcomer_cli import FACTORY

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 100


def run_verb(args: list[str], cwd: Path, path=()) -> subprocess.CompletedProcess:
    """``miner <args>`` in ``cwd`` at ``COLUMNS=100``, stdout piped (this checkout's miner)."""
    env = {**os.environ, "COLUMNS": str(WIDTH), "PYTHONPATH": os.pathsep.join([str(ROOT), *map(str, path)])}
    return subprocess.run([sys.executable, "-m", "miner", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900)


def assert_fits(r: subprocess.CompletedProcess, next_has: str | None = None) -> list[str]:
    """Every line of stdout and stderr at most 100 characters; the last stdout line ``next: ...``."""
    assert r.returncode == 0, r.stderr[-2000:]
    lines = (r.stdout + r.stderr).splitlines()
    wide = [line for line in lines if len(line) > WIDTH]
    assert not wide, f"{len(wide)} line(s) over {WIDTH} columns, e.g. {wide[0]!r}"
    out = r.stdout.strip().splitlines()
    starts = [i for i, line in enumerate(out) if line.startswith("next: ")]
    assert starts and len(out) - starts[-1] <= 3, out[-3:]  # the last line(s): the next command, wrapped
    last = " ".join(out[starts[-1]:])
    if next_has:
        assert next_has in last
    return lines


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    """A copy of this repository's workspace (captures, mined patterns, candidates, fusions)."""
    root = tmp_path_factory.mktemp("ws")
    for d in ("mined", "candidates", "fusions"):
        shutil.copytree(ROOT / d, root / d)
    shutil.copytree(ROOT / "captures" / "bert", root / "captures" / "bert")
    return root


@pytest.mark.parametrize("verb, next_has", [
    ("models", "miner scan"), ("patterns", "miner generate"), ("patterns show p4b9b2f0dcb", None),
    ("candidates", None), ("candidates show p4b9b2f0dcb", None), ("report --run w", "miner promote")])
def test_listing_verbs_fit_100_columns_and_end_with_the_next_command(ws, verb, next_has):
    assert_fits(run_verb(verb.split(), ws), next_has)


def test_generate_top_3_counts_its_skips_by_reason_and_fits(ws, tmp_path):
    shutil.copytree(ws, tmp_path / "w")
    lines = assert_fits(run_verb(["generate", "--top", "3", "--keep"], tmp_path / "w"), "miner validate")
    skipped = [line for line in lines if line.startswith("skipped")]
    assert 0 < len(skipped) < 20  # a count per reason, not a line per pattern (78 for 3 candidates before)
    assert any("fewer than 3 pointwise ops" in line for line in skipped)
    verbose = run_verb(["generate", "--top", "3", "--keep", "--verbose"], tmp_path / "w").stdout
    assert verbose.count("skipped:") > len(skipped)


@pytest.mark.slow
def test_mine_fits_100_columns_and_points_to_patterns(ws, tmp_path):
    shutil.copytree(ws, tmp_path / "w")
    assert_fits(run_verb(["mine", "--models", "bert"], tmp_path / "w"), "miner patterns")


@pytest.mark.slow
def test_validate_fits_100_columns(ws, tmp_path):
    shutil.copytree(ws, tmp_path / "w")
    assert_fits(run_verb(["validate", "p4b9b2f0dcb"], tmp_path / "w"), "miner bench")


@pytest.mark.slow
def test_scan_fits_100_columns_and_a_reused_scan_shows_no_compile_seconds(tmp_path):
    (tmp_path / "mynet.py").write_text(FACTORY)
    args = ["scan", "--models", "mynet:make", "--workspace", "w"]
    assert_fits(run_verb(args, tmp_path, path=[tmp_path]), "miner mine")
    again = assert_fits(run_verb(args, tmp_path, path=[tmp_path]), "miner mine")
    row = next(line for line in again if line.startswith("mynet") and "reused" in line)
    assert " - " in row and "compile s" in "\n".join(again)


def test_the_verbs_that_say_top_share_one_ranking(ws):
    """``generate --top``'s choice, ``patterns``' order and the candidates' ranking: est. us/step."""
    from miner.commands.patterns import ranked
    from miner.core.pattern import load_patterns
    from miner.core.workspace import Workspace
    from miner.generate.generate import refusal, select
    from miner.rank.rank import rank

    patterns = load_patterns(Workspace(ws))[:60]
    order = ranked(patterns)
    saved = [s for p, s, why in order if why is None]
    assert saved == sorted(saved, reverse=True)
    taken = [i for i, (_, _, why) in enumerate(order) if why is None]
    refused = [i for i, (_, _, why) in enumerate(order) if why is not None]
    assert refused and max(taken) < min(refused)  # the generator's refusals never above what it takes
    chosen, _ = select(patterns, 3)
    assert [p.id for p in chosen] == [p.id for p, _, why in order if why is None][:3]
    rows = {r.id: r.saved_ms.value for r in rank(patterns, ()).rows}
    assert [rows[p.id] for p in chosen] == sorted((rows[p.id] for p in patterns if refusal(p) is None),
                                                  reverse=True)[:3]


def test_patterns_and_report_without_mined_name_miner_mine(tmp_path):
    (tmp_path / "captures").mkdir()
    for verb in ("patterns", "generate"):
        r = run_verb([verb], tmp_path)
        assert r.returncode != 0 and "miner mine" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run_verb(["report"], tmp_path)
    assert r.returncode != 0 and "nothing to report" in r.stderr
    assert not (tmp_path / "reports").exists()


def test_a_mixed_dtype_input_is_named_as_such():
    from miner.generate.lower import dtype_reason

    assert dtype_reason(0, {"bool", "float32"}) == ("input 0 is bool in some occurrences and float32 in others "
                                                    "(one kernel takes floats or bool)")
    assert "int64" in dtype_reason(1, {"int64"})


class SlowStream(io.StringIO):
    """A stream whose every write yields to other threads (as a pipe to a slow reader does)."""

    def write(self, s):
        time.sleep(0.001)
        return super().write(s)


def test_progress_lines_of_two_workers_never_share_a_line():
    from miner.commands import scan as scan_cmd  # noqa: F401  (scan's echo is terminal.say)
    from miner.report.terminal import say

    out = SlowStream()
    workers = [threading.Thread(target=lambda m=m: [say(f"[{m}] step {i}", file=out) for i in range(20)])
               for m in ("bert", "gpt2")]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    lines = out.getvalue().splitlines()
    assert len(lines) == 40 and all(line.count("[") == 1 for line in lines)
