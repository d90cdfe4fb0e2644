"""Canonical forms: exact identity of patterns (labels, operand positions, shared inputs, constants)."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from miner.mine.canon import code_id, isomorphic, pattern_nodes, structure_order, template_of
from miner.mine.mine import pattern_at
from miner.core.records import NodeRecord
from test_mine_helpers import fx_graph


def _ids(fn, *inputs, names=None):
    g = fx_graph(fn, *inputs)
    picked = names or [n.name for n in g.nodes if n.category in ("pointwise", "reduction")]
    return pattern_at(g, picked)


def test_operand_order_makes_different_patterns():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    ab = _ids(lambda a, b: torch.exp(a - b), x, y)
    ba = _ids(lambda a, b: torch.exp(b - a), x, y)
    assert ab.ops == ba.ops == "sub -> exp"
    # Same structure, but with a and b swapped the first input is the subtrahend: as a pattern
    # over unnamed inputs both are sub(in0, in1) -> exp. The real asymmetry is sub(x, f(x)):
    p1 = _ids(lambda a: torch.exp(a - torch.sigmoid(a)), x)
    p2 = _ids(lambda a: torch.exp(torch.sigmoid(a) - a), x)
    assert p1.id != p2.id
    assert not isomorphic(p1.nodes, p2.nodes)
    assert ab.id == ba.id and isomorphic(ab.nodes, ba.nodes)


def test_scalars_are_abstracted_and_kept_per_occurrence():
    x = torch.randn(4, 8)
    p5 = _ids(lambda a: torch.tanh(a * 0.5), x)
    p7 = _ids(lambda a: torch.tanh(a * 0.7071), x)
    assert p5.id == p7.id and p5.n_consts == 1
    assert p5.occurrences[0].scalars == (0.5,) and p7.occurrences[0].scalars == (0.7071,)
    mul = p5.nodes[0]
    assert mul.args[1] == {"const": 0}


def test_shared_input_is_not_two_inputs():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    xx = _ids(lambda a: torch.exp(a * a), x)
    xy = _ids(lambda a, b: torch.exp(a * b), x, y)
    assert xx.n_inputs == 1 and xy.n_inputs == 2 and xx.id != xy.id


def test_structural_constants_are_part_of_the_label():
    x = torch.randn(4, 8, 16)
    last = _ids(lambda a: torch.exp(a).sum(-1, keepdim=True), x)
    mid = _ids(lambda a: torch.exp(a).sum(1, keepdim=True), x)
    nokeep = _ids(lambda a: torch.exp(a).sum(-1), x)
    assert len({last.id, mid.id, nokeep.id}) == 3
    f32 = _ids(lambda a: torch.exp(a).to(torch.float16).abs(), x)
    f64 = _ids(lambda a: torch.exp(a).to(torch.float64).abs(), x)
    assert f32.id != f64.id


def test_template_abstracts_tensor_and_scalar_slots_only():
    rec = NodeRecord(name="s", op="call_function", target="aten.sum.dim_IntList", category="reduction",
                     args=({"node": "x"}, [-1], True))
    t, refs, consts = template_of(rec)
    assert t.args == ({"ref": 0}, (-1,), True) and refs == ("x",) and consts == ()
    rec = NodeRecord(name="v", op="call_function", target="aten.var_mean.correction", category="reduction",
                     args=({"node": "x"}, [1]), kwargs={"correction": 0, "keepdim": True})
    t, refs, consts = template_of(rec)
    assert t.kwargs == {"correction": 0, "keepdim": True} and consts == ()  # correction is structural
    rec = NodeRecord(name="p", op="call_function", target="aten.pow.Tensor_Scalar", category="pointwise",
                     args=({"node": "x"}, 2))
    assert template_of(rec)[2] == (2,)


def _random_dag(rng: random.Random, n: int):
    """A random connected structure [(label, refs)] over a few labels, with shared inputs."""
    labels = ["add", "sub", "mul", "exp", "div"]
    s = []
    for j in range(n):
        arity = 1 if rng.random() < 0.3 else 2
        refs = []
        for _ in range(arity):
            if j and rng.random() < 0.7:
                refs.append(("n", rng.randrange(j)))
            else:
                refs.append(("x", rng.randrange(3)))
        if j and not any(r[0] == "n" for r in refs):
            refs[0] = ("n", j - 1)
        s.append((labels[rng.randrange(2)] if arity == 2 else labels[3], tuple(refs)))
    return s


def _permute(structure, rng):
    """The same DAG with members renumbered (kept topological) and external ids renamed."""
    n = len(structure)
    # random topological relabelling
    preds = [{r[1] for r in refs if r[0] == "n"} for _, refs in structure]
    order, done = [], set()
    while len(order) < n:
        ready = [j for j in range(n) if j not in done and preds[j] <= done]
        j = rng.choice(ready)
        order.append(j)
        done.add(j)
    new = {old: i for i, old in enumerate(order)}
    ext = {("x", k): ("y", k * 7 + 1) for k in range(3)}
    return [(structure[old][0], tuple(("n", new[r[1]]) if r[0] == "n" else ext[r] for r in structure[old][1]))
            for old in order]


def _as_nodes(code):
    templates = {}
    for lab, refs in code:
        from miner.mine.canon import NodeTemplate
        templates[lab] = NodeTemplate(target=f"aten.{lab}.default", category="pointwise",
                                      args=tuple({"ref": i} for i in range(len(refs))), n_refs=len(refs))
    return pattern_nodes(code, templates)[0]


def test_canonical_code_is_invariant_and_exact_on_random_dags():
    rng = random.Random(0)
    dags = [_random_dag(rng, rng.randrange(2, 8)) for _ in range(60)]
    codes = []
    for s in dags:
        base = structure_order(s)[2]
        for _ in range(5):
            assert structure_order(_permute(s, rng))[2] == base
        codes.append(base)
    # equal codes <=> isomorphic (VF2 on labels and operand positions)
    for (a, ca), (b, cb) in itertools.combinations(list(zip(dags, codes))[:30], 2):
        if len(a) != len(b):
            continue
        assert (ca == cb) == isomorphic(_as_nodes(ca), _as_nodes(cb))


def test_symmetric_sinks_are_permuted_to_the_minimum():
    # y = exp(x); three identical sinks mul(y, in) sharing y; one reads a shared input twice.
    s = [("exp", (("x", 0),)), ("mul", (("n", 0), ("x", 1))), ("mul", (("n", 0), ("x", 2))),
         ("mul", (("n", 0), ("x", 1)))]
    rng = random.Random(1)
    base = structure_order(s)[2]
    for _ in range(10):
        assert structure_order(_permute(s, rng))[2] == base


def test_code_id_is_stable_text():
    code = structure_order([("exp", (("x", 0),)), ("mul", (("n", 0), ("n", 0)))])[2]
    from miner.mine.canon import NodeTemplate
    templates = {"exp": NodeTemplate("aten.exp.default", "pointwise", ({"ref": 0},), n_refs=1),
                 "mul": NodeTemplate("aten.mul.Tensor", "pointwise", ({"ref": 0}, {"ref": 1}), n_refs=2)}
    pid, form = code_id(code, templates)
    # the id is a content hash of the canonical text: pinned so that it never drifts silently
    assert form == ('{"n_consts":0,"n_inputs":1,"nodes":[["aten.exp.default",[{"input":0}],{}],'
                    '["aten.mul.Tensor",[{"node":0},{"node":0}],{}]]}')
    assert pid == "p" + __import__("hashlib").sha1(form.encode()).hexdigest()[:10]


@pytest.mark.parametrize("seed", [0, 1])
def test_pattern_source_evaluates_like_the_traced_function(seed):
    torch.manual_seed(seed)
    x = torch.randn(3, 16)
    g = fx_graph(lambda a: torch.softmax(a * 0.125, -1), x)
    p = pattern_at(g, [n.name for n in g.nodes if n.category in ("pointwise", "reduction")])
    (out,) = p.evaluate([x], p.occurrences[0].scalars)
    torch.testing.assert_close(out, torch.softmax(x * 0.125, -1))
    fn = p.to_fx_function()
    torch.testing.assert_close(fn(x, 0.125)[0], out)
