"""The GEMM-epilogue rule (``miner.rules.epilogue``): which addmm + activation chains cuBLASLt's epilogue may take.

Each graph is traced on fake CUDA tensors (the rule is CUDA's: the CPU's ``_addmm_activation`` applies the erf
GELU), so these run on any machine."""

import math

import pytest
import torch

from miner.rules import epilogue
from miner.rules.graph import FxNodes

BF16 = torch.bfloat16


def gelu_new(h):  # HF's NewGELUActivation (gpt2)
    return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))


def gelu_autocast(h):  # what bf16 autocast leaves of it: pow and tanh in float32, a float32 result
    return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h.float(), 3.0))))


def gelu_fast(h):  # FastGELU: the same function written another way, constants in float32
    return 0.5 * h * (1.0 + torch.tanh(h * 0.7978845608 * (1.0 + 0.044715 * h * h)))


def gelu_sigmoid(h):  # x * sigmoid(2 * sqrt(2/pi) * (x + 0.044715 x^3)): the same function again
    return h * torch.sigmoid(2 * math.sqrt(2.0 / math.pi) * (h + 0.044715 * h * h * h))


def gelu_erf(h):  # bert's GELU: another function (4.7e-4 away at x = -2.7)
    return 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))


def planted_constant(h):  # gelu_new with 0.04 for 0.044715: must not pass for gelu_tanh
    return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.04 * torch.pow(h, 3.0))))


def decide(fn, device="cuda", bias_shape=(32,), beta=1):
    """The rule's decision on the one addmm of ``fn(addmm(bias, x, w))`` traced on fake ``device`` tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    with FakeTensorMode(allow_non_fake_inputs=True):
        b = torch.empty(*bias_shape, device=device, dtype=BF16)
        x = torch.empty(16, 8, device=device, dtype=BF16)
        w = torch.empty(8, 32, device=device, dtype=BF16)
    gm = make_fx(lambda b, x, w: fn(torch.addmm(b, x, w, beta=beta) if beta != 1 else torch.addmm(b, x, w)),
                 tracing_mode="fake")(b, x, w)
    (mm,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.addmm.default]
    return epilogue.check(FxNodes(gm.graph), mm.name), gm


@pytest.mark.parametrize("fn", [gelu_new, gelu_fast, gelu_sigmoid, lambda h: gelu_new(h).view(2, 8, 32)],
                         ids=["gelu_new", "fast_gelu", "sigmoid_form", "then_view"])
def test_every_spelling_of_the_tanh_gelu_is_taken(fn):
    d, _ = decide(fn)
    assert d.ok and d.activation == "gelu_tanh" and d.use_gelu, d.reasons
    assert len(d.replaced) == 1 and d.chain


def test_relu_is_taken_without_gelu():
    d, _ = decide(torch.relu)
    assert d.ok and d.activation == "relu" and not d.use_gelu


def test_an_autocast_float32_result_is_replaced_where_it_is_rounded_to_bf16():
    d, gm = decide(lambda h: gelu_autocast(h).to(BF16) * 1)
    nodes = {n.name: n for n in gm.graph.nodes}
    assert d.ok, d.reasons
    assert len(d.replaced) == 1 and str(nodes[d.replaced[0]].target) in epilogue.CONVERTS
    assert nodes[d.replaced[0]].meta["val"].dtype == BF16


def test_a_float32_result_read_in_float32_is_declined():
    d, _ = decide(lambda h: gelu_autocast(h).sum(-1))
    assert not d.ok and any("read in float32" in r for r in d.reasons), d.reasons


@pytest.mark.parametrize("fn,why", [(gelu_erf, "computes none of gelu_tanh"),
                                    (planted_constant, "computes none of gelu_tanh")], ids=["erf_gelu", "planted_constant"])
def test_another_function_is_declined_with_how_far_it_is(fn, why):
    d, _ = decide(fn)
    assert not d.ok and d.applies and any(why in r for r in d.reasons), d.reasons


def test_the_pre_activation_read_elsewhere_is_declined():
    d, _ = decide(lambda h: (gelu_new(h), h.view(2, 8, 32)))  # e.g. saved for a backward
    assert not d.ok and d.applies and any("pre-activation is read outside" in r for r in d.reasons), d.reasons


def test_a_tensor_read_inside_the_activation_keeps_it_from_the_epilogue():
    y = torch.zeros(())

    def inside(h):
        return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3) + y))

    d, _ = decide(inside)
    assert not d.ok and any("values of the chain are read outside" in r for r in d.reasons), d.reasons


def test_what_reads_the_activation_from_outside_stays_outside():
    d, gm = decide(lambda h: gelu_new(h) * torch.full((32,), 2.0, device=h.device, dtype=h.dtype))  # a mask, after
    assert d.ok and d.activation == "gelu_tanh", d.reasons


def test_no_activation_is_no_candidate():
    d, _ = decide(lambda h: h.view(2, 8, 32) * 2.0)
    assert not d.ok and not d.applies


@pytest.mark.parametrize("kw,why", [({"device": "cpu"}, "CUDA only"), ({"beta": 2}, "beta or alpha"),
                                    ({"bias_shape": (16, 32)}, "is not 1-D")], ids=["cpu", "beta", "2d_bias"])
def test_what_the_epilogue_cannot_do_is_declined(kw, why):
    d, _ = decide(gelu_new, **kw)
    assert not d.ok and any(why in r for r in d.reasons), d.reasons


def test_not_an_addmm_is_no_candidate():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(16, 8, device="cuda", dtype=BF16)
        w = torch.empty(8, 32, device="cuda", dtype=BF16)
    gm = make_fx(lambda x, w: gelu_new(x @ w), tracing_mode="fake")(x, w)
    mm = next(n for n in gm.graph.nodes if n.op == "call_function")
    d = epilogue.check(FxNodes(gm.graph), mm.name)
    assert not d.applies and not d.ok


def _addmm_gelu_tanh(bias, x, w, use_gelu=False):
    """What cuBLASLt's epilogue computes (the CPU's ``_addmm_activation`` applies the erf GELU instead)."""
    h = torch.addmm(bias.float(), x.float(), w.float())
    return (torch.nn.functional.gelu(h, approximate="tanh") if use_gelu else h.relu()).to(x.dtype)


@pytest.mark.parametrize("fn", [gelu_new, lambda h: gelu_autocast(h).to(BF16).view(2, 8, 32), torch.relu],
                         ids=["gelu_new", "autocast_then_view", "relu"])
def test_the_rewrite_wires_the_epilogue_where_the_chain_was(fn):
    """The pass on a real (CPU) trace, the rule's device check lifted and the epilogue emulated in float32: one
    ``_addmm_activation`` left, the chain erased, and the graph computes the chain's values (within bf16's
    rounding: the epilogue rounds once where the chain rounded the GEMM's output first)."""
    import dataclasses

    from torch.fx.experimental.proxy_tensor import make_fx

    from miner.runtime import epilogue as rewrite

    g = torch.Generator().manual_seed(0)
    b, x, w = (torch.randn(*s, generator=g).to(BF16) for s in ((32,), (16, 8), (8, 32)))
    gm = make_fx(lambda b, x, w: fn(torch.addmm(b, x, w)))(b, x, w)
    want = gm(b, x, w)
    (mm,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.addmm.default]
    d = rewrite.decision(mm)
    assert d.reasons == (d.reasons[0],) and "CUDA only" in d.reasons[0]  # the only objection on the CPU
    fused = rewrite.replace(mm, dataclasses.replace(d, reasons=()))
    left = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert left.count("aten._addmm_activation.default") == 1 and "aten.addmm.default" not in left
    assert not {"aten.tanh.default", "aten.relu.default", "aten.pow.Tensor_Scalar"} & set(left), left
    fused.target = _addmm_gelu_tanh
    gm.recompile()
    got = gm(b, x, w)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=2 ** -7)


def test_the_pass_counts_what_it_takes_and_why_it_declines():
    from miner.runtime.epilogue import GemmEpilogues

    _, gm = decide(gelu_new)
    _, erf = decide(gelu_erf)
    p = GemmEpilogues()
    p(gm.graph)
    p(erf.graph)
    assert p.counts == {"gelu_tanh": 1} and any("computes none of gelu_tanh" in r for r in p.declined)
    assert any(str(n.target) == "aten._addmm_activation.default" for n in gm.graph.nodes)
    assert isinstance(p.uuid(), bytes) and p.uuid() == GemmEpilogues().uuid()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA: cuBLASLt's GELU epilogue")
@pytest.mark.parametrize("shape", [(512, 768, 3072), (77, 64, 200)], ids=["gpt2_ffn", "odd"])
@pytest.mark.parametrize("fn", [gelu_autocast, torch.relu], ids=["gelu", "relu"])
def test_on_cuda_the_knob_fires_and_is_no_less_accurate_than_inductor(shape, fn):
    """Inductor with and without the pass on ``fn(addmm)`` in bf16: the pass fires once, and its error against
    float64 is at most Inductor's own plus one bf16 rounding."""
    from miner.runtime.epilogue import GemmEpilogues

    m, k, n = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    b, x, w = (torch.randn(*s, generator=g, device="cuda").to(BF16) for s in ((n,), (m, k), (k, n)))
    ref = fn(torch.addmm(b.double(), x.double(), w.double()))
    p = GemmEpilogues()
    errs = {}
    for opts in ({}, {"joint_custom_pre_pass": p}):
        torch._dynamo.reset()
        out = torch.compile(lambda b, x, w: fn(torch.addmm(b, x, w)).to(BF16), options=opts, dynamic=False)(b, x, w)
        errs[bool(opts)] = float((out.double() - ref).abs().max())
    torch._dynamo.reset()
    assert sum(p.counts.values()) == 1, (p.counts, p.declined)
    assert errs[True] <= errs[False] + 2 ** -8 * float(ref.abs().max()), errs


def test_inside_a_cpu_compile_the_rule_reads_the_chain_and_declines_for_the_device():
    """The pass runs under the compile's fake mode: the chain is still evaluated on real numbers (seen failing as
    "rule failed: DataDependentOutputException" before), identified, and declined only because the CPU's
    ``_addmm_activation`` is the erf GELU."""
    from miner.runtime.epilogue import GemmEpilogues

    p = GemmEpilogues()
    b, x, w = torch.randn(32).to(BF16), torch.randn(16, 8).to(BF16), torch.randn(8, 32).to(BF16)
    torch._dynamo.reset()
    try:
        with torch._inductor.config.patch(force_disable_caches=True):  # a cache hit would run no pass
            torch.compile(lambda b, x, w: gelu_new(torch.addmm(b, x, w)), options={"joint_custom_pre_pass": p},
                          dynamic=False)(b, x, w)
    finally:
        torch._dynamo.reset()
    assert not p.counts and list(p.declined) == [next(r for r in p.declined if "CUDA only" in r)], p.declined


def test_mining_reports_what_the_knob_takes_what_it_spares_and_why_it_declines():
    from miner.core.fxnode import node_record
    from miner.core.records import CapturedGraph, GraphKey
    from miner.mine import epilogue as mined

    graphs = []
    for fn, phase in ((gelu_new, "inference"), (lambda h: (gelu_new(h), h.view(2, 8, 32)), "forward")):
        _, gm = decide(fn)
        graphs.append(CapturedGraph(GraphKey("m", "tiny", "infer" if phase == "inference" else "train", phase),
                                    tuple(node_record(n) for n in gm.graph.nodes)))
    payload = mined.mine(graphs)
    taken, saved = payload["found"]
    assert taken["ok"] and taken["activation"] == "gelu_tanh" and taken["spared_bytes"] == 2 * 16 * 32 * 2
    assert not saved["ok"] and saved["spared_bytes"] == 0 and "pre-activation" in saved["reasons"][0]
    assert payload["counts"] == {"taken": 1, "declined": 1, "spared_bytes": 2048}
    line = mined.summary(payload)
    assert "m infer gelu_tanh x1" in line and "--epilogues mined/epilogues.json" in line and "pre-activation" in line


def test_the_ab_says_what_a_knobs_pass_took_in_each_compile():
    from miner.check import ab, knobs

    knob = knobs.get("gemm_epilogues")
    p = knob.options["joint_custom_pre_pass"]
    before = ab.knob_pass_counts(knob)
    p.counts["gelu_tanh"] += 12
    p.declined["the pre-activation is read outside the chain"] += 2
    try:
        text = ab.knob_pass_text(knob, before)
        assert text == ("; GemmEpilogues took gelu_tanh x12, declined 2 (the pre-activation is read outside the "
                        "chain)"), text
        assert ab.knob_pass_text(knob, ab.knob_pass_counts(knob), cache_hits=3).endswith("not run (FX cache hit: "
                                                                                         "the graphs it made before)")
        assert ab.knob_pass_text(knobs.get("reduce_overhead"), {}) == ""
    finally:
        p.counts.clear()
        p.declined.clear()


def test_in_a_training_graph_the_backwards_reads_decline_the_rewrite():
    """What the README says of training: a ReLU's output is also read through an alias for the backward (two values
    of the chain leave it), a GELU's pre-activation is saved: neither is taken."""
    from miner.runtime.epilogue import GemmEpilogues

    for act in (torch.relu, gelu_new):
        p = GemmEpilogues()
        lin, out = torch.nn.Linear(8, 32), torch.nn.Linear(32, 4)
        torch._dynamo.reset()
        try:
            with torch._inductor.config.patch(force_disable_caches=True):
                torch.compile(lambda x: out(act(lin(x))).sum(), options={"joint_custom_pre_pass": p},
                              dynamic=False)(torch.randn(16, 8)).backward()
        finally:
            torch._dynamo.reset()
        beyond_device = [r for r in p.declined if "CUDA only" not in r]
        assert not p.counts and beyond_device, (act, p.declined)
