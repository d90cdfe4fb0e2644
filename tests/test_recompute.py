"""Values Inductor recomputes in several kernels (miner/mine/recompute.py), on the committed H200 captures,
and the Inductor mechanism a rewrite would use to compute such a value once."""

from __future__ import annotations

import json
import re
import shutil
import tarfile
from pathlib import Path

import pytest
import torch

from miner.core.workspace import Workspace
from miner.mine import recompute
from miner.rules import recompute as rule
from miner.rules.graph import FxNodes

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
    ok = [f for f in payload["found"] if f["ok"] and f["family"] == "transcendental"]
    # cos and sin [1, 512, 64], forward and backward, each in the 32 RoPE kernels (16 layers, q and k)
    assert sorted((f["phase"], f["target"], len(f["kernels"])) for f in ok) == [
        ("backward", "aten.cos.default", 32), ("backward", "aten.sin.default", 32),
        ("forward", "aten.cos.default", 32), ("forward", "aten.sin.default", 32)]
    assert all(f["model"] == "llama" and list(f["shape"]) == [1, 512, 64] and f["consumer_numel"] >= 8 * 512 * 64
               for f in ok)
    # bert's GELU erf/exp in the backward: as large as the kernels it is recomputed in: declined, with why
    bert = [f for f in payload["found"] if f["model"] == "bert" and f["phase"] == "backward"]
    assert bert and all(not f["ok"] and "round trip through memory" in f["reasons"][0] for f in bert)
    # the loss's log-sum-exp: a value per row of the reduction in the same kernel (no recompute per element)
    lse = [f for f in payload["found"] if f["target"] == "aten.log.default"]
    assert {f["model"] for f in lse} == {"llama", "bert"} and all(
        not f["ok"] and f["reasons"][0].startswith("a value per row of reduction") for f in lse)
    # the table family: bert's position embedding [1, 512, 768] added to [16, 512, 768]; the attention mask
    tables = sorted((f["model"], f["target"], tuple(f["shape"])) for f in payload["found"]
                    if f["ok"] and f["family"] == "table")
    assert tables == [("bert", "aten.embedding.default", (1, 512, 768)), ("bert", "aten.index.Tensor", (16, 1, 1, 512)),
                      ("llama", "aten.index.Tensor", (16, 1, 1, 512))]
    assert "llama cos[1, 512, 64] in 64 kernels" in recompute.summary(payload)


def test_t5s_relative_position_bias_lookup_is_recomputed_in_each_decoder_layer(tmp_path):
    """#30: t5's bias lookup ``embedding(table, bucket)`` ([512, 512, 12]) is inlined into every decoder
    layer's attention kernel ([16, 12, 512, 512]: 16x) and the encoder's first; the bucket itself (the
    ``log`` and comparisons) is computed once by Inductor already, so it is not listed."""
    ws = Workspace(tmp_path)
    with tarfile.open(RUN / "captures.tgz") as tar:
        tar.extractall(ws.root, members=[m for m in tar.getmembers() if m.name.startswith("captures/t5/base/train-")],
                       filter="data")
    payload = recompute.mine(ws.load_graphs(["t5"]))
    ok = sorted((f["node"], f["target"], len(f["kernels"]), f["broadcast_sites"]) for f in payload["found"] if f["ok"])
    assert ok == [("embedding_1", "aten.embedding.default", 1, 1), ("embedding_3", "aten.embedding.default", 12, 12)]
    assert not [f for f in payload["found"] if f["target"] in rule.COMPARE | {"aten.log.default"} and f["ok"]]
    # the estimate: 12 sites x 50M elements, an int64 index read per element where the value (float32) would do
    e3 = next(f for f in payload["found"] if f["node"] == "embedding_3")
    assert e3["key"] == 1 and e3["args"] == 2 and e3["family"] == "table"
    assert e3["predicted_us"] == pytest.approx(12 * 16 * 12 * 512 * 512 * (2 / recompute.OPS_PER_S + 4 / recompute.BYTES_PER_S)
                                               * 1e6, rel=1e-3)


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


# --------------------------------------------------------------------------- the rule on small graphs, the candidate

from miner.check import realize as checks  # noqa: E402
from miner.core import candidate as candidates  # noqa: E402
from miner.generate import realize as gen  # noqa: E402

RID = gen.candidate_id()
TID = gen.candidate_id("table")
RECOMPUTED = RUN / "mined" / "recomputed.json"


def _decide(fn, *specs, op=torch.ops.aten.cos.default):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    with FakeTensorMode():
        args = [torch.empty(s, dtype=d) for s, d in specs]
    gm = make_fx(fn, tracing_mode="fake")(*args)
    node = [n for n in gm.graph.nodes if n.target == op][-1]
    return rule.check(FxNodes(gm.graph), node.name)


def test_the_rule_takes_a_small_table_with_broadcast_consumers_and_says_why_not_otherwise():
    table = ([32, 16], torch.float32)
    wide = ([8, 4, 32, 16], torch.float32)
    def shared(t, x):
        c = t.cos() * 2.0  # the table's own computation (same size) is walked through
        return x * c, (x + 1) * c
    two = _decide(shared, table, wide)
    assert two.ok and len(two.consumers) == 2
    one = _decide(lambda t, x: x * t.cos(), table, wide)  # one consumer: recomputed per element all the same
    assert one.ok and one.consumers == ("mul",)
    def same_size(t, x):
        c = t.cos()
        return x * c, x - c
    same = _decide(same_size, wide, wide)
    assert not same.ok and "as large as its consumers" in same.reasons[0]
    narrow = _decide(lambda t, x: x[:2, :1] * t.cos(), table, wide)  # a broadcast of 2 (< RATIO)
    assert not narrow.ok and "as large as its consumers" in narrow.reasons[0]
    # a log-sum-exp: the value follows a reduction (kept in registers by the reducing kernel)
    lse = _decide(lambda t, x: x - x.exp().sum(-1, keepdim=True).log(), table, wide, op=torch.ops.aten.log.default)
    assert not lse.ok and lse.reasons[0].startswith("a value per row of reduction")


def _decide_all(fn, *specs):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    with FakeTensorMode():
        args = [torch.empty(s, dtype=d) for s, d in specs]
    gm = make_fx(fn, tracing_mode="fake")(*args)
    g = FxNodes(gm.graph)
    return {n.name: rule.check(g, n.name) for n in gm.graph.nodes if n.op == "call_function"}


def test_the_rule_takes_a_lookup_and_the_last_step_of_a_comparison_chain():
    """The table family: in the t5-like bias chain only the lookup fires (its bucket's ``log`` reaches no
    broadcast consumer of its own; the lookup is the last expensive step); a chain of comparisons and
    selects fires at its last step once it is ``CHAIN`` long, its earlier steps decline (a later step is
    the value), a shorter chain is no expensive op at all."""
    from miner.check.realize import bias_chain

    got = _decide_all(bias_chain(), ([8, 4, 32, 16], torch.float32), ([32], torch.int64))
    assert {n for n, d in got.items() if d.ok} == {"embedding"}
    assert len(got["embedding"].consumers) == 3  # each layer's scores + bias
    assert got["log"].applies and not got["log"].ok
    small = _decide_all(bias_chain(), ([2, 4, 32, 16], torch.float32), ([32], torch.int64))  # a broadcast of 2
    assert not small["embedding"].ok and "as large as its consumers" in small["embedding"].reasons[0]

    def chain(t, x):
        return short_chain(torch.where(t > 0, t, -t), x)

    def short_chain(c, x):
        return x * torch.where(c.clamp_max(2.0) < 1, c, 1.0)

    table, wide = ([32, 16], torch.float32), ([8, 4, 32, 16], torch.float32)
    got = _decide_all(chain, table, wide)
    applies = {n: d for n, d in got.items() if d.applies}
    assert [n for n, d in applies.items() if d.ok] == ["where_1"]  # gt, where, clamp_max, lt, where: 5
    assert all("later step" in d.reasons[0] for n, d in applies.items() if n != "where_1")
    short = _decide_all(short_chain, table, wide)  # clamp_max, lt, where: 3
    assert not any(d.applies for d in short.values())


def test_committed_recomputed_json_is_what_mining_writes(h200):
    got = recompute.mine(h200.load_graphs(["llama", "bert"]))
    committed = recompute.load(RECOMPUTED)
    want = [f for f in committed["found"] if f["model"] in ("llama", "bert")]
    assert json.loads(json.dumps(got["found"])) == want


@pytest.mark.parametrize("cid", [RID, TID])
@pytest.mark.parametrize("name", ["pattern.py", "candidate.json"])
def test_committed_compute_once_candidate_is_what_the_generator_makes(tmp_path, name, cid):
    meta = json.loads((REPO / "candidates" / cid / "candidate.json").read_text())
    rel = meta["source"]["recomputed"]
    ws = Workspace(tmp_path)
    (ws.root / rel).parent.mkdir(parents=True)
    shutil.copy(REPO / rel, ws.root / rel)
    assert {g.id for g in gen.generate(ws, rel, meta["regenerate"])} == {RID, TID}
    assert (ws.candidates / cid / name).read_bytes() == (REPO / "candidates" / cid / name).read_bytes(), \
        f"candidates/{cid}/{name} is stale: regenerate with `{meta['regenerate']}`"


@pytest.mark.parametrize("cid,values", [(RID, 2), (TID, 1)])
def test_the_candidate_computes_the_shared_value_once_in_the_traced_graph(cid, values):
    cand = candidates.at(REPO / "candidates" / cid)
    c = checks.check_graph(cand.pattern_module, cid, "cpu")
    assert c.ok and c.matches == values, c.detail


def test_the_graph_check_fails_when_the_rule_takes_the_buckets_earlier_steps(monkeypatch):
    """Planted bug: a rule that takes every expensive op it applies to (the bucket's ``log`` as well as the
    lookup) realizes two buffers where one does: the graph check says so."""
    cand = candidates.at(REPO / "candidates" / TID)
    real = rule.check

    def greedy(graph, name):
        d = real(graph, name)
        return rule.Decision(name, (), consumers=d.consumers) if d.applies else d

    mod = cand.pattern_module
    monkeypatch.setattr(mod, "PATTERNS", mod.PATTERNS + (("aten.log.default", 1, (), 0),))
    assert checks.check_graph(mod, TID, "cpu").ok  # the real rule declines the log
    monkeypatch.setattr(rule, "check", greedy)
    c = checks.check_graph(mod, TID, "cpu")
    assert not c.ok and "2 matches on ['aten.embedding.default', 'aten.log.default']" in c.detail, c.detail


@pytest.mark.slow
@pytest.mark.parametrize("cid,op", [(RID, "cos"), (TID, "embedding")])
def test_the_candidate_compiled_runs_the_value_once_and_changes_nothing(cid, op):
    cand = candidates.at(REPO / "candidates" / cid)
    c = checks.check_compiled(cand.pattern_module, cid, "cpu")
    assert c.ok and f"the kernel computing {op} runs 1x instead of 3x" in c.detail, c.detail


from hypothesis import example, given, settings, strategies as st  # noqa: E402


@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(s=st.integers(1, 6), d=st.integers(1, 6), lead=st.integers(1, 9), users=st.integers(1, 3),
       op=st.sampled_from(["cos", "sin", "exp", "tanh"]), scale=st.booleans(), symbolic=st.booleans())
@example(s=4, d=3, lead=9, users=2, op="cos", scale=True, symbolic=False)  # llama's RoPE table: fires
@example(s=4, d=3, lead=9, users=2, op="sin", scale=False, symbolic=True)  # dynamic=True: declines
def test_property_fires_iff_shared_and_broadcast_and_changes_no_value(s, d, lead, users, op, scale, symbolic):
    """Random table sizes, broadcast factors (1 to 9), numbers of consumers, ops, an extra scaling
    step, symbolic sizes: the pass fires iff the rule says so (a static value with one or more
    pointwise consumers at least RATIO times its size), declines with a reason otherwise, never
    raises, and the rewritten graph computes exactly what the original did."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(t, x):
        c = getattr(t, op)()
        c = c * 0.5 if scale else c
        return tuple(x * c + k for k in range(users))

    table, wide = [s, d], [lead, s, d]
    g = torch.Generator().manual_seed(0)
    t, x = torch.randn(table, generator=g), torch.randn(wide, generator=g)
    gm = make_fx(fn, tracing_mode="symbolic" if symbolic else "fake")(t, x)
    cand = candidates.at(REPO / "candidates" / RID)
    from miner.runtime import rewrite

    p = rewrite.FusionPass([rewrite.entry_for(cand.path / "pattern.py", RID)])
    p(gm.graph)
    gm.recompile()
    # the candidate matches the ops it was mined with; symbolic sizes (lead >= RATIO > 1 is never specialized) never fire
    fires = op in ("cos", "sin") and not symbolic and lead >= rule.RATIO
    assert p.counts[RID] == int(fires), (p.counts, p.declined)
    if op in ("cos", "sin") and not fires:
        assert p.declined.get(RID) and all(p.declined[RID]), p.declined
    for got, want in zip(gm(t, x), fn(t, x)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_promote_with_a_win_writes_a_gated_fusion(tmp_path):
    """``miner promote`` of a compute-once candidate: a gated fusion (on CUDA it fires only in a measured
    context; the gate held open, it computes the tables once) and its test file."""
    from miner.check.promotion import write_evidence
    from miner.check.validate import validate
    from miner.core.errors import UsageError
    from miner.promote import promote
    from miner.runtime import fusions

    (tmp_path / "candidates").mkdir()
    shutil.copytree(REPO / "candidates" / RID, tmp_path / "candidates" / RID,
                    ignore=shutil.ignore_patterns("validation.json", "in_model.json"))
    ws = Workspace(tmp_path)
    validate(ws, RID, device="cpu", model=False)  # the graph and compiled checks (no model: quick)
    with pytest.raises(UsageError):  # validated without proving the rewrite in a model
        promote(ws, RID, "rope_once")
    (ws.candidates / RID / "validation.json").write_text((REPO / "candidates" / RID / "validation.json").read_text())
    with pytest.raises(UsageError, match="no in-model GPU evidence"):
        promote(ws, RID, "rope_once")
    write_evidence(ws, RID, [{"model": "llama", "mode": "train", "compile": "default", "preset": "base",
                              "speedup": 1.02, "band": 0.004, "verdict": "win", "matches": 4, "contexts": {},
                              "gpu": "synthetic", "date": "2026-12-03T00:00:00+00:00"}])
    done = promote(ws, RID, "rope_once")
    assert {p.name for p in done.files} >= {"pattern.py", "fusion.json", "wins.json", "test_rope_once.py"}
    module = fusions.load(ws.root, "rope_once")
    assert module.OP_NAME == "miner::rope_once" and module.PATTERN_ID == RID
    assert "rewrite.wins_gate(match, WINS, N_INPUTS)" in (ws.fusions / "rope_once" / "pattern.py").read_text()
    closed = checks.check_graph(module, "rope_once", "cuda")  # fake CUDA tensors: the gate decides
    assert not closed.ok and closed.matches == 0  # this context was never measured: declined
    opened = checks.check_graph(module, "rope_once", "cuda", gate_open=True)
    assert opened.ok and opened.matches == 2, opened.detail
