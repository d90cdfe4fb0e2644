"""The cost model: analytical fallback, leave-one-candidate-out accuracy, refusal on too little data."""

from __future__ import annotations

import math
import random

import pytest

from miner.rank import costmodel
from miner.rank.costmodel import Features, Sample


def feats(row: int, rows: int, kernels: int, reductions: int = 1, dtype_bytes: int = 4) -> Features:
    nbytes = row * rows * dtype_bytes
    return Features(n_pointwise=3, n_reduction=reductions, n_view=0, n_cast=0, n_inputs=1, n_outputs=1,
                    bytes_in=nbytes, bytes_out=nbytes, bytes_inductor=nbytes * (kernels + 1), row_length=row,
                    n_rows=rows, dtype_bytes=dtype_bytes, inductor_kernels=kernels)


def test_analytical_speedup_is_one_when_inductor_already_fuses():
    f = feats(1024, 4096, kernels=1)
    f = Features(**{**f.__dict__, "bytes_inductor": f.bytes_fused})
    assert costmodel.analytical_speedup(f) == pytest.approx(1.0)


def test_analytical_speedup_grows_with_kernels_and_is_launch_bound_when_tiny():
    big2, big3 = feats(4096, 8192, 2), feats(4096, 8192, 3)
    assert 1.0 < costmodel.analytical_speedup(big2) < costmodel.analytical_speedup(big3)
    # memory bound: close to the byte ratio (3 vs 2 bytes units for 2 kernels)
    assert costmodel.analytical_speedup(big2) == pytest.approx(1.5, rel=0.05)
    # a tiny tensor: launches dominate, the ratio tends to the kernel count
    assert costmodel.analytical_speedup(feats(8, 8, 3)) == pytest.approx(3.0, rel=0.05)


def synthetic_samples(n_candidates: int = 6, noise: float = 0.03, seed: int = 0) -> list[Sample]:
    """Speedups from a hidden rule the forest has to learn: the roofline ratio, damped for long rows."""
    rng = random.Random(seed)
    out = []
    for c in range(n_candidates):
        kernels = 1 + c % 3
        reductions = c % 2 + 1
        for row in (128, 768, 3072, 8192, 32000):
            f = feats(row, 8192, kernels, reductions)
            true = costmodel.analytical_speedup(f) * (0.8 if row > 4096 else 1.0)
            out.append(Sample(f"c{c}", f"{row}", f, true * math.exp(rng.gauss(0, noise))))
    return out


def test_cross_validation_reports_leave_one_candidate_out_numbers():
    acc = costmodel.cross_validate(synthetic_samples())
    assert acc.ok and acc.scheme == "leave-one-candidate-out"  # one candidate per family
    assert acc.n_points == 30 and acc.n_candidates == 6
    assert acc.spearman > 0.7
    assert 0 <= acc.mae < 0.3
    assert acc.baseline_spearman is not None and acc.baseline_mae is not None


def test_cross_validation_detects_a_useless_model():
    """Shuffled targets: the held-out rank correlation must collapse (the metric can fail)."""
    samples = synthetic_samples(seed=1)
    rng = random.Random(3)
    ys = [s.speedup for s in samples]
    rng.shuffle(ys)
    shuffled = [Sample(s.candidate, s.shape, s.features, y) for s, y in zip(samples, ys)]
    good, bad = costmodel.cross_validate(samples), costmodel.cross_validate(shuffled)
    assert bad.spearman < good.spearman - 0.4


def test_too_little_data_gives_a_reason_not_a_number():
    few = synthetic_samples(n_candidates=2)
    acc = costmodel.cross_validate(few)
    assert not acc.ok and acc.spearman is None and acc.mae is None
    assert "too little" in acc.reason and "2 candidates" in acc.reason and "2 families" in acc.reason
    assert costmodel.cross_validate([]).reason


def test_fit_predicts_with_the_forest_only_when_there_is_data():
    empty = costmodel.fit([])
    f = feats(768, 8192, 3)
    assert empty.source == "analytical" and empty.predict(f) == pytest.approx(costmodel.analytical_speedup(f))
    model = costmodel.fit(synthetic_samples())
    # the hidden rule departs from the roofline for long rows: the forest learns it and is chosen
    assert model.source == "model" and model.accuracy.ok and model.accuracy.mae < model.accuracy.baseline_mae
    model.prime([f, feats(128, 8192, 1)])
    assert model.predict(f) > model.predict(feats(128, 8192, 1))


def test_near_identical_candidates_are_held_out_together():
    samples = synthetic_samples()
    paired = [Sample(s.candidate, s.shape, s.features, s.speedup, family=f"f{int(s.candidate[1:]) // 2}")
              for s in samples]
    acc = costmodel.cross_validate(paired)
    assert acc.ok and acc.scheme == "leave-one-family-out" and acc.n_candidates == 6
    few = [Sample(s.candidate, s.shape, s.features, s.speedup, family="same") for s in samples]
    assert not costmodel.cross_validate(few).ok  # six candidates, but one family: nothing held out


def test_the_forest_is_not_used_when_the_roofline_predicts_better():
    samples = [Sample(s.candidate, s.shape, s.features, costmodel.analytical_speedup(s.features))
               for s in synthetic_samples()]
    model = costmodel.fit(samples)
    assert model.accuracy.ok and model.source == "analytical" and "no better" in model.note
    f = feats(768, 8192, 3)
    assert model.predict(f) == costmodel.analytical_speedup(f)
