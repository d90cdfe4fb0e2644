"""The records of a ranking: ``Estimate`` (a number and its source), ``Call``, ``BenchPoint``,
``BenchRun``, ``CandidateInfo``, ``CallEstimate``, ``Ranked``, ``Review``."""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from miner.rank import families
from miner.rank.costmodel import CostModel, Features
from miner.core.candidate import Candidate
from miner.core.errors import UsageError
from miner.core.tensors import TensorSpec
from miner.core.pattern import Pattern

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
    """One benchmark run's provenance: GPU, versions, date, copy bandwidth, the files it came from."""

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
    """One call's Inductor time, candidate time and saving per call and per step, each with its source."""

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
    """One row of the ranking: a pattern, its candidate (if any), its calls' estimates and its score."""

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
    """The whole ranking: rows best first, the cost model, the bench runs and the problems met reading the workspace."""

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


@dataclass(frozen=True)
class RunTable:
    """A benchmark run table under ``reports/gpu/<run>/bench.json``: provenance, whatever the workspace holds."""

    path: Path
    run: BenchRun  # its GPU, versions, date and copy bandwidth
    rows: int
    candidates: tuple[str, ...]
