"""The demoting upcast rule (``miner.rules.upcast.check(..., demote=True)``) and its candidate (candidates/d*/):
a float32 bmm of one exact bf16/fp16 upcast and one float32 value whose output every user rounds to
that bf16/fp16 (t5's PV under SDPA's math path) runs as ``aten.bmm.dtype`` on the float32 operand
rounded. Rewrites run on graphs traced with fake CUDA tensors (no GPU needed), the rewritten graph
on the CPU with the ``.dtype`` GEMM emulated."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import example, given, settings, strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from miner.check import upcast as checks
from miner.core import candidate as candidates
from miner.core.dtypes import ELEMENT_TOL
from miner.core.workspace import Workspace
from miner.generate import upcast as gen
from miner.mine import upcast
from miner.runtime import rewrite

aten = torch.ops.aten
REPO = Path(__file__).resolve().parents[1]
UPCASTS = REPO / "reports" / "gpu" / "2026-12-03-h200-profile" / "mined" / "upcasts.json"
DID = gen.candidate_id(demote=True)
bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32


def trace(fn, *specs):
    with FakeTensorMode():
        args = [torch.empty(s, dtype=d, device="cuda") for s, d in specs]
    return make_fx(fn, tracing_mode="fake")(*args)


def _pass():
    cand = candidates.at(REPO / "candidates" / DID)
    return rewrite.FusionPass([rewrite.entry_for(cand.path / "pattern.py", DID)])


class _Emulate(torch.fx.Interpreter):
    """The graph on the CPU, ``aten.bmm.dtype`` as the float32 bmm of its (bf16/fp16) operands."""

    def call_function(self, target, args, kwargs):
        if target in (aten.bmm.dtype, aten.mm.dtype):
            assert args[0].dtype == args[1].dtype and args[0].dtype in (bf16, fp16) and args[2] == fp32
            op = aten.bmm.default if target is aten.bmm.dtype else aten.mm.default
            return op(args[0].float(), args[1].float())
        return super().call_function(target, args, kwargs)


def test_the_committed_t5_capture_gives_the_24_pv_bmms_to_the_demoting_rule_only():
    payload = upcast.load(UPCASTS)
    t5 = [f for f in payload["found"] if f["model"] == "t5"]
    qk = [f for f in t5 if f["ok"]]
    pv = [f for f in t5 if f["demote"] and f["demote"]["ok"]]
    assert len(qk) == 24 and all(f["demote"] is None for f in qk)  # two exact upcasts: the exact rule's
    assert len(pv) == 24 and all(not f["ok"] for f in pv)  # and the exact rule declines them
    assert {tuple(s.get("demote") for s in f["demote"]["sources"]) for f in pv} == {("bfloat16", None)}
    assert payload["counts"]["demote_fired"] == 24


@pytest.mark.parametrize("name", ["pattern.py", "kernel.py", "candidate.json"])
def test_committed_demote_candidate_is_what_the_generator_makes(tmp_path, name):
    meta = json.loads((REPO / "candidates" / DID / "candidate.json").read_text())
    rel = meta["source"]["upcasts"]
    ws = Workspace(tmp_path)
    (ws.root / rel).parent.mkdir(parents=True)
    shutil.copy(REPO / rel, ws.root / rel)
    assert gen.generate(ws, rel, meta["regenerate"], demote=True) is not None
    assert (ws.candidates / DID / name).read_bytes() == (REPO / "candidates" / DID / name).read_bytes(), \
        f"candidates/{DID}/{name} is stale: regenerate with `{meta['regenerate']}`"


def test_the_candidates_checks_on_t5s_attention_chain():
    cand = candidates.at(REPO / "candidates" / DID)
    entry = cand.meta["observed"][0]
    g = checks.check_graph(cand.pattern_module, DID, entry)
    assert g.ok, g.detail
    e = checks.check_emulated(cand.pattern_module, DID, entry)
    assert e.ok and e.matches == 1, e.detail


def _pv(p_shape, v_shape, dv, rounded, scale):
    """t5's PV: probabilities (float32, computed: softmax times a dropout's scale) @ v upcast from ``dv``;
    the output rounded to ``dv`` (SDPA's math path) or used as float32."""
    def fn(x, v):
        probs = aten.mul.Tensor(torch.softmax(x, -1), scale)
        out = aten.bmm.default(probs, v.float().reshape(v_shape))
        return out.reshape(out.shape).to(dv) if rounded else out * 2.0
    return fn


@settings(max_examples=15, deadline=None)
@given(bh=st.integers(1, 3), s=st.integers(1, 5), t=st.integers(1, 6), d=st.integers(1, 5),
       dv=st.sampled_from([bf16, fp16, fp32]), rounded=st.booleans(), scale=st.sampled_from([1.0, 1.1111111111111112]))
@example(bh=2, s=3, t=4, d=2, dv=bf16, rounded=True, scale=1.1111111111111112)  # t5's PV: fires
@example(bh=2, s=3, t=4, d=2, dv=bf16, rounded=False, scale=1.1111111111111112)  # output used unrounded
def test_property_fires_iff_one_operand_is_rounded_where_the_output_is_and_stays_within_its_tolerance(
        bh, s, t, d, dv, rounded, scale):
    """Random small shapes (size-1 dims included), v's dtype, whether the output is rounded: the
    demoting rewrite fires iff v is a bf16 upcast (fp16 could overflow: declined), the output only
    reaches a convert to bf16 and M, N, K > 1; otherwise it declines with a reason or the matmul is no candidate; nothing
    raises. Where it fires, the rewritten graph equals the GEMM of the rounded probabilities exactly,
    and the original within the output dtype's element tolerance."""
    p_shape, v_shape = [bh, 1, s, t], [bh, t, d]
    fn = _pv(p_shape, v_shape, dv, rounded, scale)
    gm = trace(fn, ([bh, s, t], fp32), (v_shape, dv))
    p = _pass()
    p(gm.graph)
    gm.recompile()
    low = dv in (bf16, fp16)
    fires = dv == bf16 and rounded and min(s, t, d) > 1  # fp16 declines: rounding a float32 value can overflow
    assert p.counts[DID] == int(fires), (p.counts, p.declined)
    if low and not fires:
        assert p.declined.get(DID) and all(p.declined[DID]), p.declined
    if not low:  # no exact operand: no candidate of this rule, nothing counted
        assert not p.declined.get(DID)
    torch.manual_seed(0)
    x, v = torch.randn(bh, s, t) * 3, torch.randn(v_shape).to(dv)
    got, want = _Emulate(gm).run(x, v), fn(x, v)
    if fires:
        probs = aten.mul.Tensor(torch.softmax(x, -1), scale)
        exact = torch.bmm(probs.to(dv).float(), v.float()).to(dv)
        torch.testing.assert_close(got, exact, rtol=0, atol=0)
        rtol, atol = ELEMENT_TOL[str(dv).split(".")[-1]]
        torch.testing.assert_close(got.double(), want.double(), rtol=2 * rtol, atol=2 * atol)
    else:
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_fp16_is_declined_because_the_rounding_could_overflow():
    """A float32 operand beyond 65504 would round to inf in fp16 (bf16 keeps float32's range): the rule
    declines fp16 with that reason, whatever the values (it cannot know them at compile time)."""
    fn = _pv([2, 1, 3, 4], [2, 4, 2], fp16, True, 1.0)
    gm = trace(fn, ([2, 3, 4], fp32), ([2, 4, 2], fp16))
    p = _pass()
    p(gm.graph)
    assert p.counts[DID] == 0
    assert any("can overflow" in r for r in p.declined[DID]), p.declined
    big, small = torch.tensor(1e5), torch.tensor(1e-3)  # a float32 operand value, an fp16 one
    assert torch.isfinite((big * small).half()) and torch.isinf(big.half())  # the output fits, the rounded operand not
