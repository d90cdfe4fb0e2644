"""The ``captured`` validation check: a candidate's rewrite run over the graphs it was mined from, rebuilt
on the CPU at their captured sizes (``miner.core.fxnode.to_fx``).

The data is the H100 run of 2026-12-06 (``reports/gpu/2026-12-06-h100-deberta-megatron-tune/``): DeBERTa's
attention region ``p297db06345`` matched 0 of its 24 sites on the GPU, twice; its pattern was traced with
``view`` where Inductor's graphs hold ``reshape``. MegatronBert's attention region ``p37352563d9``
matched 0 there too: a one-cast region ``pae82366874`` measured beside it took its final cast first.
Each case runs in a process of its own (the generated custom ops of one region id share a name).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "reports/gpu/2026-12-06-h100-deberta-megatron-tune"

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU rebuild tests")


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("captured")
    with tarfile.open(RUN / "workspace.tgz") as t:
        t.extractall(root, filter="data")
    return root


def _run(ws: Path, body: str, interpret: bool = True) -> list[str]:
    script = f"""
from pathlib import Path
from miner.core.workspace import Workspace
from miner.core import candidate as candidates
from miner.generate import generate as gen
from miner.mine import regions
from miner.check.validate import check_captured
from miner.runtime import rewrite
ws = Workspace(Path({str(ws)!r}))
rps = {{rp.id: rp for rp in regions.load(ws)}}
def make(rid):
    r = gen.generate_one(rps[rid].pattern, ws, "test", {{"regions": "mined/regions.json", "rng": "philox4"}})
    assert isinstance(r, gen.Generated), r
    return candidates.load(ws, r.id)
{body}
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**env, "TRITON_INTERPRET": "1"} if interpret else env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split("\n")


def test_graphs_rebuild_with_every_node_and_meta(ws):
    from miner.core.fxnode import to_fx
    from miner.core.workspace import Workspace

    w = Workspace(ws)
    g = w.load_graph(ws / "captures/DebertaV2ForMaskedLM/base/train-forward-0.json")
    gm = to_fx(g)
    nodes = {n.name: n for n in gm.graph.nodes}
    assert len(nodes) == len(g.nodes)
    view = nodes["view_13"]  # the reshape inside the attention region
    assert view.target is torch.ops.aten.reshape.default and tuple(view.meta["val"].shape) == (384, 512, 512)
    assert [u.name for u in nodes["getitem_148"].users] == ["sub_tensor_24", "output"]


def test_the_attention_regions_match_every_site_where_they_were_mined(ws):
    """Without the Triton interpreter, as on a GPU machine (`miner tune` validates there): nothing runs."""
    out = _run(ws, """
for rid in ("p297db06345", "p37352563d9"):
    c = check_captured(make(rid))
    print(rid, c.ok, c.matches, c.detail)
""", interpret=False)
    assert out[0].startswith("p297db06345 True 24 24 match(es) of 24 occurrence(s)"), out
    assert out[1].startswith("p37352563d9 True 24 "), out


def test_the_check_fails_on_a_pattern_traced_with_views(ws):
    """The planted bug is the old tracer (``fwd_only``: ``reshape`` traced to ``view``): 0 matches, failed."""
    out = _run(ws, """
from torch._inductor.pattern_matcher import fwd_only
rewrite.trace_keeping_reshape = fwd_only
c = check_captured(make("p297db06345"))
print(c.ok, c.matches)
print(c.detail)
""")
    assert out[0] == "False 0", out
    assert "cannot fire where it was found" in out[1] and "structure differs" in out[1], out


def test_a_cast_only_region_is_not_generated_and_no_longer_takes_the_attention_regions_cast(ws):
    from miner.core.workspace import Workspace
    from miner.generate import generate as gen
    from miner.mine import regions

    rps = {rp.id: rp for rp in regions.load(Workspace(ws))}
    r = gen.generate_one(rps["pae82366874"].pattern, Workspace(ws), "test", {"regions": "mined/regions.json"})
    assert isinstance(r, gen.Skipped) and "nothing to fuse" in r.reason, r


def test_not_judged_without_the_source_graphs(ws, tmp_path):
    import shutil

    shutil.copytree(ws / "mined", tmp_path / "mined")
    out = _run(tmp_path, """
c = check_captured(make("p149ab91b53"))
print(c.ok, c.detail)
""")
    assert out[0].startswith("None not judged: the graphs it was mined from are not in this workspace"), out


def test_to_fx_is_the_inverse_of_what_scan_records():
    """Every node, argument (dtypes, devices, layouts, infinities, lists of nodes) and meta comes back."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from miner.core.fxnode import node_record, to_fx
    from miner.core.records import CapturedGraph, GraphKey

    aten = torch.ops.aten

    def fn(x, mask):
        fill = aten.full.default([], float("-inf"), dtype=torch.float32, layout=torch.strided,
                                 device=x.device, pin_memory=False)
        y = aten.where.self(mask, fill, aten.reshape.default(x, [2, 3, 4]))
        var, mean = aten.var_mean.correction(y, [2], correction=0, keepdim=True)
        return aten.cat.default([aten.sub.Tensor(y, mean), var.expand(2, 3, 4)], -1)

    gm = make_fx(fn, tracing_mode="fake")(torch.randn(6, 4), torch.rand(2, 3, 4) > 0.5)
    cap = CapturedGraph(GraphKey("m", "tiny", "train", "forward"), tuple(node_record(n) for n in gm.graph.nodes))
    back = to_fx(cap)
    assert str(back.graph) == str(gm.graph)
    for a, b in zip(gm.graph.nodes, back.graph.nodes):
        va, vb = a.meta.get("val"), b.meta.get("val")
        if isinstance(va, torch.Tensor):
            assert (tuple(vb.shape), vb.stride(), vb.dtype) == (tuple(va.shape), va.stride(), va.dtype), a.name


def test_offline_matches_equal_the_gpu_ab_on_t5(tmp_path):
    """The H200 A/B of t5's five dropout regions (``reports/gpu/2026-12-06-h200-t5-regions/``, gate open, in
    that run's order) fired 24, 58, 12, 0 and 12 times; the same passes over the committed H200 capture of
    t5's forward, rebuilt on the CPU, match exactly as often (``pbb9b9d613b_x4`` alone takes 24: the decoder's
    12 go to ``p4a7fd15d60_x4`` first)."""
    import shutil

    with tarfile.open(REPO / "reports/gpu/2026-12-03-h200-profile/captures.tgz") as t:
        t.extractall(tmp_path, filter="data", members=[m for m in t.getmembers() if m.name.startswith("captures/t5/")])
    ids = ["pf4693d7449_x4", "p010eaa2cbb_x4", "p4a7fd15d60_x4", "p9836c8c870_x4", "pbb9b9d613b_x4"]
    for cid in ids:
        shutil.copytree(REPO / "candidates" / cid, tmp_path / "candidates" / cid)
    script = f"""
from pathlib import Path
from miner.core.workspace import Workspace
from miner.core.fxnode import to_fx
from miner.core import candidate as candidates
from miner.runtime import rewrite
ws = Workspace(Path({str(tmp_path)!r}))
cands = [candidates.load(ws, c) for c in {ids!r}]
fp = rewrite.FusionPass([rewrite.entry_for(c.path / "pattern.py", c.id, c.pattern_module) for c in cands],
                        match_only=True)
fp(to_fx(ws.load_graph(ws.captures / "t5/base/train-forward-0.json"), device="cpu").graph)
print(*[fp.counts[c] for c in {ids!r}])
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["24", "58", "12", "0", "12"], done.stdout
