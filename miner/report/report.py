"""``miner report``: show a ``Review`` as terminal tables and as a self-contained HTML page.

The stage's parts: ``listings`` (what the terminal listings show, as text, JSON and CSV), ``terminal``
(printing them: width, colour, ``--json``/``--csv``, the ``next:`` line), ``text`` (shared formatting),
``html`` (the page, led by ``miner.rank.decision``'s table), ``figures`` and ``composition`` (its base64
PNGs), ``style.css``. Renderers only format what ``miner.rank.rank``
computed; they never compute a number themselves. Predicted numbers (cost model or analytical)
carry a leading ``~`` (in HTML also a violet italic style and a "pred" tag); measured ones carry
none. ``write_report`` writes ``reports/<run>/index.html`` with inline CSS and base64 PNG images
(matplotlib, Agg backend), so the page opens from a file or a mail attachment alike.

The renderers stay importable from here (``from miner.report.report import render_html``).
"""

from __future__ import annotations

from pathlib import Path

from miner.core.workspace import Workspace, write_text
from miner.rank.records import Review
from miner.report.figures import accuracy_chart, bench_chart, draw_pattern, layered_positions, pattern_graph
from miner.report.html import candidate_html, model_summary, per_model, render_html, verify_html
from miner.report.text import LEGEND, ops_chain, validation_rows


def default_run_name() -> str:
    """The report folder's name under ``reports/`` when none is given."""
    return "latest"


def write_report(review: Review, ws: Workspace, run: str | None = None, **kw) -> Path:
    """Write ``reports/<run>/index.html``.

    Parameters
    ----------
    review : Review
        What ``miner.rank.rank.review`` computed.
    ws : Workspace
        Where ``reports/`` is.
    run : str, optional
        The folder under ``reports/`` (default ``default_run_name()``).
    **kw
        Passed to ``render_html`` (``title``, ``detail_top``, ...).

    Returns
    -------
    Path
        The page written.
    """
    path = ws.reports / (run or default_run_name()) / "index.html"
    write_text(path, render_html(review, ws, **kw))
    return path


__all__ = ["LEGEND", "accuracy_chart", "bench_chart", "candidate_html", "default_run_name", "draw_pattern",
           "layered_positions", "model_summary", "ops_chain", "pattern_graph", "per_model", "render_html",
           "validation_rows", "verify_html", "write_report"]
