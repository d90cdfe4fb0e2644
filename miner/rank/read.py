"""The ranking's inputs, read from the workspace: mined patterns, candidates, bench points and run
tables (``load_*``, ``bench_points``, ``run_tables``) and the calls a fusion would replace
(``calls_of_*``, ``expected_calls``, ``at_published_size``). A corrupt or missing file is a
problem line, never an exception."""

from __future__ import annotations

import functools
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable, Sequence

from miner.core import candidate as candidates
from miner.core import dtypes
from miner.core.errors import MinerError, WorkspaceError
from miner.core.sizes import derive_shape
from miner.core.tensors import TensorSpec
from miner.core.pattern import Pattern, load_mining, patterns_path
from miner.core.workspace import Workspace, read_json
from miner.rank.records import BenchPoint, BenchRun, Call, CandidateInfo, RunTable

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
    """The mined patterns and the mining parameters; a problem line instead of an exception when the file is bad."""
    if not patterns_path(ws).exists():
        return [], {}
    try:
        m = load_mining(ws)
    except WorkspaceError as e:
        problems.append(str(e))
        return [], {}
    return list(m.patterns), {"params": m.params, "stats": m.stats}


def load_candidates(ws: Workspace, problems: list[str]) -> tuple[list[CandidateInfo], list[BenchRun]]:
    """Every candidate folder as a ``CandidateInfo`` (status derived from its files) and the bench runs they name."""
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


def bench_run(env, source: Path, versions: tuple[str, ...] = ("torch", "triton", "cuda", "miner")) -> BenchRun:
    """The provenance of a bench row (``miner.bench.results``' environment record) as a ``BenchRun``.

    Parameters
    ----------
    env
        The row's ``env`` (``gpu``, ``date``, ``copy_gbps`` and the version fields).
    source : Path
        The bench.json it was read from.
    versions : tuple of str
        Which version fields to keep (the empty ones are dropped).
    """
    return BenchRun(f"{env.gpu} {env.date}", env.gpu, {k: getattr(env, k) for k in versions if getattr(env, k)},
                    env.date, env.copy_gbps, (str(source),))


def bench_points(path: Path) -> tuple[list[BenchPoint], list[BenchRun]]:
    """A candidate's (or a run's) ``bench.json`` through ``miner.bench.results.load_rows``."""
    from miner.bench.results import load_rows

    points, runs = [], {}
    for row in load_rows(path):
        run = bench_run(row.env, path)
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


def run_tables(ws: Workspace, problems: list[str]) -> list[RunTable]:
    """Every ``reports/gpu/<run>/bench.json`` as a ``RunTable`` (provenance), whether or not its candidates are here."""
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
        out.append(RunTable(path, bench_run(rows[0].env, path, versions=("torch", "triton", "cuda")), len(rows),
                            tuple(dict.fromkeys(r.candidate for r in rows))))
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
