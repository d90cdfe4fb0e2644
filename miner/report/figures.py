"""Figures of the HTML report, as base64 PNGs (matplotlib, Agg backend): a pattern's graph, a
candidate's bench chart, the cost model's accuracy.
"""

from __future__ import annotations

import base64
import io
import math
from collections import Counter

from miner.rank.costmodel import Accuracy
from miner.core.dtypes import short as short_dtype
from miner.rank.records import Ranked

COLORS = {"eager": "#9aa5b8", "inductor": "#2a62c9", "max-autotune": "#6b8fd6", "candidate": "#1f8a4c",
          "roofline": "#c0392b"}
CATEGORY_COLORS = {"pointwise": "#dbe8ff", "reduction": "#ffe2b8", "view": "#eeeeee", "input": "#ffffff",
                   "output": "#d9f2e3"}


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


FONT_PT = 10  # at 110 dpi and the page's ~800 px content width, tick labels stay >= 12 px at 900 px


MAX_WIDTH_IN = 7.0  # figures no wider than the page's content at 900 px, so never scaled down there


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams.update({"font.size": FONT_PT, "axes.labelsize": FONT_PT, "xtick.labelsize": FONT_PT - 1,
                         "ytick.labelsize": FONT_PT - 1, "legend.fontsize": FONT_PT - 1,
                         "axes.titlesize": FONT_PT + 1})
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


def latest_points(r: Ranked) -> list:
    """The candidate's bench points of its latest run (``candidate.bench`` is oldest run first), timed ones."""
    bench = r.candidate.bench if r.candidate else ()
    if not bench:
        return []
    latest = bench[-1].run
    return [b for b in bench if b.run == latest and b.speedup is not None]


def speedup_range(b) -> tuple[float, float, float]:
    """(median, low, high) speedup over Inductor of one point: Inductor's median over the candidate's
    median, p80 and p20 (the candidate's spread; Inductor's own is in the table)."""
    ind = b.times["inductor"][0]
    med, p20, p80 = b.times["candidate"]
    return ind / med, ind / p80, ind / p20


def _shape_order(points: list) -> list:
    return sorted(points, key=lambda b: (b.bytes_moved, b.label))


def bench_chart(r: Ranked, run_label: str = "") -> str | None:
    """Speedup over Inductor vs input shape, latest run only: a dot per shape with its p20-p80 bar,
    on a linear axis with 1.0 (Inductor) marked; colour per dtype."""
    points = _shape_order(latest_points(r))
    if not points:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(min(MAX_WIDTH_IN, max(5.2, 0.9 * len(points) + 2.5)), 3.3))
    dtypes = sorted({_dtype(b) for b in points})
    palette = ["#2a62c9", "#c0392b", "#1f8a4c", "#a86400", "#7a4bb5"]
    for i, b in enumerate(points):
        med, lo, hi = speedup_range(b)
        c = palette[dtypes.index(_dtype(b)) % len(palette)]
        ax.errorbar([i], [med], yerr=[[med - lo], [hi - med]], fmt="o", color=c, capsize=4, ms=6, lw=1.4)
        ax.annotate(f"{med:.2f}", (i, hi), textcoords="offset points", xytext=(0, 4), ha="center",
                    fontsize=FONT_PT - 1)
    for d in dtypes:
        ax.plot([], [], "o", color=palette[dtypes.index(d) % len(palette)], label=d)
    ax.axhline(1.0, color="#5d6778", lw=1, ls="--")
    ax.set_xticks(range(len(points)), [_tick(b) for b in points], rotation=30 if len(points) > 4 else 0,
                  ha="right" if len(points) > 4 else "center", rotation_mode="anchor")
    ax.set_ylabel("speedup over Inductor")
    lo = min(speedup_range(b)[1] for b in points)
    hi = max(speedup_range(b)[2] for b in points)
    ax.set_ylim(min(0.9, lo - 0.05), max(1.1, hi + 0.08))
    ax.set_xlim(-0.6, len(points) - 0.4)
    ax.legend(frameon=False, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=len(dtypes), borderaxespad=0.2)
    if run_label:
        ax.set_title(f"run {run_label}", loc="left", fontsize=FONT_PT)
    ax.grid(axis="y", alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    return _png(fig)


def overview_chart(rows: list[tuple[str, list]]) -> str | None:
    """Every benchmarked candidate in one figure: its latest run's speedup per shape (dot, p20-p80 bar),
    one row per candidate, linear axis, 1.0 marked. ``rows``: (label, bench points)."""
    rows = [(label, _shape_order(pts)) for label, pts in rows if pts]
    if not rows:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(MAX_WIDTH_IN, 0.42 * len(rows) + 1.1))
    for y, (label, pts) in enumerate(rows):
        for b in pts:
            med, lo, hi = speedup_range(b)
            c = "#1f8a4c" if lo > 1 else "#c0392b" if hi < 1 else "#5d6778"
            ax.errorbar([med], [y], xerr=[[med - lo], [hi - med]], fmt="o", color=c, ms=5, capsize=2, lw=1.2)
    ax.axvline(1.0, color="#5d6778", lw=1, ls="--")
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("kernel alone: speedup over Inductor per shape (latest run; bar p20-p80)")
    ax.grid(axis="x", alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    return _png(fig)


def configs_chart(recs: list, headline: str = "", *, only_headline: bool = False) -> str | None:
    """What to run, per model step (``miner.check.configs.Recommendation``): each measured configuration's
    step speedup over the default compile (dot: paired median; bar: p20-p80), the run's noise band shaded
    around 1.0, the recommended configuration in bold; configurations with the fusions green, knobs alone
    blue, unusable ones (parity failed or not judged, errors) grey. A header row per model step names it and
    its setup where that differs from ``headline`` (``miner.check.ab.setup_of``); ``only_headline``: the
    model steps measured in that setup only (the report's first screen: other GPUs and shapes stay in its
    tables)."""
    from miner.rank.decision import setup_diff

    if only_headline and headline:
        recs = [rec for rec in recs if not setup_diff(rec.setup, headline)]
    groups = [(rec, [c for c in rec.configs if c.speedup is not None and c.name != "default"]) for rec in recs]
    groups = [(rec, cs) for rec, cs in groups if cs]
    if not groups:
        return None
    plt = _pyplot()
    n_rows = sum(1 + len(cs) for _, cs in groups)
    fig, ax = plt.subplots(figsize=(MAX_WIDTH_IN, 0.3 * n_rows + 1.0))
    xs = [x for _, cs in groups for c in cs for x in (c.speedup, c.p20, c.p80) if x is not None] + [1.0]
    labels, y = [], 0
    for rec, cs in groups:
        diff = setup_diff(rec.setup, headline)
        labels.append((f"{rec.model} {rec.mode}" + (f" [{diff}]" if diff else ""), "header"))
        if rec.band:
            ax.fill_between([1 - rec.band, 1 + rec.band], y + 0.5, y + len(cs) + 0.5, color="#e4e8ef", lw=0)
        for c in cs:
            y += 1
            color = "#9aa5b8" if not c.usable else COLORS["candidate"] if c.fusions else COLORS["inductor"]
            lo, hi = c.p20 if c.p20 is not None else c.speedup, c.p80 if c.p80 is not None else c.speedup
            ax.errorbar([c.speedup], [y], xerr=[[max(c.speedup - lo, 0)], [max(hi - c.speedup, 0)]], fmt="o",
                        color=color, ms=6 if c is rec.best else 4, capsize=2, lw=1.2)
            labels.append(("  " + c.name, "best" if c is rec.best else ""))
        y += 1
    ax.axvline(1.0, color="#5d6778", lw=1, ls="--")
    ax.set_yticks(range(len(labels)), [text for text, _ in labels])
    for tick, (_, kind) in zip(ax.get_yticklabels(), labels):
        if kind == "header":
            tick.set_fontstyle("italic")
        elif kind == "best":
            tick.set_fontweight("bold")
    ax.set_ylim(len(labels) - 0.5, -0.5)
    pad = 0.04 * (max(xs) - min(xs) or 1.0)
    ax.set_xlim(min(xs) - pad, max(xs) + pad)
    ax.set_xlabel("step speedup over the default torch.compile (bar: p20-p80)")
    ax.grid(axis="x", alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    return _png(fig)


def roofline_chart(rows: list[tuple[str, list]]) -> str | None:
    """Roofline share (memory floor time / kernel time) of Inductor's and the candidate's kernels, per
    candidate: the median over its latest run's shapes, with the min-max as a bar."""
    import statistics

    data = []
    for label, pts in rows:
        ind = [b.roofline_pct("inductor") for b in pts if b.roofline_pct("inductor") is not None]
        cand = [b.roofline_pct("candidate") for b in pts if b.roofline_pct("candidate") is not None]
        if ind and cand:
            data.append((label, ind, cand))
    if not data:
        return None
    plt = _pyplot()
    import numpy as np
    fig, ax = plt.subplots(figsize=(MAX_WIDTH_IN, 0.5 * len(data) + 1.1))
    y = np.arange(len(data))
    for off, idx, name, color in ((-0.18, 1, "Inductor", COLORS["inductor"]), (0.18, 2, "candidate", COLORS["candidate"])):
        med = [statistics.median(d[idx]) for d in data]
        err = [[m - min(d[idx]) for m, d in zip(med, data)], [max(d[idx]) - m for m, d in zip(med, data)]]
        ax.barh(y + off, med, 0.34, xerr=err, color=color, label=name, capsize=2, error_kw={"elinewidth": 0.9})
    ax.set_yticks(y, [d[0] for d in data])
    ax.invert_yaxis()
    ax.set_xlim(0, max(100.0, max(max(d[1] + d[2]) for d in data) * 1.03))
    ax.set_xlabel("% of the memory roofline (latest run; median over shapes, bar min-max)")
    ax.legend(frameon=False, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2)
    ax.grid(axis="x", alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    return _png(fig)


def _dtype(b) -> str:
    shape = max(b.key, key=lambda kd: math.prod(kd[0]) if kd[0] else 1)
    return short_dtype(shape[1])


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
    ax.legend(frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    return _png(fig)


def _tick(b) -> str:
    shape = max(b.key, key=lambda kd: math.prod(kd[0]) if kd[0] else 1)
    return f"{'x'.join(map(str, shape[0]))}\n{short_dtype(shape[1])} {','.join(b.models)[:14]}"
