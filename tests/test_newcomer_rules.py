"""Core rules that mutation testing found untested (issue 11, items 5-6): each test fails when the rule
is broken the way the mutant broke it (``mutmut run``, see pyproject.toml)."""

from __future__ import annotations

import pytest
import torch

from miner.core.errors import UsageError
from miner.mine.mine import MineOptions, _non_overlapping, mine
from miner.check import ab
from miner.runtime import evidence
from test_mine_helpers import fx_graph, rekey


# --------------------------------------------------------------------------- the gate's boundaries
# The gate fires from in-model evidence only (miner.runtime.gate, miner.check.ab): a step change is a
# win / loss only beyond the control's noise band, exactly at the band it is noise; one loss declines.

def test_a_step_change_exactly_at_the_noise_band_is_noise():
    assert ab.verdict(1.02, 0.02) == "noise" and ab.verdict(0.98, 0.02) == "noise"
    assert ab.verdict(1.0201, 0.02) == "win" and ab.verdict(0.9799, 0.02) == "loss"
    assert ab.verdict(1.0, 0.0) == "noise" and ab.verdict(None, 0.01) is None and ab.verdict(1.1, None) is None


def test_the_noise_band_is_the_larger_of_the_control_offset_and_twice_the_standard_error():
    steady = [0.97] * 15  # per round default/control: the control always 3% slower, no spread
    assert ab.noise_band(steady) == pytest.approx(0.03, rel=1e-6)  # the control's offset decides
    spread = [0.9, 1.1, 0.95, 1.05]
    expected = 2 * ab.rel_se_median(spread)
    assert ab.noise_band(spread) == pytest.approx(expected) and expected > abs(1.0 - 1.0)  # the spread decides


def _record(verdict, speedup, site):
    return {"model": "m", "mode": "train", "compile": "default", "preset": "base", "speedup": speedup,
            "band": 0.01, "verdict": verdict, "contexts": {site: 1}}


def test_one_loss_declines_even_beside_a_win_and_a_win_alone_fires():
    ctx = evidence.Context(((((64, 512)), "float32"),), False, False)
    win, loss = _record("win", 1.05, ctx.site), dict(_record("loss", 0.95, ctx.site), model="n")
    assert evidence.decide(ctx, [win])[0] is True
    assert evidence.decide(ctx, [win, loss])[0] is False
    assert evidence.decide(ctx, [dict(win, verdict="noise")])[0] is False
    assert evidence.decide(ctx, [])[0] is False  # unmeasured declines


def test_non_overlapping_keeps_a_greedy_node_disjoint_set_per_graph():
    embs = [(0, (1, 2), ()), (0, (2, 3), ()), (0, (3, 4), ()), (1, (2, 3), ()), (0, (5, 6), ())]
    assert _non_overlapping(embs) == [0, 2, 4, 3]  # graph order, then node order; graph 1 is separate
    assert _non_overlapping([(0, (3, 4), ()), (0, (1, 2), ())]) == [1, 0]  # sorted, not in list order


def chain(x):
    return torch.exp(torch.exp(torch.exp(torch.exp(x))))


def test_overlapping_embeddings_are_counted_once():
    """A chain of four exps holds exp->exp three times, but only twice without sharing a node."""
    g = fx_graph(chain, torch.randn(4, 8))
    result = mine([g, rekey(g, model="m2")], MineOptions(min_support=2, closed_only=False, max_nodes=2))
    (pair,) = [p for p in result.patterns if p.ops == "exp -> exp"]
    assert pair.counts.total == 6 and pair.counts.non_overlapping == 4


def dead_exp(x, y):
    a = x * 2.0
    torch.exp(a)  # computed, never used: Inductor drops it and no kernel computes it
    return torch.relu(a + y)


def test_a_value_nothing_uses_is_never_part_of_a_pattern():
    """Defect 5: an exp with no users was kept in a pattern and ranked as a missed fusion."""
    g = fx_graph(dead_exp, torch.randn(4, 8), torch.randn(4, 8))
    assert any(n.target == "aten.exp.default" and not n.users for n in g.nodes)
    ops = [p.ops for p in mine([g, rekey(g, model="m2")], MineOptions(min_support=2, closed_only=False)).patterns]
    assert ops and not any("exp" in o for o in ops), ops
    assert "mul -> add -> relu" in ops


# --------------------------------------------------------------------------- ids

class P:
    def __init__(self, pid):
        self.id = pid


def test_an_ambiguous_pattern_prefix_is_reported_as_ambiguous_with_its_matches():
    from miner.commands.patterns import find

    pats = [P("p12aaaa"), P("p12bbbb"), P("p34cccc")]
    assert find(pats, "p34").id == "p34cccc" and find(pats, "p12bbbb").id == "p12bbbb"
    with pytest.raises(UsageError, match="ambiguous pattern id 'p12': p12aaaa, p12bbbb"):
        find(pats, "p12")
    with pytest.raises(UsageError, match="unknown pattern id 'p99'"):
        find(pats, "p99")


def test_an_ambiguous_candidate_prefix_is_reported_as_ambiguous(tmp_path):
    from miner.core import candidate as candidates
    from miner.core.workspace import Workspace

    ws = Workspace(tmp_path)
    for cid in ("p12aaaa", "p12bbbb"):
        (ws.candidates / cid).mkdir(parents=True)
        (ws.candidates / cid / "candidate.json").write_text('{"id": "%s"}' % cid)
    with pytest.raises(UsageError, match="ambiguous candidate 'p12': p12aaaa, p12bbbb"):
        candidates.load(ws, "p12")
    assert candidates.load(ws, "p12b").id == "p12bbbb"


# --------------------------------------------------------------------------- the isomorphism oracle (canon)
# ``canon.isomorphic`` (networkx VF2 on ``to_digraph``) is the independent check of the canonical
# codes: it must tell apart exactly what the codes tell apart.

def op(name, *args, **kwargs):
    from miner.core.pattern import PatternNode

    return PatternNode(f"aten.{name}.default", "pointwise", args, kwargs)


def I(k):
    return {"input": k}


def N(j):
    return {"node": j}


def C(c):
    return {"const": c}


def test_oracle_sees_ops_structural_constants_and_keywords():
    from miner.mine.canon import isomorphic

    assert not isomorphic([op("exp", I(0)), op("neg", N(0))], [op("exp", I(0)), op("abs", N(0))])
    assert not isomorphic([op("exp", I(0)), op("sum", N(0), [-1])], [op("exp", I(0)), op("sum", N(0), [0])])
    assert not isomorphic([op("exp", I(0)), op("sum", N(0), [-1], keepdim=True)],
                          [op("exp", I(0)), op("sum", N(0), [-1], keepdim=False)])


def test_oracle_sees_operand_positions_even_between_nodes_of_one_kind():
    from miner.mine.canon import isomorphic

    two = [op("exp", I(0)), op("neg", I(0))]
    assert not isomorphic(two + [op("sub", N(0), N(1))], two + [op("sub", N(1), N(0))])
    # a node read twice: where(e, n, e) is not where(e, n, n)
    assert not isomorphic(two + [op("where", N(0), N(1), N(0))], two + [op("where", N(0), N(1), N(1))])


def test_oracle_ignores_how_nodes_inputs_and_constants_are_numbered():
    from miner.mine.canon import isomorphic

    assert isomorphic([op("exp", I(0)), op("neg", I(0)), op("sub", N(0), N(1))],
                      [op("neg", I(0)), op("exp", I(0)), op("sub", N(1), N(0))])
    assert isomorphic([op("exp", I(0)), op("add", N(0), I(1))], [op("exp", I(1)), op("add", N(0), I(0))])
    assert isomorphic([op("mul", I(0), C(0)), op("add", N(0), C(1))], [op("mul", I(0), C(1)), op("add", N(0), C(0))])
    assert not isomorphic([op("exp", I(0)), op("add", N(0), I(1))], [op("exp", I(0)), op("add", N(0), I(0))])


def test_digraph_has_a_node_per_op_and_per_input_and_no_constant_nodes():
    from miner.mine.canon import to_digraph

    g = to_digraph([op("exp", I(0)), op("mul", N(0), I(0)), op("add", N(1), C(0))])
    assert set(g.nodes) == {("n", 0), ("n", 1), ("n", 2), ("i", 0)}
    assert g.nodes["i", 0]["label"] == "input"
    assert {e: g.edges[e]["pos"] for e in g.edges} == {(("i", 0), ("n", 0)): (0,), (("n", 0), ("n", 1)): (0,),
                                                     (("i", 0), ("n", 1)): (1,), (("n", 1), ("n", 2)): (0,)}
    g = to_digraph([op("exp", I(0)), op("where", N(0), I(1), N(0))])
    assert g.edges[("n", 0), ("n", 1)]["pos"] == (0, 2)  # one edge for both reads, both positions
    g = to_digraph([op("exp", I(0)), op("sub", C(0), N(0))])  # a constant before an operand skips only itself
    assert g.edges[("n", 0), ("n", 1)]["pos"] == (1,)
