"""Issue #29: a region whose interior node is also read outside it still fires.

In t5-base's H200 training graph relu's gradient mask (``le(relu, 0)``) is computed in the forward
and saved, so relu (inside the relu + dropout region ``pf4693d7449``) has a reader outside the
region; likewise the attention regions' position-bias cast and ``full`` constants are read by every
layer. ``register_replacement``'s patterns require each interior node to have exactly its traced
users, so none of these regions matched on the H200 (0 times). The fix: the generator lists such
nodes (``miner.generate.region.shared_outputs``, from the kernel map: another kernel recomputes
them) as outputs of the candidate's ``search`` (a pattern output may have any users), and its
``replacement`` recomputes them from the region's inputs outside the kernel with the same ops, so
their outside readers see the values they saw before.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch._inductor.config
import torch._inductor.inductor_prims  # noqa: F401 - prims.prepare_softmax_online
import torch.nn as nn
import torch.nn.functional as F

from miner.generate import generate as gen, region
from miner.mine import regions

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "reports/gpu/2026-12-03-h200-profile"

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter tests")


class ReluDrop(nn.Module):
    """relu + dropout with nothing else keeping the mm output alive: the partitioner saves relu's
    gradient mask ``le(relu, 0)`` from the forward, a reader of relu outside the region."""

    def __init__(self, d: int = 32, f: int = 64):
        super().__init__()
        self.wi, self.wo = nn.Linear(d, f, bias=False), nn.Linear(f, d, bias=False)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.wo(self.drop(F.relu(self.wi(x)))).float().pow(2).mean()


def _pass(cid: str):
    from miner.runtime import rewrite

    return rewrite.FusionPass([rewrite.entry_for(REPO / "candidates" / cid / "pattern.py", cid)])


def _relu_drop_step(gp, graphs=None):
    """One bf16-autocast training step of ``ReluDrop`` compiled with ``gp``; the loss and the
    gradients. ``graphs`` collects each post-grad graph as ``gp`` left it."""
    from miner.runtime import rewrite

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = ReluDrop()
    opts = rewrite.inductor_options(gp)
    if graphs is not None:
        def spy(graph):
            gp(graph)
            graphs.append(graph)
        opts["post_grad_custom_pre_pass"] = spy
    try:
        with torch._inductor.config.patch(force_disable_caches=True), torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.compile(model, options=opts, dynamic=False)(torch.randn(2, 4, 32))
        loss.backward()
    finally:
        torch._dynamo.reset()
    return loss.detach(), [p.grad for p in model.parameters()]


def test_relu_dropout_fires_when_relu_is_read_outside():
    """The relu + dropout candidate fires although ``le(relu, 0)`` (saved for the backward) reads relu;
    afterwards ``le`` reads relu recomputed by the same op from the same node the fused op reads,
    so it computes the value it computed before."""
    cid = "pf4693d7449_x4"
    gp, graphs = _pass(cid), []
    loss, grads = _relu_drop_step(gp, graphs)
    assert gp.counts[cid] == 1, (gp.counts, gp.declined)
    fused = [n for g in graphs for n in g.nodes if n.target == torch.ops.miner.cpf4693d7449_x4.default]
    les = [n for g in graphs for n in g.nodes if n.target == torch.ops.aten.le.Scalar]
    assert len(fused) == 1 and len(les) == 1  # the situation of the issue: relu read outside the region
    relu = les[0].args[0]
    assert relu.target == torch.ops.aten.relu.default and relu.args[0] is fused[0].args[1]
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads)


def _attention_layers(model, qs, ks, bias16, b, h, s, d):
    """Two attention layers reading the one ``bias16`` and the one ``full`` of zeros (t5's safe softmax,
    with ``prims.prepare_softmax_online`` written out: what Inductor makes of a softmax on CUDA; on the
    CPU it leaves ``amax``/``sum``), then dropout."""
    zeros = torch.full((b, h, s, s), 0.0)
    outs = []
    for q, k in zip(qs, ks):
        if outs and getattr(model, "chained", False):  # a layer's input computed from the layer before
            q = q + outs[-1] @ k
        scores = torch.bmm(q.reshape(b * h, s, d), k.reshape(b * h, s, d).transpose(1, 2)).view(b, h, s, s)
        x = scores + bias16
        m, z = torch.ops.prims.prepare_softmax_online(x, -1)
        probs = torch.exp(x - m) / z
        empty = torch.logical_not(torch.logical_not(x == float("-inf")).any(-1, keepdim=True))
        outs.append(F.dropout(torch.where(empty, zeros, probs), model.p, training=True))
    return (*outs, bias16)  # bias16 returned: a reader outside every region


class EncoderAttention(nn.Module):
    """t5's encoder attention from its second layer on (region ``pbb9b9d613b``), in two layers sharing
    the realized position bias's bf16 cast and the ``full``."""

    p = 0.25

    def forward(self, qs, ks, bias):
        return _attention_layers(self, qs, ks, bias.to(torch.bfloat16), *qs[0].shape)

    @staticmethod
    def bias(bias):
        return bias


class DecoderAttention(nn.Module):
    """t5's decoder self-attention (region ``p4a7fd15d60``), in two layers sharing the bias computed in
    the region: the bucket gather, the causal mask's ``where`` with a ``full`` scalar, the bf16 cast."""

    p = 0.25

    def forward(self, qs, ks, mask, table, buckets):
        b, h, s, d = qs[0].shape
        bias16 = torch.where(mask.expand(b, -1, s, s), self.gathered(table, buckets),
                             torch.finfo(torch.float32).min).to(torch.bfloat16)
        return _attention_layers(self, qs, ks, bias16, b, h, s, d)

    @staticmethod
    def gathered(table, buckets):
        return F.embedding(buckets, table).permute(2, 0, 1).unsqueeze(0)

    @classmethod
    def bias(cls, mask, table, buckets):
        return torch.where(mask, cls.gathered(table, buckets), torch.finfo(torch.float32).min)


@pytest.mark.parametrize("cid,module", [("pbb9b9d613b_x4", EncoderAttention), ("p4a7fd15d60_x4", DecoderAttention)])
def test_attention_fires_in_every_layer_reading_the_shared_bias_and_full(cid, module):
    from miner.runtime import rewrite

    gp = _pass(cid)
    g = torch.Generator().manual_seed(0)
    qs = [torch.randn(2, 2, 8, 4, generator=g) for _ in range(2)]
    ks = [torch.randn(2, 2, 8, 4, generator=g) for _ in range(2)]
    if module is EncoderAttention:
        extra = (torch.randn(2, 2, 8, 8, generator=g),)
    else:
        extra = (torch.ones(8, 8, dtype=torch.bool).tril()[None, None], torch.randn(32, 2, generator=g),
                 torch.randint(0, 32, (8, 8), generator=g))
    model = module()
    torch._dynamo.reset()
    try:
        with torch.no_grad(), torch._inductor.config.patch(force_disable_caches=True):
            *outs, bias16 = torch.compile(model, options=rewrite.inductor_options(gp), dynamic=False)(qs, ks, *extra)
    finally:
        torch._dynamo.reset()
    assert gp.counts[cid] == 2, (gp.counts, gp.declined)
    bias = module.bias(*extra)
    assert torch.equal(bias16, bias.expand(2, 2, 8, 8).to(torch.bfloat16))  # the outside reader's value, bit for bit
    for q, k, out in zip(qs, ks, outs):  # the kernel's own mask: kept elements are softmax / (1 - p)
        # inside a kernel the bias's bf16 cast is elided, as Inductor elides it (emulate_precision_casts off)
        probs = torch.softmax(q @ k.transpose(-1, -2) + bias, -1)
        kept = out != 0
        assert 0.5 < kept.float().sum() / (probs != 0).float().sum() < 0.95
        torch.testing.assert_close(out[kept], (probs / (1 - model.p))[kept], rtol=1e-5, atol=1e-6)


class ChainedEncoderAttention(EncoderAttention):
    """As :class:`EncoderAttention`, the second layer's queries computed from the first layer's output
    (as in t5): the shared bias cast's reader in layer 1 leads into layer 2's region."""

    chained = True


class ChainedDecoderAttention(DecoderAttention):
    chained = True


@pytest.mark.parametrize("cid,module", [("pbb9b9d613b_x4", ChainedEncoderAttention),
                                        ("p4a7fd15d60_x4", ChainedDecoderAttention)])
def test_attention_fires_in_chained_layers(cid, module):
    """The H100 run of 2026-12-06: t5's decoder region fired in 1 of 12 layers, the rest declined as "not
    convex": the shared bias read by an earlier layer whose output reaches this layer's scores. The shared
    outputs are recomputed outside the fused op, so that path is no cycle: every layer fires."""
    from miner.runtime import rewrite

    gp = _pass(cid)
    g = torch.Generator().manual_seed(0)
    layers = 3  # (two would not tell: the pass runs in both post-grad slots, each firing the first layer left)
    qs = [torch.randn(2, 2, 8, 8, generator=g) for _ in range(layers)]
    ks = [torch.randn(2, 2, 8, 8, generator=g) for _ in range(layers)]
    if issubclass(module, EncoderAttention):
        extra = (torch.randn(2, 2, 8, 8, generator=g),)
    else:
        extra = (torch.ones(8, 8, dtype=torch.bool).tril()[None, None], torch.randn(32, 2, generator=g),
                 torch.randint(0, 32, (8, 8), generator=g))
    torch._dynamo.reset()
    try:
        with torch.no_grad(), torch._inductor.config.patch(force_disable_caches=True):
            *outs, _ = torch.compile(module(), options=rewrite.inductor_options(gp), dynamic=False)(qs, ks, *extra)
    finally:
        torch._dynamo.reset()
    assert gp.counts[cid] == layers, (gp.counts, gp.declined)
    assert all(torch.isfinite(o).all() for o in outs)


@pytest.fixture(scope="module")
def rps():
    return {rp.id: rp for rp in regions.load(PROFILE)}


def test_shared_outputs_of_the_t5_dropout_regions(rps):
    """From the H200 kernel map: relu; the bias cast and the two ``full`` of the decoder (and encoder
    layer 0) attention; the bias cast and ``full`` of encoder layers 1-11; nothing for the RMS-norm
    region. The encoder layer 0 region's ``expand`` (a view, read by the decoder's cross-attention
    mask) is no output: a fused op returns no aliases (that region still does not match)."""
    def targets(rid):
        p = region.prepare(rps[rid].pattern)
        return [p.nodes[j].target.split(".")[1] for j in region.shared_outputs(rps[rid].pattern)]

    assert targets("pf4693d7449") == ["relu"]
    assert targets("p4a7fd15d60") == ["full", "convert_element_type", "full"]
    assert targets("p9836c8c870") == ["full", "convert_element_type", "full"]
    assert targets("pbb9b9d613b") == ["convert_element_type", "full"]
    assert targets("p010eaa2cbb") == []
    assert 5 in region._read_elsewhere(rps["p9836c8c870"].pattern)  # the expand, read elsewhere


def test_search_order_puts_an_anchor_first(rps):
    """The attention regions' mask output shares no node with the softmax output: ``search`` then
    returns the last mul (it depends on both) first, so the matcher finds the others from it."""
    spec = gen.spec_from_pattern(region.prepare(rps["pbb9b9d613b"].pattern))
    spec = type(spec)(**{**spec.__dict__, "shared": region.shared_outputs(rps["pbb9b9d613b"].pattern)})
    assert not gen._anchored(spec.nodes, tuple(spec.outputs) + spec.shared)
    order = gen.search_order(spec)
    assert order[0] == max(spec.outputs) and sorted(order) == sorted(spec.outputs + spec.shared)
    assert gen._anchored(spec.nodes, order)
