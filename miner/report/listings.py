"""What ``miner candidates`` and ``miner candidates show`` list: the measured-only decision table, the
predicted ranking, one candidate in full; each as ``terminal.Listing`` (text), a JSON value and CSV rows.

The cells of a ``miner.rank.decision.Decision`` are formatted here once (``decision_cells``) and used
by the terminal, the CSV and the HTML page alike.
"""

from __future__ import annotations

from typing import Any, Sequence

from miner.rank.decision import (ADOPT, NOT_WORTH, ONLY, RULE, UNSAFE, Decision, Decisions, StepChange,
                                 model_step_cells)
from miner.rank.records import PREDICTED_MARK, Estimate, Ranked, Review
from miner.report.terminal import Column, Listing, cell
from miner.report.text import LEGEND, VARIANTS, count, cut, num, ops_chain, pct, validation_rows

VERDICT_STYLE = {ADOPT: "bold green", ONLY: "yellow", NOT_WORTH: "dim", UNSAFE: "bold red"}


# --------------------------------------------------------------------------- the decision

def step_text(s: StepChange, setup: str = "") -> str:
    """``gpt2 train 0.945x [0.930-0.960] loss ±1.0% +12 MiB``: speedup, p20-p80, verdict (``step_label``),
    noise band, peak memory change (the compile mode after a slash when not ``default``; range and memory
    when known; the setup in brackets where it differs from ``setup``)."""
    rng = f" [{s.lo:.3f}-{s.hi:.3f}]" if s.lo is not None and s.hi is not None else ""
    mem = f" {s.mem_mib:+.0f} MiB" if s.mem_mib is not None else ""
    return f"{_where(s, setup)} {s.speedup:.3f}x{rng} {s.shown} ±{100 * s.band:.1f}%{mem}"


def _where(s: StepChange, setup: str) -> str:
    """``t5 train``, the compile mode after a slash when not ``default``, the setup in brackets where it
    differs from ``setup``."""
    from miner.rank.decision import setup_diff

    diff = setup_diff(s.setup, setup) if setup else ""
    return (f"{s.model} {s.mode}" + ("" if s.compile == "default" else f"/{s.compile}")
            + (f" over knob {s.knob}" if s.knob else "") + (f" [{diff}]" if diff else ""))


def set_text(x, setup: str = "") -> str:
    """A measurement among other fusions (``SetChange``): ``among others: t5 train [H100 ...] 1.291x win as
    sdpa_reduced_math+reduce_overhead+fusions with 1 other (1.033x over the knob alone)``."""
    return f"among others: {_where(x.step, setup)} {x.text}"


def mem_text(s: StepChange) -> str:
    return "-" if s.mem_mib is None else f"{s.mem_mib:+.0f} MiB"


def kernel_runs(dec: Decisions) -> list[str]:
    """The bench runs the kernel ranges come from (one each: every candidate's latest)."""
    return sorted({d.kernel.run for d in dec.rows if d.kernel})


def decision_cells(d: Decision, *, run: bool = True, setup: str = "") -> dict[str, str]:
    """The decision table's cells, as plain text (one line per measured model in ``step`` / ``mem``).

    ``run``: name the kernel range's bench run in its cell (leave it out when every row has the same run).
    """
    k = d.kernel
    return {"verdict": d.label, "name": d.name or "-", "id": d.id, "where": d.where,
            "kernel": "-" if k is None else f"{k.lo:.2f}-{k.hi:.2f}x ({k.shapes})" + (f" run {k.run}" if run else ""),
            "step": "\n".join(step_text(s, setup) for s in d.steps) or "\n".join(
                set_text(x, setup) for x in d.together) or "not measured", "why": d.reason}


def decision_listing(dec: Decisions) -> Listing:
    """The first table: the verdict on every fusion and candidate, from measurements only."""
    cols = [Column("verdict", "verdict", max_width=12), Column("name", "fusion / candidate", wrap=False, max_width=26),
            Column("where", "fires on CUDA", max_width=16), Column("kernel", "kernel x (shapes)", max_width=14),
            Column("step", "step x [p20-p80] per model, verdict, ±noise, memory", ratio=1)]
    rows, styles = [], []
    runs = kernel_runs(dec)
    for d in dec.rows:
        c = decision_cells(d, run=len(runs) > 1, setup=dec.setup)
        c["verdict"] = cell(c["verdict"], VERDICT_STYLE.get(d.verdict))
        c["name"] = f"{c['name']}\n{d.id}" if d.name and d.name != d.id else d.id
        rows.append(c)
        styles.append(None)
    adopt = [d.name or d.id for d in dec.adopt]
    before = [f"Adopt: {', '.join(adopt)}." if adopt else "Adopt: none (no fusion has a measured in-model win "
              "without a measured loss)."]
    if dec.configs:  # knobs measured beside the fusions: what to run comes first (miner.check.configs)
        from miner.check.configs import lines

        from miner.rank.decision import setup_diff

        before[:0] = ["What to run (knobs and fusions, latest in-model A/B):"] + [
            x for c in dec.configs for x in lines(c, setup=setup_diff(c.setup, dec.setup))]
    if dec.setup:
        before.insert(0, f"Setup: {dec.setup} (a row measured otherwise names what differs, in brackets).")
    if dec.models:
        before.append("Model steps, default compile -> with the fusions (latest in-model A/B):")
        for m in dec.models:
            c = model_step_cells(m, dec.setup)
            if not m.fired and m.variant == "gated":
                before.append(f"  {c[0]:<27} {c[1]:>7} ms  = default (the gate keeps every fusion off)")
            else:
                before.append(f"  {c[0]:<27} {c[1]:>7} -> {c[2]} ms  {c[3]} {c[4]}"
                              + ("" if m.parity else f", parity {c[7]}"))
                before.append(f"  {'':<27} with {', '.join(sorted(m.fired)) or 'no fusion fired'}")
    after = [f"Rule: {_rule(dec)}.",
             "fires on CUDA: where the in-model gate fires (its evidence: fusions/<name>/wins.json); step: the "
             "fusion alone in the model step vs the default compile (`miner verify --ab`), win / loss beyond the "
             "noise band.",
             "kernel x: the kernel alone vs Inductor's, min-max over the shapes of each candidate's latest bench run"
             + (f" ({runs[0]})" if len(runs) == 1 else "") + "; it decides nothing in a model on its own.",
             "In-model A/B: " + (f"{dec.ab_source} ({dec.ab_date})" if dec.ab_source else
                                                         "none under reports/ (`miner verify --ab` on a GPU)") + "."]
    if dec.together:
        after.append(f"All promoted fusions at once ({dec.together_source}, no noise band): "
                     + "; ".join(dec.together) + ".")
    if dec.not_compared:
        after.append("Not compared (CPU-interpreter runs; their times mean nothing beside GPU rows): "
                     + ", ".join(dec.not_compared) + ".")
    after.append("marginal win: the median step is faster beyond the noise band, but the p20 of the per-round "
                 "ratios is below 1.0 (a fifth of the rounds or more were slower): more rounds would tell.")
    after.append("Why, per row: `miner candidates show <id>`.")
    return Listing("Decision (measured only)", cols, rows, before, after, styles, empty="No candidates or fusions.")


def _rule(dec: Decisions) -> str:
    return RULE


def decision_csv(dec: Decisions, review: Review) -> list[dict[str, Any]]:
    """One CSV row per decision, with the ranking's predicted numbers beside it (named as predicted)."""
    by_id = {r.id: r for r in review.rows}
    out = []
    for d in dec.rows:
        r = by_id.get(d.id)
        best = max(d.steps, key=lambda s: s.speedup, default=None)
        worst = min(d.steps, key=lambda s: s.speedup, default=None)
        out.append({"name": d.name, "id": d.id, "verdict": d.verdict, "fires_in": list(d.fires_in),
                    "kernel_speedup_min": d.kernel.lo if d.kernel else None,
                    "kernel_speedup_max": d.kernel.hi if d.kernel else None,
                    "kernel_run": d.kernel.run if d.kernel else None,
                    "step_speedup_min": worst.speedup if worst else None, "step_where_min": worst.where if worst else None,
                    "step_speedup_max": best.speedup if best else None, "step_where_max": best.where if best else None,
                    "steps": [step_text(s) for s in d.steps], "memory_mib": [s.mem_mib for s in d.steps],
                    "ab_source": dec.ab_source, "reason": d.reason,
                    "status": r.status if r else (d.status or "promoted"), "ops": d.ops,
                    "predicted_speedup": _pred(r.speedup) if r else None,
                    "predicted_saved_us_per_step": _pred(r.saved_ms, 1e3) if r else None})
    return out


def _pred(e: Estimate | None, scale: float = 1.0) -> str | None:
    return None if e is None else f"{'' if e.measured else PREDICTED_MARK}{e.value * scale:.4g}"


# --------------------------------------------------------------------------- the predicted ranking

RANK_COLS = [Column("n", "#", justify="right", wrap=False), Column("id", "id", wrap=False),
             Column("ops", "ops", ratio=1), Column("models", "mod", justify="right", wrap=False),
             Column("occ", "occ", justify="right", wrap=False), Column("safe", "safe", justify="right", wrap=False),
             Column("missed", "split", justify="right", wrap=False),
             Column("speedup", "kernel x", justify="right", wrap=False),
             Column("saved", "est. us/step", justify="right", wrap=False), Column("last", "status", wrap=False)]


def ranking_rows(review: Review, *, top: int | None, members: bool, patterns: bool) -> tuple[list, bool, int]:
    """[(rank, row, family, first member?)] of the ranked table, whether it fell back to patterns, families left out."""
    fams = review.pattern_families if patterns else review.candidate_families
    fell_back = False
    if not fams and not patterns:
        fams, fell_back = review.pattern_families, True
    by_id = {r.id: r for r in review.rows}
    shown = fams[:top] if top else fams
    out = []
    for i, fam in enumerate(shown, 1):
        for j, mid in enumerate(fam.members if members else fam.members[:1]):
            out.append((i, by_id[mid], fam, j == 0))
    return out, fell_back, len(fams) - len(shown)


def ranking_listing(review: Review, *, top: int | None, members: bool, patterns: bool) -> Listing:
    """The ranked table of candidates (or mined patterns): predicted where not measured (``~``)."""
    items, fell_back, more = ranking_rows(review, top=top, members=members, patterns=patterns)
    as_patterns = patterns or fell_back
    cols = list(RANK_COLS)
    if as_patterns:
        cols[-1] = Column("last", "why no candidate", ratio=1)
    rows = []
    for i, r, fam, first in items:
        similar = f" +{len(fam.members) - 1}" if first and len(fam.members) > 1 and not members else ""
        last = cut(review.skipped.get(r.id, "not generated yet"), 60) if as_patterns else r.status
        ident = (r.id + similar if first else f"  {r.id}") + (f"\n{r.label}" if r.label else "")
        rows.append({"n": str(i) if first else "", "id": ident,
                     "ops": ops_chain(r).replace(">", " "), "models": str(r.support[0]), "occ": str(r.occurrences),
                     "safe": pct(r.safe_share), "missed": pct(r.missed_share),
                     "speedup": _est(r.speedup, ".2f", "x"), "saved": _est(r.saved_ms, ".1f", scale=1e3),
                     "last": last})
    title = ("Predicted: " + ("mined patterns without a candidate" if as_patterns else "candidates")
             + ", ranked by estimated time saved per step")
    before = [f"(model: {review.only_model})"] if review.only_model else []
    if fell_back:
        before.append("No candidates yet (run `miner generate`): the mined patterns, ranked the same way.")
    before.append(review.basis)
    after = []
    if more > 0:
        after.append(f"... {more} more families (--top 0 shows all)")
    n_other = len(review.candidate_families if as_patterns else review.pattern_families)
    if n_other and not fell_back:
        after.append(f"({n_other} families of {'candidates' if as_patterns else 'mined patterns without a candidate'}"
                     f": `miner candidates{'' if as_patterns else ' --patterns'}`)")
    if not rows:
        return Listing(title, cols, rows, before, after, empty="Nothing to rank: no mined patterns or candidates in "
                       "this workspace (run `miner scan`, `miner mine`, `miner generate`).")
    after += [LEGEND, "est. us/step: the kernel-alone time difference times the calls per step (measured per "
              "call where the kernel was timed at that shape, else predicted ~), summed: an extrapolation, not a "
              "step measurement (the decision table has those). mod: models it occurs in; occ: non-overlapping occurrences; safe: share the safety checks "
              "accept; split: share Inductor splits into >1 kernel; kernel x: speedup over Inductor; +n: family "
              "members (--members lists them).", accuracy_line(review)]
    after += [f"warning: {p}" for p in review.problems]
    return Listing(title, cols, rows, before, after, empty="Nothing to rank: no mined patterns or candidates in this "
                   "workspace (run `miner scan`, `miner mine`, `miner generate`).")


def _est(e: Estimate | None, spec: str, suffix: str = "", scale: float = 1.0) -> str:
    if e is None:
        return "-"
    return Estimate(e.value * scale, e.source).fmt(spec, suffix)


def accuracy_line(review: Review) -> str:
    """The cost model's measured error, in one sentence (beside every predicted number)."""
    acc = review.model.accuracy
    if acc is None:
        return "Cost model's measured error: none (not trained; predictions are the analytical roofline's)."
    if not acc.ok:
        return f"Cost model's measured error: none ({acc.reason or 'accuracy undefined on these points'})."
    return (f"Cost model's measured error ({acc.scheme}, {acc.n_points} measured points, {acc.n_candidates} "
            f"candidates): MAE {acc.mae:.2f}x speedup, Spearman {acc.spearman:.2f} (analytical baseline: MAE "
            f"{num(acc.baseline_mae)}x, Spearman {num(acc.baseline_spearman)}).")


# --------------------------------------------------------------------------- JSON

def _e(e: Estimate | None) -> dict | None:
    return None if e is None else {"value": e.value, "source": e.source}


def row_json(review: Review, r: Ranked, decision: Decision | None) -> dict:
    """One ranked row in full: the ranking's fields, per-shape estimates and bench points, the decision."""
    from miner.rank import rank

    base = next(x for x in rank.to_json(_only(review, r)))
    base["calls"] = [{"model": e.call.model, "phase": e.call.phase, "inputs": e.call.label, "count": e.call.count,
                      "shape_source": e.call.source, "inductor_kernels": e.call.mix_label,
                      "inductor_ms": _e(e.inductor_ms), "speedup": _e(e.speedup), "saved_ms_per_call": _e(e.saved_ms)}
                     for e in r.calls]
    c = r.candidate
    base["bench"] = [{"inputs": b.label, "models": list(b.models), "shape_source": b.source, "run": b.run,
                      "times_ms": {v: list(t) for v, t in b.times.items()}, "errors": b.errors,
                      "speedup_vs_inductor": b.speedup, "roofline_ms": b.roofline_ms, "roofline_pct": b.roofline_pct()}
                     for b in (c.bench if c else ())]
    base["validation"] = c.validation if c else None
    base["fusion"] = c.fusion if c else None
    base["decision"] = decision.to_json() if decision else None
    base["why_no_candidate"] = None if c else review.skipped.get(r.id, "not generated yet")
    return base


def _only(review: Review, r: Ranked) -> Review:
    from dataclasses import replace
    return replace(review, rows=(r,))


def candidates_json(review: Review, dec: Decisions | None, *, top: int | None, members: bool, patterns: bool) -> dict:
    """``miner candidates --json``: the decision table and the ranked rows the text shows (``--top``, ``--patterns``)."""
    items, fell_back, more = ranking_rows(review, top=top, members=members, patterns=patterns)
    by_dec = {d.id: d for d in dec.rows} if dec else {}
    acc = review.model.accuracy
    return {"kind": "patterns" if patterns or fell_back else "candidates", "basis": review.basis,
            "scale": review.scale, "model": review.only_model,
            "decisions": dec.to_json() if dec else None,
            "ranking": [{"rank": i, "family": fam.id, "family_size": len(fam.members), "leader": first,
                         **row_json(review, r, by_dec.get(r.id))} for i, r, fam, first in items],
            "more_families": more,
            "cost_model": {"source": review.model.source, "note": review.model.note,
                           "accuracy": None if acc is None else {
                               "ok": acc.ok, "scheme": acc.scheme, "points": acc.n_points,
                               "candidates": acc.n_candidates, "mae": acc.mae, "spearman": acc.spearman,
                               "baseline_mae": acc.baseline_mae, "baseline_spearman": acc.baseline_spearman,
                               "reason": acc.reason}},
            "problems": list(review.problems)}


def ranking_csv(review: Review, dec: Decisions | None, *, top: int | None, members: bool, patterns: bool) -> list[dict]:
    """One CSV row per ranked row (as the text's table), the verdict beside it."""
    items, _, _ = ranking_rows(review, top=top, members=members, patterns=patterns)
    by_dec = {d.id: d for d in dec.rows} if dec else {}
    out = []
    for i, r, fam, first in items:
        d = by_dec.get(r.id)
        out.append({"rank": i, "id": r.id, "family": fam.id, "ops": ops_chain(r), "status": r.status,
                    "label": r.label, "verdict": d.verdict if d else "", "models": r.support[0],
                    "graphs": r.support[1], "occurrences": r.occurrences, "safe_share": r.safe_share,
                    "missed_share": r.missed_share, "inductor_kernels": r.inductor_kernels,
                    "speedup": r.speedup.value if r.speedup else None,
                    "speedup_source": r.speedup.source if r.speedup else None,
                    "saved_us_per_step": r.saved_ms.value * 1e3, "saved_source": r.saved_ms.source,
                    "why_no_candidate": None if r.candidate else review.skipped.get(r.id, "not generated yet")})
    return out


# --------------------------------------------------------------------------- one candidate

def show_listings(review: Review, r: Ranked, d: Decision | None) -> list[Listing]:
    """``miner candidates show <id>``: facts, the decision, per-call estimates, validation, benchmarks, occurrences."""
    p, c = r.pattern, r.candidate
    facts = [f"ops: {p.ops}", f"status: {r.status}" + (f" (fusion {c.fusion})" if c and c.fusion else ""),
             f"family: {r.family.id} '{r.family.name}' ({len(r.family.members)} members)",
             f"support: {p.support.n_models} models ({', '.join(p.support.models)}), {p.support.n_graphs} graphs",
             f"occurrences: {r.occurrences} non-overlapping, {r.safe} safe ({pct(r.safe_share)}); by phase "
             f"{dict(p.counts.by_phase)}",
             f"Inductor: typical {r.inductor_kernels} kernel(s) per occurrence; missed fusion {pct(r.missed_share)}",
             f"score: saved {_est(r.saved_ms, '.1f', scale=1e3)} us per step; speedup over Inductor "
             f"{_est(r.speedup, '.2f', 'x')}"]
    if d is not None:
        cells = decision_cells(d)
        facts += [f"verdict: {d.label}: {d.reason}", f"fires on CUDA: {cells['where']}",
                  f"kernel alone: {cells['kernel']}"] + gate_lines(d)
    out = [Listing(f"{r.id}  {r.label}".rstrip(), [], [], facts, ["pattern:"] + ["  " + x for x in
                                                                            p.to_source("pattern").splitlines()],
                   empty="")]
    if d is not None and d.steps:
        out.append(steps_listing(d))
    if p.inductor.splits:
        out.append(Listing("where Inductor splits it", [], [], [f"  {k}: {v}" for k, v in p.inductor.splits.items()],
                           empty=""))
    if p.rejections:
        out.append(Listing("why occurrences were rejected", [], [], [f"  {v:5d}  {k}" for k, v in sorted(
            p.rejections.items(), key=lambda kv: -kv[1])], empty=""))
    if r.calls:
        derived = any(e.call.source == "derived" for e in r.calls)
        out.append(Listing("per call (safe occurrences with the same inputs)", CALL_COLS,
                           [call_cells(e) for e in r.calls],
                           after=["derived: not captured; the captured shapes scaled up to the model's published "
                                  "size (`--scale captured` shows the captured ones)"] if derived else []))
    if c is None:
        out.append(Listing("", [], [], [f"no candidate: {review.skipped.get(r.id, 'not generated yet (miner generate)')}"],
                           empty=""))
    else:
        meta = [f"candidate files: {c.candidate.path}"] + [f"  {k}: {c.meta[k]}" for k in ("op", "regenerate",
                                                                                          "signature", "kernel")
                                                          if c.meta.get(k)]
        out.append(Listing("", [], [], meta, empty=""))
        out.append(validation_listing(c.validation))
        if c.bench:
            out.append(Listing("isolated kernel benchmarks (us per call, median; x: speedup over Inductor)", BENCH_COLS, [bench_cells(b, review.runs) for b in c.bench],
                               after=["run: oldest first; the decision and the cost model use each candidate's "
                                      "latest run only."]))
    occ = [f"  {o.graph}  {' '.join(str(m.shape) for m in o.input_meta if m is not None)}  kernels={o.n_kernels}  "
           + ("ok" if o.verdict.ok else "rejected: " + "; ".join(o.verdict.reasons)) for o in p.occurrences[:12]]
    if len(p.occurrences) > 12:
        occ.append(f"  ... {len(p.occurrences) - 12} more in the sample")
    out.append(Listing("where it occurs (sample)", [], [], occ + ["", LEGEND], empty=""))
    return out


def gate_lines(d: Decision) -> list[str]:
    """A promoted fusion's gate: the sites and size ranges where it fires, and the rule that decides."""
    from miner.runtime.evidence import BRACKET_RULE

    if not d.promoted:
        return []
    return (["gate (where it fires on CUDA):"] + [f"  {c}" for c in d.coverage or ("nowhere: no in-model win",)]
            + [f"  rule: {BRACKET_RULE}"])


def steps_listing(d: Decision) -> Listing:
    """The in-model A/B measurements a decision stands on, one row each."""
    return Listing("in-model A/B (the fusion alone vs the default compile, or vs the knob a row names)",
                   # the setup (GPU, preset, sizes, dtype) makes the first cell long: it wraps rather than squeeze
                   # the numbers and the source into one character a line
                   [Column("where", "model mode/compile", ratio=2), Column("speedup", "step x", justify="right"),
                    Column("range", "p20-p80", justify="right"), Column("band", "noise", justify="right"),
                    Column("verdict", "verdict"), Column("mem", "memory", justify="right"),
                    Column("source", "from", ratio=1)],
                   [{"where": s.where + (f" ({s.setup})" if s.setup else ""), "speedup": f"{s.speedup:.3f}x",
                     "range": "-" if s.lo is None else f"{s.lo:.3f}-{s.hi:.3f}", "band": f"±{100 * s.band:.1f}%",
                     "verdict": s.shown, "mem": mem_text(s), "source": s.source} for s in d.steps])


FIRES_TITLE = {"compute_once": "where the rule fires (each table, its shape -> the elements of its consumers)",
               "gemm_epilogue": "where the rule fires (each GEMM's output -> the activation its epilogue applies)"}


def unranked_show_listings(d: Decision, cand) -> list[Listing]:
    """``miner candidates show <id>`` of a candidate the ranking has no row for (an upcast matmul, a whole
    region): its decision, where it fires and declines, its in-model A/B and its validation."""
    meta = cand.meta
    facts = [f"ops: {d.ops}", f"status: {d.status}" + (f" (fusion {d.name})" if d.promoted else ""),
             f"verdict: {d.label}: {d.reason}", f"fires on CUDA: {d.where}"] + gate_lines(d) + [
             f"candidate files: {cand.path}", f"  regenerate: {meta.get('regenerate')}"]
    facts += [f"  {k}: {meta[k]}" for k in ("rule", "source") if meta.get(k)]
    fired = [f"  {o.get('count', 1):5d}  {o.get('model', '?')} {o.get('phase', '?')} {o.get('target', '')} " + _observed(o)
             for o in meta.get("observed", ())]
    declined = [f"  {x['count']:5d}  {x['model']} {x['phase']}: {'; '.join(x['reasons'])}"
                for x in meta.get("declined", ())]
    out = [Listing(f"{d.id}  {d.name}", [], [], facts, empty=""),
           Listing(FIRES_TITLE.get(meta.get("kind"), "where the rule fires (the GEMM's inputs after the rewrite)")
                   if meta.get("rule") else "where it was observed (its inputs)", [], [], fired, empty=""),
           Listing("where it declines", [], [], declined, empty="")]
    if d.steps:
        out.append(steps_listing(d))
    return out + [validation_listing(candidate_validation(cand))]


def _observed(o: dict) -> str:
    """One observed site's sizes: a rewritten GEMM's inputs, a GEMM epilogue's output and activation, or a table
    computed once (its shape, the elements its consumers read, the predicted saving)."""
    if "inputs" in o:
        return " x ".join(f"{i['dtype']}{i['shape']}" for i in o["inputs"])
    if "activation" in o:  # a GEMM epilogue
        return (f"{o.get('node', '')} {o['dtype']}{list(o['shape'])} -> {o['activation']}, "
                f"{o.get('spared_bytes', 0) / 1e6:.1f} MB not moved")
    text = f"{list(o.get('shape', ()))} -> {o['consumer_numel']:,} elements" if "consumer_numel" in o else ""
    return text + (f", predicted {o['predicted_us']:.1f} us saved" if o.get("predicted_us") is not None else "")


def candidate_validation(cand) -> dict | None:
    """The candidate's current validation.json (None when absent, stale or unreadable)."""
    from miner.core import candidate as candidates
    from miner.core.errors import MinerError

    try:
        return candidates.validation(cand.path)
    except MinerError:
        return None


CALL_COLS = [Column("model", "model", wrap=False), Column("phase", "phase", wrap=False), Column("inputs", "inputs", ratio=1),
             Column("count", "count", justify="right", wrap=False), Column("kern", "kern", justify="right", wrap=False),
             Column("ind", "Inductor us", justify="right", wrap=False),
             Column("speedup", "speedup", justify="right", wrap=False),
             Column("saved", "saved us/call", justify="right", wrap=False)]


def call_cells(e) -> dict[str, str]:
    c = e.call
    return {"model": c.model, "phase": c.phase, "inputs": ("derived " if c.source == "derived" else "") + c.label,
            "count": count(c.count), "kern": c.mix_label, "ind": _est(e.inductor_ms, ".1f", scale=1e3),
            "speedup": e.speedup.fmt(".2f", "x"), "saved": _est(e.saved_ms, ".2f", scale=1e3)}


BENCH_COLS = [Column("run", "run", ratio=1), Column("inputs", "inputs", ratio=1), Column("models", "models", ratio=1),
              Column("inductor", "Inductor us", justify="right", wrap=False),
              Column("candidate", "kernel us [p20-p80]", justify="right", wrap=False),
              Column("speedup", "x", justify="right", wrap=False),
              Column("roof", "roofline", justify="right", wrap=False)]


def bench_cells(b, runs: Sequence = ()) -> dict[str, str]:
    """One bench point as table cells; eager and max-autotune are in ``--json`` / ``--csv``."""
    from miner.rank.decision import run_name

    def t(v, rng=False):
        x = b.times.get(v)
        return "-" if x is None else f"{x[0] * 1e3:.1f}" + (f" [{x[1] * 1e3:.1f}-{x[2] * 1e3:.1f}]" if rng else "")
    return {"run": run_name(b.run, runs), "inputs": b.label, "models": f"{','.join(b.models)} ({b.source})",
            "inductor": t("inductor"), "candidate": t("candidate", True),
            "speedup": num(b.speedup, ".2f") + "x" if b.speedup else "-", "roof": num(b.roofline_pct(), ".0f") + "%"}


def validation_listing(v: dict | None) -> Listing:
    if not isinstance(v, dict):
        return Listing("validation", [], [], ["not validated"], empty="")
    where = ", ".join(f"{k} {v[k]}" for k in ("device", "torch", "triton", "date") if v.get(k))
    not_run = sum(isinstance(c, dict) and c.get("ok", False) is None for c in v.get("checks", ()) or ())
    head = f"overall: {'ok' if v.get('ok') else 'FAILED'}" + (f" ({v['failure']})" if v.get("failure") else "") + (
        f" ({not_run} check(s) not run: marked ? below)" if not_run else "") + (
        f"  [{where}]" if where else "")
    rows = [{"ok": cell("ok", "green") if ok else cell("FAIL", "red") if ok is False else "?", "what": w, "detail": det}
            for w, ok, det in validation_rows(v)]
    return Listing("validation", [Column("ok", "", wrap=False), Column("what", "check", ratio=1),
                                  Column("detail", "detail", ratio=1)], rows, [head], empty="")


def show_csv(r: Ranked) -> list[dict]:
    """``candidates show --csv``: one row per call (input set), its bench point beside it when measured."""
    out = []
    for e in r.calls:
        b = e.bench
        out.append({"id": r.id, "model": e.call.model, "phase": e.call.phase, "inputs": e.call.label,
                    "shape_source": e.call.source, "count": e.call.count, "inductor_kernels": e.call.mix_label,
                    "inductor_ms": e.inductor_ms.value, "inductor_source": e.inductor_ms.source,
                    "speedup": e.speedup.value, "speedup_source": e.speedup.source,
                    "saved_ms_per_call": e.saved_ms.value, "run": b.run if b else None,
                    **{f"{v}_ms": (b.times[v][0] if b and v in b.times else None) for v in VARIANTS}})
    return out


__all__ = ["accuracy_line", "candidates_json", "decision_cells", "decision_csv", "decision_listing", "mem_text",
           "ranking_csv", "ranking_listing", "row_json", "show_csv", "show_listings", "steps_listing",
           "unranked_show_listings", "step_text"]
