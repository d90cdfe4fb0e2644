"""Mining with occurrence support and the fusable op classes (cat, gathers, iota, RNG, masks...)."""

from __future__ import annotations

import pytest
import torch

from miner.core.ops import fusable_extra, op_class
from miner.mine.mine import MineOptions, mine, occurrence_support
from tests.test_mine_helpers import fx_graph


def _two_layers(x, w1, w2):
    h = torch.tanh((x @ w1) * 0.5) + 1.0
    return torch.tanh((h @ w2) * 0.5) + 1.0


def test_a_block_repeated_in_the_layers_of_one_graph_is_frequent():
    g = fx_graph(_two_layers, torch.randn(4, 8), torch.randn(8, 8), torch.randn(8, 8))
    (p,) = [p for p in mine([g]).patterns if p.ops == "mul -> tanh -> add"]
    assert p.support.n_graphs == 1 and p.counts.non_overlapping == 2
    assert not [p for p in mine([g], MineOptions(min_support=3)).patterns if p.ops == "mul -> tanh -> add"]
    assert not [p for p in mine([g], MineOptions(support="graphs")).patterns if p.ops == "mul -> tanh -> add"]


def test_occurrence_support_is_the_minimum_image_count():
    # a star: node 0 with users 1, 2, 3; the pattern (0 -> user) embeds three times at one root
    embs = [(0, (0, 1)), (0, (0, 2)), (0, (0, 3))]
    assert occurrence_support(embs) == 1  # the root is one graph node: overlapping embeddings count once
    assert occurrence_support(embs + [(1, (0, 1))]) == 2  # another graph
    assert occurrence_support([]) == 0


def test_unknown_support_rule_is_an_error():
    g = fx_graph(_two_layers, torch.randn(4, 8), torch.randn(8, 8), torch.randn(8, 8))
    with pytest.raises(ValueError, match="support"):
        mine([g], MineOptions(support="nodes"))


def test_op_classes():
    assert op_class("aten.cat.default", "other") == "concat"
    assert op_class("prims.inductor_random.default", "random") == "random"
    assert op_class("aten.exp.default", "pointwise") == "pointwise"
    assert fusable_extra("aten.cat.default", "other") and fusable_extra("prims.iota.default", "other")
    assert fusable_extra("prims.prepare_softmax_online.default", "other")
    assert fusable_extra("prims.inductor_lookup_seed.default", "random")
    assert not fusable_extra("aten.exp.default", "pointwise")  # already compute
    assert not fusable_extra("aten.slice.Tensor", "view")  # views stay connectors
    assert not fusable_extra("aten.mm.default", "matmul")


def _cat_block(x, y):
    z = torch.cat([x * 2.0, y * 2.0], -1)
    return torch.where(z > 0, z, 0.0).sum(-1)


def test_cat_is_part_of_mined_patterns_and_generate_skips_it():
    from miner.generate.generate import supported
    a = fx_graph(_cat_block, torch.randn(4, 8), torch.randn(4, 8), model="a")
    b = fx_graph(_cat_block, torch.randn(4, 8), torch.randn(4, 8), model="b")
    pats = mine([a, b]).patterns
    with_cat = [p for p in pats if any(n.target == "aten.cat.default" for n in p.nodes)]
    assert with_cat, [p.ops for p in pats]
    assert {p.support.n_graphs for p in with_cat} == {2}
    for p in with_cat:
        why = supported(p)
        assert why is not None and "cat" in why, why


def test_limit_builds_the_same_top_patterns():
    from tests.test_mine import _toy
    from tests.test_mine_helpers import rekey
    torch.manual_seed(0)
    g = fx_graph(_toy, torch.randn(4, 8), torch.randn(8, 8), torch.randn(8), torch.randn(8), model="toy")
    graphs = [g, rekey(g, model="toy2", phase="inference", mode="infer")]
    full = mine(graphs, MineOptions(closed_only=False))
    assert len(full.patterns) > 20
    for k in (1, 5, 20):
        top = mine(graphs, MineOptions(closed_only=False, limit=k))
        assert top.patterns == full.patterns[:k]
        assert top.stats["reported_patterns"] == len(full.patterns)
        assert k <= top.stats["built_patterns"] < len(full.patterns)
