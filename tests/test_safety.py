"""Safety rules: each unsafe case is rejected with its rule's reason, and its safe twin accepted."""

from __future__ import annotations

import importlib

import pytest
import torch

from miner.rules import safety
from miner.mine.mine import MineOptions, mine, pattern_at
from miner.core.pattern import Occurrence
from test_mine_helpers import fx_graph, rekey

X = torch.randn(4, 8)
W = torch.randn(8, 8)


def _compute(g, *targets):
    """Names of the graph's pointwise/reduction nodes (optionally only these targets)."""
    return [n.name for n in g.nodes if n.category in ("pointwise", "reduction")
            and (not targets or n.target.split(".")[1] in targets)]


def _rules(verdict):
    return {r.split(":", 1)[0] for r in verdict.reasons}


def _verdict(fn, *inputs, names=None, **kw):
    g = fx_graph(fn, *inputs)
    p = pattern_at(g, names(g) if callable(names) else (names or _compute(g)), **kw)
    return p.occurrences[0].verdict, p


# --------------------------------------------------------------------------- users


def _escaping(x, w):
    a = torch.exp(x)
    b = a * 2.0
    c = b + 1.0
    return c @ w, b @ w  # b (interior) is also used by a matmul outside


def _contained(x, w):
    a = torch.exp(x)
    b = a * 2.0
    c = b + 1.0
    return c @ w


def test_escaping_interior_user_becomes_an_extra_output():
    v, p = _verdict(_escaping, X, W)
    assert v.ok and v.extra_outputs == (1,)  # mul is node 1 in canonical order
    assert p.nodes[1].short == "mul" and p.occurrences[0].outputs == (1, 2)


def test_escaping_users_beyond_the_cap_reject():
    v, _ = _verdict(_escaping, X, W, max_extra_outputs=0)
    assert not v.ok and _rules(v) == {"users"}
    assert "1 interior nodes are used outside (n1)" in v.reasons[0]
    twin, _ = _verdict(_contained, X, W, max_extra_outputs=0)
    assert twin.ok and twin.extra_outputs == ()


def test_multi_output_node_read_through_an_outside_getitem_rejects():
    def f(x, w):
        var, mean = torch.var_mean(x, -1, keepdim=True, correction=0)
        return ((x - mean) * 2.0) @ w, var @ w.t()[:1]

    g = fx_graph(f, X, W)
    names = [n.name for n in g.nodes if n.target in ("aten.var_mean.correction", "aten.sub.Tensor",
                                                      "aten.mul.Tensor")]
    names += [n.name for n in g.nodes if n.target == "operator.getitem" and n.args[1] == 1]
    v = pattern_at(g, names).occurrences[0].verdict
    assert not v.ok and any("multi-output" in r for r in v.reasons)


# --------------------------------------------------------------------------- aliasing


def _view_escapes(x, w):
    a = torch.exp(x)
    v = a.view(8, 4)
    return (v + 1.0) @ w[:4], v.sum()  # the interior view is read outside


def _view_inside(x, w):
    a = torch.exp(x)
    v = a.view(8, 4)
    return (v + 1.0) @ w[:4]


def _names_exp_view_add(g):
    return [n.name for n in g.nodes if n.target in ("aten.exp.default", "aten.view.default", "aten.add.Tensor")]


def test_interior_view_used_outside_rejects_and_twin_passes():
    v, _ = _verdict(_view_escapes, X, W, names=_names_exp_view_add)
    assert not v.ok and _rules(v) == {"aliasing"} and "view n1(view) is used outside" in v.reasons[0]
    twin, _ = _verdict(_view_inside, X, W, names=_names_exp_view_add)
    assert twin.ok, twin.reasons


def test_output_returned_with_a_view_of_it_rejects():
    def f(x):
        y = torch.exp(x) + 1.0
        return y, y.view(-1)

    def twin_f(x):
        y = torch.exp(x) + 1.0
        return y, (y * 3.0).view(-1)

    v, _ = _verdict(f, X)
    assert not v.ok and _rules(v) == {"aliasing"}
    twin, _ = _verdict(twin_f, X, names=lambda g: _compute(g, "exp", "add"))
    assert twin.ok, twin.reasons


# --------------------------------------------------------------------------- mutation


def _buffer_update(x, buf):
    y = torch.exp(buf) + 1.0
    buf.copy_(x)  # the copy_ epilogue of a buffer update
    return y


def _no_update(x, buf):
    return torch.exp(buf) + 1.0


def test_input_written_by_copy_epilogue_rejects_and_twin_passes():
    v, _ = _verdict(_buffer_update, X, X.clone())
    assert not v.ok and _rules(v) == {"mutation"} and "copy_" in v.reasons[0]
    twin, _ = _verdict(_no_update, X, X.clone())
    assert twin.ok


def test_in_place_op_inside_rejects():
    def f(x):
        y = torch.exp(x)
        y.add_(1.0)
        return y * 2.0

    g = fx_graph(f, X)
    names = [n.name for n in g.nodes if n.op == "call_function"]
    assert any(n.category == "mutation" for n in g.nodes)
    occ = Occurrence(graph=g.key, nodes=tuple(names), inputs=("x_1",), outputs=(len(names) - 1,))
    v = safety.check(occ, g)
    assert not v.ok and "mutation" in _rules(v)
    # and the miner never puts a mutation into a pattern
    r = mine([g, rekey(g, index=1)], MineOptions(closed_only=False))
    assert all(n.category in ("pointwise", "reduction", "view") for p in r.patterns for n in p.nodes)


# --------------------------------------------------------------------------- randomness


def test_random_op_inside_rejects_and_is_never_mined():
    def f(x):
        y = torch.exp(x)
        return (y * torch.rand_like(y)) + 1.0

    g = fx_graph(f, X)
    names = [n.name for n in g.nodes if n.op == "call_function"]
    rand = [n for n in g.nodes if n.category == "random"]
    assert rand
    occ = Occurrence(graph=g.key, nodes=tuple(names), inputs=("x_1",), outputs=(len(names) - 1,))
    v = safety.check(occ, g)
    assert not v.ok and "randomness" in _rules(v)
    r = mine([g, rekey(g, index=1)], MineOptions(closed_only=False))
    assert r.patterns and all(rand[0].target != n.target for p in r.patterns for n in p.nodes)
    twin = pattern_at(g, _compute(g, "mul", "add")).occurrences[0].verdict
    assert twin.ok, twin.reasons


# --------------------------------------------------------------------------- meta


X3 = torch.randn(2, 4, 8)


@pytest.mark.parametrize("fn, text", [
    (lambda x: torch.exp(x).sum(1, keepdim=True), "reduces dims [1] of [2, 4, 8]; the kernel reduces the last"),
    (lambda x: torch.exp(x).sum([1, 2], keepdim=True), "reduces dims [1, 2]"),
    (lambda x: torch.exp(x).sum(), "reduces dims [0, 1, 2]"),
])
def test_reduction_not_over_the_last_dim_rejects(fn, text):
    v, _ = _verdict(fn, X3)
    assert not v.ok and _rules(v) == {"kernel"} and any(text in r for r in v.reasons), v.reasons


def test_last_dim_reduction_passes():
    v, _ = _verdict(lambda x: torch.exp(x) / torch.exp(x).sum(-1, keepdim=True), X3)
    assert v.ok, v.reasons


def test_dropped_reduced_dim_used_inside_rejects():
    v, _ = _verdict(lambda x: torch.exp(x.sum(-1)), X3)
    assert not v.ok and "keepdim=False" in v.reasons[0]
    twin, _ = _verdict(lambda x: torch.exp(x).sum(-1), X3)  # the reduction is the output: fine
    assert twin.ok, twin.reasons


def test_a_region_takes_a_non_contiguous_input_with_a_note():
    """A region kernel reads every input in place through its strides (``test_region.py`` runs one on
    t5's heads-last bias): the reason a row kernel declines is a note for a region."""
    from miner.rules.safety import check_meta

    g = fx_graph(lambda x: torch.exp(x.t()) + 1.0, X)
    occ = pattern_at(g, _compute(g)).occurrences[0]
    row, region = check_meta(occ, g), check_meta(occ, g, region=True)
    assert any("not contiguous" in r for r in row.reasons)
    assert not region.reasons and any("not contiguous" in n for n in region.notes)


def test_non_contiguous_input_rejects_and_contiguous_twin_passes():
    v, _ = _verdict(lambda x: torch.exp(x.t()) + 1.0, X)
    assert not v.ok and _rules(v) == {"meta"} and "not contiguous" in v.reasons[0]
    twin, _ = _verdict(lambda x: torch.exp(x) + 1.0, X)
    assert twin.ok


@pytest.mark.parametrize("other, ok", [
    (torch.randn(2, 4, 8), True),   # full
    (torch.randn(2, 4, 1), True),   # per row
    (torch.randn(8), True),         # per column (a LayerNorm weight)
    (torch.randn(()), True),        # scalar
    (torch.randn(2, 1, 8), False),  # a middle-dim broadcast
    (torch.randn(4, 8), False),     # a leading-dim broadcast
])
def test_broadcasting_a_row_kernel_can_do(other, ok):
    v, _ = _verdict(lambda x, y: torch.exp(x) * y, X3, other)
    assert v.ok == ok, v.reasons
    if not ok:
        assert "broadcasts operand 1" in v.reasons[0]


def test_dtype_mix_rejects_and_cast_twin_passes():
    half = torch.randn(4, 8, dtype=torch.float16)
    v, _ = _verdict(lambda a, b: torch.exp(a) + b, X, half)
    assert not v.ok and "mixes dtypes ['float16', 'float32']" in v.reasons[0]
    twin, _ = _verdict(lambda a, b: torch.exp(a) + b.float(), X, half)
    assert twin.ok, twin.reasons


def test_every_rule_is_registered_and_reasons_name_their_rule():
    assert set(safety.RULES) == {"users", "aliasing", "mutation", "meta", "randomness", "kernel"}
    v, _ = _verdict(lambda x: torch.exp(x.t()).sum(0), X)
    assert v.reasons and all(r.split(":")[0] in safety.RULES for r in v.reasons)


def test_non_convex_occurrence_rejects():
    def f(x, w):
        a = torch.exp(x)
        m = a @ w  # leaves the pattern ...
        return torch.tanh(a + m)  # ... and comes back

    v, _ = _verdict(f, X, W)
    assert not v.ok and any("not convex" in r for r in v.reasons)
    twin, _ = _verdict(lambda x, w: torch.tanh(torch.exp(x) + x @ w), X, W)
    assert twin.ok, twin.reasons


def _two_layers(b, x):
    """A shared value ``s`` (t5's position bias) read by two layers, the second layer's input computed
    from the first layer's output."""
    s = b + 1.0
    y1 = torch.tanh(x + s)
    m = y1 * 3.0
    return torch.tanh(m + s)


def test_a_shared_value_the_replacement_recomputes_is_no_cycle():
    """Layer 2's region holds ``s``; ``s`` is also read by layer 1, whose output reaches layer 2's input:
    one fused op computing ``s`` would form a cycle (declined: the H100 run's 11 of 12 decoder layers). A
    region recomputes a shared output from its inputs outside the fused op, so from there no cycle forms;
    a path from a node the fused op computes still declines."""
    g = fx_graph(_two_layers, X, X)
    adds = [n.name for n in g.nodes if n.target == "aten.add.Tensor"]
    tanhs = [n.name for n in g.nodes if n.target == "aten.tanh.default"]
    s, add2, t2 = adds[0], adds[2], tanhs[1]
    occ = pattern_at(g, [s, add2, t2]).occurrences[0]
    assert "not convex" in " ".join(safety.check_users(occ, g, max_extra_outputs=1).reasons)
    ok = safety.check_users(occ, g, max_extra_outputs=1, recomputed=frozenset({s}))
    assert not any("not convex" in r for r in ok.reasons), ok.reasons
    wrong = safety.check_users(occ, g, max_extra_outputs=1, recomputed=frozenset({add2}))  # planted: the wrong node
    assert "not convex" in " ".join(wrong.reasons)


def test_recomputed_names_are_the_shared_outputs_and_what_they_depend_on():
    """``check_match``'s split of a match's outputs: the first ``kernel_outputs`` are the fused op's, the
    rest (a region's shared outputs) and the match's nodes they depend on are recomputed outside it."""
    gm = torch.fx.symbolic_trace(lambda b, x: torch.tanh(x + torch.exp(b + 1.0)))
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert [n.name for n in nodes] == ["add", "exp", "add_1", "tanh"]
    _, exp, add_x, tanh = nodes

    class Match:  # the two things recomputed_names reads of an Inductor Match
        def __init__(self, outs):
            self.nodes, self._outs = nodes, outs

        def output_nodes(self):
            return self._outs

    occ = Occurrence(graph="m", nodes=tuple(n.name for n in nodes), inputs=("b", "x"), outputs=())
    shared_exp = Match([tanh, exp])
    assert safety.recomputed_names(shared_exp, occ, 1) == {"exp", "add"}
    assert safety.recomputed_names(shared_exp, occ, 2) == frozenset()  # every output the kernel's
    assert safety.recomputed_names(shared_exp, occ, None) == frozenset()  # unknown op: nothing skipped
    assert add_x.name not in safety.recomputed_names(shared_exp, occ, 1)


def test_the_fx_fast_paths_read_what_the_records_say():
    """``FxGraph`` answers view chains, graph facts and seed lookups from FX nodes without converting every node
    (t5's compile: the pass 25 s -> 7 s on the CPU, reports/cpu/2026-12-07-pass-cost); they must agree with the record path mining uses,
    on a graph with views of views, kwargs, in-place ops, outputs that are views and random draws."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from miner.core.fxnode import node_record
    from miner.core.records import CapturedGraph, GraphKey

    def fn(x, w):
        y = x.t().reshape(-1).view(4, 6)[1:].transpose(0, 1)  # a chain of views
        z = torch.nn.functional.dropout(torch.exp(y), 0.1, training=True)
        b = torch.zeros(6, 3)
        b.add_(y.contiguous())  # written in place
        return y.unsqueeze(0), z.sum(dim=-1, keepdim=True), torch.mm(w, w.t()).expand(2, 4, 4), b

    gm = make_fx(fn)(torch.randn(6, 4), torch.randn(4, 5))
    fx = safety.FxGraph(gm.graph)
    recs = CapturedGraph(GraphKey("m", "tiny", "train", "forward", 0), tuple(node_record(n) for n in gm.graph.nodes))
    views = [n.name for n in gm.graph.nodes if fx.view_source(n.name) is not None]
    assert len(views) >= 6, views  # the fixture does exercise the chains
    for n in gm.graph.nodes:
        assert fx.view_source(n.name) == safety.view_source(recs, n.name), n.name
        assert safety._base(fx, n.name) == safety._base(recs, n.name), n.name
    facts, want = safety._graph_facts(fx), safety._graph_facts(recs)
    assert {k: facts[k] for k in ("outputs", "out_bases", "written")} == \
        {k: want[k] for k in ("outputs", "out_bases", "written")}
    assert facts["written"]  # the in-place add's storage is found through its views
    assert [r.name for r in safety.seed_lookups(fx)] == [r.name for r in safety.seed_lookups(recs)] == []

    importlib.import_module("torch._inductor.inductor_prims")  # registers Inductor's random prims
    prims = torch.ops.prims

    def draws(x):  # Inductor's random numbers as its replace_random pass writes them
        seeds = prims.inductor_seeds.default(3, x.device)
        a = prims.inductor_random.default([4, 6], prims.inductor_lookup_seed.default(seeds, 0), "rand")
        b = prims.inductor_random.default([4, 6], prims.inductor_lookup_seed.default(seeds, 2), "randn")
        return x * (a > 0.1) + b

    gm = make_fx(draws)(torch.randn(4, 6))
    fx = safety.FxGraph(gm.graph)
    recs = CapturedGraph(GraphKey("m", "tiny", "train", "forward", 0), tuple(node_record(n) for n in gm.graph.nodes))
    found = [r.name for r in safety.seed_lookups(fx)]
    assert len(found) == 2 and found == [r.name for r in safety.seed_lookups(recs)]
