"""``miner patterns``: the ranked table of mined patterns; ``miner patterns show <id>``: one
pattern's subgraph, where it occurs, Inductor's kernels and why occurrences were rejected."""

from __future__ import annotations

import difflib
from collections import defaultdict

HELP = "list mined patterns, or show one (`patterns show <id>`)"


def add_arguments(p) -> None:
    p.add_argument("what", nargs="*", metavar="show ID", help="`show <pattern-id>` for one pattern")
    p.add_argument("--top", type=int, default=20, metavar="N", help="rows to print (default 20; 0 = all)")
    p.add_argument("--model", help="only patterns found in this model")
    p.add_argument("--missed", action="store_true", help="only patterns Inductor splits into several kernels")
    from miner.report.terminal import add_output_options
    add_output_options(p)


def columns():
    from miner.report.terminal import Column
    return [Column("n", "#", justify="right", wrap=False), Column("id", "id", wrap=False),
            Column("ops", "ops", ratio=2),
            Column("models", "mod", justify="right", wrap=False), Column("graphs", "graphs", justify="right", wrap=False),
            Column("occ", "occ", justify="right", wrap=False), Column("safe", "safe", justify="right", wrap=False),
            Column("kernels", "kern", justify="right", wrap=False), Column("missed", "split", wrap=False),
            Column("saved", "est. us/step", justify="right", wrap=False), Column("generate", "generate", ratio=1)]


def ranked(patterns) -> list[tuple]:
    """``(pattern, est. us/step, why the generator refuses it or None)`` in the one ranking
    (``miner.rank.rank.RANKING``; what ``miner generate --top``, ``candidates`` and the report use),
    the patterns ``miner generate`` refuses after the others."""
    from miner.generate.generate import refusal
    from miner.rank.rank import rank

    refused = {p.id: why for p in patterns if (why := refusal(p))}
    by_id = {p.id: p for p in patterns}
    rows = sorted(rank(list(patterns), ()).rows, key=lambda r: r.id in refused) if patterns else []
    return [(by_id[r.id], r.saved_ms.value * 1e3, refused.get(r.id)) for r in rows]


def row(p, saved_us: float | None = None, refused: str | None = None) -> dict:
    """One pattern's row: the text cells and, under the same keys, the JSON / CSV values."""
    k = p.inductor.typical_kernels
    return {"id": p.id, "ops": p.ops, "models": p.support.n_models, "graphs": p.support.n_graphs,
            "occ": p.counts.non_overlapping, "safe": p.counts.safe_share, "kernels": k,
            "missed": bool(p.inductor.missed_fusion), "saved_us_per_step": saved_us, "refused": refused}


def cells(r: dict, n: int | None = None) -> dict:
    from miner.rank.records import PREDICTED_MARK
    from miner.report.text import cut

    why = r["refused"]
    return {**{k: str(v) for k, v in r.items()}, "n": "" if n is None else str(n), "safe": f"{100 * r['safe']:.0f}%",
            "ops": r["ops"].replace(" -> ", " "),
            "kernels": "-" if r["kernels"] is None else str(r["kernels"]), "missed": "yes" if r["missed"] else "",
            "saved": "-" if r["saved_us_per_step"] is None else f"{PREDICTED_MARK}{r['saved_us_per_step']:.1f}",
            "generate": "yes" if why is None else "no: " + cut(why.removeprefix("not generated: "), 48)}


def data(p) -> dict:
    """Everything ``patterns`` shows of one pattern, and its support, counts and Inductor view, as JSON."""
    ind, c = p.inductor, p.counts
    return {**row(p), "support_models": list(p.support.models), "total": c.total, "safe_count": c.safe,
            "by_phase": dict(c.by_phase), "kernels_hist": dict(ind.kernels_hist), "splits": dict(ind.splits),
            "rejections": dict(p.rejections)}


LEGEND = ("est. us/step: predicted time a fused kernel saves per step at the models' published size (~: "
          "predicted); generate: whether `miner generate` makes a candidate of it (refused ones are listed "
          "last); mod: models; occ: non-overlapping occurrences; safe: share the safety checks accept; kern: "
          "Inductor kernels per occurrence (typical); split: Inductor splits it into several kernels somewhere.")


def listing(patterns, top: int):
    """The ranked patterns table (``top`` rows, 0: all) and its rows as data."""
    from miner.rank.rank import RANKING
    from miner.report.terminal import Listing

    order = ranked(patterns)
    shown = order if top == 0 else order[:top]
    rows = [row(p, saved, why) for p, saved, why in shown]
    after = [f"({len(order) - len(shown)} more; --top 0 for all)"] if len(shown) < len(order) else []
    after.append(LEGEND)
    return (Listing(f"Mined patterns, {RANKING}", columns(), [cells(r, i) for i, r in enumerate(rows, 1)],
                    after=after, empty="No mined patterns (run `miner mine`)."), [p for p, _, _ in shown], rows)


def find(patterns, pid: str):
    """The pattern with id (or unique id prefix) ``pid``; ``UsageError`` listing close ids otherwise."""
    from miner.core.errors import UsageError

    by_id = {p.id: p for p in patterns}
    if pid in by_id:
        return by_id[pid]
    prefixed = [i for i in by_id if i.startswith(pid)]
    if len(prefixed) == 1:
        return by_id[prefixed[0]]
    if prefixed:
        raise UsageError(f"ambiguous pattern id {pid!r}: {', '.join(prefixed[:8])}"
                         + (f" ({len(prefixed) - 8} more)" if len(prefixed) > 8 else "") + "; give more characters")
    def shared(i: str) -> int:
        return next((k for k, (a, b) in enumerate(zip(i, pid)) if a != b), min(len(i), len(pid)))

    # Close ids: those sharing the longest prefix (a mistyped tail), then difflib's guesses.
    by_prefix = sorted((i for i in by_id if shared(i) >= 3), key=lambda i: (-shared(i), i))
    close = list(dict.fromkeys(by_prefix[:5] + difflib.get_close_matches(pid, list(by_id), n=5, cutoff=0.6)))[:8]
    raise UsageError(f"unknown pattern id {pid!r}" + (f"; close: {', '.join(close)}" if close else
                                                       f"; {len(by_id)} patterns, see `miner patterns`"))


def show(p) -> str:
    """The text of ``miner patterns show <id>``."""
    lines = [f"pattern {p.id}: {p.ops}",
             f"  {p.n_compute} compute nodes, {len(p.nodes)} nodes, {p.n_inputs} inputs, {p.n_consts} scalar slots; "
             f"outputs {', '.join(f'n{j}' for j in p.outputs)}"
             + (f"; extra outputs {', '.join(f'n{j}' for j in p.extra_outputs)}" if p.extra_outputs else "")
             + ("" if p.closed else " (not closed)"),
             "", "subgraph:"]
    lines += ["  " + line for line in p.to_source().rstrip().splitlines()]
    lines += ["", f"support: {p.support.n_models} models ({', '.join(p.support.models)}), "
                  f"{p.support.n_graphs} graphs"]
    lines += [f"  {g}" for g in p.support.graphs]
    c = p.counts
    lines += [f"occurrences: {c.total} embeddings, {c.non_overlapping} non-overlapping (greedy), {c.safe} safe; "
              + ", ".join(f"{k} {v}" for k, v in c.by_phase.items())]
    ind = p.inductor
    if ind.kernels_hist:
        lines += ["inductor: kernels per occurrence " + ", ".join(f"{k}: {v}x" for k, v in ind.kernels_hist.items())
                  + (f"; {ind.one_kernel} already one kernel" if ind.one_kernel else "")
                  + (f"; {ind.recomputed} with recomputed nodes" if ind.recomputed else "")]
        if ind.missed_fusion:
            lines += ["  missed fusion, split at: " + ", ".join(f"{k} ({v}x)" for k, v in ind.splits.items())]
    else:
        lines += ["inductor: no kernel map for these graphs"]
    if p.rejections:
        lines += ["", "rejected occurrences, by reason:"]
        groups: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for reason, n in p.rejections.items():
            groups[reason.split(":", 1)[0]].append((reason, n))
        for rule, items in groups.items():
            lines += [f"  {rule} ({sum(n for _, n in items)}):"]
            lines += [f"    {n:4d}x {reason.split(':', 1)[1].strip()}" for reason, n in items]
    lines += ["", f"stored occurrences ({len(p.occurrences)} of {c.non_overlapping}):"]
    for o in p.occurrences:
        shapes = ", ".join(f"{list(m.shape)}:{m.dtype}" for m in o.input_meta if m is not None)
        lines += [f"  {o.graph}  [{'safe' if o.verdict.ok else 'REJECTED'}]  nodes {', '.join(o.nodes)}",
                  f"    inputs {', '.join(o.inputs)} ({shapes})"
                  + (f"; scalars {list(o.scalars)}" if o.scalars else "")
                  + f"; {o.n_kernels} kernel(s)" + (f" {', '.join(k.name for k in o.kernels)}" if o.kernels else "")]
        lines += [f"    - {r}" for r in o.verdict.reasons]
    return "\n".join(lines)


def run(args) -> int:
    from miner.core.errors import UsageError
    from miner.core.pattern import load_patterns, occurrence_to_json
    from miner.core.workspace import Workspace
    from miner.report.terminal import Listing, emit

    patterns = load_patterns(Workspace(args.workspace))
    if args.what:
        if args.what[0] != "show" or len(args.what) != 2:
            raise UsageError("usage: miner patterns [--top N] | miner patterns show <pattern-id>")
        p = find(patterns, args.what[1])
        lst = Listing("", [], [], show(p).splitlines(), empty="")
        full = {**data(p), "source": p.to_source(), "graphs_list": list(p.support.graphs),
                "occurrences": [occurrence_to_json(o) for o in p.occurrences]}
        occ = [{"id": p.id, "graph": str(o.graph), "phase": o.phase, "safe": o.verdict.ok, "nodes": list(o.nodes),
                "n_kernels": o.n_kernels, "reasons": list(o.verdict.reasons)} for o in p.occurrences]
        return emit(args, [lst], full, occ, f"`miner candidates show {p.id}` (its candidate, ranked and measured); "
                                            "`miner generate` writes candidates")
    if args.model:
        patterns = [p for p in patterns if args.model in p.support.models]
    if args.missed:
        patterns = [p for p in patterns if p.inductor.missed_fusion]
    if args.top < 0:
        raise UsageError("--top must be 0 (all) or positive")
    lst, shown, rows = listing(patterns, args.top)
    hint = "`miner generate --top 3` (candidates of the three best it takes)" if shown else "`miner mine`"
    return emit(args, [lst], [{**data(p), **r} for p, r in zip(shown, rows)], rows, hint)
