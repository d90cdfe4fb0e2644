"""The outer-reduction region kind (issue 30): runtime pieces, the plan's class, the committed candidates."""

import pytest
import torch

from miner.runtime import reduce as R


@pytest.mark.parametrize("rows", [32, 100])  # 32: per-row pre-aggregation in a program; 100: one atomic per element
def test_index_put_acc_matches_torch(rows):
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(-1, rows, (37, 19), generator=g)
    vals = torch.randn(3, 37, 19, generator=g).permute(1, 2, 0)  # [37, 19, 3], strided like t5's values
    got = R.index_put_acc(torch.zeros(rows, 3), idx, vals)
    want = torch.zeros(rows, 3, dtype=torch.float64).index_put_([idx], vals.double(), accumulate=True)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_index_put_acc_refuses_mismatched_values():
    with pytest.raises(ValueError, match="values"):
        R.index_put_acc(torch.zeros(4, 3), torch.zeros(5, dtype=torch.int64), torch.zeros(5, 2))


def test_kept_view_inverts_the_chain():
    kept = (1, 3, 5, 7)
    chain = (("squeeze", (0,)), ("permute", (1, 2, 0)))
    buf = torch.arange(105.0).reshape(kept)
    end = R.apply_chain(buf, chain)
    assert end.shape == (5, 7, 3)
    assert torch.equal(R.kept_view(end, kept, chain), buf)
    mask = torch.arange(35.0).reshape(5, 7, 1)  # broadcast along the last end dim, as t5's bucket mask
    k = R.kept_view(mask, kept, chain)
    assert k.shape == kept and torch.equal(k[0, 2], mask[..., 0])


def test_structure_of_normalizes_dims():
    def f(x):
        return torch.ops.aten.sum.dim_IntList(x, [-4], True).squeeze(0).permute(1, 2, 0)
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(f)(torch.zeros(2, 3, 4, 5))
    rows = R.structure_of(gm.graph.nodes)
    assert ("sum", (0,), True) in rows and ("permute", (1, 2, 0)) in rows


def test_small_sizes_keep_products():
    from miner.generate.reduce import small_sizes

    m = small_sizes([[16, 12, 512, 512], [192, 512, 512], [512, 512]], (3, 2, 37))
    assert (m[16], m[12], m[512], m[192]) == (2, 3, 37, 6)


def _pattern(nodes, n_inputs, outputs):
    from miner.core.pattern import Pattern, PatternNode

    ns = tuple(PatternNode(t, c, tuple(a), {}) for t, c, a in nodes)
    return Pattern(id="ptest", nodes=ns, n_inputs=n_inputs, n_consts=0, outputs=tuple(outputs))


def test_plan_takes_outer_sums_and_refuses_last_dim_and_two_levels():
    from miner.generate.lower import Unsupported
    from miner.generate.reduce import applies, plan

    outer = _pattern([("aten.sum.dim_IntList", "reduction", [{"input": 0}, [0], True])], 1, [0])
    assert applies(outer, [((1, 4, 8), "float32")])
    pl = plan(outer, [((1, 4, 8), "float32")], ["float32"])
    assert pl.reduced == (0,) and pl.f_inputs == {0: ()}
    last = _pattern([("aten.sum.dim_IntList", "reduction", [{"input": 0}, [-1], True])], 1, [0])
    with pytest.raises(Unsupported, match="last dim"):
        plan(last, [((2, 4, 1), "float32")], ["float32"])
    two = _pattern([("aten.sum.dim_IntList", "reduction", [{"input": 0}, [0], True]),
                    ("aten.sub.Tensor", "pointwise", [{"input": 0}, {"node": 0}])], 1, [1])
    with pytest.raises(Unsupported, match="per reduced and per kept"):
        plan(two, [((1, 4, 8), "float32"), ((2, 4, 8), "float32")], ["float32"])


@pytest.mark.parametrize("cid", ["p86f4808f37", "p0be6059bb5"])
def test_committed_candidate_matches_float64_at_odd_sizes(cid):
    from miner.check import reduce as check
    from miner.core import candidate
    from miner.core.workspace import Workspace

    cand = candidate.load(Workspace("."), cid)
    entry = cand.meta["observed"][0]
    xs = check.inputs_for(entry, (2, 3, 11), 32, "cpu", seed=3)
    c = check.check_case(cand, "odd", xs, [float(s) for s in entry["scalars"]])
    assert c.ok, c.detail


def test_a_region_whose_nodes_another_kernel_recomputes_is_not_generated():
    # t5's default-compile bias gradient: each layer's softmax-gradient fma is computed in this kernel and
    # in the softmax-backward kernel; in the FX graph it has readers outside, so the region never matched
    # on the GPU. The knob graph's region shares only constants: generated.
    import json
    from pathlib import Path

    from miner.generate import reduce as gen_reduce
    from miner.mine import regions

    root = Path(__file__).resolve().parents[1] / "reports" / "gpu"
    cases = {"2026-12-03-h200-profile": ("p22ab0db507", 12), "2026-12-06-h100-t5-knob-profile": ("p86f4808f37", 0)}
    for run, (rid, n) in cases.items():
        d = json.loads((root / run / "mined" / "regions.json").read_text())
        [r] = [r for r in d["region_patterns"] if r["id"] == rid]
        got = gen_reduce.recomputed_elsewhere(regions.region_pattern_from_json(r).pattern)
        assert len(got) == n, (rid, got)


def test_an_embedding_tables_rows_stay_literal_when_tied():
    # DebertaV2's position-embedding gradient (2026-12-06): full([512, 1536]) filled by index_put with the
    # positions: its 512 rows were tied to the sequence length (also 512), so at any other length the
    # table shrank under the indices ("index 52 is out of bounds for dimension 0 with size 2")
    from dataclasses import replace as dc_replace

    from miner.core.pattern import PatternNode
    from miner.generate.reduce import tie_shapes

    nodes = (
        PatternNode("aten.full.default", "other", ([512, 1536], {"const": 0}), {"device": {"device": "cuda:0"}}),
        PatternNode("aten.sum.dim_IntList", "reduction", ({"input": 1}, [-3], True), {}),
        PatternNode("aten.index_put.default", "other", ({"node": 0}, [{"input": 0}], {"node": 1}, True), {}),
    )

    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Pat:  # what tie_shapes reads and replaces
        nodes: tuple

    def shape(p):
        return [s if not isinstance(s, dict) else tuple(s["dim_of"]) for s in tie_shapes(p, [[1, 512], [16, 512, 1536]]
                                                                                         ).nodes[0].args[0]]

    assert shape(Pat(nodes)) == [512, (1, 2)]  # rows literal, columns follow the hidden size
    assert shape(dc_replace(Pat(nodes), nodes=nodes[:2])) == [(0, 1), (1, 2)]  # no index_put fills it: both tied
