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
from miner.report.text import VARIANTS

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
