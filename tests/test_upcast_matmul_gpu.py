"""The upcast-matmul candidate on a GPU: it fires in torch.compile, the post-grad graph holds
``aten.bmm.dtype``, forward and backward match a float64 reference, and (printed, not asserted) the
GEMM at t5's shape as float32 FFMA vs bf16 tensor cores with float32 output.

Run: ``PYTHONPATH=$PWD python -m pytest -m gpu tests/test_upcast_matmul_gpu.py -q -s``
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

from miner.core import candidate as candidates
from miner.generate import upcast as gen
from miner.runtime import rewrite
from miner.scan.profile import time_steps

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

aten = torch.ops.aten
REPO = Path(__file__).resolve().parents[1]
CID = gen.candidate_id()
H, S, D = 4, 128, 64


class Attention(torch.nn.Module):
    """t5's attention under SDPA's math path, written out: bf16 q/k/v upcast to float32, QK^T (the
    chain the candidate rewrites), a position bias that requires grad, softmax, dropout scale, PV."""

    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(1, H, S, S) * 0.1)

    def forward(self, q, k, v):  # [B, S, H, D] each, bf16 (or float64 for the reference)
        qf = q.permute(0, 2, 1, 3).float() if q.dtype != torch.float64 else q.permute(0, 2, 1, 3)
        kf = k.permute(0, 2, 1, 3).float() if k.dtype != torch.float64 else k.permute(0, 2, 1, 3)
        vf = v.permute(0, 2, 1, 3).float() if v.dtype != torch.float64 else v.permute(0, 2, 1, 3)
        scores = torch.matmul(qf * 1.0, kf.transpose(-1, -2)) + self.bias.to(qf.dtype)
        probs = scores.softmax(-1) * 1.25  # a dropout's scale: PV is no exact upcast and must decline
        return torch.matmul(probs, vf), scores


class Recorder(CustomGraphPass):
    """Runs the candidate's pass, then records the graph's targets (the post-grad graph the kernels come from)."""

    def __init__(self, inner):
        self.inner, self.targets = inner, []

    def __call__(self, graph):
        self.inner(graph)
        self.targets.append({str(n.target) for n in graph.nodes if n.op == "call_function"})

    def uuid(self):
        return None

    def __deepcopy__(self, memo):
        return self


def _pass():
    cand = candidates.at(REPO / "candidates" / CID)
    return rewrite.FusionPass([rewrite.entry_for(cand.path / "pattern.py", CID)])


def test_fires_in_compile_and_matches_float64_forward_and_backward():
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = Attention().cuda()
    ref = Attention().cuda().double()
    ref.load_state_dict(model.state_dict())
    q, k, v = (torch.randn(2, S, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    p = _pass()
    rec = Recorder(p)
    with torch._inductor.config.patch(force_disable_caches=True):
        fn = torch.compile(model, options={"post_grad_custom_pre_pass": p, "post_grad_custom_post_pass": rec},
                           dynamic=False)
        out, scores = fn(q, k, v)
        (out.sum() + scores.square().mean()).backward()
    assert p.counts[CID] == 1, (dict(p.counts), p.declined)
    assert "aten.bmm.dtype" in rec.targets[0], sorted(rec.targets[0])
    assert any("is not exact" in r for r in p.declined.get(CID, {})), p.declined  # PV declined with its reason

    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out64, scores64 = ref(q64, k64, v64)
    (out64.sum() + scores64.square().mean()).backward()
    # float32 tolerance on what the GEMM computed (its inputs are exact bf16 values)
    torch.testing.assert_close(scores.double(), scores64, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.double(), out64, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model.bias.grad.double(), ref.bias.grad, rtol=1e-4, atol=1e-5)
    for t, t64 in ((q, q64), (k, k64), (v, v64)):  # bf16 leaves: their gradients are rounded to bf16
        torch.testing.assert_close(t.grad.double(), t64.grad, rtol=2e-2, atol=2e-2)


def _median_ms(fn, n=50) -> float:
    return statistics.median(time_steps(fn, n, "cuda"))  # CUDA events around each call


def test_gemm_at_t5_shape_fp32_vs_bf16_dtype_printed():
    """[192, 512, 64] x [192, 64, 512] (t5-base QK^T, B16 S512): printed, not asserted."""
    torch.manual_seed(0)
    a16 = torch.randn(192, 512, 64, device="cuda", dtype=torch.bfloat16)
    b16 = torch.randn(192, 64, 512, device="cuda", dtype=torch.bfloat16)
    a32, b32 = a16.float(), b16.float()
    fp32 = lambda: aten.bmm.default(a32, b32)  # noqa: E731
    dtype = lambda: aten.bmm.dtype(a16, b16, torch.float32)  # noqa: E731
    for f in (fp32, dtype):
        for _ in range(5):
            f()
    torch.cuda.synchronize()
    t32, t16 = _median_ms(fp32), _median_ms(dtype)
    ref = torch.bmm(a16.double(), b16.double())
    e32 = (fp32().double() - ref).abs().max().item()
    e16 = (dtype().double() - ref).abs().max().item()
    print(f"\nt5 QK^T GEMM [192,512,64]x[192,64,512], median of 50 (CUDA events), "
          f"TF32 {'on' if torch.backends.cuda.matmul.allow_tf32 else 'off'}: "
          f"float32 bmm {t32 * 1e3:.1f} us, bf16 bmm.dtype(float32) {t16 * 1e3:.1f} us, {t32 / t16:.2f}x; "
          f"max abs error vs float64: {e32:.2e} (float32), {e16:.2e} (bf16 .dtype)")
    assert dtype().dtype == torch.float32
