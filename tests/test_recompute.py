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


# --------------------------------------------------------------------------- the rule on small graphs, the candidate

from miner.check import realize as checks  # noqa: E402
from miner.core import candidate as candidates  # noqa: E402
from miner.generate import realize as gen  # noqa: E402

RID = gen.candidate_id()
RECOMPUTED = RUN / "mined" / "recomputed.json"


def _decide(fn, *specs):
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    with FakeTensorMode():
        args = [torch.empty(s, dtype=d) for s, d in specs]
    gm = make_fx(fn, tracing_mode="fake")(*args)
    node = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.cos.default)
    return rule.check(FxNodes(gm.graph), node.name)


def test_the_rule_takes_a_small_table_with_two_broadcast_consumers_and_says_why_not_otherwise():
    table = ([32, 16], torch.float32)
    wide = ([2, 4, 32, 16], torch.float32)
    def shared(t, x):
        c = t.cos() * 2.0  # the table's own computation (same size) is walked through
        return x * c, (x + 1) * c
    two = _decide(shared, table, wide)
    assert two.ok and len(two.consumers) == 2
    one = _decide(lambda t, x: x * t.cos(), table, wide)
    assert not one.ok and one.reasons == ("1 broadcast consumer(s): nothing to share",)
    def same_size(t, x):
        c = t.cos()
        return x * c, x - c
    same = _decide(same_size, wide, wide)
    assert not same.ok and "as large as its consumers" in same.reasons[0]


def test_committed_recomputed_json_is_what_mining_writes(h200):
    got = recompute.mine(h200.load_graphs(["llama", "bert"]))
    committed = recompute.load(RECOMPUTED)
    want = [f for f in committed["found"] if f["model"] in ("llama", "bert")]
    assert json.loads(json.dumps(got["found"])) == want


@pytest.mark.parametrize("name", ["pattern.py", "candidate.json"])
def test_committed_compute_once_candidate_is_what_the_generator_makes(tmp_path, name):
    meta = json.loads((REPO / "candidates" / RID / "candidate.json").read_text())
    rel = meta["source"]["recomputed"]
    ws = Workspace(tmp_path)
    (ws.root / rel).parent.mkdir(parents=True)
    shutil.copy(REPO / rel, ws.root / rel)
    assert gen.generate(ws, rel, meta["regenerate"]) is not None
    assert (ws.candidates / RID / name).read_bytes() == (REPO / "candidates" / RID / name).read_bytes(), \
        f"candidates/{RID}/{name} is stale: regenerate with `{meta['regenerate']}`"


def test_the_candidate_computes_the_shared_table_once_in_the_traced_graph():
    cand = candidates.at(REPO / "candidates" / RID)
    c = checks.check_graph(cand.pattern_module, RID, "cpu")
    assert c.ok and c.matches == 2, c.detail


@pytest.mark.slow
def test_the_candidate_compiled_runs_cos_once_and_changes_nothing():
    cand = candidates.at(REPO / "candidates" / RID)
    c = checks.check_compiled(cand.pattern_module, RID, "cpu")
    assert c.ok, c.detail


from hypothesis import example, given, settings, strategies as st  # noqa: E402


@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(s=st.integers(1, 6), d=st.integers(1, 6), lead=st.integers(1, 9), users=st.integers(1, 3),
       op=st.sampled_from(["cos", "sin", "exp", "tanh"]), scale=st.booleans(), symbolic=st.booleans())
@example(s=4, d=3, lead=9, users=2, op="cos", scale=True, symbolic=False)  # llama's RoPE table: fires
@example(s=4, d=3, lead=9, users=2, op="sin", scale=False, symbolic=True)  # dynamic=True: declines
def test_property_fires_iff_shared_and_broadcast_and_changes_no_value(s, d, lead, users, op, scale, symbolic):
    """Random table sizes, broadcast factors (1 to 9), numbers of consumers, ops, an extra scaling
    step, symbolic sizes: the pass fires iff the rule says so (a static value with two or more
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
    fires = op in ("cos", "sin") and not symbolic and users >= 2 and lead >= rule.RATIO
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
