"""The tests of an upcast-matmul fusion (exact or demoting: an aten rewrite, no Triton kernel): ``miner.check.upcast``'s checks.

CPU: t5's attention chain at each observed shape (``case``: the candidate.json ``observed`` entry),
traced on fake CUDA tensors: with the in-model gate held open the fusion rewrites QK^T into the
``.dtype`` GEMM and declines PV (a dropout's scale is no exact upcast); with the gate on, it fires
exactly where ``miner.runtime.evidence.decide`` says for its ``wins.json``; the rewritten chain run
on the CPU (the GEMM emulated) equals the original. CUDA (``-m gpu``): the GEMM against float64 per
observed shape; with ``-m "gpu and slow"`` the fusion inside ``torch.compile`` of the tiny zoo model
(``case``: ``model``, ``mode``; gate held open: the tiny shapes are not the measured ones).
"""

from __future__ import annotations


import pytest
import torch

from miner.check import upcast as checks
from miner.runtime import evidence, fusions, gate, rewrite
from miner_testing import workspace_of

FIXTURES = ("fusion",)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def fusion(request):
    """``(name, pattern module, fusions/<name>/)`` of the fusion the requesting test module names."""
    root, name = workspace_of(request.module), request.module.FUSION
    return name, fusions.load(root, name), root / "fusions" / name


def test_rewrites_the_mined_chain_and_declines_pv(fusion, case):
    name, module, _ = fusion
    c = checks.check_graph(module, name, case, gate_open=True)
    assert c.ok, c.detail


def test_the_gate_decides_from_its_in_model_evidence(fusion, case):
    name, module, _ = fusion
    _, graph_pass, _, _ = checks.rewrite_chain(module, name, case)
    seen = graph_pass.log.seen(name)
    assert len(seen) == 1, seen  # QK^T reaches the gate; PV was declined by the rule before it
    ctx, fire = seen[0]
    assert fire == evidence.decide(ctx, gate.in_model_records(module.WINS), evidence.isolated_rows(module.WINS))[0]
    assert graph_pass.counts[name] == int(fire)


def test_rewritten_chain_equals_the_original_on_cpu(fusion, case):
    name, module, _ = fusion
    c = checks.check_emulated(module, name, case, gate_open=True)
    assert c.ok, c.detail


@pytest.mark.gpu
@cuda
def test_gemm_matches_float64(fusion, case):
    _, _, folder = fusion
    path = folder / "kernel.py"
    c = checks.check_numerics(rewrite.load_module(path, rewrite.module_name(path, "kernel")), case["label"], case,
                              "cuda")
    assert c.ok, c.detail


@pytest.mark.gpu
@pytest.mark.slow
@cuda
def test_fires_in_its_zoo_model(fusion, case):
    name, module, _ = fusion
    c = checks.check_model(module, name, case["model"], case["mode"], "cuda", gate_open=True)
    assert c.ok, c.detail
