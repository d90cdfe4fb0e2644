"""The upcast-matmul rule (miner/rules/upcast.py), its mining (miner/mine/upcast.py) on the committed H200 t5
capture, the generated candidate (candidates/u*/), and its rewrite on graphs whose nodes carry fake CUDA values
(FakeTensorMode: the graph transform runs without a GPU) and in torch.compile on the CPU (declines)."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from miner.core import candidate as candidates
from miner.core.workspace import Workspace
from miner.generate import upcast as gen
from miner.mine import upcast
from miner.rules import upcast as rule
from miner.rules.graph import FxNodes
from miner.runtime import rewrite

aten = torch.ops.aten
REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "reports" / "gpu" / "2026-12-03-h200-profile"
UPCASTS = RUN / "mined" / "upcasts.json"
CID = gen.candidate_id()
bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32


# --------------------------------------------------------------------------- small graphs (t5's chain)

def qk_scaled(q, k, scale):
    """t5's QK^T under SDPA's math path: upcast, permute, mul by a scalar, expand, clone, reshape, bmm."""
    qf = aten.mul.Tensor(q.permute(0, 2, 1, 3).float(), scale)
    kf = aten.mul.Tensor(k.permute(0, 2, 1, 3).float().permute(0, 1, 3, 2), 1.0)
    b, h, s, d = qf.shape
    a = qf.expand(b, h, s, d).clone(memory_format=torch.contiguous_format).reshape(b * h, s, d)
    m = kf.expand(b, h, d, s).clone(memory_format=torch.contiguous_format).reshape(b * h, d, s)
    return aten.bmm.default(a, m), a  # ``a`` also leaves the graph (saved for backward, as in t5)


def qk(q, k):
    return qk_scaled(q, k, 1.0)


def trace(fn, *specs, device="cuda"):
    """``fn`` traced by make_fx on fake tensors of ``specs`` ((shape, dtype) each) on ``device``."""
    with FakeTensorMode():
        args = [torch.empty(s, dtype=d, device=device) for s, d in specs]
    return make_fx(fn, tracing_mode="fake")(*args)


def decide(gm, nth=0, target=aten.bmm.default):
    node = [n for n in gm.graph.nodes if n.target == target][nth]
    return rule.check(FxNodes(gm.graph), node.name)


QK = ([2, 8, 3, 4], bf16), ([2, 8, 3, 4], bf16)


def test_rule_fires_on_the_t5_chain():
    d = decide(trace(qk, *QK))
    assert d.ok and d.applies and d.out_target == "aten.bmm.dtype", d.reasons
    assert [u.dtype for u in d.operands] == ["bfloat16", "bfloat16"]
    gm = trace(qk, *QK)
    names = {n.name: n.target for n in gm.graph.nodes}
    # the replayed steps are layout ops only: the convert and the mul by 1.0 are left out
    for u in decide(gm).operands:
        assert names[u.source] == aten.permute.default
        assert [names[s] for s in u.steps][-3:] == [aten.expand.default, aten.clone.default, aten.view.default]


def test_rule_fires_on_fp16_mm_with_t():
    d = decide(trace(lambda a, b: aten.mm.default(a.float(), b.float().t()), ([4, 8], fp16), ([6, 8], fp16)),
               target=aten.mm.default)
    assert d.ok and d.out_target == "aten.mm.dtype", d.reasons


@pytest.mark.parametrize("fn, specs, reason", [
    (lambda a, b: aten.bmm.default(a.float(), b), (([2, 3, 4], bf16), ([2, 4, 5], fp32)),
     "operand 1 is float32 at its source (a graph input, no upcast)"),
    (lambda q, k: qk_scaled(q, k, 0.5)[0], QK, "operand 0: aten.mul.Tensor by 0.5 is not exact"),
    (lambda a, b: aten.bmm.default(a.float() + 1.0, b.float()), (([2, 3, 4], bf16), ([2, 4, 5], bf16)),
     "operand 0 is float32 at its source (aten.add.Tensor, no upcast)"),
    (lambda a, b: aten.bmm.default(a.float() * b.float().sum(), b.float()), (([2, 4, 4], bf16), ([2, 4, 4], bf16)),
     "operand 0: aten.mul.Tensor by a tensor is not exact"),
    (lambda a, b: aten.bmm.default(a.float(), b.float()), (([2, 3, 4], bf16), ([2, 4, 5], fp16)),
     "operands from bfloat16 and float16 sources"),
    (lambda a, b: aten.bmm.default(a.double().float(), b.float()), (([2, 3, 4], bf16), ([2, 4, 5], bf16)),
     "operand 0 is float64 at its source (aten._to_copy.default from float64 is no bf16/fp16 upcast)"),
])
def test_rule_declines_with_its_reason(fn, specs, reason):
    d = decide(trace(fn, *specs))
    assert not d.ok and d.applies
    assert reason in d.reasons, d.reasons


def test_rule_needs_cuda_and_the_overload(monkeypatch):
    d = decide(trace(qk, *QK, device="cpu"))
    assert d.reasons == ("out_dtype matmul needs CUDA (device cpu)",)
    monkeypatch.setattr(rule, "has_overload", lambda target: False)
    assert "torch has no aten.bmm.dtype" in decide(trace(qk, *QK)).reasons


def test_a_low_precision_matmul_is_no_candidate():
    d = decide(trace(lambda a, b: aten.bmm.default(a, b), ([2, 3, 4], bf16), ([2, 4, 5], bf16)))
    assert not d.applies and not d.ok


# --------------------------------------------------------------------------- mining the committed capture

@pytest.fixture(scope="module")
def t5_capture(tmp_path_factory) -> Workspace:
    """The committed H200 t5 graphs (captures.tgz), extracted into a workspace."""
    ws = Workspace(tmp_path_factory.mktemp("h200"))
    with tarfile.open(RUN / "captures.tgz") as tar:
        members = [m for m in tar.getmembers() if m.name.startswith("captures/t5/base/train-")]
        tar.extractall(ws.root, members=members, filter="data")
    return ws


def test_mining_finds_the_24_qk_bmms_and_declines_the_24_pv_bmms(t5_capture):
    fwd = [g for g in t5_capture.load_graphs(["t5"]) if g.key.phase == "forward"]
    found = upcast.find(fwd[0])
    fired = [f for f in found if f.ok]
    declined = [f for f in found if not f.ok]
    assert len(fired) == 24 and len(declined) == 24
    assert {tuple(tuple(i["shape"]) for i in f.inputs) for f in fired} == {((192, 512, 64), (192, 64, 512))}
    assert {tuple(tuple(i["shape"]) for i in f.inputs) for f in declined} == {((192, 512, 512), (192, 512, 64))}
    assert all(s["dtype"] == "bfloat16" for f in fired for s in f.sources)
    assert {f.reasons for f in declined} == {("operand 0: aten.mul.Tensor by 1.1111111111111112 is not exact",)}


def test_committed_upcasts_json_is_what_mining_writes(t5_capture):
    got = upcast.mine(t5_capture.load_graphs(["t5"]))
    committed = upcast.load(UPCASTS)
    assert json.loads(json.dumps(got["found"])) == [f for f in committed["found"] if f["model"] == "t5"]


# --------------------------------------------------------------------------- the generated candidate

@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> Workspace:
    ws = Workspace(tmp_path_factory.mktemp("regen"))
    meta = json.loads((REPO / "candidates" / CID / "candidate.json").read_text())
    rel = meta["source"]["upcasts"]
    (ws.root / rel).parent.mkdir(parents=True)
    shutil.copy(REPO / rel, ws.root / rel)
    assert gen.generate(ws, rel, meta["regenerate"]) is not None
    return ws


@pytest.mark.parametrize("name", ["pattern.py", "kernel.py", "candidate.json"])
def test_committed_candidate_is_what_the_generator_makes(regenerated, name):
    assert (regenerated.candidates / CID / name).read_bytes() == (REPO / "candidates" / CID / name).read_bytes(), \
        f"candidates/{CID}/{name} is stale: regenerate with `miner generate --upcasts {UPCASTS.relative_to(REPO)}`"


def test_candidate_json_records_where_it_fired_and_declined():
    meta = json.loads((REPO / "candidates" / CID / "candidate.json").read_text())
    assert meta["label"] == "upcast_matmul" and meta["occurrences"] == {"t5": {"forward": 24}}
    assert sum(o["count"] for o in meta["observed"]) == 24
    assert sum(d["count"] for d in meta["declined"] if d["model"] == "t5") == 24
    status = candidates.status(Workspace(REPO), candidates.at(REPO / "candidates" / CID))
    assert status in candidates.STATUSES and status != "failed"  # later stages may have run in the checkout


def _pass():
    cand = candidates.at(REPO / "candidates" / CID)
    return rewrite.FusionPass([rewrite.entry_for(cand.path / "pattern.py", CID)])


class _Emulate(torch.fx.Interpreter):
    """Runs a graph on the CPU with ``aten.bmm.dtype`` as the float32 bmm of the upcasts (no CPU kernel)."""

    def call_function(self, target, args, kwargs):
        if target in (aten.bmm.dtype, aten.mm.dtype):
            op = aten.bmm.default if target is aten.bmm.dtype else aten.mm.default
            assert args[0].dtype == args[1].dtype == bf16 and args[2] == fp32
            return op(args[0].float(), args[1].float())
        return super().call_function(target, args, kwargs)


def test_rewrite_on_fake_cuda_graph_fires_and_computes_the_same():
    def qk_pv(q, k, v):  # the QK^T fires; PV (probabilities scaled by a dropout's 1/0.9) declines
        s, a = qk(q, k)
        p = aten.mul.Tensor(torch.softmax(s, -1), 1.1111111111111112)
        vf = v.permute(0, 2, 1, 3).float().reshape(-1, *v.shape[1:2], v.shape[-1])
        return aten.bmm.default(p, vf), a

    specs = [([2, 8, 3, 4], bf16)] * 3
    gm = trace(qk_pv, *specs)
    def fp32_clones():
        return sum(n.target == aten.clone.default and n.meta["val"].dtype == fp32 for n in gm.graph.nodes)

    clones = fp32_clones()
    p = _pass()
    p(gm.graph)
    gm.recompile()
    assert p.counts[CID] == 1
    assert sum(p.declined[CID].values()) == 1
    assert list(p.declined[CID]) == ["operand 0: aten.mul.Tensor by 1.1111111111111112 is not exact"]
    assert any("decline" in k for k in p.log.lines)
    (mm,) = [n for n in gm.graph.nodes if n.target == aten.bmm.dtype]
    assert [a.meta["val"].dtype for a in mm.args[:2]] == [bf16, bf16] and mm.meta["val"].dtype == fp32
    # the fp32 copy of k had no other user: gone; the fp32 q operand leaves the graph: kept
    assert fp32_clones() == clones - 1
    torch.manual_seed(0)
    args = [torch.randn(s, dtype=d) for s, d in specs]
    want = qk_pv(*args)
    got = _Emulate(gm).run(*args)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_compiled_on_cpu_declines_with_the_cuda_reason_and_matches_eager():
    torch._dynamo.reset()
    p = _pass()
    fn = torch.compile(lambda q, k: qk(q, k)[0], options=rewrite.inductor_options(p), dynamic=False)
    q, k = torch.randn(1, 4, 2, 8, dtype=bf16), torch.randn(1, 4, 2, 8, dtype=bf16)
    with torch._inductor.config.patch(force_disable_caches=True):  # a cache hit would skip the pass
        out = fn(q, k)
    assert p.counts[CID] == 0
    assert "out_dtype matmul needs CUDA (device cpu)" in p.declined[CID]
    torch.testing.assert_close(out, qk(q, k)[0])


def test_mine_and_generate_commands_write_the_candidate(t5_capture, capsys):
    from miner import cli

    ws = Workspace(t5_capture.root)
    assert cli.main(["--workspace", str(ws.root), "mine", "--upcasts-only"]) == 0
    assert "24 of 48 float32 bmm/mm are exact bf16/fp16 upcasts" in capsys.readouterr().out
    assert cli.main(["--workspace", str(ws.root), "generate", "--upcasts", str(ws.mined / "upcasts.json")]) == 0
    meta = json.loads((ws.candidates / CID / "candidate.json").read_text())
    assert meta["source"] == {"upcasts": "mined/upcasts.json"} and meta["counts"] == {"fired": 24, "declined": 24}
    assert cli.main(["--workspace", str(ws.root), "generate", "--upcasts", "nope.json"]) == 2


def test_a_graph_the_rule_cannot_read_declines_instead_of_raising(monkeypatch):
    gm = trace(qk, *QK)
    node = next(n for n in gm.graph.nodes if n.target == aten.bmm.default)
    monkeypatch.setattr(rule, "check", lambda graph, name, demote=False: 1 / 0)
    d = rewrite.upcast_decision(node)
    assert not d.ok and d.applies and d.reasons == ("rule failed: ZeroDivisionError: division by zero",)


# --------------------------------------------------------------------------- property (hypothesis)

from hypothesis import example, given, settings, strategies as st  # noqa: E402


def _chain(q, k, scale, permute_q, wide_batch):
    """A QK^T-like chain with the choices drawn below: q permuted or not, a multiplier on q, k's
    batch dim expanded from 1 (a broadcast operand) or not."""
    qf = q.permute(0, 2, 1, 3) if permute_q else q
    qf = aten.mul.Tensor(qf.float(), scale)
    kf = k.float().permute(0, 1, 3, 2)
    b, h, s, d = qf.shape
    if wide_batch:
        kf = kf.expand(b, h, d, kf.shape[-1])
    a = qf.clone(memory_format=torch.contiguous_format).reshape(b * h, s, d)
    m = kf.clone(memory_format=torch.contiguous_format).reshape(b * h, d, kf.shape[-1])
    return aten.bmm.default(a, m)


class _EmulateAny(_Emulate):
    def call_function(self, target, args, kwargs):
        if target in (aten.bmm.dtype, aten.mm.dtype):
            op = aten.bmm.default if target is aten.bmm.dtype else aten.mm.default
            assert args[0].dtype == args[1].dtype and args[0].dtype in (bf16, fp16) and args[2] == fp32
            return op(args[0].float(), args[1].float())
        return torch.fx.Interpreter.call_function(self, target, args, kwargs)


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 3), h=st.integers(1, 3), s=st.integers(1, 5), d=st.integers(1, 6),
       dq=st.sampled_from([bf16, fp16, fp32]), dk=st.sampled_from([bf16, fp16, fp32]),
       scale=st.sampled_from([1.0, 0.5, 1.1111111111111112]), permute_q=st.booleans(), wide_batch=st.booleans())
@example(b=1, h=1, s=1, d=1, dq=bf16, dk=bf16, scale=1.0, permute_q=False, wide_batch=False)  # K = 1: found by it
def test_property_fires_exactly_when_exact_and_computes_the_same(b, h, s, d, dq, dk, scale, permute_q, wide_batch):
    """Random small shapes (size-1 dims included), source dtypes, multipliers and layouts: the rewrite
    fires iff both operands are exact upcasts of the same low-precision dtype (multiplier 1.0); any
    other float32 matmul declines with a reason; nothing raises; and the rewritten graph (the GEMM
    emulated as the float32 product of the upcasts) computes exactly what the original did. A GEMM
    with a size-1 dim declines: Inductor's decomposition would round its float32 output to bf16."""
    qshape = [b, s, h, d] if permute_q else [b, h, s, d]
    kshape = [1 if wide_batch else b, h, s + 1, d]
    fn = lambda q, k: _chain(q, k, scale, permute_q, wide_batch)  # noqa: E731
    gm = trace(fn, (qshape, dq), (kshape, dk))
    p = _pass()
    p(gm.graph)
    gm.recompile()
    exact = dq == dk and dq in (bf16, fp16) and scale == 1.0 and min(s, s + 1, d) > 1  # M, N, K > 1
    assert p.counts[CID] == (1 if exact else 0), (p.counts, p.declined)
    if not exact:  # declined, with at least one reason (one match may carry several)
        assert p.declined.get(CID) and all(p.declined[CID]), p.declined
    assert any(n.target == aten.bmm.dtype for n in gm.graph.nodes) == exact
    torch.manual_seed(0)
    q, k = torch.randn(qshape, dtype=dq), torch.randn(kshape, dtype=dk)
    torch.testing.assert_close(_EmulateAny(gm).run(q, k), fn(q, k), rtol=0, atol=0)
