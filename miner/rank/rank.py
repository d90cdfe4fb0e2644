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
"""

from __future__ import annotations

import difflib
import functools
import json
import math
import statistics
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Sequence

from miner.rank import costmodel
from miner.rank import families
from miner.rank.costmodel import CostModel, Features, Sample
from miner.core import candidate as candidates
from miner.core.candidate import Candidate
from miner.core import dtypes
from miner.core.errors import MinerError, UsageError, WorkspaceError
from miner.core.sizes import derive_shape
from miner.core.tensors import TensorSpec
from miner.core.pattern import Pattern, load_mining, pattern_from_json, patterns_path
from miner.core.workspace import Workspace, read_json

PREDICTED_MARK = "~"
SCALES = ("published", "captured")


# --------------------------------------------------------------------------- records

@dataclass(frozen=True)
class Estimate:
    """A number and where it comes from: "measured", "model" or "analytical"."""

    value: float
    source: str

    @property
    def measured(self) -> bool:
        return self.source == "measured"

    def fmt(self, spec: str = ".2f", suffix: str = "") -> str:
        if self.value is None or not math.isfinite(self.value):
            return "-"
        return f"{'' if self.measured else PREDICTED_MARK}{self.value:{spec}}{suffix}"


@dataclass(frozen=True)
class Call:
    """Safe occurrences of a pattern in one model with the same inputs: what a fusion would replace."""

    model: str
    phase: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    count: float  # occurrences (an expected value for patterns known from a sample)
    inductor_kernels: int | None = None  # in the sampled occurrence
    kernel_mix: tuple[tuple[int, float], ...] = ()  # (Inductor kernels, share of the count); empty: inductor_kernels
    bytes: dict[str, float] = field(default_factory=dict)  # fused / unfused / inductor, from candidate.json
    source: str = "captured"  # or "derived" (scaled to the model's published size)
    captured: tuple[TensorSpec, ...] = ()  # the captured inputs a derived call was scaled from

    @property
    def key(self) -> tuple:
        return tuple((t.shape, t.dtype) for t in self.inputs)

    @property
    def mix(self) -> tuple[tuple[int, float], ...]:
        return self.kernel_mix or ((self.inductor_kernels or 1, 1.0),)

    def with_kernels(self, k: int) -> "Call":
        """This call as if Inductor had used ``k`` kernels (a byte count measured for another k is dropped)."""
        nbytes = self.bytes if self.inductor_kernels == k else {x: v for x, v in self.bytes.items() if x != "inductor"}
        return replace(self, inductor_kernels=k, kernel_mix=(), bytes=nbytes)

    @property
    def mix_label(self) -> str:
        if len(self.mix) == 1:
            return str(self.mix[0][0])
        return " ".join(f"{k}:{100 * w:.0f}%" for k, w in self.mix)

    @property
    def main(self) -> TensorSpec | None:
        return max(self.inputs or self.outputs, key=lambda t: t.numel, default=None)

    @property
    def label(self) -> str:
        return " ".join(t.short for t in self.inputs)


@dataclass(frozen=True)
class BenchPoint:
    """One benchmarked input set of a candidate, from ``miner.bench``'s ``BenchRow``."""

    candidate: str
    key: tuple
    label: str
    models: tuple[str, ...]
    source: str  # captured | derived
    times: dict[str, tuple[float, float, float]]  # variant -> (median, p20, p80) ms
    errors: dict[str, str]
    bytes_moved: int
    roofline_ms: float
    run: str  # BenchRun.key

    @property
    def speedup(self) -> float | None:
        ind, cand = self.times.get("inductor"), self.times.get("candidate")
        return ind[0] / cand[0] if ind and cand and cand[0] > 0 else None

    def roofline_pct(self, variant: str = "candidate") -> float | None:
        t = self.times.get(variant)
        return 100.0 * self.roofline_ms / t[0] if t and t[0] > 0 else None


@dataclass(frozen=True)
class BenchRun:
    key: str
    gpu: str
    versions: dict[str, str]
    date: str
    copy_gbps: float | None
    sources: tuple[str, ...]


@dataclass(frozen=True)
class CandidateInfo:
    """A candidate and what the workspace says of it: status, fusion, validation, bench points."""

    candidate: Candidate
    status: str  # see miner.core.candidate.STATUSES
    fusion: str | None = None
    validation: dict | None = None
    bench: tuple[BenchPoint, ...] = ()

    @property
    def id(self) -> str:
        return self.candidate.id

    @property
    def meta(self) -> dict:
        return self.candidate.meta

    @property
    def label(self) -> str:
        return str(self.meta.get("label") or "")


@dataclass(frozen=True)
class CallEstimate:
    call: Call
    features: Features
    speedup: Estimate  # over Inductor
    inductor_ms: Estimate
    saved_ms: Estimate  # per call
    bench: BenchPoint | None = None

    @property
    def total_saved_ms(self) -> float:
        return self.saved_ms.value * self.call.count


@dataclass(frozen=True)
class Ranked:
    id: str
    pattern: Pattern
    candidate: CandidateInfo | None
    family: families.Family
    status: str
    occurrences: int  # non-overlapping (in the selected models)
    safe: int
    missed_share: float | None  # occurrences Inductor split into more than one kernel
    inductor_kernels: int | None  # the typical count
    calls: tuple[CallEstimate, ...]
    speedup: Estimate | None  # call-count-weighted geometric mean
    saved_ms: Estimate  # per step of every model, summed

    @property
    def safe_share(self) -> float:
        return self.safe / self.occurrences if self.occurrences else 0.0

    @property
    def support(self) -> tuple[int, int]:
        return (self.pattern.support.n_models, self.pattern.support.n_graphs)

    @property
    def label(self) -> str:
        return (self.candidate.fusion or self.candidate.label) if self.candidate else ""


@dataclass(frozen=True)
class Review:
    rows: tuple[Ranked, ...]
    families: tuple[families.Family, ...]
    model: CostModel
    runs: tuple[BenchRun, ...]
    scale: str
    only_model: str | None
    basis: str  # what the ranking stands on, in one or two sentences
    problems: tuple[str, ...] = ()
    mining: dict = field(default_factory=dict)  # params and stats of miner mine
    run_tables: tuple[RunTable, ...] = ()  # every reports/gpu/*/bench.json, used or not
    skipped: dict[str, str] = field(default_factory=dict)  # pattern id -> why no candidate was generated
    measured: dict = field(default_factory=dict)  # pattern id -> miner.rank.measured.Credit (GPU step profiles)

    @property
    def candidate_families(self) -> tuple[families.Family, ...]:
        ids = {r.id for r in self.rows if r.candidate is not None}
        return tuple(f for f in self.families if f.id in ids)

    @property
    def pattern_families(self) -> tuple[families.Family, ...]:
        """Families of mined patterns that have no candidate (yet)."""
        ids = {r.id for r in self.rows if r.candidate is None}
        return tuple(f for f in self.families if f.id in ids)

    def find(self, ident: str) -> Ranked:
        for r in self.rows:
            if ident in (r.id, r.pattern.id) or (r.candidate and ident == r.candidate.fusion):
                return r
        matches = [r for r in self.rows if r.id.startswith(ident)] or [r for r in self.rows if r.label == ident]
        if len(matches) == 1:
            return matches[0]
        ids = [r.id for r in self.rows]
        close = [m.id for m in matches][:5] or difflib.get_close_matches(ident, ids, n=5, cutoff=0.3)
        if close:
            hint = f"; did you mean {', '.join(close)}?"
        elif ids:
            hint = f"; known ids: {', '.join(ids[:8])}{' ...' if len(ids) > 8 else ''}"
        else:
            hint = "; this workspace has no candidates or patterns (run `miner mine`, `miner generate`)"
        raise UsageError(f"{'ambiguous' if len(matches) > 1 else 'unknown'} candidate {ident!r}{hint}")


# --------------------------------------------------------------------------- reading the workspace

def _tensor(d: Any) -> TensorSpec | None:
    shape = getattr(d, "shape", None) if not isinstance(d, dict) else d.get("shape")
    dtype = getattr(d, "dtype", None) if not isinstance(d, dict) else d.get("dtype")
    if shape is None or not all(isinstance(s, int) for s in shape):
        return None  # symbolic sizes: nothing to time
    return TensorSpec(tuple(shape), dtypes.name(dtype or "float32"))


def _tensors(xs: Iterable[Any]) -> tuple[TensorSpec, ...] | None:
    ts = [_tensor(x) for x in xs if x is not None]
    return None if any(t is None for t in ts) else tuple(ts)


def load_patterns(ws: Workspace, problems: list[str]) -> tuple[list[Pattern], dict]:
    if not patterns_path(ws).exists():
        return [], {}
    try:
        m = load_mining(ws)
    except WorkspaceError as e:
        problems.append(str(e))
        return [], {}
    return list(m.patterns), {"params": m.params, "stats": m.stats}


def load_candidates(ws: Workspace, problems: list[str]) -> tuple[list[CandidateInfo], list[BenchRun]]:
    out = []
    promoted = candidates.fusions_by_candidate(ws)
    bench, runs = load_bench(ws, problems)
    for d in candidates.folders(ws):
        try:
            cand = candidates.at(d)
        except WorkspaceError as e:
            problems.append(str(e))
            continue
        try:
            validation = candidates.validation(d)
        except WorkspaceError as e:
            problems.append(str(e))
            validation = None
        points = bench.get(cand.id, [])
        fusion = promoted.get(cand.id)
        status = candidates.status_of(validation, fusion, timed=bool(points))
        out.append(CandidateInfo(cand, status, fusion, validation, tuple(points)))
    used = {p.run for c in out for p in c.bench}
    return out, [r for k, r in runs.items() if k in used]


def load_bench(ws: Workspace, problems: list[str]) -> tuple[dict[str, list[BenchPoint]], dict[str, BenchRun]]:
    """Every benchmark row in the workspace, by candidate id, oldest run first (a later run wins a shape).

    Rows come from ``candidates/<id>/bench.json`` and from the run tables ``reports/gpu/*/bench.json``
    (the same row in both counts once), so results copied back from a GPU machine are found either way.
    """
    by_cand: dict[str, dict[tuple, BenchPoint]] = {}
    runs: dict[str, BenchRun] = {}
    paths = sorted(ws.candidates.glob("*/bench.json")) + sorted(ws.reports.glob("gpu/*/bench.json"))
    for path in paths:
        try:
            points, found = bench_points(path)
        except (MinerError, KeyError, TypeError, ValueError) as e:
            problems.append(f"{path}: {e}")
            continue
        for r in found:
            old = runs.get(r.key)
            runs[r.key] = replace(r, sources=tuple(dict.fromkeys((old.sources if old else ()) + r.sources)))
        for p in points:
            by_cand.setdefault(p.candidate, {})[(p.run, p.source, p.models, p.key)] = p
    date = {k: r.date for k, r in runs.items()}
    return ({c: sorted(pts.values(), key=lambda p: date.get(p.run, "")) for c, pts in by_cand.items()}, runs)


def bench_points(path: Path) -> tuple[list[BenchPoint], list[BenchRun]]:
    """A candidate's (or a run's) ``bench.json`` through ``miner.bench.results.load_rows``."""
    from miner.bench.results import load_rows

    points, runs = [], {}
    for row in load_rows(path):
        env = row.env
        run = BenchRun(f"{env.gpu} {env.date}", env.gpu,
                       {k: v for k, v in (("torch", env.torch), ("triton", env.triton), ("cuda", env.cuda),
                                          ("miner", env.miner)) if v},
                       env.date, env.copy_gbps, (str(path),))
        runs[run.key] = run
        times = {v.name: (v.timing.median_ms, v.timing.p20_ms, v.timing.p80_ms)
                 for v in row.variants if v.timing is not None}
        errors = {v.name: v.error or ("numerics" if v.numerics_ok is False else "")
                  for v in row.variants if v.timing is None}
        inputs = tuple(TensorSpec(tuple(s.shape), s.dtype) for s in row.case.inputs)
        points.append(BenchPoint(row.candidate, tuple((t.shape, t.dtype) for t in inputs), " ".join(t.short for t in inputs),
                                 tuple(row.case.models), row.case.source, times, errors,
                                 row.bytes_moved, row.roofline_ms, run.key))
    return points, list(runs.values())


def skipped_reasons(ws: Workspace) -> dict[str, str]:
    """pattern id -> why ``miner generate`` wrote no candidate for it (``candidates/index.json``)."""
    path = ws.candidates / "index.json"
    try:
        data = read_json(path) if path.exists() else {}
    except WorkspaceError:
        return {}
    return {str(s.get("id")): str(s.get("reason", "")) for s in data.get("skipped", []) or [] if isinstance(s, dict)}


@dataclass(frozen=True)
class RunTable:
    """A benchmark run table under ``reports/gpu/<run>/bench.json``: provenance, whatever the workspace holds."""

    path: Path
    gpu: str
    versions: dict[str, str]
    date: str
    copy_gbps: float | None
    rows: int
    candidates: tuple[str, ...]


def run_tables(ws: Workspace, problems: list[str]) -> list[RunTable]:
    out = []
    for path in sorted(ws.reports.glob("gpu/*/bench.json")):
        try:
            from miner.bench.results import load_rows
            rows = load_rows(path)
        except (MinerError, KeyError, TypeError, ValueError, ImportError) as e:
            problems.append(f"{path}: {e}")
            continue
        if not rows:
            continue
        env = rows[0].env
        out.append(RunTable(path, env.gpu, {k: v for k, v in (("torch", env.torch), ("triton", env.triton),
                                                               ("cuda", env.cuda)) if v},
                            env.date, env.copy_gbps, len(rows), tuple(dict.fromkeys(r.candidate for r in rows))))
    return out


# --------------------------------------------------------------------------- calls

def calls_of_candidate(meta: dict) -> list[Call]:
    """The observed calls of ``candidate.json``, as recorded (one per model, phase and input signature)."""
    calls = []
    for o in meta.get("observed", ()) or ():
        ins = _tensors(o.get("inputs", ()))
        outs = _tensors(o.get("outputs", ()))
        if not ins:
            continue
        calls.append(Call(str(o.get("model", "?")), str(o.get("phase", "")), ins, outs or (), int(o.get("count", 1)),
                          o.get("inductor_kernels"), {k: float(v) for k, v in (o.get("bytes") or {}).items()
                                                      if isinstance(v, (int, float))}))
    return calls


def calls_of_pattern(p: Pattern) -> list[Call]:
    """The safe occurrences of the pattern's stored sample, grouped by (model, phase, inputs)."""
    groups: dict[tuple, list] = {}
    for o in p.occurrences:
        ins, outs = _tensors(o.input_meta), _tensors(o.output_meta)
        if o.verdict.ok and ins:
            groups.setdefault((o.graph.model, o.phase, ins, outs or ()), []).append(o)
    return [Call(model, phase, ins, outs, len(occ), statistics.median_low([o.n_kernels for o in occ]) or None)
            for (model, phase, ins, outs), occ in groups.items()]


def expected_calls(p: Pattern, sample: Sequence[Call]) -> list[Call]:
    """Calls standing for *all* safe occurrences, not only the stored sample.

    ``patterns.json`` (and so ``candidate.json``'s ``observed``) keeps a few occurrences per pattern
    but counts all of them. Each sampled call stands for its share of ``counts.safe``, with the mix
    of Inductor's kernel counts of ``inductor.kernels_hist`` (which covers every
    occurrence), so a sample that happens to hold the one split occurrence does not make every
    occurrence look split. Counts are therefore expected values, not integers.
    """
    sampled = sum(c.count for c in sample)
    if not sampled:
        return []
    per = p.counts.safe / sampled if p.counts.safe else 1.0
    hist = {int(k): v for k, v in p.inductor.kernels_hist.items() if int(k) > 0}
    mapped = sum(hist.values())
    mix = tuple((k, n / mapped) for k, n in sorted(hist.items()))
    return [replace(c, count=c.count * per, kernel_mix=mix) for c in sample]


@functools.lru_cache(maxsize=None)
def _derived(shape: tuple[int, ...], model: str) -> tuple[int, ...] | None:
    try:
        return derive_shape(shape, model)
    except ValueError:  # a model without pinned sizes, or a size no role explains
        return None


def at_published_size(call: Call) -> Call:
    """The call scaled to its model's published size (unchanged when that cannot be derived)."""
    shapes = [_derived(t.shape, call.model) for t in call.inputs + call.outputs]
    if any(s is None for s in shapes):
        return call
    shapes = [s[0] for s in shapes]
    ins = tuple(TensorSpec(s, t.dtype) for s, t in zip(shapes, call.inputs))
    outs = tuple(TensorSpec(s, t.dtype) for s, t in zip(shapes[len(call.inputs):], call.outputs))
    if ins == call.inputs:
        return call
    ratio = sum(t.nbytes for t in ins + outs) / max(1, sum(t.nbytes for t in call.inputs + call.outputs))
    return replace(call, inputs=ins, outputs=outs, bytes={k: v * ratio for k, v in call.bytes.items()},
                   source="derived", captured=call.inputs)


# --------------------------------------------------------------------------- features and estimates

def call_features(p: Pattern, call: Call) -> Features:
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


def _combine(sources: Iterable[str]) -> str:
    s = set(sources)
    return "measured" if s <= {"measured"} else "model" if "model" in s else "analytical"


def calls_for(p: Pattern, c: CandidateInfo | None, *, scale: str = "published", only_model: str | None = None) -> list[Call]:
    """The calls a fusion of ``p`` would replace: the candidate's observed ones, else the pattern's sample."""
    sample = calls_of_candidate(c.meta) if c and c.meta.get("observed") else calls_of_pattern(p)
    calls = [x for x in expected_calls(p, sample) if only_model is None or x.model == only_model]
    return [at_published_size(x) for x in calls] if scale == "published" else calls


def rank_one(p: Pattern, c: CandidateInfo | None, model: CostModel, *, scale: str = "published",
             only_model: str | None = None) -> Ranked:
    calls = calls_for(p, c, scale=scale, only_model=only_model)
    bench = {b.key: b for b in (c.bench if c else ())}
    ests = sorted((estimate_call(p, x, bench, model) for x in calls), key=lambda e: -e.total_saved_ms)
    n = sum(e.call.count for e in ests)
    speedup = None
    if n:
        speedup = Estimate(math.exp(sum(e.call.count * math.log(max(e.speedup.value, 1e-9)) for e in ests) / n),
                           _combine(e.speedup.source for e in ests))
    saved = Estimate(sum(e.total_saved_ms for e in ests), _combine(e.saved_ms.source for e in ests) if ests
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
    return json.dumps(to_json(review_), indent=1)
