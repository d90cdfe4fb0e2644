"""The dropout stream's statistics (``miner.check.random_stats``): the four-per-call stream passes
each check, and each check fails on a stream broken the way it is meant to catch.

On the CPU: the pure-torch Philox at ~1e5 draws, the Triton helpers and the generated candidate
``pf4693d7449_x4`` under the interpreter at ~1e4. On the H200 (``-m gpu``): 1e8 draws per case.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from miner.check import random_stats as rs
from miner.runtime import philox

REPO = Path(__file__).resolve().parents[1]
# Triton sources run compiled on a CUDA machine, under the interpreter on CPU tensors otherwise (conftest)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
N = 1 << 17  # draws per case with the pure-torch Philox


def good(seed, shape, p):
    return rs.torch_keep(seed, shape, p)


def _from_uniform(fn):
    """A keep source from ``fn(seed, L) -> uniforms`` (L: the int64 logical indices)."""
    def keep(seed, shape, p):
        return (fn(seed, torch.arange(math.prod(shape))) > p).reshape(tuple(shape))
    return keep


def _word0(seed, lin):  # planted: one Philox word reused for the four elements of a group
    return philox.to_uniform(philox.philox4x32(seed, lin >> 2)[0])


def _fails(stats, name_part):
    hit = [s for s in stats if name_part in s.name]
    assert hit, [s.name for s in stats]
    return any(not s.ok for s in hit)


def test_the_stream_passes_every_check():
    # the baseline the planted bugs are measured against: nothing fails on the real stream
    stats = rs.all_stats(good, rs.reference_apply, N)
    assert all(s.ok for s in stats), [s.line() for s in stats if not s.ok]
    assert len(stats) == 3 + 4 + 6 + 9 + 2 + 3


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_fails_on_a_biased_threshold(p):
    # planted: keep = u > p + 0.01 (e.g. a threshold compared after rounding p up)
    def biased(seed, shape, q):
        return good(seed, shape, q + 0.01)
    assert rs.keep_rate(good, p, N).ok
    assert not rs.keep_rate(biased, p, N).ok


def test_words_and_column_neighbours_fail_when_one_word_serves_a_group():
    # planted: the four elements of a group share word 0 (pytorch/pytorch#198333's symptom)
    keep = _from_uniform(_word0)
    assert _fails(rs.words(keep, N // 4), "words")
    assert _fails(rs.neighbours(keep, [4, 4, 32, 64]), "columns")


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_neighbours_fail_along_a_dim_the_counter_ignores(dim):
    # planted: a counter without the batch (0), head (1) or row (2) index: masks repeat along that dim
    shape = [4, 4, 32, 64]
    strides = [math.prod(shape[d + 1:]) for d in range(4)]

    def periodic(seed, lin):
        idx = [(lin // strides[d]) % shape[d] for d in range(4)]
        idx[dim] = torch.zeros_like(idx[dim])
        return philox.uniform(seed, sum(i * s for i, s in zip(idx, strides)))
    stats = rs.neighbours(_from_uniform(periodic), shape)
    assert not stats[dim].ok and stats[dim].value > 20, [s.line() for s in stats]
    assert all(s.ok for s in rs.neighbours(good, shape))


def test_layers_fail_when_two_layers_share_a_seed():
    # planted: the seed lookup gives layers 2 and 3 the same seed
    stats = rs.layers(good, N // 4, lookup=lambda seeds, i: seeds[min(i, 2)])
    assert not next(s for s in stats if s.name == "layers 2,3 of one step").ok
    assert next(s for s in stats if s.name == "layers 0,1 of one step").ok


def test_seed_neighbours_fail_when_the_key_drops_a_bit():
    # planted: the key is seed >> 1 (consecutive seeds s, s+1 collide for even s)
    def keyed(seed, shape, p):
        return good(seed >> 1, shape, p)
    assert _fails(rs.layers(keyed, N // 4), "seeds 0,0+1")


def test_steps_fail_when_the_seed_vector_is_not_redrawn():
    # planted: every step reads step 0's seed vector (e.g. seeds captured once, as a constant)
    assert all(s.ok for s in rs.steps(good, N // 4))
    stats = rs.steps(good, N // 4, seeds_of=lambda t, count: rs.inductor_seeds(0, count))
    assert all(not s.ok for s in stats)


@pytest.mark.parametrize("wrong", ["1/p", "none", "bf16-rounded"])
def test_scale_fails_on_a_wrong_scale(wrong):
    # planted: dropout scaled by 1/p, not scaled, or by 1/(1-p) rounded to bf16 first
    def apply(x, seed, p):
        keep = rs.torch_keep(seed, x.shape, p)
        s = {"1/p": 1 / p, "none": 1.0, "bf16-rounded": float(torch.tensor(1 / (1 - p)).bfloat16())}[wrong]
        return ((keep * x.float()) * torch.tensor(s, dtype=torch.float32)).to(x.dtype)
    assert rs.scale(rs.reference_apply, 0.1, N).ok
    assert not rs.scale(apply, 0.1, N).ok


def test_triton_helpers_pass_under_the_interpreter():
    # the jit helpers' stream (both draws) at interpreter sizes: keep rate, neighbours, words
    for per_group in (True, False):
        def keep(seed, shape, p, per_group=per_group):
            return rs.triton_keep(seed, shape, p, device=DEVICE, per_group=per_group).cpu()
        stats = [rs.keep_rate(keep, 0.5, 1 << 14)] + rs.neighbours(keep, [2, 2, 16, 32]) + rs.words(keep, 1 << 12)
        assert all(s.ok for s in stats), [s.line() for s in stats if not s.ok]


def test_generated_candidate_passes_under_the_interpreter():
    # the committed candidate's own kernel: its masks and its scale
    from miner.core import candidate as candidates
    from miner.core.workspace import Workspace

    launch = candidates.load(Workspace(REPO), "pf4693d7449_x4").kernel_module.launch

    def keep(seed, shape, p):
        return rs.candidate_keep(launch, seed, shape, p, device=DEVICE).cpu()
    stats = [rs.keep_rate(keep, 0.1, 1 << 14)] + rs.neighbours(keep, [2, 2, 16, 32]) + rs.words(keep, 1 << 12)
    # float32 outputs: the interpreter rounds float32 -> bf16 toward zero (18 of 64 kept bf16 elements came
    # out one ulp low here), the GPU to nearest; the GPU test checks bf16
    stats.append(rs.scale(lambda x, s, p: rs.candidate_apply(launch, x, s, p), 0.1, 1 << 14, dtype=torch.float32,
                          device=DEVICE))
    assert all(s.ok for s in stats), [s.line() for s in stats if not s.ok]


@pytest.mark.gpu
@pytest.mark.parametrize("source", ["triton", "bits", "candidate"])
def test_gpu_statistics_at_1e8_draws(source):
    """On a GPU: every statistic at 1e8 draws per case (the jit helpers; the ``philox4_dropout_bits`` knob's
    kernel; the candidate's kernel)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import os

    os.chdir(REPO)
    assert rs.main(["--device", "cuda", "--draws", "1e8", "--source", source]) == 0
