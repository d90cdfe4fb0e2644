"""Rank candidates by the time they would save across the zoo.

``review(workspace)`` reads what the other stages left in the workspace (``mined/patterns.json``,
``candidates/<id>/{candidate,validation,bench}.json``, ``fusions/``) and returns a ``Review``: one
``Ranked`` row per candidate, and per mined pattern that has no candidate yet, best first.

Score = expected time saved in one step of every zoo model the pattern occurs in. Each *safe*
occurrence (an unsafe one is never rewritten) is a ``Call`` of the pattern on some inputs; by
default the call is scaled to its model's published size (``miner.core.sizes.derive_shape``: tiny-preset
captures stand for bert-base, gpt2, llama-1B, t5-base), since that is what users run. Per call the
saving is Inductor's time minus the fused kernel's: measured where ``miner bench`` timed those
inputs, predicted otherwise (``miner.rank.costmodel``); savings add up over calls x counts. Ties are
broken by support (models, then graphs). Missed-fusion share and safe share are shown beside the
score, not folded in, except that unsafe occurrences save nothing.

Every number carries its source (``Estimate.source``): "measured", "model" (the cost model) or
"analytical" (the roofline guess); anything not measured prints with a leading ``~``. Every input
may be missing: no bench data ranks on predictions, no patterns gives an empty review.

The stage's parts: ``records`` (the records above), ``read`` (the workspace reader: patterns,
candidates, bench points, calls), this module (the scorer), ``costmodel`` and ``families``. The
records and the reader stay importable from here (``from miner.rank.rank import Review``).
"""


from __future__ import annotations

import difflib
import json
import math
import statistics
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Iterable, Sequence

from miner.rank import costmodel
from miner.rank import families
from miner.rank.costmodel import CostModel, Features, Sample
from miner.core import dtypes
from miner.core.errors import UsageError
from miner.core.tensors import TensorSpec
from miner.core.pattern import Pattern, pattern_from_json
from miner.core.workspace import Workspace
from miner.rank.records import (PREDICTED_MARK, SCALES, BenchPoint, BenchRun, Call, CallEstimate,  # noqa: F401 re-exported
                                CandidateInfo, Estimate, Ranked, Review, RunTable)
from miner.rank.read import (at_published_size, bench_points, calls_of_candidate, calls_of_pattern,  # noqa: F401
                             expected_calls, load_bench, load_candidates, load_patterns, run_tables, skipped_reasons)

# --------------------------------------------------------------------------- features and estimates

def call_features(p: Pattern, call: Call) -> Features:
    """The cost model's features of one call of ``p`` (op mix, casts, bytes, row shape)."""
    cats = Counter(n.category for n in p.nodes)
    casts = sum(1 for n in p.nodes if n.target in families.CAST_OPS)
    main = call.main
    bytes_in = float(sum(t.nbytes for t in call.inputs))
    bytes_out = float(sum(t.nbytes for t in call.outputs) or (main.nbytes if main else 0))
    k = call.inductor_kernels or 1
    fused = call.bytes.get("fused") or bytes_in + bytes_out
    # Without a measured split, Inductor is assumed to re-read the largest input once per extra kernel.
    inductor = call.bytes.get("inductor") or fused + (k - 1) * (main.nbytes if main else 0)
    row = main.shape[-1] if main and main.shape else 1
    return Features(n_pointwise=cats["pointwise"] - casts, n_reduction=cats["reduction"], n_view=cats["view"],
                    n_cast=casts, n_inputs=len(call.inputs), n_outputs=max(1, len(call.outputs)),
                    bytes_in=bytes_in, bytes_out=max(0.0, fused - bytes_in), bytes_inductor=float(inductor),
                    row_length=int(row), n_rows=int(main.numel // max(row, 1)) if main else 1,
                    dtype_bytes=dtypes.size(main.dtype if main else "float32", default=4),
                    inductor_kernels=k)


def estimate_call(p: Pattern, call: Call, bench: dict[tuple, BenchPoint], model: CostModel) -> CallEstimate:
    """One call's Inductor and candidate times and the saving: measured where ``bench`` timed
    ``call.key``, else predicted by ``model``.

    Parameters
    ----------
    p : Pattern
        The pattern.
    call : Call
        One observed (or scaled) call of it.
    bench : dict
        Bench points by call key.
    model : CostModel
        The fitted cost model (or the analytical fallback).

    Returns
    -------
    CallEstimate
        Times and saving, each an ``Estimate`` that names its source.
    """
    f = call_features(p, call)
    b = bench.get(call.key)
    if b is not None and b.speedup is not None:
        ind, cand = b.times["inductor"][0], b.times["candidate"][0]
        return CallEstimate(call, f, Estimate(b.speedup, "measured"), Estimate(ind, "measured"),
                            Estimate(ind - cand, "measured"), b)
    ind = saved = 0.0  # expectations over the kernel mix
    for k, w in call.mix:
        fk = call_features(p, call.with_kernels(k))
        ind_k = costmodel.analytical_inductor_seconds(fk, model.bandwidth) * 1e3
        ind += w * ind_k
        saved += w * ind_k * (1 - 1 / model.predict(fk))
    s = ind / (ind - saved) if ind > saved else float("inf")
    return CallEstimate(call, f, Estimate(s, model.source), Estimate(ind, "analytical"),
                        Estimate(saved, model.source), b)


def training_samples(items: Sequence[tuple[Pattern, CandidateInfo]]) -> list[Sample]:
    """Every input set measured in each candidate's latest run, with its features.

    Older runs timed older kernels of the same candidate (the generator changes between runs), so
    they do not train the model. A benchmarked input set that no observed call has (a shape derived for a model the capture did
    not see) borrows the kernel count and byte ratios of the candidate's first observed call.
    """
    samples = []
    for p, c in items:
        calls = calls_of_candidate(c.meta)
        known = {x.key: x for x in calls + [at_published_size(x) for x in calls]}
        latest = c.bench[-1].run if c.bench else None  # c.bench is oldest run first
        for b in c.bench:
            if b.speedup is None or b.run != latest:
                continue
            call = known.get(b.key)
            if call is None and calls:
                ins = tuple(TensorSpec(s, d) for s, d in b.key)
                call = replace(calls[0], inputs=ins, outputs=(), bytes={"fused": float(b.bytes_moved)})
            if call is not None:
                samples.append(Sample(c.id, b.label, call_features(p, call), b.speedup))
    return samples


def combine_sources(sources: Iterable[str]) -> str:
    """The source of a sum of estimates: "measured" only if every part was, else "model" if any part was, else "analytical"."""
    s = set(sources)
    return "measured" if s <= {"measured"} else "model" if "model" in s else "analytical"


def calls_for(p: Pattern, c: CandidateInfo | None, *, scale: str = "published", only_model: str | None = None) -> list[Call]:
    """The calls a fusion of ``p`` would replace: the candidate's observed ones, else the pattern's sample."""
    sample = calls_of_candidate(c.meta) if c and c.meta.get("observed") else calls_of_pattern(p)
    calls = [x for x in expected_calls(p, sample) if only_model is None or x.model == only_model]
    return [at_published_size(x) for x in calls] if scale == "published" else calls


def rank_one(p: Pattern, c: CandidateInfo | None, model: CostModel, *, scale: str = "published",
             only_model: str | None = None) -> Ranked:
    """One ``Ranked`` row: the pattern's calls (scaled per ``scale``), their estimates and their sum.

    Parameters
    ----------
    p : Pattern
        The mined pattern.
    c : CandidateInfo or None
        Its candidate, if one was generated.
    model : CostModel
        Predicts what was not measured.
    scale : str
        ``"published"`` (calls at the model's published size) or ``"captured"``.
    only_model : str, optional
        Keep only this zoo model's calls.
    """
    calls = calls_for(p, c, scale=scale, only_model=only_model)
    bench = {b.key: b for b in (c.bench if c else ())}
    ests = sorted((estimate_call(p, x, bench, model) for x in calls), key=lambda e: -e.total_saved_ms)
    n = sum(e.call.count for e in ests)
    speedup = None
    if n:
        speedup = Estimate(math.exp(sum(e.call.count * math.log(max(e.speedup.value, 1e-9)) for e in ests) / n),
                           combine_sources(e.speedup.source for e in ests))
    saved = Estimate(sum(e.total_saved_ms for e in ests), combine_sources(e.saved_ms.source for e in ests) if ests
                     else model.source)
    occs, safe = p.counts.non_overlapping, p.counts.safe
    if only_model and p.occurrences:  # estimated from the stored sample
        sample = [o for o in p.occurrences if o.graph.model == only_model]
        scale = p.counts.non_overlapping / len(p.occurrences)
        occs, safe = round(len(sample) * scale), round(sum(o.verdict.ok for o in sample) * scale)
    hist = {int(k): v for k, v in p.inductor.kernels_hist.items()}
    mapped = sum(hist.values())
    missed = sum(v for k, v in hist.items() if k > 1) / mapped if mapped else None
    return Ranked(id=c.id if c else p.id, pattern=p, candidate=c, family=families.Family(p.id, p.ops, (p.id,)),
                  status=c.status if c else "mined", occurrences=occs, safe=safe, missed_share=missed,
                  inductor_kernels=p.inductor.typical_kernels, calls=tuple(ests), speedup=speedup, saved_ms=saved)


def _sort_key(r: Ranked):
    return (-r.saved_ms.value, -r.support[0], -r.support[1], -r.occurrences, r.id)


def rank(patterns: Sequence[Pattern], candidates: Sequence[CandidateInfo], runs: Sequence[BenchRun] = (), *,
         scale: str = "published", only_model: str | None = None, problems: Sequence[str] = (),
         mining: dict | None = None) -> Review:
    """Rank candidates, and mined patterns without one, on expected time saved."""
    if scale not in SCALES:
        raise UsageError(f"unknown scale {scale!r}; one of {', '.join(SCALES)}")
    by_id = {p.id: p for p in patterns}
    items: list[tuple[Pattern, CandidateInfo | None]] = []
    for c in candidates:
        p = by_id.get(c.id)
        if p is None and isinstance(c.meta.get("pattern"), dict):
            try:
                p = pattern_from_json(c.meta["pattern"])
            except (KeyError, TypeError, ValueError):
                p = None
        if p is not None:
            items.append((p, c))
    with_cand = {p.id for p, _ in items}
    items += [(p, None) for p in patterns if p.id not in with_cand]
    bws = [r.copy_gbps for r in runs if r.copy_gbps]
    bandwidth = statistics.median(bws) * 1e9 if bws else costmodel.NOMINAL_BANDWIDTH
    benched = [(p, c) for p, c in items if c and c.bench]
    family_of = {m: f.id for f in families.cluster([(p.id, [n.target for n in p.nodes], [n.category for n in p.nodes])
                                                    for p, _ in sorted(benched, key=lambda pc: pc[0].id)])
                 for m in f.members}
    samples = [replace(s, family=family_of.get(s.candidate)) for s in training_samples(benched)]
    model = costmodel.fit(samples, bandwidth)
    if model.source == "model":  # one forest call for every prediction instead of one each
        model.prime([call_features(p, x.with_kernels(k)) for p, c in items
                     for x in calls_for(p, c, scale=scale, only_model=only_model) for k, _ in x.mix])
    rows = [rank_one(p, c, model, scale=scale, only_model=only_model) for p, c in items]
    if only_model:
        rows = [r for r in rows if r.occurrences]
    rows.sort(key=_sort_key)
    # A family is led by its best usable member: a failed candidate leads only a family of failures.
    # Candidates and mined-only patterns form separate families; a family is led by its best usable
    # member (a failed candidate leads only a family of failures).
    order = {r.id: i for i, r in enumerate(rows)}
    fams = []
    for group in ([r for r in rows if r.candidate], [r for r in rows if not r.candidate]):
        leaders_first = sorted(group, key=lambda r: r.status == "failed")
        fams += sorted(families.cluster([(r.id, [n.target for n in r.pattern.nodes],
                                          [n.category for n in r.pattern.nodes]) for r in leaders_first]),
                       key=lambda f: order[f.id])
    fam_of = {m: f for f in fams for m in f.members}
    rows = [replace(r, family=fam_of[r.id]) for r in rows]
    return Review(tuple(rows), tuple(fams), model, tuple(runs), scale, only_model,
                  _basis(rows, runs, model, scale), tuple(problems), mining or {})


RANKING = "ranked by estimated time saved per step (est. us/step)"  # every listing's header says so


def pattern_order(patterns: Sequence[Pattern], refused: dict[str, str] | None = None) -> list[Pattern]:
    """``patterns`` in the one ranking every verb uses (:func:`rank`'s, without candidates: estimated
    time saved per step at the published size); those in ``refused`` (id -> why ``miner generate``
    will not take it) after all the others, in the same order among themselves."""
    refused = refused or {}
    by_id = {p.id: p for p in patterns}
    rows = rank(list(patterns), ()).rows
    return [by_id[r.id] for r in sorted(rows, key=lambda r: r.id in refused)]


def refused_reasons(skipped: dict[str, str]) -> dict[str, str]:
    """The reasons of ``candidates/index.json`` that say the generator will never take a pattern
    (not "below --top N" or "not selected": those it would take)."""
    return {i: why for i, why in skipped.items() if not why.startswith(("below --top", "not selected"))}


def _refused_last(review_: Review) -> Review:
    """``review_`` with the mined patterns the generator refuses after the others (rows and families)."""
    refused = refused_reasons(review_.skipped)
    rows = tuple(sorted(review_.rows, key=lambda r: r.candidate is None and r.id in refused))
    fams = tuple(sorted(review_.families, key=lambda f: f.id in refused))
    return replace(review_, rows=rows, families=fams)


def _basis(rows: Sequence[Ranked], runs: Sequence[BenchRun], model: CostModel, scale: str) -> str:
    where = ("at each model's published size (tiny-preset captures scaled up)" if scale == "published"
             else "at the captured shapes")
    points = [e for r in rows for e in r.calls]
    measured = sum(e.saved_ms.measured for e in points)
    if not runs:
        return (f"No GPU benchmark results in this workspace: every speedup and saving ({where}) is predicted "
                f"by the analytical roofline model: bytes moved by Inductor's kernels vs one fused kernel at a "
                f"nominal {model.bandwidth / 1e12:.1f} TB/s plus {costmodel.LAUNCH_SECONDS * 1e6:.0f} us per launch.")
    how = ("the cost model, a random forest correcting the roofline" if model.source == "model"
           else "the analytical roofline model")
    return (f"{measured} of {len(points)} (candidate, input) points are measured on "
            f"{', '.join(sorted({r.gpu for r in runs}))}; the others are predicted by {how} ({model.note}). "
            f"Savings {where}.")


def review(workspace: Workspace | str | Path, *, only_model: str | None = None, scale: str = "published") -> Review:
    """Everything the workspace knows, ranked."""
    ws = workspace if isinstance(workspace, Workspace) else Workspace(workspace)
    problems: list[str] = []
    patterns, mining = load_patterns(ws, problems)
    candidates, runs = load_candidates(ws, problems)
    if only_model is not None:
        known = {m for p in patterns for m in p.support.models}
        known |= {str(o.get("model")) for c in candidates for o in c.meta.get("observed", ()) or ()}
        if only_model not in known:
            close = difflib.get_close_matches(only_model, sorted(known), n=3, cutoff=0.3)
            raise UsageError(f"no pattern occurs in model {only_model!r}; models: {', '.join(sorted(known)) or 'none'}"
                             + (f" (did you mean {', '.join(close)}?)" if close else ""))
    tables = run_tables(ws, problems)
    out = replace(rank(patterns, candidates, runs, scale=scale, only_model=only_model, problems=problems,
                       mining=mining), run_tables=tuple(tables), skipped=skipped_reasons(ws))
    out = _refused_last(out)
    from miner.rank import measured  # ranks by measured recoverable time where step profiles exist
    return out if only_model else measured.apply(out, ws)


def to_json(review_: Review) -> list[dict]:
    """The ranking as JSON values (for scripts): sources spelled out next to every estimate."""
    def est(e):
        return None if e is None else {"value": e.value, "source": e.source}
    return [{"id": r.id, "family": r.family.id, "ops": r.pattern.ops, "status": r.status, "label": r.label,
             "saved_ms_per_step": est(r.saved_ms), "speedup_vs_inductor": est(r.speedup),
             "occurrences": r.occurrences, "safe_share": r.safe_share, "missed_fusion_share": r.missed_share,
             "inductor_kernels": r.inductor_kernels,
             "support": {"models": list(r.pattern.support.models), "graphs": r.pattern.support.n_graphs},
             **({"regions": list(review_.measured[r.id].regions), "measured_notes": list(review_.measured[r.id].notes)}
                if r.id in review_.measured else {})}
            for r in review_.rows]


def dumps(review_: Review) -> str:
    """The review as indented JSON (``to_json``)."""
    return json.dumps(to_json(review_), indent=1)


__all__ = ["PREDICTED_MARK", "SCALES", "BenchPoint", "BenchRun", "Call", "CallEstimate", "CandidateInfo", "Estimate",
           "RANKING", "Ranked", "Review", "RunTable", "pattern_order", "refused_reasons", "at_published_size", "bench_points", "calls_for", "calls_of_candidate",
           "calls_of_pattern", "combine_sources", "estimate_call", "expected_calls", "load_bench", "load_candidates",
           "load_patterns", "rank", "rank_one", "review", "run_tables", "skipped_reasons", "to_json", "dumps",
           "training_samples", "call_features"]
