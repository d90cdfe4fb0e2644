"""A real scan of tiny bert and gpt2 (torch.compile, no mocks): graphs, categories, softmax and layer-norm."""

from collections import Counter

import pytest

from miner.cli import main
from miner.core.graph import to_networkx
from miner.core.workspace import Workspace


@pytest.fixture(scope="module")
def scanned(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo")
    assert main(["--workspace", str(root), "scan", "--models", "bert,gpt2"]) == 0
    return Workspace(root)


@pytest.mark.parametrize("model", ["bert", "gpt2"])
def test_forward_and_backward_graphs(scanned, model):
    (result,) = [r for r in scanned.scans() if r.model == model]
    assert result.ok and result.graph_breaks == 0
    assert Counter(k.phase for k in result.graphs) == {"forward": 1, "backward": 1}
    graphs = scanned.load_graphs([model])
    assert len(graphs) == 2
    for g in graphs:
        cats = Counter(n.category for n in g.nodes if n.op == "call_function")
        assert cats["pointwise"] > 50 and cats["reduction"] > 5 and cats["matmul"] >= 8 and cats["view"] > 10
        assert g.kernels, "the kernel map is empty"
        assert g.provenance["torch"] and g.provenance["kernel_map"]


@pytest.mark.parametrize("model", ["bert", "gpt2"])
def test_softmax_and_layer_norm_with_shapes_and_kernels(scanned, model):
    fwd = next(g for g in scanned.load_graphs([model]) if g.key.phase == "forward")
    by_target = {}
    for n in fwd.nodes:
        by_target.setdefault(n.target, []).append(n)
    # attention softmax: amax -> sub -> exp -> sum -> div over the key axis (seq 64), 4 heads, batch 2
    attention_max = [n for n in by_target["aten.amax.default"] if n.meta[0].shape == (2, 4, 64, 1)]
    assert len(attention_max) == 2  # one per layer (a third amax is the loss's log-softmax)
    exp = next(n for n in by_target["aten.exp.default"] if n.meta[0].shape == (2, 4, 64, 64))
    assert exp.kernels and exp.module
    assert "attn" in exp.module.lower() or "attention" in exp.module.lower(), exp.module
    # layer norm: var_mean over hidden (128) -> rsqrt
    vm = by_target["aten.var_mean.correction"]
    assert len(vm) >= 4 and all(n.meta[0].shape[-1] == 1 and n.kernels for n in vm)
    assert all(n.kernels[0].kind in ("reduction", "persistent_reduction") for n in vm)
    g = to_networkx(fwd)
    rsqrt = by_target["aten.rsqrt.default"][0]
    assert any(g.nodes[p]["op"] == "aten.add.Tensor" for p in g.predecessors(rsqrt.name))
