"""Ranking by measured recoverable time (miner.rank.measured) on a synthetic step profile."""

from __future__ import annotations

import pytest
import torch

from miner.core.pattern import save_patterns
from miner.core.workspace import Workspace
from miner.mine import regions
from miner.mine.mine import pattern_at
from miner.rank import measured
from miner.scan import profile as prof
from miner.scan.profile import KernelProfile, StepProfile
from tests.test_mine_helpers import fx_graph, with_kernels

BW = 1e12


def _graph():
    def fn(x, w):
        a = torch.relu(x @ w)   # kernel k1: relu, mul
        b = a * 3.0
        c = torch.exp(b)        # kernel k2: exp, add
        return c + 1.0

    g = fx_graph(fn, torch.randn(4, 8), torch.randn(8, 8), model="m")
    name = {n.target.split(".")[1]: n.name for n in g.nodes if n.op == "call_function"}
    g = with_kernels(g, {name["relu"]: ["k1:1"], name["mul"]: ["k1:1"], name["exp"]: ["k2:2"], name["add"]: ["k2:2"]})
    return g, name


def _profile(g, name, k1=(100.0, 40.0), k2=(60.0, 30.0)) -> StepProfile:
    rows = (KernelProfile("k1", "triton_pointwise", k1[0], 1.0, str(g.key), 4e-8, k1[1], ("k1:1",),
                          ((name["relu"], name["mul"]),)),
            KernelProfile("k2", "triton_pointwise", k2[0], 1.0, str(g.key), 3e-8, k2[1], ("k2:2",),
                          ((name["exp"], name["add"]),)),
            KernelProfile("nvjet_gemm", "gemm", 500.0, 1.0))
    return StepProfile("m", "base", "train", "cuda", 1.0, 0.9, 1.1, 20, 5, BW, rows)


@pytest.fixture
def index():
    g, name = _graph()
    rps = regions.group([g], [_profile(g, name)])
    return g, name, measured.SiteIndex(rps, {"m": BW})


def test_pattern_equal_to_a_kernel_gets_its_time_above_floor(index):
    g, name, idx = index
    p = pattern_at(g, [name["relu"], name["mul"]])
    c = measured.credit_pattern(p, idx)
    assert c.us_per_step == pytest.approx(60.0) and c.occurrences == 1 and len(c.regions) == 1


def test_pattern_that_splits_a_kernel_gets_nothing(index):
    g, name, idx = index
    p = pattern_at(g, [name["relu"], name["mul"], name["exp"]])
    c = measured.credit_pattern(p, idx)
    assert c.us_per_step == 0.0 and any("splits k2" in n for n in c.notes)


def test_pattern_spanning_two_whole_kernels_gets_their_time_minus_one_floor(index):
    g, name, idx = index
    p = pattern_at(g, [name["relu"], name["mul"], name["exp"], name["add"]])
    occ = p.occurrences[0]
    nbytes = sum(s.nbytes for s in occ.input_meta + occ.output_meta)
    c = measured.credit_pattern(p, idx)
    assert c.us_per_step == pytest.approx(160.0 - nbytes / BW * 1e6) and len(c.regions) == 2


def test_unprofiled_graph_is_not_measured(index):
    g, name, _ = index
    p = pattern_at(g, [name["relu"], name["mul"]])
    assert measured.credit_pattern(p, measured.SiteIndex((), {})) is None


def test_candidates_rank_by_measured_time_and_add_regions(tmp_path):
    from miner.rank import rank
    g, name = _graph()
    ws = Workspace(tmp_path)
    ws.save_graph(g)
    prof.save(ws, _profile(g, name, k1=(100.0, 40.0), k2=(300.0, 30.0)))
    pats = [pattern_at(g, [name["relu"], name["mul"]]), pattern_at(g, [name["relu"], name["mul"], name["exp"]])]
    save_patterns(ws, pats, {}, {})
    review = rank.review(ws)
    by = {r.id: r for r in review.rows}
    assert all(r.saved_ms.measured for r in review.rows)
    assert by[pats[0].id].saved_ms.value == pytest.approx(0.060)
    assert by[pats[1].id].saved_ms.value == 0.0
    regions_rows = [r for r in review.rows if r.status == "region"]
    assert [round(r.saved_ms.value, 3) for r in regions_rows] == [0.27]  # k2 (exp, add): 300 - 30 us
    assert review.rows[0].status == "region" and "measured recoverable time" in review.basis
    assert review.skipped[review.rows[0].id].startswith("region")
    assert set(review.measured) >= {pats[0].id, pats[1].id}


def test_no_profiles_leaves_the_review_alone(tmp_path):
    from miner.rank import rank
    g, name = _graph()
    ws = Workspace(tmp_path)
    ws.save_graph(g)
    save_patterns(ws, [pattern_at(g, [name["relu"], name["mul"]])], {}, {})
    review = rank.review(ws)
    assert not any(r.saved_ms.measured for r in review.rows) and not review.measured


def test_mined_patterns_link_to_the_regions_that_hold_them(tmp_path, capsys):
    from miner.cli import main
    from miner.commands.profile import mined_links
    g, name = _graph()
    ws = Workspace(tmp_path)
    ws.save_graph(g)
    prof.save(ws, _profile(g, name))
    pats = [pattern_at(g, [name["relu"], name["mul"]]), pattern_at(g, [name["relu"], name["mul"], name["exp"]])]
    save_patterns(ws, pats, {}, {})
    rps = regions.group([g], prof.load_all(ws))
    k1 = next(rp.id for rp in rps if rp.occurrences[0].region.kernel.name == "k1:1")
    k2 = next(rp.id for rp in rps if rp.occurrences[0].region.kernel.name == "k2:2")
    links = mined_links(ws, rps)
    assert links[k1] == [pats[0].id, pats[1].id] and links[k2] == [pats[1].id]
    assert main(["--workspace", str(tmp_path), "profile", "--show", "--preset", "base"]) == 0
    out = capsys.readouterr().out
    assert "mined patterns inside them" in out and k2 in out


def test_pattern_without_a_safe_occurrence_is_measured_zero(index):
    from dataclasses import replace as dc_replace
    from miner.core.pattern import Verdict
    g, name, idx = index
    p = pattern_at(g, [name["relu"], name["mul"]])
    unsafe = dc_replace(p, occurrences=tuple(dc_replace(o, verdict=Verdict(ok=False, reasons=("x",)))
                                             for o in p.occurrences))
    c = measured.credit_pattern(unsafe, idx)
    assert c.us_per_step == 0.0 and "no safe occurrence" in c.notes[0] and len(c.regions) == 1
