"""The self-contained HTML page of a ``Review`` (inline CSS from ``style.css``, base64 PNG figures).

Predicted numbers carry a leading ``~``, a violet italic style and a "pred" tag; measured ones none.
"""

from __future__ import annotations

import datetime as _dt
import html
import math
from collections import Counter
from pathlib import Path
from typing import Iterable, Sequence

from miner import __version__
from miner.rank.costmodel import FEATURE_NAMES
from miner.core.errors import MinerError
from miner.core.dtypes import short as short_dtype
from miner.rank.rank import combine_sources
from miner.rank.records import PREDICTED_MARK, BenchRun, Estimate, Ranked, Review
from miner.core.workspace import Workspace
from miner.rank.decision import Decision, Decisions, decide, run_name
from miner.report.listings import accuracy_line, decision_cells, kernel_runs, set_text, step_text
from miner.report.figures import accuracy_chart, bench_chart, draw_pattern, latest_points, overview_chart, roofline_chart
from miner.rank.decision import RULE
from miner.report.text import LEGEND, VARIANTS, count, cut, num, pct, validation_rows

def _e(x) -> str:
    return html.escape(str(x))


def _est(e: Estimate | None, spec: str = ".2f", suffix: str = "", scale: float = 1.0) -> str:
    if e is None or not math.isfinite(e.value):
        return "-"
    text = f"{e.value * scale:{spec}}{suffix}"
    if e.measured:
        return f'<span class="meas" title="measured">{_e(text)}</span>'
    return f'<span class="pred" title="predicted ({_e(e.source)})">{PREDICTED_MARK}{_e(text)}</span>'


def _badge(status: str, decision: Decision | None = None) -> str:
    """The status badge; a promoted fusion's follows the gate: green only where the gate fires somewhere."""
    cls = "failed" if status.startswith("fail") else status
    if status == "promoted" and decision is not None and not decision.fires_in:
        return '<span class="badge idle" title="the in-model gate fires nowhere: no measured in-model win">promoted · fires nowhere</span>'
    return f'<span class="badge {_e(cls)}">{_e(status)}</span>'


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], num: set[int] = frozenset(), cls: str = "") -> str:
    head = "".join(f'<th class="num">{_e(h)}</th>' if i in num else f"<th>{_e(h)}</th>" for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f'<td class="num">{c}</td>' if i in num else f"<td>{c}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f'<div class="tablewrap"><table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


RANK_HEADER = ("#", "candidate", "ops", "models", "graphs", "occ", "safe", "missed", "kernels",
               "kernel speedup", "est. µs/step", "status")
RANK_NUM = {0, 3, 4, 5, 6, 7, 8, 9, 10}


def _rank_cells(i: str, r: Ranked, detailed: set[str], decisions: dict | None = None) -> list[str]:
    ident = f'<a href="#c-{_e(r.id)}">{_e(r.id)}</a>' if r.id in detailed else _e(r.id)
    label = f'<br><span class="small">{_e(r.label)}</span>' if r.label else ""
    return [i, f"<code>{ident}</code>{label}", f'<span class="ops">{_e(r.pattern.ops)}</span>', str(r.support[0]),
            str(r.support[1]), str(r.occurrences), pct(r.safe_share), pct(r.missed_share),
            "-" if r.inductor_kernels is None else str(r.inductor_kernels),
            _est(r.speedup, ".2f", "×"), _est(r.saved_ms, ".1f", scale=1e3), _badge(r.status, (decisions or {}).get(r.id))]


def ranked_table(review: Review, fams: Sequence, detailed: set[str], *, table_id: str, top: int | None = None,
                 last_column: str = "status", decisions: dict | None = None) -> str:
    """One row per family (its leader) with the other members folded; the first ``top`` families.

    ``last_column``: "status" (candidates) or "why" (mined patterns: why no candidate was generated).
    """
    by_id = {r.id: r for r in review.rows}
    shown = list(fams[:top] if top else fams)
    header = RANK_HEADER[:-1] + (("status",) if last_column == "status" else ("why no candidate",))
    if last_column != "status":
        header = (header[0], "pattern") + header[2:]

    def cells(i: str, r: Ranked) -> list[str]:
        c = _rank_cells(i, r, detailed, decisions)
        if last_column != "status":
            c[-1] = f'<span class="small">{_e(review.skipped.get(r.id, "not generated yet"))}</span>'
        return c

    head = "".join(f'<th class="num">{_e(h)}</th>' if i in RANK_NUM else f"<th>{_e(h)}</th>" for i, h in enumerate(header))
    body = []
    for i, fam in enumerate(shown, 1):
        lead = by_id[fam.id]
        body.append('<tr class="family" data-id="{}">'.format(_e(lead.id)) + "".join(
            f'<td class="num">{c}</td>' if j in RANK_NUM else (f'<td class="ops">{c}</td>' if j == 2 else f"<td>{c}</td>")
            for j, c in enumerate(cells(str(i), lead))) + "</tr>")
        if len(fam.members) > 1:
            members = [by_id[m] for m in fam.members[1:]]
            inner = _table(header, [cells("", m) for m in members], RANK_NUM)
            body.append(f'<tr class="members"><td></td><td colspan="{len(header) - 1}"><details class="members">'
                        f"<summary>{len(members)} more in family “{_e(fam.name)}”</summary>{inner}</details></td></tr>")
    more = len(fams) - len(shown)
    tail = (f'<p class="small">{more} more families not shown; <code>miner candidates '
            f'{"--patterns " if last_column != "status" else ""}--top 0</code> lists them all.</p>') if more > 0 else ""
    return (f'<div class="tablewrap"><table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}'
            f'</tbody></table></div>{tail}')


def per_model(review: Review) -> dict[str, tuple[int, int, Estimate]]:
    """model -> (patterns occurring there, candidates among them, µs per step the candidates save there).

    Mined patterns overlap (a sub-chain and its extension share nodes), so only candidates are summed;
    candidates may overlap too, so the sum is an upper bound.
    """
    out: dict[str, list] = {}
    for r in review.rows:
        for m in r.pattern.support.models:
            entry = out.setdefault(m, [0, 0, 0.0, set()])
            entry[0] += 1
            entry[1] += r.candidate is not None
        if r.candidate is None or r.status == "failed":
            continue
        for e in r.calls:
            entry = out.setdefault(e.call.model, [0, 0, 0.0, set()])
            entry[2] += e.total_saved_ms
            entry[3].add(e.saved_ms.source)
    return {m: (a, b, Estimate(ms, combine_sources(src) if src else review.model.source)) for m, (a, b, ms, src) in out.items()}


def model_summary(ws: Workspace, review: Review) -> str:
    """The per-model table: patterns, candidates, the saving per step (HTML)."""
    try:
        scans = ws.scans()
    except Exception as e:  # a corrupt scan file must not sink the whole report
        return f'<p class="banner">Could not read the scan results: {_e(e)}</p>'
    if not scans:
        return '<p class="banner">No scan results (captures/*/*/*.scan.json) in this workspace: run <code>miner scan</code>.</p>'
    mined = per_model(review)
    rows, seen = [], set()
    for s in scans:
        nodes = sum(s.nodes_by_category.values())
        pr = f"{s.nodes_by_category.get('pointwise', 0)} / {s.nodes_by_category.get('reduction', 0)}"
        first = s.model not in seen
        seen.add(s.model)
        pats, cands, saved = mined.get(s.model, (0, 0, None))
        saved = saved if cands else None
        rows.append([_e(s.model), _e(s.preset), _e(s.mode),
                     '<span class="good">ok</span>' if s.ok else f'<span class="bad">failed</span> {_e(s.error or "")}',
                     str(len(s.graphs)), str(nodes), pr, str(s.kernels), str(s.graph_breaks), f"{s.seconds:.0f}",
                     str(pats) if first else "″", str(cands) if first else "″",
                     (_est(saved, ".1f", scale=1e3) if saved is not None else "-") if first else "″"])
    return _table(("model", "preset", "mode", "scan", "graphs", "nodes", "pw / red", "kernels", "breaks",
                   "scan s", "patterns", "candidates", "saved µs/step"), rows,
                  {4, 5, 6, 7, 8, 9, 10, 11, 12}) + (
        '<p class="small">nodes: post-grad FX nodes; pw / red: pointwise / reduction nodes; kernels: Inductor kernel '
        "launches; patterns: mined patterns occurring in the model (they overlap); saved: the sum of its non-failed "
        "candidates' expected savings per step (an upper bound where candidates overlap).</p>")


def accuracy_html(review: Review) -> str:
    """The cost model's cross-validated accuracy and its chart, or why there is none (HTML)."""
    acc, model = review.model.accuracy, review.model
    if acc is None or not acc.ok:
        reason = acc.reason if acc and acc.reason else "accuracy is undefined on these points (a constant vector)"
        return (f'<p class="banner">No accuracy number: {_e(reason)}. Predictions below come from the '
                f'{"cost model" if model.source == "model" else "analytical roofline model"} and are marked '
                f'{PREDICTED_MARK}.</p>')
    rows = [["random forest (cost model)", f"{acc.spearman:.2f}", f"{acc.mae:.3f}×"],
            ["analytical roofline (baseline)", num(acc.baseline_spearman), num(acc.baseline_mae, ".3f") + "×"]]
    return (f"<p>Cross-validation: <b>{_e(acc.scheme)}</b> over {acc.n_points} measured (candidate, input) points "
            f"from {acc.n_candidates} candidates: every point of a candidate is predicted by a forest trained "
            f"without that candidate (and, for leave-one-family-out, without its near-identical siblings). Spearman = rank correlation of predicted vs measured speedup over Inductor; "
            f"MAE = mean |predicted − measured| speedup.</p>"
            + _table(("predictor", "Spearman ρ", "MAE"), rows, {1, 2})
            + (f'<div class="chart"><img alt="cost model accuracy" src="{accuracy_chart(acc)}" style="max-width:420px"></div>'
               if acc.held_out else "")
            + f"<p><b>Used for the predictions on this page:</b> {_e(model.note)}.</p>"
            + f'<p class="small">The forest learns log(measured / analytical speedup) from: '
              f'{_e(", ".join(FEATURE_NAMES))}.</p>')


def _run_cells(r: BenchRun) -> list[str]:
    """GPU, versions, date, copy bandwidth of a benchmark run, as table cells."""
    return [_e(r.gpu), _e(", ".join(f"{k} {v}" for k, v in r.versions.items())), _e(r.date), num(r.copy_gbps, ".0f")]


def provenance_html(review: Review) -> str:
    """Where the measured numbers come from: the bench runs and the run tables under reports/gpu/ (HTML)."""
    if not review.runs:
        out = '<p class="banner">No GPU benchmark results of these candidates in this workspace: nothing on this page is measured.</p>'
    else:
        rows = [_run_cells(r) + [str(len(set(r.sources)))] for r in review.runs]
        out = ("<p>The measured numbers on this page come from these runs (<code>candidates/&lt;id&gt;/bench.json</code>):</p>"
               + _table(("GPU", "versions", "date (UTC)", "copy bandwidth GB/s", "candidates"), rows, {3, 4}))
    if review.run_tables:
        known = {r.id for r in review.rows if r.candidate is not None}
        rows = [[f"<code>{_e(t.path.parent.name)}</code>"] + _run_cells(t.run) + [str(t.rows),
                 _e(", ".join(t.candidates[:4]) + (" …" if len(t.candidates) > 4 else "")),
                 "yes" if set(t.candidates) & known else "no (candidates not in this workspace)"]
                for t in review.run_tables]
        out += ("<h4>Benchmark run tables under reports/gpu/</h4>"
                + _table(("run", "GPU", "versions", "date (UTC)", "copy GB/s", "rows", "candidates", "ranked here"),
                         rows, {4, 5}))
    return out


def latest_verify(ws: Workspace) -> tuple[Path, list] | None:
    """The newest ``reports/gpu/*/verify.json`` (by its env date) and its results; None if there is none."""
    from miner.check import verify

    found = []
    for path in ws.reports.glob("gpu/*/verify.json"):
        try:
            results = verify.load(path)
        except (OSError, ValueError, KeyError, TypeError, MinerError):
            continue
        date = next((r.env.get("date") for r in results if r.env.get("date")), "")
        found.append((date, str(path), path, results))
    if not found:
        return None
    _, _, path, results = max(found)
    return path, results


def end_to_end_html(ws: Workspace, dec: Decisions) -> str:
    """All promoted fusions at once: the gated rows of the latest in-model A/B, or the plain ``miner verify``
    run where that is newer (the older one folded, named with its date)."""
    found = latest_verify(ws)
    plain_date = str(next((r.env.get("date") for r in found[1] if r.env.get("date")), "")) if found else ""
    gated = [m for m in dec.models if m.variant == "gated" or m.fired]
    if not gated or (found and plain_date > str(dec.ab_date or "")):
        return verify_html(ws)
    from miner.rank.decision import MODEL_STEP_HEADER, model_step_cells

    out = (f"<p>The latest measurement of every promoted fusion at once, with its gate on (what a user gets): "
           f"the <code>gated</code> variant of the in-model A/B ({_e(dec.ab_date)}; <code>miner verify --ab</code>), "
           "timed alternately with the default compile and a control.</p>"
           + _table(MODEL_STEP_HEADER, [[_e(c) for c in model_step_cells(m, dec.setup)] for m in gated], {1, 2, 3}))
    if found:
        out += (f"<details><summary>Older: the plain <code>miner verify</code> run of {_e(plain_date)} (no noise "
                f"band)</summary>{verify_html(ws)}</details>")
    return out


def verify_html(ws: Workspace) -> str:
    """End to end: the promoted fusions in real model steps (``miner verify``), with the gate's decisions."""
    from miner.check import verify

    found = latest_verify(ws)
    if found is None:
        return ('<p class="banner">No <code>miner verify</code> run under reports/gpu/: no end-to-end number. '
                "Run it on a CUDA machine (docs/benchmarking.md).</p>")
    path, results = found
    rows = []
    for r in results:
        own = {k: v for k, v in r.matches.items() if not k.startswith("inductor.")}
        fired = ", ".join(f"{k}×{v}" for k, v in sorted(own.items()) if v) or "none"
        rows.append([_e(r.model), _e(r.mode), _e(f"B{r.batch} S{r.seq}" if r.batch else f"{r.preset} preset"),
                     verify.format_step(r.default), verify.format_step(r.fused),
                     "-" if r.speedup is None else f"{r.speedup:.3f}×",
                     "-" if r.default is None or r.fused is None else
                     f"{r.default.peak_mem_bytes / 2**30:.2f} / {r.fused.peak_mem_bytes / 2**30:.2f}",
                     "ok" if r.parity and r.parity.ok else _e(r.error or "FAIL"), _e(fired)])
    gate = [f"<li>{_e(r.model)} {_e(r.mode)}: ×{n} {_e(d)}</li>" for r in results for d, n in sorted(r.gate.items())]
    env = results[0].env if results else {}
    return (f"<p>From <code>{_e(path.relative_to(ws.root).as_posix())}</code> ({_e(env.get('gpu'))}, torch "
            f"{_e(env.get('torch'))}, {_e(env.get('date'))}): <code>torch.compile(model)</code> vs the same with "
            "<code>fusions.inductor_options()</code>, bf16 autocast, median step time (p20–p80).</p>"
            + _table(("model", "mode", "size", "default ms", "fused ms", "speedup", "step peak GiB default / fused",
                      "parity", "fusions fired"), rows, {3, 4, 5})
            + ("<p>The gate's decisions while compiling, as that run made them (since 2026-12-03 a promoted "
               "fusion fires on CUDA only where <code>miner verify --ab</code> measured the model's step "
               "faster).</p><ul class=\"small\">"
               + "".join(gate) + "</ul>" if gate else ""))


VERDICT_CLASS = {"adopt": "adopt", "fires only in": "only", "not worth it": "notworth", "unsafe": "unsafe",
                 "not measured": "unmeasured"}


def _code(text: str) -> str:
    """``text`` escaped, its `backticked` spans as <code>."""
    import re
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", _e(text))


def _verdict(d: Decision) -> str:
    return f'<span class="verdict {VERDICT_CLASS.get(d.verdict, "")}">{_e(d.label)}</span>'


def decision_html(dec: Decisions) -> str:
    """The first screen: every fusion and candidate, its verdict from measurements only, and why (HTML)."""
    runs = kernel_runs(dec)
    rows = []
    for d in dec.rows:
        c = decision_cells(d, run=len(runs) > 1, setup=dec.setup)
        name = (f"<b>{_e(d.name)}</b><br>" if d.name and d.name != d.id else "") + f'<code>{_e(d.id)}</code>'
        link = f'<a href="#c-{_e(d.id)}">{name}</a>'
        rows.append([_verdict(d), link, _e(c["where"]), _e(c["kernel"]),
                     "<br>".join(_e(step_text(x, dec.setup)).replace(" MiB", "&nbsp;MiB") for x in d.steps)
                     or '<span class="small">' + ("<br>".join(_e(set_text(x, dec.setup)) for x in d.together)
                                                  or "not measured") + "</span>",
                     f'<span class="small">why: {_code(d.reason)}</span>'])
    adopt = [d.name or d.id for d in dec.adopt]
    setup = (f'<p class="setup">Setup: <b>{_e(dec.setup)}</b> (a row measured otherwise names what differs, '
             "in brackets).</p>" if dec.setup else "")
    head = setup + (f'<p class="headline good">Adopt: <b>{_e(", ".join(adopt))}</b>.</p>' if adopt else
            '<p class="headline">Adopt: <b>none</b>: no fusion or candidate has a measured in-model win without a '
            "measured loss.</p>")
    if dec.configs:  # knobs measured beside the fusions: what to run comes first (miner.check.configs)
        from miner.check import configs
        from miner.rank.decision import setup_diff
        from miner.report.figures import configs_chart

        head = "".join(f"<p><b>{_e(c.where)}</b>"
                       + (f" [{_e(setup_diff(c.setup, dec.setup))}]" if setup_diff(c.setup, dec.setup) else "")
                       + f": run <b>{_e(c.best.name)}</b>.</p><ul>"
                       + "".join(f"<li>{_e(x.strip())}</li>" for x in configs.lines(c, 10**6)[1:]) + "</ul>"
                       + _table(configs.HEADER, [[_e(x) for x in configs.cells(k)] for k in c.configs], {1, 2})
                       for c in dec.configs) + head
        chart = configs_chart(list(dec.configs), dec.setup, only_headline=True)
        if chart:
            head = (f'<div class="chart"><img alt="configurations per model step" src="{chart}"></div>'
                    f'<p class="small">Each model step measured on {_e(dec.setup or "the GPU")}: its configurations '
                    "against its default compile, dot the paired median, bar p20-p80, shaded the run's noise band; "
                    "green with the fusions, blue a knob alone, grey not usable (parity failed or not judged); bold "
                    "what to run. Steps measured elsewhere (another GPU or shape) are in the tables below.</p>" + head)
    if dec.models:
        from miner.rank.decision import MODEL_STEP_HEADER, model_step_cells

        head += ("<p><b>Model steps</b>, the default <code>torch.compile</code> against the fusions as they fire "
                 "(the latest in-model A/B per model: the gated variant, or every fusion of the run with the gate "
                 "open), median step ms, speedup with its p20-p80, verdict against the default-vs-default noise "
                 "band, step peak memory default / fused:</p>"
                 + _table(MODEL_STEP_HEADER, [[_e(c) for c in model_step_cells(m, dec.setup)] for m in dec.models],
                          {1, 2, 3})
                 + "<p><b>Per fusion and candidate</b>, each measured alone in the model step:</p>")
    src = (f"In-model A/B: <code>{_e(dec.ab_source)}</code> ({_e(dec.ab_date)})." if dec.ab_source else
           "In-model A/B: none under <code>reports/</code> yet (<code>miner verify --ab</code> on a GPU; "
           "docs/benchmarking.md).")
    notes = [f"Rule: {_code(RULE)}.", src,
             "fires on CUDA: where the in-model gate fires (its evidence: <code>fusions/&lt;name&gt;/wins.json</code>); "
             "step: the fusion alone in the model step vs the default compile, win / loss beyond the noise band.",
             "kernel x: the kernel alone vs Inductor's, min-max over the shapes of each candidate's latest bench run"
             + (f" (<code>{_e(runs[0])}</code>)" if len(runs) == 1 else "") + "; it decides nothing in a model on its own."]
    if dec.together:
        notes.append(f"All promoted fusions at once (<code>{_e(dec.together_source)}</code>, no noise band): "
                     + _e("; ".join(dec.together)) + ".")
    if dec.not_compared:
        notes.append("Not compared (CPU-interpreter runs; their times mean nothing beside GPU rows): "
                     + ", ".join(f"<code>{_e(f)}</code>" for f in dec.not_compared) + ".")
    notes.append("marginal win: the median step is faster beyond the noise band, but the p20 of the per-round "
                 "ratios is below 1.0 (a fifth of the rounds or more were slower): more rounds would tell.")
    header = ("verdict", "fusion / candidate", "fires on CUDA", "kernel x (shapes)",
              "step change per model: x [p20-p80], verdict, ±noise band, peak memory")
    body = "".join(f'<tr class="decision" data-decision="{_e(d.id)}" data-verdict="{_e(d.verdict)}">'
                   + "".join(f"<td>{c}</td>" for c in row[:-1])
                   + f'</tr><tr class="why"><td></td><td colspan="{len(header) - 1}">{row[-1]}</td></tr>'
                   for d, row in zip(dec.rows, rows))
    table = ('<div class="tablewrap"><table class="decision" id="decision-table"><thead><tr>'
             + "".join(f"<th>{_e(h)}</th>" for h in header) + f"</tr></thead><tbody>{body}</tbody></table></div>")
    return head + table + "".join(f'<p class="small">{n}</p>' for n in notes)


def kernels_html(review: Review) -> str:
    """Speedup vs shape of every benchmarked candidate and their roofline share, latest run each (HTML)."""
    rows = [(r, latest_points(r)) for r in review.rows if r.candidate is not None]
    rows = [(r, pts) for r, pts in rows if pts]
    names = Counter(r.label or r.id for r, _ in rows)
    rows = [((r.label or r.id) + (f" {r.id[:7]}" if names[r.label or r.id] > 1 else ""), pts) for r, pts in rows]
    if not rows:
        return ""
    names = sorted({run_name(pts[0].run, review.runs) for _, pts in rows})
    over, roof = overview_chart(rows), roofline_chart(rows)
    return ('<section id="kernels"><h2>The kernels alone (measured, isolated)</h2>'
            f"<p>Each candidate's kernel against the kernel(s) Inductor generates for the same subgraph, per input "
            f"shape, from each candidate's latest bench run ({_e(', '.join(names))}); a kernel faster alone can "
            "still make the model step slower (it splits a kernel Inductor would have fused with its neighbours), "
            "which is why only the in-model A/B above decides.</p>"
            + (f'<div class="chart"><img alt="speedup vs shape" src="{over}"></div>' if over else "")
            + (f'<div class="chart"><img alt="roofline share" src="{roof}"></div>' if roof else "")
            + "</section>")


def candidate_html(r: Ranked, skipped: dict[str, str] | None = None, decision: Decision | None = None,
                   runs: Sequence[BenchRun] = ()) -> str:
    """One candidate (or pattern without one) in full: graph, decision, calls, validation, bench chart (HTML)."""
    skipped = skipped or {}
    p, c = r.pattern, r.candidate
    facts = [("ops", f"<code>{_e(p.ops)}</code>"), ("status", _badge(r.status, decision) + (f" fusion <code>{_e(c.fusion)}</code>"
                                                                                  if c and c.fusion else "")),
             ("family", f"{_e(r.family.name)} ({len(r.family.members)} member(s))"),
             ("support", f"{p.support.n_models} models ({_e(', '.join(p.support.models))}), {p.support.n_graphs} graphs"),
             ("occurrences", f"{r.occurrences} non-overlapping, {r.safe} safe ({pct(r.safe_share)}); by phase "
                             f"{_e(', '.join(f'{k} {v}' for k, v in p.counts.by_phase.items()))}"),
             ("Inductor", f"typical {r.inductor_kernels if r.inductor_kernels is not None else '?'} kernel(s) / occurrence; "
                          f"missed fusion in {pct(r.missed_share)}"),
             ("speedup vs Inductor", _est(r.speedup, ".2f", "×")),
             ("est. saved per step (kernel time × calls)", _est(r.saved_ms, ".1f", " µs", 1e3))]
    if decision is not None:
        cells = decision_cells(decision)
        facts[2:2] = [("verdict (measured)", f"{_verdict(decision)} <span class=\"small\">{_e(decision.reason)}</span>"),
                      ("fires on CUDA", _e(cells["where"])), ("kernel alone", _e(cells["kernel"]))]
    if c is not None:
        facts.append(("files", f"<code>{_e(c.candidate.path.name)}/</code>"))
    else:
        facts.append(("no candidate", _e(skipped.get(r.id, "not generated yet"))))
    kind = "candidate" if c is not None else "mined pattern"
    parts = [f'<section id="c-{_e(r.id)}"><h2><span class="small">{kind}</span> {_e(r.id)} '
             f'{("· " + _e(r.label)) if r.label else ""}</h2>',
             '<div class="cand"><div class="figscroll">', f'<img class="natural" alt="pattern {_e(r.id)}" src="{draw_pattern(p)}">',
             '<p class="small">square boxes: inputs used by several ops (an input used once is named in its '
             'op\'s box); blue: pointwise; orange: reduction; grey: view; green border: outputs.</p></div><div>',
             '<table class="facts"><tbody>' + "".join(f"<tr><td>{_e(k)}</td><td>{v}</td></tr>" for k, v in facts)
             + "</tbody></table>", "</div></div>"]
    if p.inductor.splits:
        parts.append("<h4>Where Inductor splits it</h4>" + _table(
            ("edge", "occurrences"), [[f"<code>{_e(k)}</code>", str(v)] for k, v in p.inductor.splits.items()], {1}))
    if r.calls:
        parts.append("<h4>Where it would save time (safe occurrences, grouped by inputs)</h4>")
        rows = [[_e(e.call.model), _e(e.call.phase), f'<span class="mono">{_e(cut(e.call.label, 90))}</span>'
                 + (' <span class="small">(derived)</span>' if e.call.source == "derived" else ""), count(e.call.count),
                 _e(e.call.mix_label),
                 _est(e.inductor_ms, ".1f", scale=1e3), _est(e.speedup, ".2f", "×"), _est(e.saved_ms, ".1f", scale=1e3)]
                for e in r.calls[:15]]
        parts.append(_table(("model", "phase", "inputs", "count", "kernels", "Inductor µs", "speedup",
                             "saved µs / call"), rows, {3, 4, 5, 6, 7}))
        if len(r.calls) > 15:
            parts.append(f'<p class="small">… {len(r.calls) - 15} more input sets.</p>')
    if p.rejections:
        parts.append("<h4>Why occurrences were rejected</h4>" + _table(
            ("reason", "occurrences"), [[_e(k), str(v)] for k, v in sorted(p.rejections.items(), key=lambda kv: -kv[1])],
            {1}))
    if p.occurrences:
        rows = []
        for o in p.occurrences[:40]:
            shapes = " ".join(f"{short_dtype(m.dtype)}{list(m.shape)}" for m in o.input_meta if m is not None)
            verdict = ('<span class="good">ok</span>' if o.verdict.ok
                       else '<span class="bad">rejected</span>: ' + _e("; ".join(o.verdict.reasons)))
            rows.append([_e(o.graph), _e(o.phase), f'<span class="mono">{_e(shapes)}</span>', str(o.n_kernels),
                         _e(", ".join(k.name for k in o.kernels)[:120]), verdict])
        parts.append(f"<details><summary>Where it occurs: {len(p.occurrences)} sampled occurrences</summary>"
                     f'<div class="scroll">' + _table(("graph", "phase", "inputs", "kernels", "Inductor kernels",
                                                     "verdict"), rows, {3}) + "</div></details>")
    if c is not None:
        vrows = validation_rows(c.validation) if isinstance(c.validation, dict) else []
        if c.validation is None:
            parts.append('<h4>Validation</h4><p class="small">Not validated yet (<code>miner validate</code>).</p>')
        else:
            ok = c.validation.get("ok")
            head = '<span class="good">passed</span>' if ok else '<span class="bad">failed</span>'
            where = ", ".join(f"{k} {c.validation[k]}" for k in ("device", "torch", "triton", "date") if c.validation.get(k))
            parts.append(f"<h4>Validation: {head}</h4>" + (f'<p class="small">{_e(where)}</p>' if where else ""))
            if c.validation.get("failure"):
                parts.append(f'<p class="bad">{_e(c.validation["failure"])}</p>')
            if vrows:
                parts.append('<div class="scroll">' + _table(("check", "result", "detail"), [
                    [_e(w), '<span class="good">ok</span>' if k else '<span class="bad">fail</span>' if k is False else "?",
                     f'<span class="small">{_e(d)}</span>'] for w, k, d in vrows]) + "</div>")
        latest = latest_points(r)
        chart = bench_chart(r, run_name(latest[0].run, runs)) if latest else None
        if chart:
            parts.append("<h4>Benchmark (measured): the kernel alone vs Inductor</h4>"
                         f'<p class="small">Latest run only (<code>{_e(run_name(latest[0].run, runs))}</code>): '
                         "speedup over Inductor per input shape; dot: median, bar: p20-p80 of the kernel's time.</p>"
                         f'<div class="chart"><img alt="benchmark {_e(r.id)}" src="{chart}"></div>')
            def bench_row(b) -> list[str]:
                return ([f'<span class="nowrap">{_e(run_name(b.run, runs))}</span>',
                         f'<span class="mono">{_e(cut(b.label, 70))}</span>', _e(", ".join(b.models)), _e(b.source),
                         num(b.speedup, ".2f") + "×" if b.speedup else "-", num(b.roofline_pct(), ".0f") + "%"]
                        + [num(b.times[v][0] * 1e3, ".1f") if v in b.times else
                           f'<span class="bad" title="{_e(b.errors.get(v, ""))}">n/a</span>' for v in VARIANTS]
                        + [num(b.roofline_ms * 1e3, ".1f")])
            header = ("run", "inputs", "models", "shape source", "vs Inductor", "% roofline", "eager µs", "Inductor µs",
                      "max-autotune µs", "candidate µs", "roofline µs")
            newest = latest[0].run
            parts.append(_table(header, [bench_row(b) for b in c.bench if b.run == newest], set(range(4, 11))))
            older = [b for b in c.bench if b.run != newest]
            if older:
                parts.append(f"<details><summary>{len(older)} rows of older runs (other kernels of this candidate; "
                             "not used above)</summary>"
                             + _table(header, [bench_row(b) for b in older], set(range(4, 11))) + "</details>")
        else:
            parts.append('<h4>Benchmark</h4><p class="small">Not benchmarked on a GPU: the speedups above are '
                         f'predicted ({PREDICTED_MARK}).</p>')
    parts.append("</section>")
    return "".join(parts)


def render_html(review: Review, ws: Workspace, *, title: str = "miner review", detail_top: int = 10,
                table_top: int = 50) -> str:
    """The whole report page, self-contained (inline CSS, base64 PNGs).

    Parameters
    ----------
    review : Review
        What ``miner.rank.rank.review`` computed.
    ws : Workspace
        The workspace (scans, verify runs).
    title : str
        The page title.
    detail_top : int
        How many patterns without a candidate get a detail section (every candidate gets one).
    table_top : int
        Rows of the ranked table.

    Returns
    -------
    str
        The HTML.
    """
    CSS = Path(__file__).with_name("style.css").read_text()

    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    dec = decide(review, ws)
    by_dec = {d.id: d for d in dec.rows}
    detailed_rows = _detailed(review, detail_top)
    detailed = {r.id for r in detailed_rows}
    mining = review.mining.get("params", {})
    counts = Counter(d.verdict for d in dec.rows)
    body = [f"<header><h1>{_e(title)}</h1><div class=\"sub\">miner {__version__} · generated {now} · "
            f"{len(dec.rows)} fusions and candidates decided: "
            f"{_e(', '.join(f'{v} {k}' for k, v in counts.items()) or 'none')} · {len(review.rows)} patterns ranked "
            "(predicted)</div></header><main>",
            '<nav class="toc"><a href="#decision">Decision</a><a href="#endtoend">End to end</a>'
            '<a href="#kernels">Kernels</a><a href="#ranking">Predicted ranking</a><a href="#patterns">Mined patterns'
            '</a><a href="#costmodel">Cost model</a><a href="#summary">Models</a><a href="#provenance">Provenance</a>'
            '<a href="#details">Details</a></nav>']
    body += [f"<div class=\"banner\">{_e(p)}</div>" for p in review.problems]
    body.append('<section id="decision"><h2>What to adopt (measured only)</h2>' + decision_html(dec) + "</section>")
    body.append('<section id="endtoend"><h2>End to end: all promoted fusions at once (latest run)</h2>'
                f"{end_to_end_html(ws, dec)}</section>")
    from miner.report.composition import composition_html  # the step figure, when step profiles exist
    body.append(composition_html(ws))
    body.append(kernels_html(review))
    body.append('<section id="ranking"><h2>Predicted: candidates ranked by estimated time saved</h2>'
                f'<p class="banner info">{_e(accuracy_line(review))} {_e(review.basis)}</p>'
                "<p>One row per family of near-identical patterns (same ops up to casts/views or one op); "
                "unfold a family to see its other members. est. µs/step: the kernel-alone time difference times "
                "the calls per step, summed over every safe occurrence (measured per call where the kernel was "
                "timed at that shape, else predicted, marked ~): an extrapolation, not a step measurement. "
                "Ties broken by support.</p>"
                + (ranked_table(review, review.candidate_families, detailed, table_id="ranked", decisions=by_dec)
                   if review.candidate_families else
                   '<p class="banner">No candidates yet: run <code>miner generate</code> (the mined patterns are '
                   'ranked below).</p>' if review.rows else
                   '<p class="banner">Nothing to rank yet: no mined patterns or candidates.</p>')
                + f'<p class="legend">{_e(LEGEND)} occ = non-overlapping occurrences; safe = share accepted by the '
                  "safety checks; missed = share of occurrences Inductor splits into more than one kernel; kernels = "
                  "Inductor kernels per occurrence (typical); kernel speedup = over Inductor (call-weighted geometric "
                  "mean).</p></section>")
    if review.pattern_families:
        body.append('<section id="patterns"><h2>Predicted: mined patterns without a candidate</h2>'
                    f'<p class="banner info">{_e(accuracy_line(review))}</p>'
                    "<p>Ranked the same way (all predicted), with the reason <code>miner generate</code> gave for not "
                    "writing a candidate. Sub-patterns overlap: their savings do not add up.</p>"
                    + ranked_table(review, review.pattern_families, detailed, table_id="patterns-table", top=table_top,
                                   last_column="why") + "</section>")
    body.append(f'<section id="costmodel"><h2>Cost model</h2>{accuracy_html(review)}</section>')
    body.append(f'<section id="summary"><h2>Models scanned</h2>{model_summary(ws, review)}'
                + (f'<p class="small">Mining parameters: {_e(mining)}</p>' if mining else "") + "</section>")
    body.append(f'<section id="provenance"><h2>Provenance of the measurements</h2>{provenance_html(review)}</section>')
    body.append('<div id="details">')
    body += [candidate_html(r, review.skipped, by_dec.get(r.id), review.runs) for r in detailed_rows]
    body += [decision_section(d, dec.setup) for d in dec.rows if d.id not in detailed]
    body.append("</div>")
    if len(detailed_rows) < len(review.rows):
        body.append(f'<p class="small">Details are shown for every candidate and the top {detail_top} mined patterns; '
                    f"<code>miner candidates show &lt;id&gt;</code> prints any other.</p>")
    body.append(f"<footer>Generated by <code>miner report</code> from the workspace {_e(ws.root.resolve().name)}/."
                "</footer></main>")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
            f'content="width=device-width, initial-scale=1"><meta name="miner-inputs" content="{inputs_digest(ws)}">'
            f'<title>{_e(title)}</title><style>{CSS}</style></head>'
            f'<body>{"".join(body)}</body></html>\n')


def decision_section(d: Decision, setup: str = "") -> str:
    """The detail section of a fusion or candidate the ranking has no row for (an upcast matmul, a
    compute-once value, a whole region): its verdict, where its gate fires, its in-model steps."""
    cover = "".join(f"<li><code>{_e(c)}</code></li>" for c in d.coverage)
    steps = "".join(f"<li>{_e(step_text(x, setup))} <span class=\"small\">({_e(x.source)})</span></li>"
                    for x in d.steps) + "".join(
        f"<li>{_e(set_text(x, setup))} <span class=\"small\">({_e(x.step.source)})</span></li>" for x in d.together)
    return (f'<section id="c-{_e(d.id)}"><h2><span class="small">{"fusion" if d.promoted else "candidate"}</span> '
            f"{_e(d.id)} · {_e(d.name)}</h2><p>{_verdict(d)} <span class=\"small\">{_code(d.reason)}</span></p>"
            f"<p>ops: <code>{_e(d.ops or '-')}</code>; fires on CUDA: {_e(d.where)}</p>"
            + (f"<h4>Where the gate fires</h4><ul>{cover}</ul>" if cover else "")
            + (f"<h4>In-model A/B</h4><ul>{steps}</ul>" if steps else "") + "</section>")


INPUT_GLOBS = ("reports/gpu/**/*.json", "fusions/*/*.json", "candidates/**/*.json", "candidates/*/*.py",
               "mined/*.json", "captures/**/*.json", "profiles/**/*.json")


def inputs_digest(ws: Workspace) -> str:
    """sha256 over the workspace files a report is made from (paths and bytes, :data:`INPUT_GLOBS`):
    recorded in the page (``<meta name="miner-inputs">``) so a test can tell a stale report."""
    import hashlib

    h = hashlib.sha256()
    files = sorted({p for g in INPUT_GLOBS for p in ws.root.glob(g) if p.is_file()})
    for p in files:
        h.update(p.relative_to(ws.root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _detailed(review: Review, top: int) -> list[Ranked]:
    """Every candidate (in ranking order), then the best ``top`` patterns without one."""
    return [r for r in review.rows if r.candidate is not None] + [r for r in review.rows if r.candidate is None][:top]
