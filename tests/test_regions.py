"""Regions: each kernel call site's FX node set as a canonical pattern (``miner.regions``).

Real data: ``fixtures/h200_regions.json``, a small extract of the H200 captures (t5, llama, gpt2,
bert base training; ``fixtures/make_h200_regions.py`` regenerates it) with the regions the whole
graphs give.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from miner.core.ops import op_class
from miner.mine import regions
from miner.core.records import CapturedGraph, GraphKey, KernelRef, NodeRecord, from_json
from miner.core.tensors import TensorSpec
from miner.core.workspace import Workspace
from tests.test_mine_helpers import fx_graph, shuffled, with_kernels

FIXTURE = Path(__file__).parent / "fixtures" / "h200_regions.json"


@pytest.fixture(scope="module")
def h200():
    data = json.loads(FIXTURE.read_text())
    graphs = {str(g.key): g for g in (from_json(CapturedGraph, d) for d in data["graphs"])}
    return graphs, data["expected"]


def test_h200_regions_match_the_whole_graphs(h200):
    graphs, expected = h200
    for exp in expected:
        got = {r.kernel.name: r for r in regions.extract(graphs[exp["graph"]])}
        assert len(got) == len(exp["regions"])
        for e in exp["regions"]:
            r = got[e["kernel"]]
            assert (r.pattern.id, list(r.nodes), list(r.inputs), list(r.outputs), r.bytes) == \
                (e["id"], e["nodes"], e["inputs"], e["outputs"], e["bytes"]), e["kernel"]


def test_t5_attention_softmax_is_one_region_pattern_across_layers(h200):
    graphs, _ = h200
    t5 = graphs["t5/base/train-forward-0"]
    rps = regions.group([t5])
    soft = [rp for rp in rps if "embedding" in rp.kernel_names[0] and "safe_softmax" in rp.kernel_names[0]]
    assert len(soft) == 1 and len(soft[0].occurrences) == 2  # two layers' call sites, one pattern
    rp = soft[0]
    # fusable op classes are part of the region: the bias lookup, the mask, online softmax, dropout's RNG
    for op in ("embedding", "where", "prepare_softmax_online", "inductor_lookup_seed", "inductor_random"):
        assert op in rp.ops.split(" -> "), op
    # each layer reads another dropout seed: the index is a scalar slot, not structure
    seeds = [o.region.occurrence.scalars for o in rp.occurrences]
    assert seeds[0] != seeds[1]
    r = rp.occurrences[0].region
    assert r.kernel_name.startswith("triton_per_fused__safe_softmax") and ":" not in r.kernel_name
    # inputs: the seeds, the scores, the mask, the bias table, the bucket indices; 3 outputs
    # (softmax kept for backward, the dropout mask, the dropped-out probabilities)
    assert len(r.inputs) == 5 and len(r.outputs) == 3
    assert abs(r.bytes - 0.6546e9) / 0.6546e9 < 0.01  # Inductor counted 0.6546 GB for this kernel


def test_region_patterns_group_across_models_and_phases(h200):
    graphs, _ = h200
    rps = regions.group(graphs.values())
    n_sites = sum(len(regions.extract(g)) for g in graphs.values())
    assert sum(len(rp.occurrences) for rp in rps) == n_sites
    for rp in rps:
        assert rp.pattern.counts.total == len(rp.occurrences)
        assert set(rp.pattern.support.models) == {o.region.graph.model for o in rp.occurrences}
    rope = [rp for rp in rps if "cat" in rp.ops.split(" -> ") and "slice" in rp.ops.split(" -> ")]
    assert rope and all(o.region.graph.model == "llama" for o in rope[0].occurrences)


def test_region_ids_ignore_names_and_node_order():
    # a whole committed CPU capture (C++ kernels): rename and re-order every node
    ws = Workspace(Path(__file__).resolve().parents[1])
    g = ws.load_graph(ws.captures / "bert" / "tiny" / "train-backward-0.json")
    a = sorted(r.pattern.id for r in regions.extract(g))
    assert len(a) > 5
    b = sorted(r.pattern.id for r in regions.extract(shuffled(g, seed=3)))
    assert a == b


# --------------------------------------------------------------------------- small synthetic graphs


def _two_kernel_graph():
    def fn(x, w):
        h = x @ w
        e = torch.exp(h)          # recomputed in both kernels
        a = (e * 2.0).sum(-1)     # kernel k1
        b = (e + 1.0).amax(-1)    # kernel k2
        return a, b

    g = fx_graph(fn, torch.randn(4, 8), torch.randn(8, 8))
    names = {n.target.split(".")[1]: n.name for n in reversed(g.nodes) if n.op == "call_function"}
    return g, names  # short op name -> its (first) node


def test_recomputed_producer_is_in_both_regions_and_stored_by_neither():
    g, names = _two_kernel_graph()
    exp, mul, sum_, add, amax = (names[op] for op in ("exp", "mul", "sum", "add", "amax"))
    g = with_kernels(g, {exp: ["k1:1", "k2:2"], mul: ["k1:1"], sum_: ["k1:1"], add: ["k2:2"], amax: ["k2:2"]})
    r1, r2 = regions.extract(g)
    assert r1.kernel.name == "k1:1" and exp in r1.nodes and exp in r2.nodes
    assert r1.outputs == (sum_,) and r2.outputs == (amax,)  # exp never leaves: each kernel recomputes it
    assert r1.inputs == r2.inputs  # the matmul result


def test_a_value_read_by_another_kernel_leaves_its_first_holder():
    g, names = _two_kernel_graph()
    exp, mul, sum_, add, amax = (names[op] for op in ("exp", "mul", "sum", "add", "amax"))
    g = with_kernels(g, {exp: ["k1:1"], mul: ["k1:1"], sum_: ["k1:1"], add: ["k2:2"], amax: ["k2:2"]})
    r1, r2 = regions.extract(g)
    assert set(r1.outputs) == {exp, sum_} and r2.inputs == (exp,)
    p = r1.pattern
    assert len(p.extra_outputs) == 1 and p.nodes[p.extra_outputs[0]].target == "aten.exp.default"


def test_unmapped_views_feeding_a_kernel_join_its_region():
    def fn(x, w):
        h = (x @ w).view(2, 2, 8)
        return torch.relu(h) * 3.0

    g = fx_graph(fn, torch.randn(4, 8), torch.randn(8, 8))
    view = next(n.name for n in g.nodes if n.target.startswith("aten.view"))
    relu = next(n.name for n in g.nodes if n.target.startswith("aten.relu"))
    mul = next(n.name for n in g.nodes if n.target.startswith("aten.mul"))
    (r,) = regions.extract(with_kernels(g, {relu: ["k:1"], mul: ["k:1"]}))
    assert view in r.nodes and r.outputs == (mul,)
    assert r.occurrence.input_meta[0].shape == (4, 8)  # the matmul result, viewed inside the region
    assert regions.region_ops(r.pattern.nodes) == "relu -> mul"


def _seed_graph(index: int) -> CapturedGraph:
    m = TensorSpec((4,), "float32", (1,), "cuda")
    recs = (
        NodeRecord("seeds", "placeholder", "seeds", "input", users=("seed",), meta=(TensorSpec((3,), "int64", (1,)),)),
        NodeRecord("x", "placeholder", "x", "input", users=("mul",), meta=(m,)),
        NodeRecord("seed", "call_function", "prims.inductor_lookup_seed.default", "random",
                   args=({"node": "seeds"}, index), users=("rand",), meta=(TensorSpec((), "int64", ()),),
                   kernels=(KernelRef("k:1", "pointwise"),)),
        NodeRecord("rand", "call_function", "prims.inductor_random.default", "random",
                   args=([4], {"node": "seed"}, "rand"), users=("gt",), meta=(m,), kernels=(KernelRef("k:1", "pointwise"),)),
        NodeRecord("gt", "call_function", "aten.gt.Scalar", "pointwise", args=({"node": "rand"}, 0.1), users=("mul",),
                   meta=(TensorSpec((4,), "bool", (1,)),), kernels=(KernelRef("k:1", "pointwise"),)),
        NodeRecord("mul", "call_function", "aten.mul.Tensor", "pointwise", args=({"node": "gt"}, {"node": "x"}),
                   users=("output",), meta=(m,), kernels=(KernelRef("k:1", "pointwise"),)),
        NodeRecord("output", "output", "output", "output", args=([{"node": "mul"}],)),
    )
    return CapturedGraph(GraphKey("m", "base", "train", "forward", index), recs, (KernelRef("k:1", "pointwise"),))


def test_dropout_seed_index_is_a_value_so_layers_group():
    a, b = (regions.extract(_seed_graph(i))[0] for i in (0, 2))
    assert a.pattern.id == b.pattern.id
    assert a.occurrence.scalars != b.occurrence.scalars and 2 in b.occurrence.scalars
    assert a.bytes == 3 * 8 + 4 * 4 + 4 * 4  # seeds + x in, mul out


class _Profile:
    """What ``regions.group`` needs of a StepProfile."""

    def __init__(self, times):
        self.times = times

    def graph_keys(self):
        return list(self.times)

    def site_times(self, key):
        return self.times[key]


def test_group_attaches_measured_times_and_ranks_by_time_above_floor():
    g0, g2 = _seed_graph(0), _seed_graph(2)
    prof = _Profile({g0.key: {"k:1": (30.0, 10.0, 1.0)}, g2.key: {"k:1": (25.0, None, 1.0)}})
    (rp,) = regions.group([g0, g2], profiles=[prof])
    assert rp.measured == 2 and rp.us_per_step == 55.0
    assert rp.floor_us_per_step == 10.0 and rp.above_floor_us == 20.0  # no floor, no credit
    assert rp.roofline == pytest.approx(10.0 / 30.0)
    assert [o.source for o in rp.occurrences] == ["measured", "measured"]


def test_save_and_load_round_trip(tmp_path, h200):
    graphs, _ = h200
    rps = regions.group(graphs.values())
    ws = Workspace(tmp_path)
    regions.save(ws, rps)
    back = regions.load(ws)
    assert [rp.id for rp in back] == [rp.id for rp in rps]
    for a, b in zip(rps, back):
        assert [o.region.kernel for o in a.occurrences] == [o.region.kernel for o in b.occurrences]
        assert [o.region.outputs for o in a.occurrences] == [o.region.outputs for o in b.occurrences]
        assert b.pattern.canonical() == a.pattern.canonical()


def test_load_names_a_corrupt_file(tmp_path):
    from miner.core.errors import WorkspaceError
    ws = Workspace(tmp_path)
    regions.regions_path(ws).parent.mkdir(parents=True)
    regions.regions_path(ws).write_text("{nope")
    with pytest.raises(WorkspaceError, match="regions.json"):
        regions.load(ws)


def test_many_tied_sinks_fall_back_to_a_deterministic_order():
    # 8 identical sinks: 8! orders is too many to try; the fallback is a function of structure
    labels = {f"s{i}": "exp" for i in range(8)}
    ops = {f"s{i}": (f"in{i % 3}",) for i in range(8)}
    members = list(labels)
    ex, order, inputs, code = regions.region_order(members, labels.__getitem__, ops.__getitem__)
    ex2, _, _, code2 = regions.region_order(members[::-1], labels.__getitem__, ops.__getitem__)
    assert not ex and code == code2 and len(order) == 8


def test_kernel_base_strips_only_a_numeric_handle():
    assert regions.kernel_base("triton_per_fused_x_13:812") == "triton_per_fused_x_13"
    assert regions.kernel_base("extern_kernels.mm") == "extern_kernels.mm"
    assert op_class("aten.cat.default", "other") == "concat"
    assert op_class("aten.exp.default", "pointwise") == "pointwise"


def test_a_getitem_read_outside_its_kernel_is_a_region_output():
    """A multi-output reduction's getitems map to no kernel. DeBERTa's attention region saves the softmax's
    row max and sum for the backward; left out of the outputs, its pattern had inner nodes with readers
    outside and never matched, neither in the tiny step nor at B16 S512 (H100, 2026-12-06: 0 matches)."""
    def fn(x):
        var, mean = torch.var_mean(x, -1, correction=0, keepdim=True)
        return (x - mean) * torch.rsqrt(var + 1e-5), mean, var  # the stats are also read by the graph output

    g = fx_graph(fn, torch.randn(4, 8))
    kernel_ops = ("var_mean", "sub", "add", "rsqrt", "mul")
    names = {n.name: n.target.split(".")[1] for n in g.nodes if n.op == "call_function"}
    getitems = [n for n, op in names.items() if n.startswith("getitem")]
    (r,) = regions.extract(with_kernels(g, {n: ["k:1"] for n, op in names.items() if op in kernel_ops}))
    assert len(getitems) == 2 and set(getitems) <= set(r.nodes)
    assert set(getitems) <= set(r.outputs), r.outputs  # before: only the normalized value left
    p = r.pattern
    assert sorted(p.nodes[j].target for j in p.extra_outputs) == ["operator.getitem"] * 2
