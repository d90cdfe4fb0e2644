"""Terminal tables of a ``Review``: the ranked table (``miner candidates``) and one candidate in full (``--show``).

Renderers only format what ``miner.rank.rank`` computed. Predicted numbers carry a leading ``~``.
"""

from __future__ import annotations

import math
from typing import Sequence

from miner.rank.costmodel import Accuracy
from miner.rank.records import PREDICTED_MARK, CallEstimate, Estimate, Ranked, Review

VARIANTS = ("eager", "inductor", "max-autotune", "candidate")  # the timed variants, in table order
LEGEND = (f"{PREDICTED_MARK} = predicted (not measured): by the cost model, or by the analytical roofline "
          "model when there is no benchmark data; numbers without it were measured on a GPU by `miner bench` "
          "(the pattern's subgraph compiled alone by Inductor vs the candidate's kernel).")


def _us(e: Estimate | None) -> str:
    return "-" if e is None else e.fmt(".1f") if abs(e.value) < 1e5 else e.fmt(".3g")


def pct(x: float | None) -> str:
    """``0.25`` -> ``25%``; ``-`` for None or nan."""
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.0f}%"


def cut(s: str, n: int) -> str:
    """``s`` cut to ``n`` characters, an ellipsis marking the cut."""
    return s if len(s) <= n else s[: n - 1] + "…"


def _columns(rows: Sequence[Sequence[str]], header: Sequence[str], right: set[int]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = lambda r: "  ".join(str(x).rjust(w) if i in right else str(x).ljust(w)
                              for i, (x, w) in enumerate(zip(r, widths))).rstrip()
    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def ops_chain(r: Ranked) -> str:
    """The pattern's ops, views left out, as ``amax>sub>exp>sum>div``."""
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
            last = (cut(review.skipped.get(r.id, "not generated yet"), 40) if patterns
                    else r.status + (f" ({r.label})" if r.label else ""))
            rows.append([str(i) if j == 0 else "", r.id, fam_col, cut(ops_chain(r), 38), str(r.support[0]),
                         str(r.support[1]), str(r.occurrences), pct(r.safe_share), pct(r.missed_share),
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
            f"{num(acc.baseline_spearman)}, MAE {num(acc.baseline_mae)}x); {model_note}.")


def num(x: float | None, spec: str = ".2f") -> str:
    """``x`` formatted with ``spec``; ``-`` for None."""
    return "-" if x is None else f"{x:{spec}}"


def render_show(review: Review, r: Ranked) -> str:
    """Everything known about one candidate (or pattern), as text."""
    p, c = r.pattern, r.candidate
    lines = [f"{r.id}  {r.label or ''}".rstrip(), f"  ops:      {p.ops}",
             f"  status:   {r.status}" + (f" (fusion {c.fusion})" if c and c.fusion else ""),
             f"  family:   {r.family.id} '{r.family.name}' ({len(r.family.members)} members: "
             f"{', '.join(r.family.members[:6])}{' ...' if len(r.family.members) > 6 else ''})",
             f"  support:  {p.support.n_models} models ({', '.join(p.support.models)}), {p.support.n_graphs} graphs",
             f"  occurrences: {r.occurrences} non-overlapping, {r.safe} safe ({pct(r.safe_share)}); "
             f"by phase {dict(p.counts.by_phase)}",
             f"  Inductor: typical {r.inductor_kernels} kernel(s) per occurrence; kernels histogram "
             f"{dict(p.inductor.kernels_hist)}; missed fusion {pct(r.missed_share)}",
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
                    + [num(b.speedup, ".2f") + "x" if b.speedup else "-", num(b.roofline_pct(), ".0f") + "%"]
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
    return [c.model, c.phase, cut(c.label, 60) + (" (derived)" if c.source == "derived" else ""), count(c.count),
            c.mix_label, e.inductor_ms.fmt(".4f"),
            e.speedup.fmt(".2f", "x"), _us(_scaled(e.saved_ms))]


def count(n: float) -> str:
    """An occurrence count: integral ones without decimals."""
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
