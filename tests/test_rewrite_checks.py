"""The compile-time half of the one rule set: canonical dims, declines with reasons, dynamic shapes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from miner.core.pattern import PatternNode, canonical_dims, canonical_nodes
from miner.runtime import fusions, rewrite
from tests.safety_harness import FUSIONS, check, compiled_run, eager_run, fx_run

RMS = fusions.load(FUSIONS, "rms_norm").pattern


def rms(w, x):
    return RMS(w, x, 2.0, 1e-6)


@pytest.mark.parametrize("dims, ndim, want", [
    (1, 2, -1), ([1], 2, [-1]), ([2], 3, [-1]), ([0, 2], 3, [-3, -1]), (-1, 2, -1), ([1], None, [1]),
    (True, 2, True), (None, 2, None),
])
def test_canonical_dims_is_one_rule(dims, ndim, want):
    assert canonical_dims(dims, ndim) == want


def test_canonical_nodes_propagate_ranks_through_the_pattern():
    nodes = [PatternNode("aten.amax.default", "reduction", ({"input": 0}, (1,), True)),
             PatternNode("aten.sub.Tensor", "pointwise", ({"input": 0}, {"node": 0})),
             PatternNode("aten.sum.dim_IntList", "reduction", ({"node": 1}, (1,), True))]
    out = canonical_nodes(nodes, [2])
    assert out[0].args[1] == (-1,) and out[2].args[1] == (-1,) and out[1] == nodes[1]


def test_graph_dims_are_canonicalized_before_matching():
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x: torch.ops.aten.amax.default(x, [1], True), tracing_mode="fake")(torch.randn(3, 4))
    assert rewrite.canonicalize_dims(gm.graph) == 1
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    assert node.args[1] == [-1] or tuple(node.args[1]) == (-1,)
    assert rewrite.canonicalize_dims(gm.graph) == 0  # idempotent


def test_declines_are_counted_per_fusion_and_reason_and_reported_with_the_gate():
    before = dict(rewrite.GATE_DECISIONS)
    args = (torch.randn(8), torch.randn(6, 8).t())  # rms over a transposed (non-contiguous) input
    fn = lambda w, x: rms(w, x.t())  # noqa: E731
    run = fx_run(fn, (torch.randn(8), torch.randn(8, 6)), FUSIONS, "rms_norm")
    assert run.fired("rms_norm") == 0
    (reason, n), = [(r, n) for r, n in run.declined["rms_norm"].items()]
    assert n == 1 and reason.startswith("meta: in1 is not contiguous")
    new = {k for k, v in rewrite.GATE_DECISIONS.items() if v != before.get(k, 0)}
    assert any(k.startswith("rms_norm decline ") and "not contiguous" in k for k in new), new
    del args


def test_match_check_never_raises():
    broken = SimpleNamespace(kwargs={"x0": SimpleNamespace(meta={"val": torch.randn(2, 3)}, name="x0")},
                             graph=None, nodes=[], output_nodes=lambda: [])
    reasons = rewrite.match_reasons(broken, 1, ("float",))
    assert reasons and reasons[0].startswith("error:")  # declined with its reason, not raised
    assert rewrite.match_reasons(SimpleNamespace(kwargs={}), 1, ("float",)) == ["meta: an input is not a tensor"]


@pytest.mark.parametrize("name, fn, args", [
    ("log_softmax", lambda x: F.log_softmax(x, dim=-1), (torch.randn(4, 10),)),
    ("rms_norm", rms, (torch.randn(16), torch.randn(2, 3, 16))),
])
def test_dynamic_shapes_decline_with_a_reason_or_fire_and_never_raise(name, fn, args):
    """dynamic=True: symbolic sizes reach the check; it declines with "symbolic shape" (the contract
    is checked on static sizes), the compiled model runs and matches eager, also on a second size."""
    run = compiled_run(fn, args, FUSIONS, name, backward=False, dynamic=True)
    outcome = check(run, eager_run(fn, args), name)
    if outcome == "declined":
        assert any("symbolic shape" in r for r in run.all_reasons()), run.declined
