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


@pytest.mark.gpu
def test_gpu_direct_launch_gives_tritons_results(rms_cand, monkeypatch):
    """A plan's later calls launch the compiled kernel directly (``miner.runtime.direct``): after its
    check, every call gives what Triton's own launch gives, bit for bit, for new seed indices (another
    int specialization: 1, 16) and an input 2 bytes off alignment (another pointer specialization)."""
    from miner.runtime import direct, launch

    g = torch.Generator(device="cuda").manual_seed(1)
    w = torch.rand(768, device="cuda", generator=g) + 0.5
    res = torch.randn(4, 128, 768, device="cuda", generator=g)
    a = torch.randn(4 * 128 * 768 + 1, device="cuda", generator=g).to(torch.bfloat16)
    seeds = torch.randint(0, 2 ** 62, (112,), device="cuda", generator=g)
    cases = [(a[:-1].view(4, 128, 768), 4)] * 3 + [(a[:-1].view(4, 128, 768), 1), (a[:-1].view(4, 128, 768), 16),
                                                    (a[1:].view(4, 128, 768), 4)]

    def run(aa, idx):
        return rms_cand.kernel_module.launch(w, res, seeds, aa, idx, 0.1, 1 / 0.9, 2.0, 1e-6)

    monkeypatch.setattr(launch, "PLANS", {})
    monkeypatch.setattr(direct, "hooked", lambda: True)  # Triton's launch only: the reference
    expect = [run(*c) for c in cases]
    monkeypatch.setattr(launch, "PLANS", {})
    monkeypatch.undo()
    got = [[run(*c) for c in cases] for _ in range(3)]
    plans = [p for p in launch.PLANS.values() if p.direct is not None]
    assert any(fn is not None and checked for p in plans for fn, checked in p.direct.launchers.values())
    for rounds in got:
        for e, o in zip(expect, rounds):
            assert direct.same_bits(e, o)
