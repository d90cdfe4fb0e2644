"""The compile modes users run, on a CUDA device (issue 12, step 4): every promoted fusion in a
small model under ``dynamic=False``, ``dynamic=True``, ``mode="reduce-overhead"`` (CUDA graphs)
and ``mode="max-autotune"`` works (equal to eager within the dtype tolerance, forward and
backward) or declines with its reason, never raises, and no tile tuning runs inside a CUDA-graph
capture. The in-model gate is held open (``gate.forced_open``): with it on, every match in this
unmeasured model declines for want of evidence and the kernels would never run; a case where the
pattern neither fired nor declined fails (it tested nothing).

Run (the H200): ``pytest -m gpu tests/test_compile_modes_gpu.py -q -p no:cacheprovider``
"""

from __future__ import annotations

import pytest
import torch

from miner.runtime import fusions, gate, launch
from miner.core.dtypes import ELEMENT_TOL, MODEL_TOL
from tests.safety_harness import FUSIONS

pytestmark = pytest.mark.gpu

P = {n: m.pattern for n in fusions.names(FUSIONS) if hasattr(m := fusions.load(FUSIONS, n), "pattern")}  # chains only
NAMES = sorted(P) + [n for n in fusions.names(FUSIONS) if n in ("upcast_matmul", "demote_matmul")]  # + matmul rewrites
# a compiled model against eager: the model tolerances (Inductor reorders reductions too); demote_matmul's
# output is bf16 (SDPA's math path rounds it): one bf16 rounding apart at most, its element tolerance
TOL = {"demote_matmul": ELEMENT_TOL["bfloat16"]}


class Chains(torch.nn.Module):
    """One chain per fusion, between linear layers (so the chain's inputs are fresh activations)."""

    def __init__(self, name: str, h: int):
        super().__init__()
        self.name = name
        self.inp = torch.nn.Linear(h, h)
        self.w = torch.nn.Parameter(torch.randn(h) * 0.1 + 1.0)
        self.b = torch.nn.Parameter(torch.randn(h) * 0.1)

    def forward(self, x):
        y = self.inp(x)
        if self.name == "softmax_like":
            return P[self.name](y > -10.0, torch.zeros_like(y), y)[0]
        if self.name == "log_softmax":
            return P[self.name](y.reshape(-1, y.shape[-1]))[-1]
        if self.name == "layer_norm":
            return P[self.name](y, self.w, self.b, 1e-5)[-1]
        if self.name == "rms_norm":
            return P[self.name](self.w, y, 2.0, 1e-6)[-1]
        if self.name == "add_rms_norm":
            return P[self.name](self.w, y, x, 2.0, 1e-6)[-1]
        if self.name == "upcast_matmul":  # SDPA's math path: bf16 values upcast, a float32 QK^T
            q, k = y.to(torch.bfloat16).float(), x.to(torch.bfloat16).float()
            return torch.matmul(q, k.transpose(-1, -2)) / 16.0
        if self.name == "demote_matmul":  # SDPA's math path: float32 probabilities @ v upcast, rounded to bf16
            probs = torch.softmax(y, -1) * 1.25
            v = x.to(torch.bfloat16).float().transpose(-1, -2)
            return torch.matmul(probs, v).to(torch.bfloat16)
        raise KeyError(self.name)


CONFIGS = [dict(dynamic=False), dict(dynamic=True), dict(mode="reduce-overhead"), dict(mode="max-autotune")]


@pytest.fixture
def no_tuning_in_capture(monkeypatch):
    """Fail if launch.pick would time configs while a CUDA graph is being captured."""
    import triton.testing

    real = triton.testing.do_bench

    def guarded(*a, **k):
        assert not torch.cuda.is_current_stream_capturing(), "do_bench inside a CUDA-graph capture"
        return real(*a, **k)

    monkeypatch.setattr(triton.testing, "do_bench", guarded)
    launch.TUNED.clear()


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("name", NAMES)
def test_fusion_under_compile_mode_works_or_declines(name, cfg, no_tuning_in_capture):
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = Chains(name, 256).cuda()
    gp = fusions.install(FUSIONS, [name])
    try:
        with torch._inductor.config.patch(force_disable_caches=True), gate.forced_open():
            compiled = torch.compile(model, **cfg)
            for step, (train, b, s) in enumerate([(False, 4, 64), (False, 4, 64), (False, 2, 96),  # warmup, replay,
                                                  (True, 4, 64), (True, 4, 64), (True, 2, 96)]):  # a new size
                x = torch.randn(b, s, 256, device="cuda")
                with torch.set_grad_enabled(train):
                    out = compiled(x)
                    want = model(x)
                rtol, atol = TOL.get(name, MODEL_TOL["logits"])
                torch.testing.assert_close(out.detach().clone(), want.detach(), rtol=rtol, atol=atol)
                if not train:
                    continue
                params = list(model.parameters())
                g = torch.autograd.grad(out.float().sum(), params, allow_unused=True)
                gw = torch.autograd.grad(want.float().sum(), params, allow_unused=True)
                for got, ref in zip(g, gw):
                    assert (got is None) == (ref is None)
                    if got is not None:
                        torch.testing.assert_close(got, ref, rtol=MODEL_TOL["grads"][0], atol=MODEL_TOL["grads"][1])
    finally:
        fusions.uninstall()
    fired = gp.counts.get(name, 0)
    declined = gp.declined.get(name, {})
    print(f"\n{name} {cfg}: fired {fired}, declined {dict(declined)}")
    assert fired or declined, f"{name} {cfg}: the pattern neither fired nor declined (the case tested nothing)"
    assert all(r.strip() for r in declined), declined  # every decline carries its reason
