"""The ``pack_dropout_masks`` knob (miner.check.mask_bits): dropout keep masks saved as bits, on the CPU."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

from miner.check import knobs, mask_bits

SHAPE = (3, 5, 13)  # 195 elements per mask: not a multiple of 8 (a 5-element pad)
N_MASKS = 2


class TwoDropouts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(13, 13)
        self.b = torch.nn.Linear(13, 13)

    def forward(self, x):
        y = torch.nn.functional.gelu(torch.nn.functional.dropout(self.a(x), 0.3, True))
        return torch.nn.functional.dropout(self.b(y), 0.4, True).square().sum()


class SavedMasks(CustomGraphPass):
    """Records, for the partitioned forward graph (the first post-grad graph with primals), the dtype and
    element count of its bool and uint8 outputs: the masks it saves for the backward (one byte per element)."""

    def __init__(self):
        self.saved: list[tuple[torch.dtype, int]] = []

    @property
    def mask_bytes(self) -> list[int]:
        return [n for _, n in self.saved]

    def __call__(self, graph):
        if self.saved or not any(n.name.startswith("primals") for n in graph.find_nodes(op="placeholder")):
            return
        outs = torch.utils._pytree.arg_tree_leaves(*next(iter(graph.find_nodes(op="output"))).args)
        vals = [o.meta["val"] for o in outs if isinstance(o, torch.fx.Node)]
        self.saved = [(v.dtype, v.numel()) for v in vals if v.dtype in (torch.bool, torch.uint8)]

    def uuid(self):
        return None


class ReluDropout(torch.nn.Module):
    """A feed-forward block as t5's: relu, dropout, a second relu; 8192 elements per mask (>= MIN_NUMEL)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 64)
        self.b = torch.nn.Linear(64, 64)

    def forward(self, x):
        y = torch.nn.functional.dropout(torch.relu(self.a(x)), 0.3, True)
        return torch.relu(self.b(y)).square().sum()


BIG = (4, 32, 64)


def _step(joint_pass, *, simdlen=None, model_cls=TwoDropouts, shape=SHAPE, options=None):
    """Loss and gradients of one seeded training step of ``model_cls`` (on ``shape``) compiled with
    ``joint_pass`` as the joint-graph pass (and Inductor's ``cpp.simdlen``: 1 for scalar C++ kernels),
    and the saved masks' bytes of its forward graph."""
    import torch._functorch.config as fconfig

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = model_cls()
    x = torch.randn(shape, requires_grad=True)
    saved = SavedMasks()
    compiled = torch.compile(model, options={"joint_custom_post_pass": joint_pass, "post_grad_custom_pre_pass": saved,
                                             "fx_graph_cache": False, "cpp.simdlen": simdlen, **(options or {})})
    with fconfig.patch(enable_autograd_cache=False):
        torch.manual_seed(1)
        loss = compiled(x)
        loss.backward()
    grads = [x.grad] + [p.grad for p in model.parameters()]
    return loss.detach(), grads, saved.mask_bytes


@pytest.fixture(scope="module")
def default_step():
    return _step(None, simdlen=1)


def test_pack_unpack_round_trip_odd_sizes():
    for shape in [(13,), (3, 5, 13), (8,), (2, 7)]:
        mask = torch.rand(shape, generator=torch.Generator().manual_seed(3)) > 0.5
        bits = mask_bits.pack(mask)
        assert bits.dtype == torch.uint8 and bits.numel() == math.ceil(mask.numel() / 8)
        assert torch.equal(mask_bits.unpack(bits, shape), mask)


def test_the_knob_keeps_values_and_saves_an_eighth_of_the_mask_bytes(default_step):
    loss, grads, default_bytes = default_step
    k_loss, k_grads, knob_bytes = _step(mask_bits.PackDropoutMasks(), simdlen=1)
    # same random stream, same masks: bitwise-equal loss and gradients (with scalar C++ kernels: see below)
    assert torch.equal(loss, k_loss) and all(torch.equal(g, h) for g, h in zip(grads, k_grads))
    n = math.prod(SHAPE)
    assert sorted(default_bytes) == [n] * N_MASKS  # the default saves both masks as bool bytes
    assert sorted(knob_bytes) == [math.ceil(n / 8)] * N_MASKS  # the knob: their bits
    assert sum(default_bytes) / sum(knob_bytes) > 7.5


def test_vectorized_kernels_differ_only_in_the_last_bits():
    """With Inductor's vectorized C++ kernels the kernels are split differently (the unpack inside
    them), so GELU's erf/exp or the loss's sum may run scalar in one and vectorized in the other: a few ulps."""
    loss, grads, _ = _step(None)
    k_loss, k_grads, _ = _step(mask_bits.PackDropoutMasks())
    assert torch.allclose(loss, k_loss, rtol=1e-6, atol=0)
    assert all(torch.allclose(g, h, rtol=1e-5, atol=1e-6) for g, h in zip(grads, k_grads))


def _reversed_bits(bits, shape):
    shifts = 7 - torch.arange(8, dtype=torch.uint8, device=bits.device)
    spread = (bits.unsqueeze(1) >> shifts) & 1
    return spread.view(-1)[:math.prod(shape)].view(shape).to(torch.bool)


def _off_by_one(bits, shape):
    shifts = torch.arange(8, dtype=torch.uint8, device=bits.device)
    spread = (bits.unsqueeze(1) >> shifts) & 1
    return spread.view(-1)[1:math.prod(shape) + 1].view(shape).to(torch.bool)


@pytest.mark.parametrize("planted", [_reversed_bits, _off_by_one])
def test_a_planted_unpack_bug_changes_the_gradients(default_step, monkeypatch, planted):
    loss, grads, _ = default_step
    monkeypatch.setattr(mask_bits, "unpack", planted)
    k_loss, k_grads, _ = _step(mask_bits.PackDropoutMasks(), simdlen=1)
    assert max((g - h).abs().max().item() for g, h in zip(grads, k_grads)) > 1e-2


def test_inference_graphs_are_left_alone():
    graph = torch.fx.Graph()
    x = graph.placeholder("arg0_1")
    graph.output(graph.call_function(torch.ops.aten.relu.default, (x,)))
    assert mask_bits.forward_nodes(graph) == set()


def test_pack_bool_masks_saves_relu_and_dropout_masks_as_bits_and_keeps_values():
    """``pack_bool_masks``: ReLU's ``le`` masks (which ``pack_dropout_masks`` leaves as bool bytes) and the
    dropout keep mask all saved as bits; bitwise-equal loss and gradients with scalar C++ kernels."""
    loss, grads, default_bytes = _step(None, simdlen=1, model_cls=ReluDropout, shape=BIG)
    _, _, dropout_bytes = _step(mask_bits.PackDropoutMasks(), simdlen=1, model_cls=ReluDropout, shape=BIG)
    k_loss, k_grads, bool_bytes = _step(mask_bits.PackBoolMasks(), simdlen=1, model_cls=ReluDropout, shape=BIG)
    n = math.prod(BIG)
    assert len(default_bytes) >= 2 and set(default_bytes) == {n}  # the keep mask and relu's mask(s), as bool
    assert sum(n // 8 == b for b in dropout_bytes) == 1 and n in dropout_bytes  # only the keep mask packed
    assert set(bool_bytes) == {n // 8} and len(bool_bytes) == len(default_bytes)  # every one packed
    assert torch.equal(loss, k_loss) and all(torch.equal(g, h) for g, h in zip(grads, k_grads))


def test_pack_bool_masks_leaves_small_and_backward_only_masks_alone():
    """A bool tensor under ``MIN_NUMEL`` elements, or one computed from the tangents (the backward's own),
    is no candidate: TwoDropouts' 195-element masks stay bool bytes."""
    _, _, small = _step(mask_bits.PackBoolMasks(), simdlen=1)
    assert sorted(small) == [math.prod(SHAPE)] * N_MASKS
    graph = torch.fx.Graph()
    x, t = graph.placeholder("primals_1"), graph.placeholder("tangents_1")
    with torch._subclasses.FakeTensorMode():
        for node in (x, t):
            node.meta["val"] = torch.empty(64, 128)
    m = graph.call_function(torch.ops.aten.gt.Scalar, (t, 0.0))
    with torch._subclasses.FakeTensorMode():
        m.meta["val"] = torch.empty(64, 128, dtype=torch.bool)
    graph.output((graph.call_function(torch.ops.aten.mul.Tensor, (x, m)),))
    assert m in mask_bits.tangent_dependent(graph)
    assert not mask_bits.is_saved_bool(m, set(), mask_bits.tangent_dependent(graph))


# --------------------------------------------------------------------------- recompute_dropout_masks

def test_recomputed_masks_save_no_mask_bytes_and_keep_every_value(default_step):
    loss, grads, default_bytes = default_step
    k_loss, k_grads, knob_bytes = _step(mask_bits.RecomputeDropoutMasks(), simdlen=1)
    assert sorted(default_bytes) == [math.prod(SHAPE)] * N_MASKS and knob_bytes == []  # only the seed is saved
    # the backward drew the forward's masks again: bitwise-equal loss and gradients
    assert torch.equal(loss, k_loss) and all(torch.equal(g, h) for g, h in zip(grads, k_grads))


class _OtherSeed(CustomGraphPass):
    """A planted bug: the backward's users of each mask read a mask drawn from another seed (seed + 1)."""

    def __call__(self, graph):
        from miner.runtime import bits as bits_tag

        fwd = mask_bits.forward_nodes(graph)
        for mask in [n for n in graph.nodes if n in fwd and mask_bits.is_keep_mask(n)]:
            (draw, p), shape = mask.args, list(mask.meta["val"].shape)
            back = [u for u in mask.users if u not in fwd]
            redraw = bits_tag.insert_traced(
                graph, lambda s: torch.ops.prims.inductor_random(shape, s + 1, "rand") > p, [draw.args[1]],
                after=draw.args[1], recompute=True, tags=(bits_tag.UNPACK, bits_tag.UNPACKED))
            for u in back:
                u.replace_input_with(mask, redraw)

    def uuid(self):
        return None


def test_a_backward_drawing_another_mask_changes_the_gradients_not_the_loss(default_step):
    loss, grads, _ = default_step
    k_loss, k_grads, _ = _step(_OtherSeed(), simdlen=1)
    assert torch.equal(loss, k_loss)  # the forward is the same: the loss alone would not see it
    assert max((g - h).abs().max().item() for g, h in zip(grads, k_grads)) > 1e-2


class WrittenOut(torch.nn.Module):
    """A dropout written out: ``rand_like(y) > p`` (under ``fallback_random`` an ``aten.rand_like`` draw)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(13, 13)

    def forward(self, x):
        y = self.a(x)
        return torch.nn.functional.gelu(y * (torch.rand_like(y) > 0.3) / 0.7).square().sum()


def test_masks_drawn_from_the_generator_are_saved_as_before():
    """Under ``fallback_random`` the keep mask is ``gt(aten.rand_like(y), p)``, drawn from the generator: a
    second draw would be the generator's next numbers, another mask, so it is saved as before; Inductor's own
    seeded draw of the same model is recomputed."""
    n = math.prod(SHAPE)
    loss, grads, default_bytes = _step(None, simdlen=1, model_cls=WrittenOut, options={"fallback_random": True})
    k_loss, k_grads, knob_bytes = _step(mask_bits.RecomputeDropoutMasks(), simdlen=1, model_cls=WrittenOut,
                                        options={"fallback_random": True})
    assert default_bytes == knob_bytes == [n]
    assert torch.equal(loss, k_loss) and all(torch.equal(g, h) for g, h in zip(grads, k_grads))
    assert _step(mask_bits.RecomputeDropoutMasks(), simdlen=1, model_cls=WrittenOut)[2] == []


class BF16FeedForward(torch.nn.Module):
    """t5's feed-forward under bf16 autocast: the keep mask is ``gt(convert_element_type(draw, bf16), p)``."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 128, bias=False)
        self.b = torch.nn.Linear(128, 64, bias=False)

    def forward(self, x):
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            y = self.b(torch.nn.functional.dropout(torch.relu(self.a(x)), 0.1, True))
        return y.float().square().sum()


def _ff_step(joint_pass, fusion_pass=None):
    """:func:`_step` of :class:`BF16FeedForward`; with ``fusion_pass`` (gate open) in Inductor's post-grad slots
    (then no mask bytes are recorded)."""
    from miner.runtime import rewrite

    return _step(joint_pass, model_cls=BF16FeedForward, shape=(2, 16, 64),
                 options=rewrite.inductor_options(fusion_pass) if fusion_pass else None)


def test_under_autocast_the_mask_compared_through_a_cast_is_recomputed_too():
    loss, grads, default_bytes = _ff_step(None)
    k_loss, k_grads, knob_bytes = _ff_step(mask_bits.RecomputeDropoutMasks())
    n = 2 * 16 * 128
    assert default_bytes == [n, n] and knob_bytes == [n]  # the dropout's mask gone, ReLU's saved as before
    assert torch.equal(loss, k_loss) and all(torch.equal(g, h) for g, h in zip(grads, k_grads))


def test_a_region_drawing_its_own_stream_does_not_fire_on_a_recomputed_mask():
    """A dropout region kernel draws the four-per-call stream in the forward; the backward would draw the mask
    again in Inductor's: the two would disagree. With the mask recomputed its seed is saved for the backward (a
    reader outside the region), so the region does not match, and the step is the default's, bitwise."""
    from miner.runtime import fusions

    root = Path(__file__).resolve().parents[1]
    default = _ff_step(None)
    fused = fusions.graph_pass(root, ["relu_dropout"], interpret=True)
    fused.gate = "open"
    f_loss, f_grads, _ = _ff_step(None, fused)
    assert fused.counts["relu_dropout"] == 1 and not torch.equal(f_loss, default[0])  # its own stream
    both = fusions.graph_pass(root, ["relu_dropout"], interpret=True)
    both.gate = "open"
    b_loss, b_grads, _ = _ff_step(mask_bits.RecomputeDropoutMasks(), both)
    assert both.counts["relu_dropout"] == 0
    assert torch.equal(b_loss, default[0]) and all(torch.equal(g, h) for g, h in zip(b_grads, default[1]))


def test_under_autocast_the_packed_mask_is_the_one_compared_through_the_cast():
    """``pack_dropout_masks`` finds a bf16 dropout's mask through the cast as well (before, only masks compared
    from the draw itself were packed), and a dropout region on top packs its own mask: the same values as the
    region alone."""
    from miner.runtime import fusions

    n = 2 * 16 * 128
    loss, grads, default_bytes = _ff_step(None)
    k_loss, k_grads, knob_bytes = _ff_step(mask_bits.PackDropoutMasks())
    assert default_bytes == [n, n] and sorted(knob_bytes) == [n // 8, n]  # the dropout's as bits, ReLU's as bytes
    assert torch.equal(loss, k_loss) and all(torch.equal(g, h) for g, h in zip(grads, k_grads))
    root = Path(__file__).resolve().parents[1]
    alone, packed = (fusions.graph_pass(root, ["relu_dropout"], interpret=True) for _ in range(2))
    alone.gate = packed.gate = "open"
    a_loss, a_grads, _ = _ff_step(None, alone)
    p_loss, p_grads, _ = _ff_step(mask_bits.PackDropoutMasks(), packed)
    assert alone.counts["relu_dropout"] == packed.counts["relu_dropout"] == 1
    assert torch.equal(a_loss, p_loss) and all(torch.equal(g, h) for g, h in zip(a_grads, p_grads))


def test_recomputed_masks_in_a_feed_forward_block():
    """t5's feed-forward: relu, dropout, relu. The dropout's mask is recomputed; ReLU's ``le`` masks stay."""
    loss, grads, default_bytes = _step(None, simdlen=1, model_cls=ReluDropout, shape=BIG)
    k_loss, k_grads, knob_bytes = _step(mask_bits.RecomputeDropoutMasks(), simdlen=1, model_cls=ReluDropout, shape=BIG)
    assert torch.equal(loss, k_loss) and all(torch.equal(g, h) for g, h in zip(grads, k_grads))
    n = math.prod(BIG)
    assert default_bytes == [n, n] and knob_bytes == [n]  # the dropout's mask gone, a ReLU's saved as before


def test_the_knob_is_registered_and_documented():
    import torch._inductor

    knob = knobs.get("pack_dropout_masks")
    assert isinstance(knob.options["joint_custom_post_pass"], mask_bits.PackDropoutMasks)
    assert "joint_custom_post_pass" in torch._inductor.list_options()
    assert "one bit per element" in knob.doc and "not the numerics" in knob.doc and not knob.numerics
    assert "pack_dropout_masks" in knobs.describe()
    # its uuid is in Inductor's FX graph cache key, and follows the pass's source
    assert knob.options["joint_custom_post_pass"].uuid() == mask_bits.PackDropoutMasks().uuid()
    both = knobs.get("pack_bool_masks")
    assert isinstance(both.options["joint_custom_post_pass"], mask_bits.PackBoolMasks) and not both.numerics
    assert "le(out, 0)" in both.doc and "pack_bool_masks" in knobs.describe()
    again = knobs.get("recompute_dropout_masks")
    assert isinstance(again.options["joint_custom_post_pass"], mask_bits.RecomputeDropoutMasks) and not again.numerics
    assert "draws it again from the saved seed" in again.doc and "recompute_dropout_masks" in knobs.describe()
    assert again.options["joint_custom_post_pass"].uuid() == mask_bits.RecomputeDropoutMasks().uuid()
    # one uuid per pass: with one per file, Inductor's FX cache served philox4_dropout_bits's compiled graphs to
    # recompute_dropout_masks in the same process (a CPU A/B, 2026-12-07: parity failed on another stream)
    passes = [k.options["joint_custom_post_pass"] for k in knobs.KNOBS.values() if "joint_custom_post_pass" in k.options]
    assert len(passes) >= 4 and len({q.uuid() for q in passes}) == len(passes)


class Fold(CustomGraphPass):
    """The post-grad pre pass a fusion pass starts with (``miner.runtime.bits.fold_round_trips``),
    recording per graph (forward, then backward) how many round trips it folded and which unpack nodes remain."""

    def __init__(self, planted=None):
        self.folded: list[int] = []
        self.unpacks_left: list[int] = []
        self.planted = planted

    def __call__(self, graph):
        from miner.runtime import bits

        self.folded.append(bits.fold_round_trips(graph) if self.planted is None else self.planted(graph))
        self.unpacks_left.append(sum(n.meta.get(bits.TAG) in (bits.UNPACK, bits.UNPACKED) for n in graph.nodes))

    def uuid(self):
        return None


def _folded_step(fold: Fold):
    import torch._functorch.config as fconfig

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TwoDropouts()
    x = torch.randn(SHAPE, requires_grad=True)
    compiled = torch.compile(model, options={"joint_custom_post_pass": mask_bits.PackDropoutMasks(),
                                             "post_grad_custom_pre_pass": fold, "fx_graph_cache": False,
                                             "cpp.simdlen": 1})
    with fconfig.patch(enable_autograd_cache=False):
        torch.manual_seed(1)
        loss = compiled(x)
        loss.backward()
    return loss.detach(), [x.grad] + [p.grad for p in model.parameters()]


def test_the_forward_reads_its_masks_again_and_the_backward_its_bits(default_step):
    """With the round trip folded (what a fusion pass does first, so a dropout region's ``mul(x, mask)``
    matches), the forward has no unpack left, the backward keeps its own (its bits are an input), and
    loss and gradients stay bitwise equal."""
    loss, grads = default_step[:2]
    fold = Fold()
    k_loss, k_grads = _folded_step(fold)
    assert fold.folded == [N_MASKS, 0] and fold.unpacks_left[0] == 0 and fold.unpacks_left[1] > 0
    assert torch.equal(loss, k_loss) and all(torch.equal(g, h) for g, h in zip(grads, k_grads))


def test_a_planted_fold_to_the_wrong_mask_changes_the_loss(default_step):
    """The check above fails on a fold that hands the forward another mask (the two dropouts' swapped)."""
    from miner.runtime import bits

    def swapped(graph):
        pairs = [(n, bits.source_mask(n)) for n in graph.nodes if n.meta.get(bits.TAG) == bits.UNPACKED]
        pairs = [(n, m) for n, m in pairs if m is not None]
        for (n, _), (_, m) in zip(pairs, pairs[::-1]):
            n.replace_all_uses_with(m)
        return len(pairs)

    loss = default_step[0]
    k_loss, _ = _folded_step(Fold(planted=swapped))
    assert not torch.equal(loss, k_loss)


def test_an_unpack_of_bits_from_an_input_is_left_alone():
    """A backward graph's unpack reads the saved bits (a placeholder, tagged as the pack's result by the
    partitioner's meta copy): no mask in the graph, nothing folded."""
    from miner.runtime import bits

    graph = torch.fx.Graph()
    b = graph.placeholder("getitem_1")
    with torch._subclasses.FakeTensorMode():
        b.meta.update({"val": torch.empty(25, dtype=torch.uint8), bits.TAG: bits.BITS})
        u = graph.call_function(torch.ops.aten.ne.Scalar, (b, 0))
        u.meta.update({"val": torch.empty(25, dtype=torch.bool), bits.TAG: bits.UNPACKED})
    graph.output((u,))
    assert bits.source_mask(u) is None and bits.fold_round_trips(graph) == 0 and u in graph.nodes


def test_a_fusion_pass_folds_the_round_trip_first(default_step):
    """The fusion pass itself (no fusions in it) is that fold: installed in both post-grad slots with the
    knob, the forward's unpacks are gone and the values stay bitwise equal."""
    from miner.runtime import bits
    from miner.runtime.rewrite import FusionPass

    seen = Fold(planted=lambda graph: 0)  # only counts what the fusion pass left
    fusion_pass = FusionPass([])

    class Both(CustomGraphPass):
        def __call__(self, graph):
            fusion_pass(graph)
            seen(graph)

        def uuid(self):
            return None

    loss, grads = default_step[:2]
    k_loss, k_grads = _folded_step(Both())
    assert seen.unpacks_left[0] == 0 and seen.unpacks_left[1] > 0
    assert torch.equal(loss, k_loss) and all(torch.equal(g, h) for g, h in zip(grads, k_grads))
    assert FusionPass([]).uuid() == fusion_pass.uuid()
