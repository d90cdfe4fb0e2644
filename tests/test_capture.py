"""Capture on small modules (real torch.compile, no mocks), and the private Inductor surface it uses."""

import importlib

import pytest
import torch

from miner.core.fxnode import encode_arg, module_path
from miner.scan.capture import PRIVATE_SURFACE, capture_step, kernel_kind
from miner.core.graph import to_networkx
from miner.core.records import CapturedGraph, from_json, to_json
from miner_models import Built


def test_private_surface():
    """Every private name capture relies on still exists: a torch upgrade that moves one fails here."""
    for dotted in PRIVATE_SURFACE:
        parts = dotted.split(".")
        obj, i = _longest_module(parts)
        for attr in parts[i:]:
            assert hasattr(obj, attr), f"{dotted}: torch no longer has {attr!r}; update miner/capture.py"
            obj = getattr(obj, attr)


def _longest_module(parts):
    for i in range(len(parts), 0, -1):
        try:
            return importlib.import_module(".".join(parts[:i])), i
        except ImportError:
            continue
    raise AssertionError(f"no module in {'.'.join(parts)}")


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x, labels):
        h = torch.softmax(self.norm(self.proj(x)), dim=-1)
        return {"loss": torch.nn.functional.mse_loss(h, labels)}


@pytest.fixture(scope="module")
def block_graphs():
    torch.manual_seed(0)
    m = Block()
    inputs = {"x": torch.randn(4, 16), "labels": torch.rand(4, 16)}
    return capture_step(Built(m, inputs, lambda out: out["loss"]), name="block", preset="tiny", mode="train",
                        device="cpu")


def test_train_step_captures_forward_and_backward(block_graphs):
    phases = [g.key.phase for g in block_graphs.graphs]
    assert phases == ["forward", "backward"]
    assert block_graphs.graph_breaks == 0
    fwd = block_graphs.graphs[0]
    targets = [n.target for n in fwd.nodes]
    for op in ("aten.var_mean.correction", "aten.amax.default", "aten.exp.default", "aten.div.Tensor"):
        assert op in targets


def test_nodes_carry_meta_module_and_kernels(block_graphs):
    fwd = block_graphs.graphs[0]
    exp = next(n for n in fwd.nodes if n.target == "aten.exp.default")
    assert exp.meta[0].shape == (4, 16) and exp.meta[0].dtype == "float32" and exp.meta[0].stride == (16, 1)
    assert exp.category == "pointwise"
    assert exp.kernels and exp.kernels[0].kind in ("pointwise", "reduction")
    var_mean = next(n for n in fwd.nodes if n.target == "aten.var_mean.correction")
    assert len(var_mean.meta) == 2  # (var, mean)
    assert var_mean.module == "norm"
    addmm = next(n for n in fwd.nodes if n.target == "aten.addmm.default")
    assert addmm.category == "matmul" and addmm.kernels[0].kind == "extern"
    # every compute node that is not a view landed in some kernel
    for n in fwd.nodes:
        if n.op == "call_function" and n.category in ("pointwise", "reduction", "matmul"):
            assert n.kernels, n.name


def test_round_trip_and_networkx(block_graphs):
    g = block_graphs.graphs[1]
    again = from_json(CapturedGraph, to_json(g))
    assert again == g
    nxg = to_networkx(again)
    assert nxg.number_of_nodes() == len(g.nodes)
    sub = next(n for n in g.nodes if n.target == "aten.sub.Tensor")
    # operand order is kept on the edges
    for pos, src in sub.inputs():
        assert nxg.edges[src, sub.name]["pos"] == pos


def test_encode_arg_and_kernel_kind():
    assert encode_arg(torch.float16) == {"dtype": "float16"}
    assert encode_arg(float("-inf")) == {"float": "-inf"}
    assert encode_arg([1, (2, 3)]) == [1, [2, 3]]
    assert kernel_kind("triton_per_fused__softmax_0:3", []) == "persistent_reduction"
    assert kernel_kind("triton_red_fused_sum_1:4", []) == "reduction"
    assert kernel_kind("extern_kernels.addmm:1", []) == "extern"
    assert kernel_kind("cpp_fused_exp_sum_2:5", ["pointwise", "reduction"]) == "reduction"


def test_module_path_normalizes_dynamo_paths():
    class N:
        meta = {"nn_module_stack": {"a": ("L['self'].bert.encoder.layer[0].attention", object)}}
    assert module_path(N()) == "bert.encoder.layer.0.attention"


def test_mix_order_reductions_get_a_kernel_map_entry(monkeypatch):
    """Inductor's mix-order reduction codegen names no kernel for provenance; we add the entry."""
    import torch._inductor.debug as inductor_debug
    from torch._inductor.codegen.simd import SIMDScheduling
    from torch._inductor.codegen.triton import TritonScheduling

    from miner.scan.capture import track_mix_order_reductions

    traced = []

    def fake_trace(node_schedule, name, is_extern=False):
        traced.append((tuple(node_schedule), name))
        return 100 + len(traced)

    def fake_mix(self, node1, node2):  # as Inductor: define the kernel, a comment with no name, then
        self.define_kernel("src", [node1, node2], None)  # node2's epilogue through the ordinary path
        self.define_kernel("epilogue", ["epi"], None)

    monkeypatch.setattr(inductor_debug, "set_kernel_post_grad_provenance_tracing", fake_trace)
    monkeypatch.setattr(SIMDScheduling, "_codegen_mix_order_reduction", fake_mix)
    monkeypatch.setattr(TritonScheduling, "define_kernel", lambda self, src, sched, kernel: "triton_per_fused_ln_bwd_7")
    sched = object.__new__(TritonScheduling)
    with track_mix_order_reductions() as added:
        sched.define_kernel("src", ["plain"], None)  # an ordinary kernel: Inductor traces it itself
        sched._codegen_mix_order_reduction("n1", "n2")
        sched._codegen_mix_order_reduction("n3", "n4")
    assert traced == [(("n1", "n2"), "triton_per_fused_ln_bwd_7"), (("n3", "n4"), "triton_per_fused_ln_bwd_7")]
    assert added == ["triton_per_fused_ln_bwd_7:101", "triton_per_fused_ln_bwd_7:102"]
    assert SIMDScheduling._codegen_mix_order_reduction is fake_mix  # restored
    sched._codegen_mix_order_reduction("n5", "n6")
    assert len(traced) == 2


class NormBlock(torch.nn.Module):
    """Linear + residual + LayerNorm: its backward is a mix-order reduction at >= 4096 rows."""

    def __init__(self, d=768):
        super().__init__()
        self.proj = torch.nn.Linear(d, d)
        self.norm = torch.nn.LayerNorm(d)

    def forward(self, x, labels):
        return {"loss": torch.nn.functional.mse_loss(self.norm(x + self.proj(x)), labels)}


@pytest.mark.gpu
def test_gpu_mix_order_reduction_is_in_the_kernel_map():
    """On CUDA: the layer-norm backward mix-order kernel is captured with its FX nodes and joined."""
    from torch._inductor import metrics

    torch.manual_seed(0)
    m = NormBlock().cuda()
    inputs = {"x": torch.randn(8192, 768, device="cuda"), "labels": torch.randn(8192, 768, device="cuda")}
    metrics.reset()
    out = capture_step(Built(m, inputs, lambda o: o["loss"]), name="norm", preset="tiny", mode="train", device="cuda",
                       autocast_dtype=torch.bfloat16, profile=True)
    made = getattr(metrics, "codegen_mix_order_reduction", None)
    if made is None:
        pytest.skip("this torch has no mix-order reductions")
    assert made > 0, "Inductor made no mix-order reduction here"
    bwd = next(g for g in out.graphs if g.key.phase == "backward")
    mapped = {k.name for r in bwd.nodes for k in r.kernels}
    assert any(n.startswith("triton_per_") and "layer_norm_backward" in n for n in mapped), sorted(mapped)
    triton = [k for k in out.profile.kernels if k.kind.startswith("triton")]
    assert triton and all(k.sites for k in triton), [k.name for k in triton if not k.sites]
    # one map entry per launch: no site recorded twice (Inductor's own entry and ours)
    assert all(len(k.sites) == round(k.calls_per_step) for k in triton if not k.split), \
        [(k.name, len(k.sites), k.calls_per_step) for k in triton]


def test_a_knob_label_compiles_with_that_knob(tmp_path):
    # ``<model>@<knob>``: the zoo builds the model, the capture compiles it with the knob's Inductor options
    # (here pack_bool_masks: the masks saved as bits, so the graphs hold the pack's shifts) under its
    # context, and says so; without the knob the same model's graph holds none; an unknown knob is an error
    import miner_models as models
    from miner.core.errors import UsageError
    from miner.check.knobs import of_label as knob_of

    assert models.resolve("t5@pack_bool_masks").name == "t5@pack_bool_masks"
    assert knob_of("t5") is None and knob_of("t5@sdpa_reduced_math+pack_bool_masks").name == \
        "sdpa_reduced_math+pack_bool_masks"
    with pytest.raises(UsageError):
        knob_of("t5@no_such_knob")
    with pytest.raises(UsageError):
        models.resolve("t5@")

    class Dropper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(64, 64)

        def forward(self, x):
            return {"loss": torch.nn.functional.dropout(self.proj(x), 0.5).relu().sum()}

    def capture(name):
        torch.manual_seed(0)
        out = capture_step(Built(Dropper(), {"x": torch.randn(128, 64)}, lambda o: o["loss"]), name=name,
                           preset="tiny", mode="train", device="cpu")
        return out, {n.target for g in out.graphs for n in g.nodes}

    packed, targets = capture("d@pack_bool_masks")
    assert "aten.__lshift__.Scalar" in targets and packed.graphs[0].provenance["knob"] == "pack_bool_masks"
    plain, targets = capture("d")
    assert "aten.__lshift__.Scalar" not in targets and "knob" not in plain.graphs[0].provenance
