"""The ``philox4_dropout_bits`` knob: dropout masks drawn four per Philox call straight into bits
(``miner.runtime.keep_bits``, ``miner.check.mask_bits.DrawDropoutBits``), on the CPU (the kernel in the
Triton interpreter). The op's bits equal the int64 reference stream; its masks pass the stream's statistics;
a compiled training step saves only bits and equals an eager step with the op's own masks injected; the A/B's
parity judge records and injects them, and fails on planted bugs (a recorded mask that is not the applied one,
a backward that reads another mask's bits)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch._inductor.custom_graph_pass import CustomGraphPass

from miner.check import knobs, mask_bits, masks
from miner.check import random_stats as rs
from miner.runtime import bits, keep_bits, launch, philox, rewrite
from tests.test_mask_bits import SavedMasks

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SHAPE = (3, 5, 13)  # 195 elements per mask: not a multiple of 8
KNOB = knobs.get("philox4_dropout_bits")


@pytest.mark.parametrize("numel", [1, 7, 8, 9, 195, 8192 * 2 + 13])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_the_ops_bits_are_the_reference_streams_keep_mask(numel, p):
    seeds = masks.seed_vector(3, 5, DEVICE)  # Inductor's seed vector: negative seeds among them
    got = keep_bits.op()(seeds, 2, numel, p)
    assert got.dtype == torch.uint8 and got.shape == (math.ceil(numel / 8),)
    want = bits.pack(philox.uniform(int(seeds[2]), torch.arange(numel)) > p)
    assert torch.equal(got.cpu(), want)
    # the bytes past the mask are zero bits (the pad of ``bits.pack``), and another seed index is another mask
    if numel > 64:
        assert not torch.equal(keep_bits.op()(seeds, 3, numel, p).cpu(), want)


def test_the_bits_pass_the_streams_statistics():
    def keep(seed, shape, p):
        return rs.bits_keep(seed, shape, p, device=DEVICE).cpu()
    stats = ([rs.keep_rate(keep, p, 1 << 14) for p in (0.1, 0.5)] + rs.neighbours(keep, [2, 2, 16, 32])
             + rs.words(keep, 1 << 12) + rs.layers(keep, 1 << 12))
    assert all(s.ok for s in stats), [s.line() for s in stats if not s.ok]


class TwoDropouts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(13, 13)
        self.b = torch.nn.Linear(13, 13)

    def forward(self, x, drop=F.dropout):
        y = F.gelu(drop(self.a(x), 0.3, True))
        return drop(self.b(y), 0.4, True).square().sum()


def _step(joint_pass):
    """One seeded training step of ``TwoDropouts`` compiled with ``joint_pass``: loss, gradients, the saved
    bool/uint8 tensors and the op's recorded draws."""
    import torch._functorch.config as fconfig

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TwoDropouts().to(DEVICE)
    x = torch.randn(SHAPE, device=DEVICE, requires_grad=True)
    saved = SavedMasks()
    compiled = torch.compile(model, options={"joint_custom_post_pass": joint_pass, "post_grad_custom_pre_pass": saved,
                                             "fx_graph_cache": False})
    with fconfig.patch(enable_autograd_cache=False), launch.recording() as calls:
        torch.manual_seed(1)
        loss = compiled(x)
        loss.backward()
    return model, x, loss.detach(), [x.grad] + [p.grad for p in model.parameters()], saved.saved, calls


def _injected(model, x, calls):
    """The eager step with the recorded masks injected in program order (the dropout's own definition)."""
    drawn = iter(c.outputs[0] for c in calls)

    def drop(t, p, training):
        return t * next(drawn).reshape(t.shape) * (1.0 / (1.0 - p))
    model.zero_grad()
    xe = x.detach().clone().requires_grad_(True)
    loss = model(xe, drop=drop)
    loss.backward()
    return loss.detach(), [xe.grad] + [p.grad for p in model.parameters()]


def _close(a, b):
    return all(torch.allclose(u, v, rtol=1e-4, atol=1e-5) for u, v in zip(a, b))


def test_a_compiled_step_saves_bits_and_equals_eager_with_its_own_masks():
    model, x, loss, grads, saved, calls = _step(mask_bits.DrawDropoutBits())
    assert [c.pattern_id for c in calls] == [keep_bits.PATTERN_ID] * 2  # both masks drawn by the op, once each
    assert saved == [(torch.uint8, math.ceil(math.prod(SHAPE) / 8))] * 2  # bits saved, no bool mask
    ref_loss, ref_grads = _injected(model, x, calls)
    assert _close([loss], [ref_loss]) and _close(grads, ref_grads)
    # the masks are the op's stream at Inductor's seeds: index k of the step's seed vector
    seeds = calls[0].seeds[0]
    for c in calls:
        k, p = c.scalars
        assert torch.equal(c.outputs[0].cpu(), (philox.uniform(int(seeds[k]), torch.arange(c.outputs[0].numel())) > p))
    # the default compile draws other masks (Inductor's stream): its loss is not this one
    _, _, d_loss, _, d_saved, d_calls = _step(None)
    assert d_calls == [] and (torch.bool, math.prod(SHAPE)) in d_saved and not torch.equal(d_loss, loss)


class _BackwardReadsTheOtherBits(CustomGraphPass):
    """A planted bug after the knob's pass: every backward unpack reads the other mask's bits."""

    def __call__(self, graph):
        from miner.runtime import bits as bits_tag

        mask_bits.DrawDropoutBits()(graph)
        fwd = mask_bits.forward_nodes(graph)
        keep = [n for n in graph.nodes if n.meta.get(bits_tag.TAG) == bits_tag.UNPACKED]
        assert len(keep) == 2
        backward = [[u for u in k.users if u not in fwd] for k in keep]
        for users, a, b in ((backward[0], keep[0], keep[1]), (backward[1], keep[1], keep[0])):
            for u in users:
                u.replace_input_with(a, b)

    def uuid(self):
        return None


def test_a_backward_reading_another_masks_bits_fails_the_injected_reference():
    model, x, loss, grads, _, calls = _step(_BackwardReadsTheOtherBits())
    ref_loss, ref_grads = _injected(model, x, calls)
    assert _close([loss], [ref_loss])  # the forward is right: the loss alone would not see it
    assert not _close(grads, ref_grads)


def test_the_knob_is_registered_documented_and_draws():
    assert KNOB.draws == keep_bits.PATTERN_ID and "philox4_dropout_bits" in knobs.__doc__
    assert isinstance(KNOB.options["joint_custom_post_pass"], mask_bits.DrawDropoutBits)
    assert knobs.combine([knobs.get("sdpa_reduced_math"), KNOB]).draws == keep_bits.PATTERN_ID
    assert knobs.combine([knobs.get("sdpa_reduced_math"), knobs.get("reduce_overhead")]).draws == ""


def test_inference_graphs_and_other_draws_are_left_alone():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(8, 8)
    g.output(x)
    mask_bits.DrawDropoutBits()(g)  # no tangents: nothing to do, nothing raised
    assert [n.op for n in g.nodes] == ["placeholder", "output"]
    # a mask drawn from the generator (``fallback_random``: aten.rand_like, no seed to draw from again) is Inductor's
    with torch._inductor.config.patch(fallback_random=True):
        _, _, _, _, saved, calls = _step(mask_bits.DrawDropoutBits())
    assert calls == [] and (torch.bool, math.prod(SHAPE)) in saved


def _ff_built(batch=2):
    from miner_models import Built

    from tests.test_random_masks import FF

    torch.manual_seed(1)
    return Built(FF().to(DEVICE), {"x": torch.randn(batch, 4, 32, device=DEVICE)}, lambda out: out)


def test_the_ab_judges_the_knob_by_its_own_masks_injected(monkeypatch):
    # the knob alone in the A/B (no fusion): its masks recorded and injected ("masks injected", ok); the direct
    # comparison with the default would compare two random streams. Planted: the op records the mask it did not
    # apply (its complement): the judge fails it. At batch 2 (the step's judge out of memory) the same holds
    from dataclasses import replace

    from miner.check import ab
    from miner.check.verify import make_parity
    from miner.runtime import rewrite

    ab.raise_compile_limits()
    built = _ff_built(batch=4)

    def live(name, knob):
        with torch._inductor.config.patch(force_disable_caches=True):
            return ab.prepare(ab.VariantSpec(name, None, (), knob=knob), built, built.inputs,
                              ab.ABCase("m", "train", "default"), ab.ABOptions(preset="tiny", device=DEVICE, warmup=1))
    judge = masks.ab_judge(built, built.inputs, {}, mode="train", device=DEVICE,
                           graph_pass=lambda names: rewrite.FusionPass([]))
    default, knob = live("default", None), live("knob:philox4_dropout_bits", KNOB)
    assert getattr(knob, "knob", None) is KNOB
    before = make_parity(1.0, 1.0, None, None, {}, {})
    p = judge(default, knob, before)
    assert p.judged == masks.METHOD and p.ok is True, p
    small = judge(default, knob, before, batch=2)
    assert small.judged == "masks injected at batch 2" and small.ok is True, small
    assert judge(default, replace(knob, knob=knobs.get("recompute_dropout_masks")), before) is None  # Inductor's masks

    real = bits.unpack  # the compiled graphs' unpacks are traced already: only the op's recording changes
    monkeypatch.setattr(bits, "unpack", lambda b, shape: ~real(b, shape))
    bad = judge(default, knob, before)
    assert bad.judged == masks.METHOD and bad.ok is False, bad


def _region_step(joint_pass, fusion_pass, device="cpu"):
    """One seeded bf16-autocast relu + dropout step (``tests.test_mask_bits.BF16FeedForward``) compiled with the
    ``joint_pass`` knob and ``fusion_pass`` (None: no post-grad pass): loss, gradients, the (dtype, elements) of every
    tensor the backward saved at least 256 elements of, and the kernels' recorded draws."""
    import torch._functorch.config as fconfig

    from miner.runtime import rewrite
    from tests.test_mask_bits import BF16FeedForward

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = BF16FeedForward().to(device)
    x = torch.randn(2, 16, 64, device=device, requires_grad=True)
    saved = []

    def keep(t):
        if t.numel() >= 256:
            saved.append((t.dtype, t.numel()))
        return t
    options = {"joint_custom_post_pass": joint_pass, "fx_graph_cache": False,
               **(rewrite.inductor_options(fusion_pass) if fusion_pass is not None else {})}
    compiled = torch.compile(model, options=options)
    with fconfig.patch(enable_autograd_cache=False), launch.recording() as calls, \
            torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        torch.manual_seed(1)
        loss = compiled(x)
    loss.backward()
    return loss.detach(), [x.grad] + [p.grad for p in model.parameters()], sorted(saved, key=str), calls


def _complement_bits(run):
    """``launch.run`` with every output a kernel stored as bits complemented (a planted bug: the saved bits are not
    the mask the kernel applied; the recording inside ``run`` still sees the right ones)."""
    def inverted(spec, xs, scalars, **kw):
        outs = run(spec, xs, scalars, **kw)
        return tuple(~o if k in kw.get("bits", ()) else o for k, o in enumerate(outs))
    return inverted


def _relu_dropout():
    from pathlib import Path

    from miner.runtime import fusions

    p = fusions.graph_pass(Path(__file__).resolve().parents[1], ["relu_dropout"], interpret=True)
    p.gate = "open"
    return p


ON_BOTH = pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])])


@ON_BOTH
def test_under_the_knob_a_dropout_region_draws_the_mask_and_the_backward_saves_its_bits(device):
    """With the knob, t5's relu + dropout region (``fusions/relu_dropout``, drawing the knob's four-per-call stream)
    takes the draw back (``miner.runtime.drawn``): no ``philox4_keep_bits`` runs, the backward saves the bits packed
    from the region's own mask (no bool mask), and the step equals the region's without the knob bitwise (one
    stream, one mask in forward and backward); under ``philox4_dropout_bits_in_region`` the region's kernel stores
    those bits itself (``rewrite.pack_in_kernel``), the same step. No region taking it: the knob's graph exactly.
    Planted: bits of the complement of the region's mask, packed by the pass or stored by the kernel, break the
    gradients, not the loss."""
    n = 2 * 16 * 128
    a_loss, a_grads, a_saved, a_calls = _region_step(None, _relu_dropout(), device)  # the region alone: a bool mask saved
    assert a_saved.count((torch.bool, n)) == 2 and [c.pattern_id for c in a_calls] == ["pf4693d7449_x4"]  # +ReLU's
    both = _relu_dropout()
    b_loss, b_grads, b_saved, b_calls = _region_step(mask_bits.DrawDropoutBits(), both, device)
    assert both.counts["relu_dropout"] >= 1 and both.draws_taken >= 1 and both.masks_packed == 0  # a pass packs them
    assert [c.pattern_id for c in b_calls] == ["pf4693d7449_x4"]  # the region drew it; the op never ran
    assert (torch.uint8, n // 8) in b_saved and b_saved.count((torch.bool, n)) == 1, b_saved  # ReLU's mask only
    assert torch.equal(a_loss, b_loss) and all(torch.equal(g, h) for g, h in zip(a_grads, b_grads))
    # philox4_dropout_bits_in_region: the region's kernel stores the saved bits itself, the same step
    inreg = _relu_dropout()
    r_loss, r_grads, r_saved, r_calls = _region_step(mask_bits.DrawDropoutBitsInRegion(), inreg, device)
    assert inreg.draws_taken >= 1 and inreg.masks_packed >= 1 and [c.pattern_id for c in r_calls] == ["pf4693d7449_x4"]
    assert r_saved == b_saved and torch.equal(r_loss, a_loss) and all(torch.equal(g, h) for g, h in zip(r_grads, a_grads))

    # no region to take it: the draw put back, the knob's own step (the op draws, the bits saved)
    k_loss, k_grads, k_saved, k_calls = _region_step(mask_bits.DrawDropoutBits(), None, device)
    none = rewrite.FusionPass([])
    e_loss, e_grads, e_saved, e_calls = _region_step(mask_bits.DrawDropoutBits(), none, device)
    assert none.draws_taken == 0 and [c.pattern_id for c in e_calls] == [keep_bits.PATTERN_ID]
    assert e_saved == k_saved and torch.equal(e_loss, k_loss) and all(torch.equal(g, h) for g, h in zip(e_grads, k_grads))

    import miner.runtime.drawn as drawn_mod

    with pytest.MonkeyPatch.context() as m:
        real = bits.pack  # planted: the packing pass packs the complement of the region's mask
        m.setattr(drawn_mod.bits, "pack", lambda mask: real(~mask))
        bad = _relu_dropout()
        p_loss, p_grads, _, _ = _region_step(mask_bits.DrawDropoutBits(), bad, device)
    assert bad.draws_taken >= 1 and bad.masks_packed == 0 and torch.equal(p_loss, a_loss)
    assert not all(torch.allclose(g, h) for g, h in zip(p_grads, a_grads))

    with pytest.MonkeyPatch.context() as m:  # planted: the region's kernel stores the complement of its mask as bits
        m.setattr(launch, "run", _complement_bits(launch.run))
        wrong = _relu_dropout()
        w_loss, w_grads, _, _ = _region_step(mask_bits.DrawDropoutBitsInRegion(), wrong, device)
    assert wrong.masks_packed >= 1 and torch.equal(w_loss, a_loss)
    assert not all(torch.allclose(g, h) for g, h in zip(w_grads, a_grads))


def test_only_a_region_drawing_the_knobs_stream_may_take_a_drawn_mask():
    from types import SimpleNamespace

    from miner.runtime import decisions, rewrite

    drawn_node = SimpleNamespace(meta={bits.TAG: bits.DRAWN})
    match = SimpleNamespace(nodes=[SimpleNamespace(meta={}), drawn_node])

    def under(rng):
        module = SimpleNamespace(_kernel=lambda: SimpleNamespace(RNG=rng))
        fusion_pass = SimpleNamespace(entries=[SimpleNamespace(name="f", module=module)])
        with decisions.applying(fusion_pass, "f"):
            return rewrite.drawn_reasons(match)
    assert under("philox4") == []
    assert under("inductor") == [rewrite.DRAWN_STREAM] and under(None) == [rewrite.DRAWN_STREAM]
    assert rewrite.drawn_reasons(SimpleNamespace(nodes=[SimpleNamespace(meta={})])) == []  # no drawn mask: no say


def test_the_ab_judges_the_knob_with_a_region_taking_its_draw():
    """The knob with a region that took its draw back: the step's masks are recorded by the region (the op never
    runs), and the judge injects them: ok; the same variant whose saved bits are the complement's fails, whether a
    packing pass packed them (``philox4_dropout_bits``) or the region's kernel stored them
    (``philox4_dropout_bits_in_region``)."""
    from miner.check import ab
    from miner.check.verify import make_parity
    from miner.runtime import rewrite
    from miner_models import Built
    from tests.test_mask_bits import BF16FeedForward

    ab.raise_compile_limits()
    torch.manual_seed(1)
    built = Built(BF16FeedForward(), {"x": torch.randn(2, 16, 64)}, lambda out: out)
    fused = _relu_dropout()
    modules = {e.name: e.module for e in fused.entries}

    def live(name, knob, graph_pass=None, names=()):
        with torch._inductor.config.patch(force_disable_caches=True):
            return ab.prepare(ab.VariantSpec(name, graph_pass, names, knob=knob), built, built.inputs,
                              ab.ABCase("m", "train", "default"), ab.ABOptions(preset="tiny", device="cpu", warmup=1))
    judge = masks.ab_judge(built, built.inputs, modules, mode="train", device="cpu",
                           graph_pass=lambda names: rewrite.FusionPass([]))
    default = live("default", None)
    both = live("knob:philox4_dropout_bits+fusions", KNOB, fused, ("relu_dropout",))
    assert both.res.matches.get("relu_dropout")
    assert "of the knob's mask draws taken by the regions" in ab.taken_text(fused)  # what the compile's log line says
    before = make_parity(1.0, 1.0, None, None, {}, {})
    p = judge(default, both, before)
    assert p.judged == masks.METHOD and p.ok is True, p
    import miner.runtime.drawn as drawn_mod

    with pytest.MonkeyPatch.context() as m:  # planted: the backward's bits packed from the complement of the mask
        real = bits.pack
        m.setattr(drawn_mod.bits, "pack", lambda mask: real(~mask))
        bad = live("knob:philox4_dropout_bits+fusions", KNOB, _relu_dropout(), ("relu_dropout",))
        assert bad.res.matches.get("relu_dropout")
    worse = judge(default, bad, before)
    assert worse.judged == masks.METHOD and worse.ok is False, worse

    in_region = knobs.get("philox4_dropout_bits_in_region")  # the region's kernel stores the bits: judged alike
    fused = _relu_dropout()
    stored = live("knob:philox4_dropout_bits_in_region+fusions", in_region, fused, ("relu_dropout",))
    assert "packed into bits by their region's kernel" in ab.taken_text(fused)
    p = judge(default, stored, before)
    assert p.judged == masks.METHOD and p.ok is True, p

    with pytest.MonkeyPatch.context() as m:  # planted: the backward's bits, stored by the kernel, the complement's
        m.setattr(launch, "run", _complement_bits(launch.run))
        bad = live("knob:philox4_dropout_bits_in_region+fusions", in_region, _relu_dropout(), ("relu_dropout",))
        assert bad.res.matches.get("relu_dropout")
        worse = judge(default, bad, before)
    assert worse.judged == masks.METHOD and worse.ok is False, worse


def test_the_fusion_pass_cache_key_follows_drawn(monkeypatch, tmp_path):
    """``miner.runtime.drawn`` changes the graphs the fusion pass compiles, so its source is in the pass's uuid
    (Inductor's FX cache key): an edited copy gives another key, never a stale compiled graph."""
    from miner.runtime import drawn

    before = rewrite.FusionPass([]).uuid()
    edited = tmp_path / "drawn.py"
    edited.write_text(__import__("pathlib").Path(drawn.__file__).read_text() + "\n# edited\n")
    monkeypatch.setattr(drawn, "__file__", str(edited))
    assert rewrite.FusionPass([]).uuid() != before
