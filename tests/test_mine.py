"""Mining: counts against independent graph walks, invariance, support, closedness, Inductor's view,
the patterns file and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from miner.cli import main
from miner.core.errors import UsageError, WorkspaceError
from miner.mine.mine import MineOptions, mine, pattern_at
from miner.core.pattern import load_mining, load_patterns, save_patterns
from miner.core.records import CapturedGraph
from miner.core.workspace import Workspace
from test_mine_helpers import (fx_graph, gelu_erf_fn, gelu_tanh_fn, layer_norm_fn, rekey, rms_norm_fn, shuffled,
                               silu_mul_fn, softmax_fn, with_kernels)

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- independent walks
# Each walker finds a block by following producer/user links by op name, without the miner.


def _op(rec) -> str:
    if rec.op != "call_function":
        return ""  # backward placeholders are named after forward nodes ("amax", "exp")
    parts = rec.target.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _args(g: CapturedGraph, rec) -> list:
    """Positional args with node refs resolved to names."""
    return [a["node"] if isinstance(a, dict) and "node" in a else a for a in rec.args]


def _users(g, name, op):
    return [g.node(u) for u in g.node(name).users if _op(g.node(u)) == op]


def walk_softmax(g):
    """amax(x) -> sub(x, amax) -> exp -> sum -> div(exp, sum): node sets."""
    found = []
    for a in (n for n in g.nodes if _op(n) == "amax"):
        x = _args(g, a)[0]
        for s in _users(g, a.name, "sub"):
            if _args(g, s)[:2] != [x, a.name]:
                continue
            for e in _users(g, s.name, "exp"):
                for sm in _users(g, e.name, "sum"):
                    for d in _users(g, e.name, "div"):
                        if _args(g, d)[:2] == [e.name, sm.name]:
                            found.append({a.name, s.name, e.name, sm.name, d.name})
    return found


def walk_layer_norm(g):
    """var_mean(x) -> getitem 0 -> add -> rsqrt; getitem 1 -> sub(x, mean) -> mul(sub, rsqrt) -> mul -> add."""
    found = []
    for v in (n for n in g.nodes if _op(n) == "var_mean"):
        x = _args(g, v)[0]
        gets = {_args(g, u)[1]: u for u in _users(g, v.name, "getitem")}
        if set(gets) != {0, 1}:
            continue
        for ad in _users(g, gets[0].name, "add"):
            for r in _users(g, ad.name, "rsqrt"):
                for s in _users(g, gets[1].name, "sub"):
                    if _args(g, s)[:2] != [x, gets[1].name]:
                        continue
                    for m in _users(g, s.name, "mul"):
                        if set(_args(g, m)[:2]) != {s.name, r.name}:
                            continue
                        for m2 in _users(g, m.name, "mul"):
                            for b in _users(g, m2.name, "add"):
                                found.append({v.name, gets[0].name, gets[1].name, ad.name, r.name, s.name, m.name,
                                              m2.name, b.name})
    return found


def walk_rms_norm(g):
    """pow(x, 2) -> mean -> add -> rsqrt -> mul(x, rsqrt) -> mul(. , weight)."""
    found = []
    for p in (n for n in g.nodes if _op(n) == "pow"):
        x = _args(g, p)[0]
        for me in _users(g, p.name, "mean"):
            for ad in _users(g, me.name, "add"):
                for r in _users(g, ad.name, "rsqrt"):
                    for m in _users(g, r.name, "mul"):
                        if set(_args(g, m)[:2]) != {x, r.name}:
                            continue
                        for m2 in _users(g, m.name, "mul"):
                            found.append({p.name, me.name, ad.name, r.name, m.name, m2.name})
    return found


def walk_gelu_erf(g):
    """mul(x, c) -> erf -> add -> mul(mul(x, c'), add)."""
    found = []
    for e in (n for n in g.nodes if _op(n) == "erf"):
        m1 = g.node(_args(g, e)[0])
        if _op(m1) != "mul":
            continue
        x = _args(g, m1)[0]
        for ad in _users(g, e.name, "add"):
            for m in _users(g, ad.name, "mul"):
                rest = [a for a in _args(g, m)[:2] if a != ad.name]
                if len(rest) != 1 or not isinstance(rest[0], str):
                    continue  # mul(add, 0.5): GELU's backward, not GELU
                other = g.node(rest[0])
                if _op(other) == "mul" and _args(g, other)[0] == x and not isinstance(_args(g, other)[1], str):
                    found.append({m1.name, e.name, ad.name, m.name, other.name})
    return found


def walk_gelu_tanh(g):
    """pow(x, 3) -> mul -> add(x, .) -> mul -> tanh -> add -> mul(mul(x, .5), .): GPT-2's GELU."""
    found = []
    for t in (n for n in g.nodes if _op(n) == "tanh"):
        m3 = g.node(_args(g, t)[0])
        if _op(m3) != "mul":
            continue
        a1 = g.node(_args(g, m3)[0])
        if _op(a1) != "add":
            continue
        x, m2n = _args(g, a1)[:2]
        m2 = g.node(m2n)
        if _op(m2) != "mul" or _op(g.node(_args(g, m2)[0])) != "pow":
            continue
        pw = g.node(_args(g, m2)[0])
        if _args(g, pw)[0] != x:
            continue
        for a2 in _users(g, t.name, "add"):
            for m in _users(g, a2.name, "mul"):
                other = g.node([a for a in _args(g, m)[:2] if a != a2.name][0])
                if _op(other) == "mul" and x in _args(g, other):
                    found.append({pw.name, m2.name, a1.name, m3.name, t.name, a2.name, m.name, other.name})
    return found


def walk_silu_mul(g):
    """neg(x) -> exp -> add -> div(x, add) -> mul(div, y): SiLU(gate) * up."""
    found = []
    for ng in (n for n in g.nodes if _op(n) == "neg"):
        x = _args(g, ng)[0]
        for e in _users(g, ng.name, "exp"):
            for ad in _users(g, e.name, "add"):
                for d in _users(g, ad.name, "div"):
                    if _args(g, d)[:2] != [x, ad.name]:
                        continue
                    for m in _users(g, d.name, "mul"):
                        if _args(g, m)[0] == d.name:  # silu(gate) * up; mul(grad, silu) is the backward's
                            found.append({ng.name, e.name, ad.name, d.name, m.name})
    return found


# --------------------------------------------------------------------------- synthetic models


def _toy(x, w, g, b):
    """Three blocks of softmax / layer norm / GELU / RMS norm / SiLU*up, between matmuls."""
    h = x
    for _ in range(3):
        h = softmax_fn(h, w)
        h = layer_norm_fn(h, w, g, b)
        h = gelu_erf_fn(h, w)
        h = gelu_tanh_fn(h, w)
        h = rms_norm_fn(h, w, g)
        h = silu_mul_fn(h, w, w.t().contiguous())
    return h


@pytest.fixture(scope="module")
def toy_graphs():
    torch.manual_seed(0)
    args = (torch.randn(4, 8), torch.randn(8, 8), torch.randn(8), torch.randn(8))
    g = fx_graph(_toy, *args, model="toy")
    return [g, rekey(g, model="toy2", phase="inference", mode="infer")]


@pytest.fixture(scope="module")
def toy_result(toy_graphs):
    return mine(toy_graphs, MineOptions(closed_only=False, max_nodes=8, verify=True))


BLOCKS = [("softmax", walk_softmax), ("layer_norm", walk_layer_norm), ("rms_norm", walk_rms_norm),
          ("gelu_erf", walk_gelu_erf), ("gelu_tanh", walk_gelu_tanh), ("silu_mul", walk_silu_mul)]


def _expected(graphs, walker):
    """(pattern id, number of blocks, graphs holding one) from the independent walk."""
    chains = [(g, c) for g in graphs for c in walker(g)]
    assert chains, "the walker found nothing"
    g0, c0 = chains[0]
    pid = pattern_at(g0, sorted(c0)).id
    ids = {pattern_at(g, sorted(c)).id for g, c in chains}
    assert ids == {pid}, "one block, one pattern"
    return pid, len(chains), {str(g.key) for g, _ in chains}


@pytest.mark.parametrize("block, walker", BLOCKS, ids=[b for b, _ in BLOCKS])
def test_block_counts_match_an_independent_walk(toy_graphs, toy_result, block, walker):
    pid, n, graphs = _expected(toy_graphs, walker)
    assert n == 6  # 3 blocks x 2 graphs
    p = toy_result.by_id()[pid]
    assert p.counts.total == n and p.counts.non_overlapping == n
    assert set(p.support.graphs) == graphs and p.support.n_models == 2


def test_expected_ops_and_scalars(toy_result, toy_graphs):
    by_ops = {}
    for block, walker in BLOCKS:
        pid, _, _ = _expected(toy_graphs, walker)
        by_ops[block] = toy_result.by_id()[pid]
    assert by_ops["softmax"].ops == "amax -> sub -> exp -> sum -> div"
    assert by_ops["rms_norm"].ops.split(" -> ")[:4] == ["pow", "mean", "add", "rsqrt"]
    gelu = by_ops["gelu_erf"]
    assert sorted(gelu.occurrences[0].scalars) == sorted([0.5, 0.7071067811865476, 1])
    # the eager function of the mined pattern computes GELU
    x = torch.randn(3, 8)
    out = gelu.evaluate([x], gelu.occurrences[0].scalars)
    torch.testing.assert_close(out[0], torch.nn.functional.gelu(x))


def test_closed_mining_drops_subpatterns_inside_a_larger_one(toy_graphs, toy_result):
    closed = mine(toy_graphs)  # closed only (default)
    inner = pattern_at(toy_graphs[0], sorted(walk_softmax(toy_graphs[0])[0] - {
        n.name for n in toy_graphs[0].nodes if _op(n) in ("amax", "sub")})).id  # exp -> sum -> div
    assert inner in toy_result.by_id() and not toy_result.by_id()[inner].closed
    assert inner not in closed.by_id()
    assert all(p.closed for p in closed.patterns)
    assert len(closed.patterns) < len(toy_result.patterns)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_renaming_and_reordering_nodes_changes_nothing(toy_graphs, toy_result, seed):
    shuffled_graphs = [shuffled(g, seed * 10 + i) for i, g in enumerate(toy_graphs)]
    again = mine(shuffled_graphs, MineOptions(closed_only=False, max_nodes=8))

    def summary(r):
        return {p.id: (p.counts.total, p.counts.non_overlapping, p.counts.safe, p.support.graphs, p.closed)
                for p in r.patterns}

    assert summary(again) == summary(toy_result)


def test_min_support_and_min_models_prune(toy_graphs):
    one = toy_graphs[:1]
    assert mine(one, MineOptions(support="graphs")).patterns == ()  # min_support=2 graphs
    assert mine(one, MineOptions(support="graphs", min_support=1)).patterns
    # occurrence support (the default): what repeats inside the one graph is frequent
    by_occ = mine(one).patterns
    assert by_occ and all(p.counts.total >= 2 for p in by_occ)
    assert mine(toy_graphs, MineOptions(min_models=3)).patterns == ()
    assert mine(toy_graphs, MineOptions(min_models=2)).patterns


def test_scalars_group_and_keep_their_values():
    a = fx_graph(lambda x: torch.tanh(x * 0.5) + 1.0, torch.randn(4, 8), model="a")
    b = fx_graph(lambda x: torch.tanh(x * 0.7071) + 2.0, torch.randn(4, 8), model="b")
    r = mine([a, b])
    (p,) = [p for p in r.patterns if p.ops == "mul -> tanh -> add"]
    assert p.support.models == ("a", "b")
    assert sorted(o.scalars for o in p.occurrences) == [(0.5, 1.0), (0.7071, 2.0)]


def test_operand_order_separates_patterns():
    a = fx_graph(lambda x: torch.exp(x - torch.sigmoid(x)), torch.randn(4, 8), model="a")
    b = fx_graph(lambda x: torch.exp(torch.sigmoid(x) - x), torch.randn(4, 8), model="b")
    def with_sigmoid(r):
        return [p for p in r.patterns if "sigmoid" in p.ops]

    assert with_sigmoid(mine([a, b])) == []  # one graph each: never merged into one pattern
    two = with_sigmoid(mine([a, rekey(a, index=1), b, rekey(b, index=1)]))
    assert len(two) == 2 and all(p.support.n_graphs == 2 and p.counts.total == 2 for p in two)


def test_inductor_view_one_kernel_vs_missed_fusion():
    g = fx_graph(softmax_fn, torch.randn(4, 8), torch.randn(8, 8))
    names = {n.name: n for n in g.nodes}
    chain = walk_softmax(g)[0]
    fused = with_kernels(g, {n: ["k_fused"] for n in chain}, kind="reduction")
    split = with_kernels(rekey(g, index=1), {n: (["k_div"] if _op(names[n]) == "div" else ["k_red"])
                                             for n in chain}, kind="reduction")
    def softmax_pattern(graphs):
        (p,) = [p for p in mine(graphs).patterns if p.ops == "amax -> sub -> exp -> sum -> div"]
        return p.inductor

    half = softmax_pattern([fused, split])
    assert half.kernels_hist == {"1": 1, "2": 1} and half.one_kernel == 1
    assert not half.missed_fusion  # split in 1 of 2 occurrences: not most of them
    ind = softmax_pattern([fused, split, rekey(split, index=2)])
    assert ind.missed_fusion and ind.one_kernel == 1
    assert ind.splits == {"n2:exp -> n4:div": 2, "n3:sum -> n4:div": 2}
    # A producer recomputed in a second kernel is not a split: one kernel still holds every node.
    recomputed = with_kernels(g, {n: (["k1", "k2"] if _op(names[n]) == "exp" else ["k1"]) for n in chain})
    occ = pattern_at(recomputed, sorted(chain)).occurrences[0]
    assert occ.n_kernels == 2 and len(occ.recomputed) == 1 and occ.in_one_kernel


# --------------------------------------------------------------------------- the patterns file


def test_patterns_file_round_trips(tmp_path, toy_graphs):
    r = mine(toy_graphs)
    ws = Workspace(tmp_path)
    path = save_patterns(ws, r.patterns, r.params, r.stats)
    assert path == tmp_path / "mined" / "patterns.json"
    back = load_mining(ws)
    assert back.patterns == r.patterns and back.params == json.loads(json.dumps(r.params))
    assert load_patterns(tmp_path) == list(r.patterns)


def test_corrupt_or_foreign_patterns_file_names_the_file(tmp_path):
    ws = Workspace(tmp_path)
    (tmp_path / "mined").mkdir()
    f = tmp_path / "mined" / "patterns.json"
    f.write_text("{not json")
    with pytest.raises(WorkspaceError, match="patterns.json"):
        load_patterns(ws)
    f.write_text(json.dumps({"schema": 99, "kind": "MiningResult", "result": {}}))
    with pytest.raises(WorkspaceError, match="schema 99"):
        load_patterns(ws)
    f.write_text(json.dumps({"schema": 1, "kind": "MiningResult", "result": {"patterns": [{"id": "p1"}]}}))
    with pytest.raises(WorkspaceError, match="malformed"):
        load_patterns(ws)


def test_cli_mine_patterns_show(tmp_path, toy_graphs, capsys):
    ws = Workspace(tmp_path)
    for g in toy_graphs:
        ws.save_graph(g)
    assert main(["--workspace", str(tmp_path), "mine", "--max-nodes", "6"]) == 0
    out = capsys.readouterr().out
    assert "patterns" in out and "wrote" in out
    patterns = load_patterns(ws)
    assert patterns and all(p.n_compute <= 6 for p in patterns)
    assert main(["--workspace", str(tmp_path), "patterns", "--top", "5"]) == 0
    table = capsys.readouterr().out
    from miner.commands.patterns import ranked

    best = ranked(patterns)[0][0]  # the one ranking (est. us/step), not mining's order
    assert "ranked by estimated time saved per step" in table.splitlines()[0]
    assert best.id in table.splitlines()[3] and "safe" in table.splitlines()[1]
    assert main(["--workspace", str(tmp_path), "patterns", "show", patterns[0].id]) == 0
    shown = capsys.readouterr().out
    assert f"pattern {patterns[0].id}" in shown and "def pattern(" in shown and "support:" in shown
    assert main(["--workspace", str(tmp_path), "patterns", "show", patterns[0].id[:-1] + "z"]) == 2
    err = capsys.readouterr().err
    assert "unknown pattern id" in err and patterns[0].id in err


def test_show_groups_rejection_reasons(toy_graphs):
    from miner.commands.patterns import find, show

    g = fx_graph(lambda x: torch.exp(x.t()).sum(1, keepdim=True) + 1.0, torch.randn(8, 4))
    r = mine([g, rekey(g, index=1)])
    rejected = [p for p in r.patterns if p.rejections]
    assert rejected and rejected[0].counts.safe == 0
    text = show(rejected[0])
    assert "rejected occurrences, by reason:" in text and "  meta (2):" in text
    assert "2x in0 is not contiguous" in text and "REJECTED" in text
    with pytest.raises(UsageError, match="close"):
        find(r.patterns, rejected[0].id[:4] + "zzzzzz")


# --------------------------------------------------------------------------- real captures

REAL = {  # model -> blocks the tiny model must show (walker, max compute nodes to mine)
    "bert": [("softmax", walk_softmax, 5), ("layer_norm", walk_layer_norm, 7), ("gelu_erf", walk_gelu_erf, 5)],
    "gpt2": [("softmax", walk_softmax, 5), ("layer_norm", walk_layer_norm, 7), ("gelu_tanh", walk_gelu_tanh, 8)],
    "llama": [("rms_norm", walk_rms_norm, 6), ("silu_mul", walk_silu_mul, 5)],
    "t5": [("softmax", walk_softmax, 5)],
}


def _real_graphs(model):
    ws = Workspace(REPO)
    graphs = [g for g in ws.load_graphs([model]) if g.key.preset == "tiny"] if ws.graph_files([model]) else []
    if not graphs:
        pytest.skip(f"no committed tiny captures of {model}")
    return graphs


@pytest.mark.parametrize("model, block, walker, k",
                         [(m, b, w, k) for m, items in REAL.items() for b, w, k in items],
                         ids=[f"{m}-{b}" for m, items in REAL.items() for b, _, _ in items])
def test_real_tiny_models_show_their_blocks_with_walked_counts(model, block, walker, k):
    graphs = _real_graphs(model)
    pid, n, where = _expected(graphs, walker)
    # Mining only up to the block's size keeps this test fast; counts must match the walk.
    holding = [g for g in graphs if str(g.key) in where]
    r = mine(holding, MineOptions(closed_only=False, max_nodes=k, max_views=2 if block == "layer_norm" else 0,
                                  min_support=len(holding)))
    p = r.by_id()[pid]
    assert p.counts.total == n and p.counts.non_overlapping == n
    assert set(p.support.graphs) == where


def test_committed_reference_patterns_show_the_known_blocks():
    path = REPO / "mined" / "patterns.json"
    if not path.exists():
        pytest.skip("no committed mined/patterns.json")
    assert path.stat().st_size < 5_000_000  # kept small: capped patterns and stored occurrences
    result = load_mining(Workspace(REPO))  # also checks every id against its canonical form
    ops = {p.ops: p for p in result.patterns}
    for block in ("mul -> mul -> erf -> add -> mul",                      # GELU (erf), bert
                  "mul -> pow -> mul -> add -> mul -> tanh -> add -> mul",  # GELU (tanh), gpt2
                  "neg -> exp -> add -> div -> mul",                      # SiLU(gate) * up, llama
                  "pow -> mean -> add -> rsqrt -> mul -> mul",            # RMS norm, llama and t5
                  "var_mean -> sub -> add -> rsqrt -> mul -> mul -> add",  # layer norm, bert and gpt2
                  "amax -> sub -> exp -> sum -> log -> sub"):             # log-softmax (the loss)
        assert block in ops, block
        assert ops[block].counts.safe > 0
    assert any("amax -> sub -> exp -> sum -> div" in p.ops for p in result.patterns)  # softmax (+ dropout)
    assert result.stats["reported_patterns"] >= len(result.patterns) == result.params["limit"]


def test_pattern_function_is_traceable_by_make_fx():
    from torch.fx.experimental.proxy_tensor import make_fx

    g = fx_graph(gelu_erf_fn, torch.randn(4, 8), torch.randn(8, 8))
    p = pattern_at(g, sorted(walk_gelu_erf(g)[0]))
    gm = make_fx(p.to_fx_function(scalars=p.occurrences[0].scalars))(torch.randn(4, 8))
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert targets == [f"aten.{n.target.split('.', 1)[1]}" for n in p.nodes]
