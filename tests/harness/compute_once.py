"""The tests of a compute-once fusion (an identity after a value, no kernel): ``miner.check.realize``'s checks.

CPU: the pass on a traced three-layer RoPE chain (both tables computed once, a second run takes
nothing); with ``-m slow`` the chain compiled by Inductor with and without it (equal outputs, the
table's kernel runs once). CUDA (``-m "gpu and slow"``): the fusion inside ``torch.compile`` of the
tiny zoo model (``case``: ``model``, ``mode``; gate held open: the tiny shapes are not the measured ones).
"""

from __future__ import annotations

import pytest
import torch

from miner.check import realize as checks
from miner_testing import named_pattern as fusion  # noqa: F401 - the fixture FIXTURES names

FIXTURES = ("fusion",)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_computes_the_shared_tables_once_in_the_traced_chain(fusion, case):
    name, module = fusion
    c = checks.check_graph(module, name, case["device"])
    assert c.ok, c.detail


@pytest.mark.slow
def test_compiled_chain_is_unchanged_and_runs_the_table_kernel_once(fusion, case):
    name, module = fusion
    c = checks.check_compiled(module, name, case["device"])
    assert c.ok, c.detail


@pytest.mark.gpu
@pytest.mark.slow
@cuda
def test_fires_in_its_zoo_model(fusion, case):
    name, module = fusion
    c = checks.check_model(module, name, case["model"], case["mode"], "cuda", gate_open=True)
    assert c.ok, c.detail
