"""Show a ``Review``: a terminal table, one candidate in full, and a self-contained HTML page.

Renderers only format what ``miner.rank.rank`` computed; they never compute a number themselves.
Predicted numbers (cost model or analytical) carry a leading ``~`` (in HTML also a violet italic
style and a "pred" tag); measured ones carry none. ``write_html`` writes
``reports/<run>/index.html`` with inline CSS and base64 PNG images (matplotlib, Agg backend), so
the page opens from a file or a mail attachment alike.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import io
import math
from collections import Counter
from pathlib import Path
from typing import Iterable, Sequence

from miner import __version__
from miner.rank.costmodel import FEATURE_NAMES, Accuracy
from miner.core.errors import MinerError
from miner.core.dtypes import short as short_dtype
from miner.rank.rank import PREDICTED_MARK, CallEstimate, Estimate, Ranked, Review
from miner.core.workspace import Workspace, write_text

LEGEND = (f"{PREDICTED_MARK} = predicted (not measured): by the cost model, or by the analytical roofline "
          "model when there is no benchmark data; numbers without it were measured on a GPU by `miner bench` "
          "(the pattern's subgraph compiled alone by Inductor vs the candidate's kernel).")
VARIANTS = ("eager", "inductor", "max-autotune", "candidate")
COLORS = {"eager": "#9aa5b8", "inductor": "#2a62c9", "max-autotune": "#6b8fd6", "candidate": "#1f8a4c",
          "roofline": "#c0392b"}
CATEGORY_COLORS = {"pointwise": "#dbe8ff", "reduction": "#ffe2b8", "view": "#eeeeee", "input": "#ffffff",
                   "output": "#d9f2e3"}


# --------------------------------------------------------------------------- text

def _us(e: Estimate | None) -> str:
    return "-" if e is None else e.fmt(".1f") if abs(e.value) < 1e5 else e.fmt(".3g")


def _pct(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.0f}%"


def _cut(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def _columns(rows: Sequence[Sequence[str]], header: Sequence[str], right: set[int]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = lambda r: "  ".join(str(x).rjust(w) if i in right else str(x).ljust(w)
                              for i, (x, w) in enumerate(zip(r, widths))).rstrip()
    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def ops_chain(r: Ranked) -> str:
    from miner.rank.families import short_op
    return ">".join(short_op(n.target) for n in r.pattern.nodes if n.category != "view")


def render_table(review: Review, top: int | None = 20, members: bool = False, patterns: bool = False) -> str:
    """The ranked review list: one row per family (its best member), or every member.

    Candidates by default; ``patterns``: the mined patterns that have no candidate, with the
    reason ``miner generate`` gave (also the fallback while there is no candidate at all).
    """
    out = [_basis_lines(review)]
    if not review.rows:
        out.append("\nNothing to rank: no mined patterns or candidates in this workspace "
                   "(run `miner scan`, `miner mine`, `miner generate`).")
        return "\n".join(out)
    all_fams = review.pattern_families if patterns else review.candidate_families
    if not all_fams and not patterns:
        out.append("No candidates yet (run `miner generate`): the mined patterns, ranked the same way.\n")
        all_fams, patterns = review.pattern_families, True
    by_id = {r.id: r for r in review.rows}
    fams = all_fams[:top] if top else all_fams
    header = ["#", "id", "family", "ops", "models", "graphs", "occ", "safe", "missed", "kern", "speedup",
              "saved us/step", "why no candidate" if patterns else "status"]
    rows = []
    for i, fam in enumerate(fams, 1):
        for j, mid in enumerate(fam.members if members else fam.members[:1]):
            r = by_id[mid]
            fam_col = (f"+{len(fam.members) - 1} similar" if len(fam.members) > 1 else "") if j == 0 else f"of {fam.id}"
            last = (_cut(review.skipped.get(r.id, "not generated yet"), 40) if patterns
                    else r.status + (f" ({r.label})" if r.label else ""))
            rows.append([str(i) if j == 0 else "", r.id, fam_col, _cut(ops_chain(r), 38), str(r.support[0]),
                         str(r.support[1]), str(r.occurrences), _pct(r.safe_share), _pct(r.missed_share),
                         "-" if r.inductor_kernels is None else str(r.inductor_kernels),
                         "-" if r.speedup is None else r.speedup.fmt(".2f", "x"), _us(_scaled(r.saved_ms)), last])
    out.append(_columns(rows, header, {0, 4, 5, 6, 7, 8, 9, 10, 11}))
    if len(fams) < len(all_fams):
        out.append(f"... {len(all_fams) - len(fams)} more families (--top 0 shows all)")
    n_other = len(review.candidate_families if patterns else review.pattern_families)
    if n_other:
        out.append(f"({n_other} families of {'candidates' if patterns else 'mined patterns without a candidate'}: "
                   f"`miner candidates{'' if patterns else ' --patterns'}`)")
    out.append("")
    out.append(LEGEND)
    out.append("occ: non-overlapping occurrences; safe: share the safety checks accept; missed: share Inductor "
               "splits into >1 kernel; kern: Inductor kernels per occurrence; (+n): family members, --members "
               "lists them.")
    out.append(_accuracy_line(review.model.accuracy, review.model.note))
    out += [f"warning: {p}" for p in review.problems]
    return "\n".join(out)


def _scaled(e: Estimate) -> Estimate:
    return Estimate(e.value * 1e3, e.source)  # ms -> us


def _basis_lines(review: Review) -> str:
    scope = f" (model: {review.only_model})" if review.only_model else ""
    return f"Candidates ranked by expected time saved per training/inference step{scope}.\n{review.basis}\n"


def _accuracy_line(acc: Accuracy | None, model_note: str = "") -> str:
    if acc is None:
        return "Cost model: not trained."
    if not acc.ok:
        return f"Cost model: {acc.reason or 'accuracy undefined on these points'}."
    return (f"Cost model accuracy ({acc.scheme}, {acc.n_points} measured points, {acc.n_candidates} candidates): "
            f"Spearman {acc.spearman:.2f}, MAE {acc.mae:.2f}x speedup (analytical baseline: Spearman "
            f"{_num(acc.baseline_spearman)}, MAE {_num(acc.baseline_mae)}x); {model_note}.")


def _num(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else f"{x:{spec}}"


def render_show(review: Review, r: Ranked) -> str:
    """Everything known about one candidate (or pattern), as text."""
    p, c = r.pattern, r.candidate
    lines = [f"{r.id}  {r.label or ''}".rstrip(), f"  ops:      {p.ops}",
             f"  status:   {r.status}" + (f" (fusion {c.fusion})" if c and c.fusion else ""),
             f"  family:   {r.family.id} '{r.family.name}' ({len(r.family.members)} members: "
             f"{', '.join(r.family.members[:6])}{' ...' if len(r.family.members) > 6 else ''})",
             f"  support:  {p.support.n_models} models ({', '.join(p.support.models)}), {p.support.n_graphs} graphs",
             f"  occurrences: {r.occurrences} non-overlapping, {r.safe} safe ({_pct(r.safe_share)}); "
             f"by phase {dict(p.counts.by_phase)}",
             f"  Inductor: typical {r.inductor_kernels} kernel(s) per occurrence; kernels histogram "
             f"{dict(p.inductor.kernels_hist)}; missed fusion {_pct(r.missed_share)}",
             f"  score:    saved {_us(_scaled(r.saved_ms))} us per step; speedup over Inductor "
             f"{'-' if r.speedup is None else r.speedup.fmt('.2f', 'x')}", "", "pattern:"]
    lines += ["  " + line for line in p.to_source("pattern").splitlines()]
    if p.inductor.splits:
        lines += ["", "where Inductor splits it:"] + [f"  {k}: {v}" for k, v in p.inductor.splits.items()]
    if p.rejections:
        lines += ["", "why occurrences were rejected:"] + [f"  {v:5d}  {k}" for k, v in
                                                         sorted(p.rejections.items(), key=lambda kv: -kv[1])]
    if r.calls:
        lines += ["", "per call (safe occurrences with the same inputs):"]
        lines.append(_columns([_call_cells(e) for e in r.calls],
                              ["model", "phase", "inputs", "count", "kern", "Inductor ms", "speedup", "saved us/call"],
                              {3, 4, 5, 6, 7}))
    if c is None:
        lines += ["", f"no candidate: {review.skipped.get(r.id, 'not generated yet (miner generate)')}"]
    if c is not None:
        lines += ["", f"candidate files: {c.candidate.path}"]
        for key in ("op", "regenerate", "signature", "kernel"):
            if c.meta.get(key):
                lines.append(f"  {key}: {c.meta[key]}")
        lines += ["", "validation:"] + (_validation_lines(c.validation) or ["  not validated"])
        if c.bench:
            lines += ["", "benchmarks (ms, median [p20-p80]):"]
            rows = [[b.label, ",".join(b.models), b.source] + [_timing(b.times.get(v)) for v in VARIANTS]
                    + [_num(b.speedup, ".2f") + "x" if b.speedup else "-", _num(b.roofline_pct(), ".0f") + "%"]
                    for b in c.bench]
            lines.append(_columns(rows, ["inputs", "models", "source", *VARIANTS, "vs Inductor", "roofline"],
                                  {3, 4, 5, 6, 7, 8}))
    lines += ["", "where it occurs (sample):"]
    for o in p.occurrences[:12]:
        shapes = " ".join(str(m.shape) for m in o.input_meta if m is not None)
        verdict = "ok" if o.verdict.ok else "rejected: " + "; ".join(o.verdict.reasons)
        lines.append(f"  {o.graph}  {shapes}  kernels={o.n_kernels}  {verdict}")
    if len(p.occurrences) > 12:
        lines.append(f"  ... {len(p.occurrences) - 12} more in the sample")
    lines += ["", LEGEND]
    return "\n".join(lines)


def _call_cells(e: CallEstimate) -> list[str]:
    c = e.call
    return [c.model, c.phase, _cut(c.label, 60) + (" (derived)" if c.source == "derived" else ""), _count(c.count),
            c.mix_label, e.inductor_ms.fmt(".4f"),
            e.speedup.fmt(".2f", "x"), _us(_scaled(e.saved_ms))]


def _count(n: float) -> str:
    return str(int(n)) if float(n).is_integer() else f"{n:.1f}"


def _timing(t: tuple[float, float, float] | None) -> str:
    return "-" if t is None else f"{t[0]:.4f} [{t[1]:.4f}-{t[2]:.4f}]"


def _validation_lines(v: dict | None) -> list[str]:
    if not isinstance(v, dict):
        return []
    where = ", ".join(f"{k} {v[k]}" for k in ("device", "torch", "triton", "date") if v.get(k))
    lines = [f"  overall: {'ok' if v.get('ok') else 'FAILED'}" + (f" ({v['failure']})" if v.get("failure") else "")
             + (f"  [{where}]" if where else "")]
    for row in validation_rows(v):
        lines.append(f"  {'ok  ' if row[1] else 'FAIL' if row[1] is False else '?   '} {row[0]}  {row[2]}")
    return lines


def validation_rows(v: dict) -> list[tuple[str, bool | None, str]]:
    """(what, ok, detail) for each check of a validation.json (``miner.check.validate.Validation.to_json``)."""
    out = []
    for c in v.get("checks", ()) or ():
        if not isinstance(c, dict):
            continue
        detail = [str(c.get("detail") or "")]
        detail += [f"{k}={_short(c[k])}" for k in ("max_abs", "max_rel", "matches") if c.get(k) is not None]
        out.append((f"{c.get('kind', '?')}: {c.get('case', '')}".strip(), c.get("ok"), ", ".join(d for d in detail if d)))
    return out


def _short(x) -> str:
    return f"{x:.3g}" if isinstance(x, float) else str(x)[:80]


# --------------------------------------------------------------------------- images

def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def node_label(n) -> str:
    """``sum[-1]``, ``convert bf16``, ``exp``: the op and its structural constants (dims, dtype)."""
    from miner.rank.families import short_op
    extra = []
    for a in n.args:
        if isinstance(a, (list, tuple)) and a and all(isinstance(x, int) for x in a):
            extra.append("[" + ",".join(map(str, a)) + "]")
        elif isinstance(a, dict) and "dtype" in a:
            extra.append(short_dtype(a["dtype"]))
        elif n.target == "operator.getitem" and isinstance(a, int):
            extra.append(str(a))
    return " ".join([short_op(n.target)] + extra)


def pattern_graph(p, inline_inputs: bool = True):
    """The pattern as an ``nx.DiGraph``: ops ``n<j>`` (label, category), outputs marked, and inputs
    ``in<k>`` as nodes; with ``inline_inputs`` an input used by one op only is written into that
    op's label (``mul in1``) instead, which keeps wide patterns readable."""
    import networkx as nx
    users: dict[int, set[int]] = {}
    for j, n in enumerate(p.nodes):
        for kind, idx in n.refs():
            if kind == "input":
                users.setdefault(idx, set()).add(j)
    shared = {k for k, js in users.items() if len(js) > 1 or not inline_inputs}
    g = nx.DiGraph()
    for k in sorted(shared):
        g.add_node(f"in{k}", label=f"in{k}", category="input")
    outs = set(p.all_outputs)
    for j, n in enumerate(p.nodes):
        own = [f"in{idx}" for kind, idx in n.refs() if kind == "input" and idx not in shared]
        g.add_node(f"n{j}", label=" ".join([node_label(n)] + own), category="output" if j in outs else n.category,
                   base=n.category)
        for kind, idx in n.refs():
            if kind == "node" or (kind == "input" and idx in shared):
                g.add_edge(f"in{idx}" if kind == "input" else f"n{idx}", f"n{j}")
    return g


def layered_positions(g, layer_of: dict) -> dict:
    """(x, y) per node: one row per layer (first on top), ordered within a row by the mean x of the
    node's operands (barycenter heuristic, fewer crossings); a source is then moved over its users."""
    rows: dict[int, list] = {}
    for n in g.nodes:
        rows.setdefault(layer_of[n], []).append(n)
    x: dict = {}

    def place(row: list, key) -> None:
        row.sort(key=key)
        for i, n in enumerate(row):
            x[n] = i - (len(row) - 1) / 2

    for layer in sorted(rows):
        preds = lambda n: [x[p] for p in g.predecessors(n) if p in x]
        place(rows[layer], lambda n: (sum(preds(n)) / len(preds(n))) if preds(n) else 0.0)
    for layer in sorted(rows):  # sources (inputs) follow their users
        if all(g.in_degree(n) == 0 for n in rows[layer]):
            place(rows[layer], lambda n: sum(x[v] for v in g.successors(n)) / max(1, g.out_degree(n)))
    return {n: (x[n] * 1.1, -layer_of[n] * 1.0) for n in g.nodes}


def draw_pattern(p) -> str:
    """The pattern top to bottom (networkx layered layout, drawn with matplotlib), as a PNG data URI.

    Nodes are labelled boxes: inputs white, pointwise blue, reductions orange, views grey, outputs
    green-edged; an edge goes from an operand to its user.
    """
    import networkx as nx
    plt = _pyplot()
    g = pattern_graph(p)
    ops = g.subgraph(n for n, d in g.nodes(data=True) if d["category"] != "input")
    layer_of = {n: i + 1 for i, layer in enumerate(nx.topological_generations(ops)) for n in layer}
    for n, d in g.nodes(data=True):  # an input sits just above its first user
        if d["category"] == "input":
            layer_of[n] = min((layer_of[v] for v in g.successors(n)), default=1) - 1
    shift = min(layer_of.values(), default=0)
    layer_of = {n: v - shift for n, v in layer_of.items()}
    nx.set_node_attributes(g, layer_of, "layer")
    pos = layered_positions(g, layer_of)
    layers = 1 + max(layer_of.values(), default=0)
    width = max(Counter(layer_of.values()).values(), default=1)
    fig, ax = plt.subplots(figsize=(max(2.4, 1.45 * width + 0.8), 0.6 * layers + 0.3))
    for u, v in g.edges:
        skip = layer_of[v] - layer_of[u] > 1 and abs(pos[u][0] - pos[v][0]) < 1e-6  # would hide behind a node
        ax.annotate("", xy=pos[v], xytext=pos[u], arrowprops=dict(
            arrowstyle="-|>", color="#7b8496", lw=1.1, shrinkA=11, shrinkB=11,
            connectionstyle=f"arc3,rad={-0.5 if skip else 0.0}"))
    outs = {f"n{j}" for j in p.all_outputs}
    for n, d in g.nodes(data=True):
        cat = d.get("base", d["category"]) if d["category"] == "output" else d["category"]
        ax.text(*pos[n], d["label"], ha="center", va="center", fontsize=9, family="DejaVu Sans Mono",
                bbox=dict(boxstyle="round,pad=0.35" if cat != "input" else "square,pad=0.35",
                          fc=CATEGORY_COLORS.get(cat, "#ffffff"), ec="#1f8a4c" if n in outs else "#44506a",
                          lw=2.0 if n in outs else 0.9))
    xs = [x for x, _ in pos.values()] or [0]
    ys = [y for _, y in pos.values()] or [0]
    ax.set_xlim(min(xs) - 0.7, max(xs) + 0.7)
    ax.set_ylim(min(ys) - 0.4, max(ys) + 0.4)
    ax.set_axis_off()
    return _png(fig)


def bench_chart(r: Ranked) -> str | None:
    """Grouped bars per benchmarked input set: eager / Inductor / max-autotune / candidate / roofline (measured)."""
    points = [b for b in (r.candidate.bench if r.candidate else ()) if b.times]
    if not points:
        return None
    plt = _pyplot()
    import numpy as np
    points = sorted(points, key=lambda b: (b.source != "derived", -b.bytes_moved))[:10]
    series = [v for v in VARIANTS if any(v in b.times for b in points)] + ["roofline"]
    x = np.arange(len(points))
    w = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(5.5, 1.3 * len(points) + 2.5), 3.4))
    for i, s in enumerate(series):
        if s == "roofline":
            vals = [b.roofline_ms * 1e3 for b in points]
            err = None
        else:
            vals = [b.times[s][0] * 1e3 if s in b.times else np.nan for b in points]
            err = np.array([[b.times[s][0] - b.times[s][1], b.times[s][2] - b.times[s][0]] if s in b.times
                            else [0, 0] for b in points]).T * 1e3
        ax.bar(x + (i - (len(series) - 1) / 2) * w, vals, w, yerr=err, label=s, color=COLORS[s],
               hatch="//" if s == "roofline" else None, edgecolor="white" if s != "roofline" else COLORS[s],
               fill=s != "roofline", capsize=2, error_kw={"elinewidth": 0.8})
    ax.set_xticks(x, [_tick(b) for b in points], fontsize=7.5)
    ax.set_ylabel("µs per call (median, p20-p80)")
    ax.set_yscale("log")
    ax.legend(fontsize=8, ncol=len(series), loc="upper center", bbox_to_anchor=(0.5, 1.16), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    return _png(fig)


def accuracy_chart(acc: Accuracy) -> str | None:
    """Held-out predicted vs measured speedup (forest and analytical), with the diagonal."""
    if not acc.held_out:
        return None
    plt = _pyplot()
    y, forest, base = zip(*acc.held_out)
    fig, ax = plt.subplots(figsize=(4.2, 3.6))
    lo, hi = min(y + forest + base) * 0.9, max(y + forest + base) * 1.1
    ax.plot([lo, hi], [lo, hi], color="#9aa5b8", lw=1, ls="--")
    ax.scatter(y, base, s=18, color="#c9a227", label="analytical", alpha=0.8)
    ax.scatter(y, forest, s=18, color="#7a4bb5", label="forest (held out)", alpha=0.8)
    ax.set_xlabel("measured speedup over Inductor")
    ax.set_ylabel("predicted")
    ax.legend(fontsize=8, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    return _png(fig)


def _tick(b) -> str:
    shape = max(b.key, key=lambda kd: math.prod(kd[0]) if kd[0] else 1)
    return f"{'x'.join(map(str, shape[0]))}\n{short_dtype(shape[1])} {','.join(b.models)[:18]}\n({b.source})"


# --------------------------------------------------------------------------- HTML

def _e(x) -> str:
    return html.escape(str(x))


def _est(e: Estimate | None, spec: str = ".2f", suffix: str = "", scale: float = 1.0) -> str:
    if e is None or not math.isfinite(e.value):
        return "-"
    text = f"{e.value * scale:{spec}}{suffix}"
    if e.measured:
        return f'<span class="meas" title="measured">{_e(text)}</span>'
    return f'<span class="pred" title="predicted ({_e(e.source)})">{PREDICTED_MARK}{_e(text)}</span>'


def _badge(status: str) -> str:
    cls = "failed" if status.startswith("fail") else status
    return f'<span class="badge {_e(cls)}">{_e(status)}</span>'


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], num: set[int] = frozenset(), cls: str = "") -> str:
    head = "".join(f'<th class="num">{_e(h)}</th>' if i in num else f"<th>{_e(h)}</th>" for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f'<td class="num">{c}</td>' if i in num else f"<td>{c}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


RANK_HEADER = ("#", "candidate", "ops", "models", "graphs", "occ", "safe", "missed", "kernels",
               "speedup", "saved µs/step", "status")
RANK_NUM = {0, 3, 4, 5, 6, 7, 8, 9, 10}


def _rank_cells(i: str, r: Ranked, detailed: set[str]) -> list[str]:
    ident = f'<a href="#c-{_e(r.id)}">{_e(r.id)}</a>' if r.id in detailed else _e(r.id)
    label = f'<br><span class="small">{_e(r.label)}</span>' if r.label else ""
    return [i, f"<code>{ident}</code>{label}", f'<span class="ops">{_e(r.pattern.ops)}</span>', str(r.support[0]),
            str(r.support[1]), str(r.occurrences), _pct(r.safe_share), _pct(r.missed_share),
            "-" if r.inductor_kernels is None else str(r.inductor_kernels),
            _est(r.speedup, ".2f", "×"), _est(r.saved_ms, ".1f", scale=1e3), _badge(r.status)]


def ranked_table(review: Review, fams: Sequence, detailed: set[str], *, table_id: str, top: int | None = None,
                 last_column: str = "status") -> str:
    """One row per family (its leader) with the other members folded; the first ``top`` families.

    ``last_column``: "status" (candidates) or "why" (mined patterns: why no candidate was generated).
    """
    by_id = {r.id: r for r in review.rows}
    shown = list(fams[:top] if top else fams)
    header = RANK_HEADER[:-1] + (("status",) if last_column == "status" else ("why no candidate",))
    if last_column != "status":
        header = (header[0], "pattern") + header[2:]

    def cells(i: str, r: Ranked) -> list[str]:
        c = _rank_cells(i, r, detailed)
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
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>{tail}'


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
    from miner.rank.rank import _combine
    return {m: (a, b, Estimate(ms, _combine(src) if src else review.model.source)) for m, (a, b, ms, src) in out.items()}


def model_summary(ws: Workspace, review: Review) -> str:
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
    acc, model = review.model.accuracy, review.model
    if acc is None or not acc.ok:
        reason = acc.reason if acc and acc.reason else "accuracy is undefined on these points (a constant vector)"
        return (f'<p class="banner">No accuracy number: {_e(reason)}. Predictions below come from the '
                f'{"cost model" if model.source == "model" else "analytical roofline model"} and are marked '
                f'{PREDICTED_MARK}.</p>')
    rows = [["random forest (cost model)", f"{acc.spearman:.2f}", f"{acc.mae:.3f}×"],
            ["analytical roofline (baseline)", _num(acc.baseline_spearman), _num(acc.baseline_mae, ".3f") + "×"]]
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


def provenance_html(review: Review) -> str:
    if not review.runs:
        out = '<p class="banner">No GPU benchmark results of these candidates in this workspace: nothing on this page is measured.</p>'
    else:
        rows = [[_e(r.gpu), _e(", ".join(f"{k} {v}" for k, v in r.versions.items())), _e(r.date),
                 _num(r.copy_gbps, ".0f"), str(len(set(r.sources)))] for r in review.runs]
        out = ("<p>The measured numbers on this page come from these runs (<code>candidates/&lt;id&gt;/bench.json</code>):</p>"
               + _table(("GPU", "versions", "date (UTC)", "copy bandwidth GB/s", "candidates"), rows, {3, 4}))
    if review.run_tables:
        known = {r.id for r in review.rows if r.candidate is not None}
        rows = [[f"<code>{_e(t.path.parent.name)}</code>", _e(t.gpu), _e(", ".join(f"{k} {v}" for k, v in t.versions.items())),
                 _e(t.date), _num(t.copy_gbps, ".0f"), str(t.rows),
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
            + ("<p>The measured-wins gate while compiling: a promoted fusion fires on CUDA only where "
               "<code>miner bench</code> measured it at least as fast as Inductor.</p><ul class=\"small\">"
               + "".join(gate) + "</ul>" if gate else ""))


def candidate_html(r: Ranked, skipped: dict[str, str] | None = None) -> str:
    skipped = skipped or {}
    p, c = r.pattern, r.candidate
    facts = [("ops", f"<code>{_e(p.ops)}</code>"), ("status", _badge(r.status) + (f" fusion <code>{_e(c.fusion)}</code>"
                                                                                  if c and c.fusion else "")),
             ("family", f"{_e(r.family.name)} ({len(r.family.members)} member(s))"),
             ("support", f"{p.support.n_models} models ({_e(', '.join(p.support.models))}), {p.support.n_graphs} graphs"),
             ("occurrences", f"{r.occurrences} non-overlapping, {r.safe} safe ({_pct(r.safe_share)}); by phase "
                             f"{_e(', '.join(f'{k} {v}' for k, v in p.counts.by_phase.items()))}"),
             ("Inductor", f"typical {r.inductor_kernels if r.inductor_kernels is not None else '?'} kernel(s) / occurrence; "
                          f"missed fusion in {_pct(r.missed_share)}"),
             ("speedup vs Inductor", _est(r.speedup, ".2f", "×")),
             ("saved per step", _est(r.saved_ms, ".1f", " µs", 1e3))]
    if c is not None:
        facts.append(("files", f"<code>{_e(c.candidate.path.name)}/</code>"))
    else:
        facts.append(("no candidate", _e(skipped.get(r.id, "not generated yet"))))
    kind = "candidate" if c is not None else "mined pattern"
    parts = [f'<section id="c-{_e(r.id)}"><h2><span class="small">{kind}</span> {_e(r.id)} '
             f'{("· " + _e(r.label)) if r.label else ""}</h2>',
             '<div class="cand"><div>', f'<img alt="pattern {_e(r.id)}" src="{draw_pattern(p)}">',
             '<p class="small">square boxes: inputs used by several ops (an input used once is named in its '
             'op\'s box); blue: pointwise; orange: reduction; grey: view; green border: outputs.</p></div><div>',
             '<table class="facts"><tbody>' + "".join(f"<tr><td>{_e(k)}</td><td>{v}</td></tr>" for k, v in facts)
             + "</tbody></table>", "</div></div>"]
    if p.inductor.splits:
        parts.append("<h4>Where Inductor splits it</h4>" + _table(
            ("edge", "occurrences"), [[f"<code>{_e(k)}</code>", str(v)] for k, v in p.inductor.splits.items()], {1}))
    if r.calls:
        parts.append("<h4>Where it would save time (safe occurrences, grouped by inputs)</h4>")
        rows = [[_e(e.call.model), _e(e.call.phase), f'<span class="mono">{_e(_cut(e.call.label, 90))}</span>'
                 + (' <span class="small">(derived)</span>' if e.call.source == "derived" else ""), _count(e.call.count),
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
        chart = bench_chart(r)
        if chart:
            parts.append("<h4>Benchmark (measured)</h4>"
                         f'<div class="chart"><img alt="benchmark {_e(r.id)}" src="{chart}"></div>')
            rows = [[f'<span class="mono">{_e(_cut(b.label, 70))}</span>', _e(", ".join(b.models)), _e(b.source)]
                    + [_num(b.times[v][0] * 1e3, ".1f") if v in b.times else
                       f'<span class="bad" title="{_e(b.errors.get(v, ""))}">n/a</span>' for v in VARIANTS]
                    + [_num(b.roofline_ms * 1e3, ".1f"), _num(b.speedup, ".2f") + "×" if b.speedup else "-",
                       _num(b.roofline_pct(), ".0f") + "%"] for b in c.bench]
            parts.append(_table(("inputs", "models", "shape source", "eager µs", "Inductor µs", "max-autotune µs",
                                 "candidate µs", "roofline µs", "vs Inductor", "% roofline"), rows,
                                {3, 4, 5, 6, 7, 8, 9}))
        else:
            parts.append('<h4>Benchmark</h4><p class="small">Not benchmarked on a GPU: the speedups above are '
                         f'predicted ({PREDICTED_MARK}).</p>')
    parts.append("</section>")
    return "".join(parts)


def render_html(review: Review, ws: Workspace, *, title: str = "miner review", detail_top: int = 10,
                table_top: int = 50) -> str:
    CSS = Path(__file__).with_name("style.css").read_text()

    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    detailed_rows = _detailed(review, detail_top)
    detailed = {r.id for r in detailed_rows}
    banner_cls = "banner info" if review.runs else "banner"
    n_cand = sum(r.candidate is not None for r in review.rows)
    mining = review.mining.get("params", {})
    counts = Counter(r.status for r in review.rows)
    body = [f"<header><h1>{_e(title)}</h1><div class=\"sub\">miner {__version__} · generated {now} · "
            f"{len(review.rows)} patterns, {n_cand} candidates, {len(review.families)} families · "
            f"{_e(', '.join(f'{v} {k}' for k, v in counts.items()))}</div></header><main>",
            '<nav class="toc"><a href="#summary">Models</a><a href="#ranking">Candidates</a><a href="#patterns">Mined patterns</a><a href="#endtoend">End to end</a><a href="#costmodel">'
            'Cost model</a><a href="#provenance">Provenance</a><a href="#details">Details</a></nav>',
            f'<div class="{banner_cls}">{_e(review.basis)}</div>',
            f'<p class="legend">{_e(LEGEND)}</p>']
    body += [f"<div class=\"banner\">{_e(p)}</div>" for p in review.problems]
    from miner.report.composition import composition_html  # the first figure, when step profiles exist
    body.append(composition_html(ws))
    body.append(f'<section id="summary"><h2>Models scanned</h2>{model_summary(ws, review)}'
                + (f'<p class="small">Mining parameters: {_e(mining)}</p>' if mining else "") + "</section>")
    body.append('<section id="ranking"><h2>Ranked candidates</h2>'
                "<p>One row per family of near-identical patterns (same ops up to casts/views or one op); "
                "unfold a family to see its other members. Score: expected µs saved per step, summed over every "
                "safe occurrence in the zoo; ties broken by support.</p>"
                + (ranked_table(review, review.candidate_families, detailed, table_id="ranked")
                   if review.candidate_families else
                   '<p class="banner">No candidates yet: run <code>miner generate</code> (the mined patterns are '
                   'ranked below).</p>' if review.rows else
                   '<p class="banner">Nothing to rank yet: no mined patterns or candidates.</p>')
                + f'<p class="legend">{_e(LEGEND)} occ = non-overlapping occurrences; safe = share accepted by the '
                  "safety checks; missed = share of occurrences Inductor splits into more than one kernel; kernels = "
                  "Inductor kernels per occurrence (typical); speedup = over Inductor (call-weighted geometric mean); "
                  "saved = expected µs saved per step, summed over every safe occurrence.</p></section>")
    if review.pattern_families:
        body.append('<section id="patterns"><h2>Mined patterns without a candidate</h2>'
                    "<p>Ranked the same way (all predicted), with the reason <code>miner generate</code> gave for not "
                    "writing a candidate. Sub-patterns overlap: their savings do not add up.</p>"
                    + ranked_table(review, review.pattern_families, detailed, table_id="patterns-table", top=table_top,
                                   last_column="why") + "</section>")
    body.append(f'<section id="endtoend"><h2>End to end: promoted fusions in model steps</h2>{verify_html(ws)}</section>')
    body.append(f'<section id="costmodel"><h2>Cost model</h2>{accuracy_html(review)}</section>')
    body.append(f'<section id="provenance"><h2>Provenance of the measurements</h2>{provenance_html(review)}</section>')
    body.append('<div id="details">')
    body += [candidate_html(r, review.skipped) for r in detailed_rows]
    body.append("</div>")
    if len(detailed_rows) < len(review.rows):
        body.append(f'<p class="small">Details are shown for every candidate and the top {detail_top} mined patterns; '
                    f"<code>miner candidates show &lt;id&gt;</code> prints any other.</p>")
    body.append(f"<footer>Generated by <code>miner report</code> from the workspace {_e(ws.root.resolve().name)}/."
                "</footer></main>")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
            f'content="width=device-width, initial-scale=1"><title>{_e(title)}</title><style>{CSS}</style></head>'
            f'<body>{"".join(body)}</body></html>\n')


def _detailed(review: Review, top: int) -> list[Ranked]:
    """Every candidate (in ranking order), then the best ``top`` patterns without one."""
    return [r for r in review.rows if r.candidate is not None] + [r for r in review.rows if r.candidate is None][:top]


def default_run_name() -> str:
    return "latest"


def write_report(review: Review, ws: Workspace, run: str | None = None, **kw) -> Path:
    """Write ``reports/<run>/index.html``; returns its path."""
    path = ws.reports / (run or default_run_name()) / "index.html"
    write_text(path, render_html(review, ws, **kw))
    return path
