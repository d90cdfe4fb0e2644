"""Concrete adversarial cases around the chains the promoted fusions rewrite (issue 12).

Each case asserts the issue's contract: the fusion fires and matches eager (forward; backward
for the compiled ones), or it declines with the expected reason, and nothing raises. The three
failure classes of the issue:

1. wrong values: the ``_safe_softmax`` chain over a size-1 last dim whose result is broadcast to
   wider mask rows (returned 1/16 instead of 1) -> ``test_softmax_size1_scores_wider_mask_*``;
2. a crash in launch.py ("does not fit rows") where a match's inputs have different row shapes
   -> ``test_norm_over_size1_dim_with_wider_weight_*``;
3. firing on matches mining rejects (non-contiguous, expanded, sliced inputs, mixed dtypes,
   buffers written in place, a bad broadcast) -> ``test_mining_rejects_are_declined``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from miner.runtime import fusions
from tests.safety_harness import FUSIONS, check, compiled_run, eager_run, fx_run


# loaded outside any trace; an upcast-matmul fusion (an aten rewrite, no chain) has tests/fusions/test_<name>.py
PATTERNS = {n: m.pattern for n in fusions.names(FUSIONS) if hasattr(m := fusions.load(FUSIONS, n), "pattern")}


def _pattern(name):
    return PATTERNS[name]


def softmax_like(mask_src, fill, scores):
    """The post-grad ``_safe_softmax`` chain: mask = any(x != -inf) per row, where(~mask, fill, softmax)."""
    return _pattern("softmax_like")(mask_src > 0, fill, scores)


def rms_norm(w, x):
    return _pattern("rms_norm")(w, x, 2.0, 1e-6)


def add_rms_norm(w, x, r):
    return _pattern("add_rms_norm")(w, x, r, 2.0, 1e-6)


def layer_norm(x, w, b):
    return _pattern("layer_norm")(x, w, b, 1e-5)


def log_softmax(x):
    return _pattern("log_softmax")(x)


def _reasons(run):
    return " | ".join(run.all_reasons())


# --------------------------------------------------------------------------- class 1: wrong values


SIZE1 = (torch.randn(2, 5, 16), torch.zeros(2, 5, 16), torch.randn(2, 5, 1))


def test_softmax_size1_scores_wider_mask_declines_fx():
    run = fx_run(softmax_like, SIZE1, FUSIONS, "softmax_like")
    assert check(run, eager_run(softmax_like, SIZE1), "softmax_like", expect="decline") == "declined"
    assert "broadcast copies" in _reasons(run) and _reasons(run).startswith("kernel:")


def test_softmax_size1_scores_wider_mask_declines_compiled():
    """The issue's model: compiled with the fusion it returned 1/16 where eager returns 1."""
    run = compiled_run(softmax_like, SIZE1, FUSIONS, "softmax_like", backward=False)
    eager = eager_run(softmax_like, SIZE1)
    assert torch.all(eager.outputs[0][eager.outputs[0] != 0] == 1)  # softmax over one element
    assert check(run, eager, "softmax_like", expect="decline") == "declined"
    # (in training the partitioner saves the softmax for backward: an interior node used outside, no match)
    assert "broadcast copies" in _reasons(run), run.declined


def test_softmax_same_rows_still_fires():
    args = (torch.randn(2, 5, 16), torch.zeros(2, 5, 16), torch.randn(2, 5, 16))
    run = fx_run(softmax_like, args, FUSIONS, "softmax_like")
    assert check(run, eager_run(softmax_like, args), "softmax_like", expect="fire") == "fired"


# --------------------------------------------------------------------------- class 2: crashes


def test_norm_over_size1_dim_with_wider_weight_declines():
    args = (torch.randn(24), torch.randn(2, 5, 1), torch.randn(2, 5, 1))
    run = fx_run(add_rms_norm, args, FUSIONS, "add_rms_norm")  # crashed in launch.py before
    check(run, eager_run(add_rms_norm, args), "add_rms_norm", expect="decline")
    assert "kernel:" in _reasons(run) and "does not fill the rows" in _reasons(run)
    args = args[:2]
    run = fx_run(rms_norm, args, FUSIONS, "rms_norm")
    check(run, eager_run(rms_norm, args), "rms_norm", expect="decline")
    assert "reduces 1 element(s) per row" in _reasons(run)


def test_norm_over_size1_dim_with_wider_weight_declines_compiled():
    args = (torch.randn(24), torch.randn(2, 5, 1), torch.randn(2, 5, 1))
    run = compiled_run(add_rms_norm, args, FUSIONS, "add_rms_norm")
    check(run, eager_run(add_rms_norm, args, backward=True), "add_rms_norm", expect="decline")
    run = compiled_run(add_rms_norm, args, FUSIONS, "add_rms_norm", backward=False)
    check(run, eager_run(add_rms_norm, args), "add_rms_norm", expect="decline")
    assert "does not fill the rows" in _reasons(run), run.declined


def test_norm_over_rows_of_one_element_declines():
    """Found by the property suite on the H200 (case ``layer_norm: shapes [(1, 1, 1), (1,), (1,)]``): the
    fused backward's x gradient was 0.7513 where eager's is 0.7500; over one element var is 0, so
    rsqrt(var + eps)'s gradient amplifies rounding by eps^-1.5 (FMA contraction on CUDA). Nothing to
    reduce there: the kernel's contract declines rows of one element."""
    args = (torch.tensor([[[1.5410]]]), torch.tensor([-0.2934]), torch.tensor([-2.1788]))
    run = compiled_run(layer_norm, args, FUSIONS, "layer_norm")
    assert check(run, eager_run(layer_norm, args, backward=True), "layer_norm", expect="decline") == "declined"
    assert "one element per row" in _reasons(run), run.declined


def _rms_norm_eps_argument(w, x, eps):
    return _pattern("rms_norm")(w, x, 2.0, eps)


def test_eps_that_dynamic_turns_into_a_tensor_declines_with_that_reason():
    """Found on the H200 (llama training, ``dynamic=True``): Dynamo does not specialize a Python float
    under ``dynamic=True``, so the norm's eps reaches the post-grad graph as a 0-d tensor input and the
    pattern's scalar ``c1`` binds to that node. The kernel takes eps as a compile-time constant: the
    match declines, and says so (it used to decline with a misleading shape-contract reason)."""
    args = (torch.randn(8), torch.randn(3, 5, 8), 1e-6)
    run = compiled_run(_rms_norm_eps_argument, args, FUSIONS, "rms_norm", dynamic=True)
    eager = eager_run(_rms_norm_eps_argument, args, backward=True)
    assert check(run, eager, "rms_norm", expect="decline", declined_parity=False) == "declined"
    assert "scalar: c1 is a graph value (a float32[] tensor)" in _reasons(run), run.declined
    assert "does not fill the rows" not in _reasons(run), run.declined


# --------------------------------------------------------------------------- class 3: what mining rejects


def _buffer_written(w, x):
    out = rms_norm(w, x)
    x.copy_(torch.zeros_like(x))  # the copy_ epilogue of a buffer update
    return out


def _input_from_inplace(w, x):
    x = x.add_(1.0)  # the chain's input is produced by an in-place op
    return rms_norm(w, x)


X = torch.randn(3, 4, 8)
REJECTS = [  # (name, fn, args, reason substring)
    ("log_softmax", lambda x: log_softmax(x.t()), (torch.randn(8, 6),), "not contiguous"),
    ("log_softmax", lambda x: log_softmax(x[:, 1:]), (torch.randn(6, 9),), "not contiguous"),
    ("log_softmax", lambda x: log_softmax(x.expand(6, 8)), (torch.randn(1, 8),), "not contiguous"),
    ("rms_norm", lambda w, x: rms_norm(w, x.transpose(0, 1)), (torch.randn(8), X), "not contiguous"),
    ("layer_norm", lambda x, w, b: layer_norm(x.expand(3, 4, 8), w, b),
     (torch.randn(4, 8), torch.randn(8), torch.randn(8)), "not contiguous"),
    ("layer_norm", layer_norm, (X, torch.randn(8, dtype=torch.bfloat16), torch.randn(8)), "mixes dtypes"),
    ("rms_norm", rms_norm, (torch.randn(8, dtype=torch.float16), X), "mixes dtypes"),
    ("rms_norm", _buffer_written, (torch.randn(8), X), "written in place"),
    ("rms_norm", _input_from_inplace, (torch.randn(8), X), "in-place op"),
    ("rms_norm", rms_norm, (torch.randn(4, 1), X), "broadcasts operand"),
    ("log_softmax", log_softmax, (torch.randn(4, 8, dtype=torch.float64),), "the kernel loads"),
]


@pytest.mark.parametrize("name, fn, args, reason", REJECTS, ids=[f"{c[0]}-{c[3]}-{i}" for i, c in enumerate(REJECTS)])
def test_mining_rejects_are_declined(name, fn, args, reason):
    run = fx_run(fn, args, FUSIONS, name)
    check(run, eager_run(fn, args), name, expect="decline")
    assert reason in _reasons(run), run.declined


# --------------------------------------------------------------------------- canonical dims


@pytest.mark.parametrize("dim", [1, -1])
def test_log_softmax_fires_for_either_spelling_of_the_last_dim(dim):
    args = (torch.randn(4, 10),)
    run = compiled_run(lambda x: F.log_softmax(x, dim=dim), args, FUSIONS, "log_softmax", backward=False)
    check(run, eager_run(lambda x: F.log_softmax(x, dim=dim), args), "log_softmax", expect="fire")


def _log_softmax_dim0(x):
    a = torch.ops.aten
    v1 = a.sub.Tensor(x, a.amax.default(x, [0], True))
    return a.sub.Tensor(v1, a.log.default(a.sum.dim_IntList(a.exp.default(v1), [0], True)))


def test_log_softmax_over_a_leading_dim_is_not_matched():
    """dim 0 of a 2-d tensor is canonically -2: not the pattern's -1."""
    args = (torch.randn(4, 10),)
    run = fx_run(_log_softmax_dim0, args, FUSIONS, "log_softmax")
    assert run.fired("log_softmax") == 0
    check(run, eager_run(_log_softmax_dim0, args), "log_softmax", expect="decline")
