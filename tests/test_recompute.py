"""Values Inductor recomputes in several kernels (miner/mine/recompute.py), on the committed H200 captures,
and the Inductor mechanism a rewrite would use to compute such a value once."""

from __future__ import annotations

import re
import tarfile
from pathlib import Path

import pytest
import torch

from miner.core.workspace import Workspace
from miner.mine import recompute

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "reports" / "gpu" / "2026-12-03-h200-profile"


@pytest.fixture(scope="module")
def h200(tmp_path_factory) -> Workspace:
    ws = Workspace(tmp_path_factory.mktemp("h200"))
    with tarfile.open(RUN / "captures.tgz") as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(("captures/llama/base/train-",
                                                                       "captures/bert/base/train-"))]
        tar.extractall(ws.root, members=members, filter="data")
    return ws


def test_llamas_rope_tables_are_recomputed_in_every_rope_kernel(h200):
    payload = recompute.mine(h200.load_graphs(["llama", "bert"]))
    ok = [f for f in payload["found"] if f["ok"]]
    # cos and sin [1, 512, 64], forward and backward, each in the 32 RoPE kernels (16 layers, q and k)
    assert sorted((f["phase"], f["target"], len(f["kernels"])) for f in ok) == [
        ("backward", "aten.cos.default", 32), ("backward", "aten.sin.default", 32),
        ("forward", "aten.cos.default", 32), ("forward", "aten.sin.default", 32)]
    assert all(f["model"] == "llama" and list(f["shape"]) == [1, 512, 64] and f["consumer_numel"] >= 8 * 512 * 64
               for f in ok)
    # bert's GELU erf/exp in the backward: as large as the kernels it is recomputed in: declined, with why
    bert = [f for f in payload["found"] if f["model"] == "bert"]
    assert bert and all(not f["ok"] and "round trip through memory" in f["reasons"][0] for f in bert)
    assert payload["counts"]["kernel_sites"] == 128
    assert "llama cos[1, 512, 64] in 64 kernels" in recompute.summary(payload)


@pytest.mark.slow
def test_force_stride_order_makes_inductor_compute_a_shared_table_once():
    """The mechanism: without it each layer's kernel recomputes cos/sin; through
    ``prims.inductor_force_stride_order`` they are computed in one kernel and the others load them."""
    from torch._inductor.utils import run_and_get_code

    inv = torch.rand(8)
    ws = [torch.randn(16, 16) for _ in range(3)]

    def layers(force):
        def fn(x, pos):
            e = torch.cat([pos[:, None].float() * inv[None, :]] * 2, -1)
            c, s = e.cos(), e.sin()
            if force:
                c = torch.ops.prims.inductor_force_stride_order.default(c, c.stride())
                s = torch.ops.prims.inductor_force_stride_order.default(s, s.stride())
            for w in ws:
                q = x @ w
                x = q * c + torch.cat([-q[..., 8:], q[..., :8]], -1) * s
            return x
        return fn

    x, pos = torch.randn(2, 4, 32, 16), torch.arange(32)
    calls, outs = {}, {}
    for force in (False, True):
        torch._dynamo.reset()
        outs[force], code = run_and_get_code(torch.compile(layers(force)), x, pos)
        torch.testing.assert_close(outs[force], layers(False)(x, pos), rtol=1e-4, atol=1e-4)
        src = "\n".join(code)
        with_cos = {k for k in re.findall(r"^(\w+) = async_compile", src, re.M) if "cos" in k}
        calls[force] = sum(len(re.findall(rf"^\s+{k}\(", src, re.M)) for k in with_cos)
    assert calls[False] == 3 and calls[True] == 1, calls  # once per layer, then once in all
    torch.testing.assert_close(outs[True], outs[False], rtol=1e-6, atol=1e-6)  # the same values, computed once
