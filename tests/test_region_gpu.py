"""On the H200: a region candidate with dropout draws Inductor's own random numbers (run with ``-m gpu``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch._inductor.inductor_prims  # noqa: F401 - prims.inductor_random & co.

from miner.core import candidate as candidates
from miner.core.workspace import Workspace

REPO = Path(__file__).resolve().parents[1]
RMS_DROPOUT = "p010eaa2cbb"


@pytest.fixture(scope="module")
def rms_cand():
    return candidates.load(Workspace(REPO), RMS_DROPOUT)


@pytest.mark.gpu
def test_gpu_masks_equal_inductors_own(rms_cand):
    """On CUDA the kernel draws Inductor's numbers: its mask equals the one of the same region
    compiled by Inductor (torch.compile of the pattern), element for element, at the t5 shape."""
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.rand(768, device="cuda", generator=g) + 0.5
    res = torch.randn(16, 512, 768, device="cuda", generator=g)
    a = torch.randn(16, 512, 768, device="cuda", generator=g).to(torch.bfloat16)
    seeds = torch.randint(0, 2 ** 62, (112,), device="cuda", generator=g)
    args = (w, res, seeds, a, 4, 0.1, 1 / 0.9, 2.0, 1e-6)
    ours = rms_cand.kernel_module.launch(*args)
    torch._dynamo.reset()
    theirs = torch.compile(rms_cand.pattern_module.pattern, dynamic=False,
                           options={"post_grad_custom_pre_pass": None, "post_grad_custom_post_pass": None})(*args)
    torch._dynamo.reset()
    agree = (ours[0] == theirs[0]).double().mean().item()
    assert agree == 1.0, f"masks agree on {agree:.6f} of the elements"
    for o, t in zip(ours[1:], theirs[1:]):
        torch.testing.assert_close(o.float(), t.float(), rtol=2e-2, atol=2e-2)
