"""The compile modes users run, on a CUDA device (issue 12, step 4): every promoted fusion in a
small model under ``dynamic=False``, ``dynamic=True``, ``mode="reduce-overhead"`` (CUDA graphs)
and ``mode="max-autotune"`` works (equal to eager within the dtype tolerance, forward and
backward) or declines with its reason, never raises, and no tile tuning runs inside a CUDA-graph
capture. The in-model gate is held open (the pass's ``gate_held("open")``): with it on, every match in this
unmeasured model declines for want of evidence and the kernels would never run; a case where the
pattern neither fired nor declined fails (it tested nothing).

Run (the H200): ``pytest -m gpu tests/test_compile_modes_gpu.py -q -p no:cacheprovider``
"""

from __future__ import annotations

import os

import pytest
import torch

from miner.check.realize import rope_chain
from miner.runtime import fusions, launch
from miner.core.dtypes import ELEMENT_TOL, MODEL_TOL, NORM_TOL
from tests.safety_harness import FUSIONS

pytestmark = pytest.mark.gpu

P = {n: m.pattern for n in fusions.names(FUSIONS) if hasattr(m := fusions.load(FUSIONS, n), "pattern")}  # chains only
# + the aten rewrites with no chain: the matmul rewrites and compute_once (an identity after a table)
NAMES = sorted(P) + [n for n in fusions.names(FUSIONS) if n in ("upcast_matmul", "demote_matmul", "compute_once")]
DEVICE = os.environ.get("MINER_COMPILE_MODES_DEVICE", "cuda")  # "cpu": a dry run of the logic (no CUDA graphs)
# a compiled model against eager: the model tolerances (Inductor reorders reductions too); demote_matmul's
# output is bf16 (SDPA's math path rounds it): one bf16 rounding apart at most, its element tolerance
TOL = {"demote_matmul": ELEMENT_TOL["bfloat16"]}


# demote_matmul also fires in the backward graph (grad_v = probs^T @ grad_out is only seen rounded to bf16):
# each product of a weight's gradient then carries a bf16 rounding of the probabilities, summed over the
# batch, so element-wise one-rounding tolerances do not apply; its gradients are compared by relative norm
# (NORM_TOL, as ``miner bench`` checks a variant)


def grad_tol(name: str, grad: torch.Tensor) -> tuple[float, float]:
    """A gradient's tolerance: a bf16 parameter's, the bf16 element tolerance (its backward GEMMs round to
    bf16); any other, the model tolerance (the rewrites run after AOT autograd split the graph: the
    backward graph is rewritten on its own, where its own matmuls qualify)."""
    return ELEMENT_TOL["bfloat16"] if grad.dtype == torch.bfloat16 else MODEL_TOL["grads"]


class Chains(torch.nn.Module):
    """One chain per fusion, between linear layers (so the chain's inputs are fresh activations)."""

    def __init__(self, name: str, h: int):
        super().__init__()
        self.name = name
        self.inp = torch.nn.Linear(h, h)
        self.w = torch.nn.Parameter(torch.randn(h) * 0.1 + 1.0)
        self.b = torch.nn.Parameter(torch.randn(h) * 0.1)
        # the matmul rewrites' bf16 values come out of bf16 GEMMs, as under autocast (the same extern mm in
        # eager and Inductor: no bias, which Inductor may move into a float32 consumer). Not
        # ``x.to(bf16).float()``: Inductor's ``pointless_convert`` may drop that float32 -> bf16 -> float32
        # round trip, so plain Inductor would differ from eager by the rounding and the rule see no upcast
        self.q16 = torch.nn.Linear(h, h, bias=False).to(torch.bfloat16)
        self.k16 = torch.nn.Linear(h, h, bias=False).to(torch.bfloat16)

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
        if self.name == "upcast_matmul":  # SDPA's math path: bf16 q and k upcast, a float32 QK^T
            xb = x.to(torch.bfloat16)
            q, k = self.q16(xb).float(), self.k16(xb).float()
            return torch.matmul(q, k.transpose(-1, -2)) / 16.0
        if self.name == "demote_matmul":  # SDPA's math path: float32 probabilities @ v upcast, rounded to bf16
            probs = torch.softmax(y, -1) * 1.25
            v = self.k16(x.to(torch.bfloat16)).float().transpose(-1, -2)
            return torch.matmul(probs, v).to(torch.bfloat16)
        if self.name == "compute_once":  # llama's RoPE table, shared by 3 layers: cos/sin computed once
            b, s = y.shape[:2]
            q = y.reshape(b, s, 16, 16).transpose(1, 2)  # [b, heads, s, 16] against a [s, 16] table
            return rope_chain()(q, torch.arange(s, device=y.device))
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
    model = Chains(name, 256).to(DEVICE)
    gp = fusions.install(FUSIONS, [name])
    try:
        with torch._inductor.config.patch(force_disable_caches=True), gp.gate_held("open"):
            compiled = torch.compile(model, **cfg)
            for step, (train, b, s) in enumerate([(False, 4, 64), (False, 4, 64), (False, 2, 96),  # warmup, replay,
                                                  (True, 4, 64), (True, 4, 64), (True, 2, 96)]):  # a new size
                x = torch.randn(b, s, 256, device=DEVICE)
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
                        if name == "demote_matmul":  # it fires in the backward graph too (see the note above grad_tol)
                            rel = float((got.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30))
                            assert rel <= NORM_TOL["bfloat16"], f"{name} grad: relative norm error {rel:.2e}"
                            continue
                        rtol, atol = grad_tol(name, got)
                        torch.testing.assert_close(got, ref, rtol=rtol, atol=atol)
    finally:
        fusions.uninstall()
    fired = gp.counts.get(name, 0)
    declined = gp.declined.get(name, {})
    print(f"\n{name} {cfg}: fired {fired}, declined {dict(declined)}")
    assert fired or declined, f"{name} {cfg}: the pattern neither fired nor declined (the case tested nothing)"
    assert all(r.strip() for r in declined), declined  # every decline carries its reason
