"""Predict a candidate's speedup over Inductor on shapes nobody has benchmarked.

Two predictors, both labelled with where their number comes from:

* ``analytical_speedup``: a roofline guess. Inductor's split moves ``bytes_inductor`` through
  HBM in ``inductor_kernels`` launches; the fused kernel moves ``bytes_fused`` in one launch:
  ``speedup = (bytes_inductor / bw + kernels * launch) / (bytes_fused / bw + launch)``.
  Used when there is no benchmark data to learn from (labelled "analytical").
* ``CostModel``: a scikit-learn random forest on ``log(measured / analytical speedup)``, fed the
  features of ``Features`` (op counts by kind, reductions, bytes in/out, row length, dtype,
  Inductor's kernel count, the analytical guess itself): it learns corrections to the roofline.
  It is used only when its cross-validated MAE beats the analytical model's on the same points
  (otherwise predictions stay analytical, and the report says why). Labelled "model".

``cross_validate`` measures the forest by leave-one-family-out: every point of one candidate is
predicted by a forest that never saw that candidate nor its near-identical siblings (the same
family, ``miner.rank.families``: same ops up to a cast), which is the situation of an unbenchmarked
candidate; with one candidate per family this is leave-one-candidate-out. Spearman's rank correlation (do we order the (candidate, shape) pairs
right?) and the mean absolute error of the speedup are pooled over all held-out points. With fewer
than ``MIN_CANDIDATES`` candidates or ``MIN_POINTS`` points it returns no numbers and says why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

NOMINAL_BANDWIDTH = 4.0e12  # bytes/s: H200 HBM3e is 4.8 TB/s peak; copies reach ~85% of it
LAUNCH_SECONDS = 2.0e-6  # per kernel, inside a CUDA graph
MIN_CANDIDATES = 3
MIN_POINTS = 10

@dataclass(frozen=True)
class Features:
    """What the cost model knows about one (candidate, shape, dtype)."""

    n_pointwise: int
    n_reduction: int
    n_view: int
    n_cast: int
    n_inputs: int
    n_outputs: int
    bytes_in: float
    bytes_out: float
    bytes_inductor: float  # what Inductor's split moves (measured or estimated)
    row_length: int
    n_rows: int
    dtype_bytes: int
    inductor_kernels: int

    @property
    def bytes_fused(self) -> float:
        return self.bytes_in + self.bytes_out

    def vector(self) -> list[float]:
        return [self.n_pointwise, self.n_reduction, self.n_view, self.n_cast, self.n_inputs,
                self.n_outputs, math.log2(1 + self.bytes_in), math.log2(1 + self.bytes_out),
                math.log2(1 + self.bytes_inductor), math.log2(1 + self.row_length),
                math.log2(1 + self.n_rows), self.dtype_bytes, self.inductor_kernels,
                math.log(analytical_speedup(self))]


FEATURE_NAMES = ("pointwise ops", "reductions", "views", "casts", "inputs", "outputs", "log2 bytes in",
                 "log2 bytes out", "log2 bytes Inductor", "log2 row length", "log2 rows", "dtype bytes",
                 "Inductor kernels", "log analytical speedup")


def analytical_speedup(f: Features, bandwidth: float = NOMINAL_BANDWIDTH,
                       launch: float = LAUNCH_SECONDS) -> float:
    """Roofline speedup of one fused kernel over Inductor's split (1.0 when Inductor already fuses)."""
    kernels = max(1, f.inductor_kernels)
    fused = max(f.bytes_fused, 1.0) / bandwidth + launch
    split = max(f.bytes_inductor, f.bytes_fused, 1.0) / bandwidth + kernels * launch
    return split / fused


def analytical_inductor_seconds(f: Features, bandwidth: float = NOMINAL_BANDWIDTH,
                                launch: float = LAUNCH_SECONDS) -> float:
    """Roofline time of Inductor's split, for turning a predicted speedup into time saved."""
    return max(f.bytes_inductor, f.bytes_fused, 1.0) / bandwidth + max(1, f.inductor_kernels) * launch


@dataclass(frozen=True)
class Sample:
    """One measured (candidate, shape): its features and speedup over Inductor."""

    candidate: str
    shape: str
    features: Features
    speedup: float
    family: str | None = None  # held out together in cross-validation (default: the candidate)

    @property
    def group(self) -> str:
        return self.family or self.candidate


@dataclass(frozen=True)
class Accuracy:
    """Cross-validated accuracy, or why there is none."""

    scheme: str
    n_points: int
    n_candidates: int
    spearman: float | None = None
    mae: float | None = None  # mean |predicted - measured| speedup
    baseline_spearman: float | None = None  # the analytical guess on the same points
    baseline_mae: float | None = None
    reason: str | None = None  # set when there are no numbers
    held_out: tuple[tuple[float, float, float], ...] = ()  # (measured, forest, analytical) per point

    @property
    def ok(self) -> bool:
        return self.spearman is not None


@dataclass
class CostModel:
    """The forest when cross-validation shows it beats the analytical model, else the analytical model.

    The forest predicts the log of measured / analytical speedup (a correction to the roofline), so
    with little data it stays close to the roofline instead of to the mean of the training points.
    ``note`` says which predictor is used and why.
    """

    forest: object | None = None
    n_points: int = 0
    n_candidates: int = 0
    bandwidth: float = NOMINAL_BANDWIDTH
    accuracy: Accuracy | None = None
    candidates: frozenset[str] = field(default_factory=frozenset)
    note: str = "no benchmark data: predictions are analytical"
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def source(self) -> str:
        return "model" if self.forest is not None else "analytical"

    def predict(self, f: Features) -> float:
        if self.forest is None:
            return analytical_speedup(f, self.bandwidth)
        if f not in self._cache:
            self.prime([f])
        return self._cache[f]

    def prime(self, features: Sequence[Features]) -> None:
        """Predict many at once (one forest call instead of one per shape) and remember them."""
        todo = list(dict.fromkeys(f for f in features if f not in self._cache))
        if self.forest is None or not todo:
            return
        for f, y in zip(todo, self.forest.predict(np.array([f.vector() for f in todo]))):
            self._cache[f] = analytical_speedup(f, self.bandwidth) * float(math.exp(y))


def _forest():
    from sklearn.ensemble import RandomForestRegressor
    return RandomForestRegressor(n_estimators=100, min_samples_leaf=2, random_state=0, n_jobs=1)


def _residuals(samples: Sequence[Sample], bandwidth: float) -> np.ndarray:
    return np.log([s.speedup / analytical_speedup(s.features, bandwidth) for s in samples])


def fit(samples: Sequence[Sample], bandwidth: float = NOMINAL_BANDWIDTH) -> CostModel:
    """Cross-validate, then fit the forest on every sample if it beat the analytical model."""
    candidates = frozenset(s.candidate for s in samples)
    acc = cross_validate(samples, bandwidth)
    base = dict(n_points=len(samples), n_candidates=len(candidates), bandwidth=bandwidth, accuracy=acc,
                candidates=candidates)
    if not samples:
        return CostModel(**base)
    if not acc.ok:
        return CostModel(**base, note="too little benchmark data to check a learned model: predictions are analytical")
    if acc.mae >= acc.baseline_mae:
        return CostModel(**base, note=f"the forest's cross-validated MAE ({acc.mae:.3f}) is no better than the "
                                      f"analytical model's ({acc.baseline_mae:.3f}): predictions are analytical")
    forest = _forest()
    forest.fit(np.array([s.features.vector() for s in samples]), _residuals(samples, bandwidth))
    return CostModel(forest, **base, note=f"the forest (cross-validated MAE {acc.mae:.3f} vs the analytical "
                                          f"model's {acc.baseline_mae:.3f}) predicts")


def cross_validate(samples: Sequence[Sample], bandwidth: float = NOMINAL_BANDWIDTH) -> Accuracy:
    """Leave-one-family-out Spearman and MAE of the forest (and of the analytical guess)."""
    groups = [s.group for s in samples]
    n, k, g = len(samples), len({s.candidate for s in samples}), len(set(groups))
    scheme = "leave-one-family-out" if g < k else "leave-one-candidate-out"
    if g < MIN_CANDIDATES or n < MIN_POINTS:
        return Accuracy(scheme, n, k, reason=f"too little benchmark data to measure accuracy: {n} measured "
                                             f"(candidate, shape) points from {k} candidates in {g} families; "
                                             f"need at least {MIN_POINTS} points from {MIN_CANDIDATES} families")
    from scipy.stats import spearmanr
    from sklearn.model_selection import LeaveOneGroupOut

    x = np.array([s.features.vector() for s in samples])
    y = np.array([s.speedup for s in samples])
    base = np.array([analytical_speedup(s.features, bandwidth) for s in samples])
    r = _residuals(samples, bandwidth)
    pred = np.empty(n)
    for train, test in LeaveOneGroupOut().split(x, y, groups):
        forest = _forest()
        forest.fit(x[train], r[train])
        pred[test] = base[test] * np.exp(forest.predict(x[test]))
    return Accuracy(scheme, n, k, spearman=_spearman(spearmanr, pred, y), mae=float(np.mean(np.abs(pred - y))),
                    baseline_spearman=_spearman(spearmanr, base, y), baseline_mae=float(np.mean(np.abs(base - y))),
                    reason=None if np.ptp(pred) and np.ptp(y) else "rank correlation undefined: constant speedups",
                    held_out=tuple(zip(y.tolist(), pred.tolist(), base.tolist())))


def _spearman(spearmanr, a, b) -> float | None:
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return None  # undefined for a constant vector
    return float(spearmanr(a, b).statistic)
