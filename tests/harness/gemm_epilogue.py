"""The tests of a GEMM-epilogue fusion (an addmm + activation as one cuBLASLt GEMM, no kernel): ``miner.check.epilogue``.

CPU: the pass on the traced four-GEMM chain (the tanh GELU and the ReLU taken, the erf GELU and a pre-activation
read outside declined, a second run takes nothing), and the rewritten graph run with the epilogue emulated equals
the chain. CUDA (``-m gpu``): the chain compiled by Inductor with and without it (no less accurate against float64),
and (``-m "gpu and slow"``) the fusion inside ``torch.compile`` of the tiny zoo model (``case``: ``model``,
``mode``). The gate is held open: the test shapes are not the measured ones.
"""

from __future__ import annotations

import pytest
import torch

from miner.check import epilogue as checks
from miner_testing import named_pattern as fusion  # noqa: F401 - the fixture FIXTURES names

FIXTURES = ("fusion",)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the epilogue is cuBLASLt's")


def test_takes_the_tanh_gelu_and_relu_and_declines_the_rest(fusion, case):
    name, module = fusion
    c, _ = checks.check_graph(module, name, gate_open=True)
    assert c.ok, c.detail


def test_rewritten_chain_equals_the_original_on_cpu(fusion, case):
    name, module = fusion
    c = checks.check_emulated(module, name, gate_open=True)
    assert c.ok, c.detail


@pytest.mark.gpu
@cuda
def test_compiled_chain_is_as_accurate_as_inductor(fusion, case):
    name, module = fusion
    c = checks.check_compiled(module, name, "cuda", gate_open=True)
    assert c.ok, c.detail


@pytest.mark.gpu
@pytest.mark.slow
@cuda
def test_fires_in_its_zoo_model(fusion, case):
    name, module = fusion
    c = checks.check_model(module, name, case["model"], case["mode"], "cuda", gate_open=True)
    assert c.ok, c.detail
