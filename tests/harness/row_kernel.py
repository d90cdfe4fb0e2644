"""The tests of a Triton kernel fusion (a row or region kernel), each run once per row of the module's ``CASES``.

Arguments (``case``): ``shapes`` and ``scalars`` of the inputs; the training test's ``matches`` (measured
by ``miner promote`` with ``miner.check.fusion_chain.train_matches``: 0 where backward keeps the chain's
interior values, so the matcher must leave it alone); the zoo test's ``model`` and ``mode``; the registry
test's ``unknown`` name. Tolerances: ``miner.core.dtypes.ELEMENT_TOL`` against float64.
"""

from __future__ import annotations

import copy

import pytest
import torch

from miner.check.fusion_chain import FusionUnderTest
from miner.core import dtypes
from miner.core.errors import UsageError
from miner_testing import workspace_of

FIXTURES = ("fusion",)


@pytest.fixture(scope="module")
def fusion(request) -> FusionUnderTest:
    """The fusion the requesting test module names."""
    return FusionUnderTest(workspace_of(request.module) / "fusions", request.module.FUSION)


def test_kernel_matches_float64_reference(fusion, case, dtype, device):
    shapes, scalars = case["shapes"], case["scalars"]
    xs = fusion.inputs(shapes, dtype, device)
    outs = fusion.kernel.launch(*xs, *scalars)
    expected = fusion.pattern.pattern(*xs, *scalars)
    ref = fusion.pattern.pattern(*[x.double() if x.is_floating_point() else x for x in xs], *scalars)
    assert len(outs) == len(ref) == fusion.pattern.N_OUTPUTS
    for out, exp, r in zip(outs, expected, ref):
        assert out.shape == exp.shape and out.dtype == exp.dtype
        if out.dtype == torch.bool:
            assert torch.equal(out, r)
            continue
        rtol, atol = dtypes.ELEMENT_TOL[dtypes.name(out.dtype)]
        torch.testing.assert_close(out.double(), r.double(), rtol=rtol, atol=atol, equal_nan=True)


def test_looped_kernel_matches_one_pass(fusion, case):
    xs = fusion.inputs(case["shapes"], "float32", "cpu")
    looped = fusion.kernel.launch(*xs, *case["scalars"], variant="looped")
    for a, b in zip(looped, fusion.kernel.launch(*xs, *case["scalars"])):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_torch_compile_uses_the_fusion_and_matches_eager(fusion, case, device):
    # The rewrite itself, gate held open: on CUDA the in-model gate (tests/test_gate.py) declines
    # every context no in-model A/B measured, these small shapes included.
    xs = fusion.inputs(case["shapes"], "float32", device)
    model = fusion.chain_model(case["shapes"], case["scalars"], device)
    got, matches = fusion.compile_and_run(model, xs, train=False, gate="open")
    assert matches == 1, f"the chain appears once; the fusion matched {matches} times"
    with torch.no_grad():
        expected = model(*xs)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_training_step_matches_eager_with_the_expected_matches(fusion, case, device):
    # In a training graph the chain's interior values may be saved for backward (extra users); then
    # the matcher must leave it alone (matches 0), else it must fire. Gradients equal eager's.
    xs = fusion.inputs(case["shapes"], "float32", device)
    model = fusion.chain_model(case["shapes"], case["scalars"], device)
    got, matches = fusion.compile_and_run(model, xs, train=True, gate="open")
    assert matches == case["matches"], f"expected {case['matches']} matches in the training step, got {matches}"
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    expected = model(*xs)
    sum(o.float().sum() for o in expected if o.is_floating_point()).backward()
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for a, p in zip(grads, model.parameters()):
        # a weight gradient sums over every row with cancellation: Inductor's reduction order alone
        # moves single elements by ~1e-5 of the gradient's scale, so compare as a whole (norm-wise)
        assert (a - p.grad).norm() <= 1e-5 * p.grad.norm() + 1e-6, ((a - p.grad).norm(), p.grad.norm())


@pytest.mark.slow
def test_fusion_fires_in_its_zoo_model(fusion, case):
    import miner_models as models

    mode = case["mode"]
    built = models.resolve(case["model"]).build("tiny", mode, "cpu")
    eager = built.model
    model = copy.deepcopy(eager)
    graph_pass = fusion.fusions.graph_pass([fusion.name])

    def step(m, fn):
        torch.manual_seed(0)
        out = fn(**built.inputs)
        if mode == "train":
            built.loss(out).backward()
        return out["logits"], {n: p.grad for n, p in m.named_parameters() if p.grad is not None}

    e_logits, e_grads = step(eager, eager)
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True, fallback_random=True):
        compiled = torch.compile(model, options=fusion.fusions.inductor_options(graph_pass_=graph_pass), dynamic=False)
        c_logits, c_grads = step(model, compiled)
    torch._dynamo.reset()
    assert graph_pass.counts[fusion.name] > 0
    torch.testing.assert_close(c_logits, e_logits, rtol=1e-4, atol=1e-4)
    for k, g in e_grads.items():
        torch.testing.assert_close(c_grads[k], g, rtol=1e-3, atol=1e-4)


def test_registry_is_loud_about_unknown_names(fusion, case):
    assert fusion.name in fusion.fusions.names()
    with pytest.raises(UsageError, match=fusion.name):
        fusion.fusions.load(case["unknown"])
