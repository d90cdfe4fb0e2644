"""The "masks injected" parity (``miner.check.masks``) of a step whose dropout kernels draw the
four-per-call stream: it passes for the committed ``_x4`` candidates and fails on planted bugs (a
scale of 1, a mask output that is not the mask applied, a backward that reads another mask).

On the CPU the candidates' patterns (they hold bf16 casts: mined on the H200 under bf16 autocast)
fire in a small feed-forward block under CPU bf16 autocast (``FF``: relu + dropout, then dropout +
residual + RMS norm, as in t5); their kernels run in the Triton interpreter. On a CUDA machine the
same block runs on the GPU. The t5 check itself is ``miner validate <id>_x4 --device cuda``.
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from miner.check import masks

REPO = Path(__file__).resolve().parents[1]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
X4 = ("pf4693d7449_x4", "p010eaa2cbb_x4")


class FF(nn.Module):
    """t5's feed-forward sublayer: relu + dropout (``pf4693d7449``), dropout + residual + RMS norm
    (``p010eaa2cbb``), then a head. ``h0``'s square in the loss keeps the mm output saved, so the
    partitioner recomputes relu's gradient mask in the backward (as in t5 on the H200) instead of
    saving it from the forward, where it would read relu outside the region."""

    def __init__(self, d: int = 32, f: int = 64, p: float = 0.5):
        super().__init__()
        self.wi, self.wo = nn.Linear(d, f, bias=False), nn.Linear(f, d, bias=False)
        self.drop, self.drop2 = nn.Dropout(p), nn.Dropout(p)
        self.w = nn.Parameter(torch.ones(d))
        self.head = nn.Linear(d, 16, bias=False)

    def forward(self, x):
        h0 = self.wi(x)
        y = x + self.drop2(self.wo(self.drop(F.relu(h0))))
        y = self.w * (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6))
        return self.head(y).float().pow(2).mean() + 1e-3 * (h0 * h0).float().mean()


def _built():
    from miner_models import Built

    torch.manual_seed(1)
    model = FF().to(DEVICE)
    return Built(model, {"x": torch.randn(2, 4, 32, device=DEVICE)}, lambda out: out)


def _candidate(tmp: Path, cid: str, suffix: str = "", edits: dict | None = None):
    """A copy of a committed candidate under another pattern id and op name (``cid + suffix``: its
    own custom op), ``edits`` = {file: [(old, new), ...]} planted into it."""
    from miner.core import candidate as candidates

    dst = tmp / (cid + suffix)
    shutil.copytree(REPO / "candidates" / cid, dst)
    for name in ("pattern.py", "kernel.py"):
        p = dst / name
        text = p.read_text().replace(cid, cid + suffix)
        for old, new in (edits or {}).get(name, []):
            assert old in text, (name, old)
            text = text.replace(old, new)
        p.write_text(text)
    return candidates.at(dst)


def _parity(cands, floor):
    from miner.runtime import rewrite

    gp = rewrite.FusionPass([rewrite.entry_for(c.path / "pattern.py", c.id) for c in cands])
    built = _built()
    got = masks.observe_compiled(built, "train", DEVICE, graph_pass=gp, autocast=True, seed=0)
    r = masks.masked_parity(built, got, mode="train", device=DEVICE, slots_of=masks.slots_of(cands), autocast=True,
                            floor=floor)
    assert sum(gp.counts.values()) == len(cands), gp.counts  # each candidate fired once
    return r


@pytest.fixture(scope="module")
def floor():
    """The default compile's errors to the eager reference with Inductor's own masks (measured once)."""
    built = _built()
    f, why = masks.floor_of(built, "train", DEVICE, autocast=True, seed=0,
                            count=len(masks.dropout_calls(built, "train", DEVICE)))
    assert f is not None, why
    assert all(v < 0.05 for v in f.values()), f  # Inductor's masks reproduced (other masks: ~0.3 and more)
    return f


def test_mask_slots_of_the_committed_candidates():
    # catches a slot read from the wrong node: the seed input, its index scalar, the mask output
    from miner.core import candidate as candidates
    from miner.core.workspace import Workspace

    got = {cid: masks.mask_slots(candidates.load(Workspace(REPO), cid).meta["pattern"]) for cid in X4}
    assert got == {"pf4693d7449_x4": [masks.MaskSlot(0, 0, 0)], "p010eaa2cbb_x4": [masks.MaskSlot(2, 0, 0)]}
    pattern = candidates.load(Workspace(REPO), "pf4693d7449_x4").meta["pattern"]
    with pytest.raises(ValueError, match="not a region output"):
        masks.mask_slots({**pattern, "extra_outputs": []})


def test_inductor_stream_is_reproduced():
    # catches a wrong reproduction of Inductor's own masks (seed vector, seed order, stream, conversion)
    def three(a, b, c):
        return F.dropout(a, 0.5, True), F.dropout(b, 0.3, True), F.dropout(c, 0.2, True)
    xs = [torch.ones(3, 40, device=DEVICE), torch.ones(5, 7, device=DEVICE), torch.ones(2, 3, 11, device=DEVICE)]
    fn = torch.compile(three, dynamic=False)
    fn(*xs)
    torch.manual_seed(7)
    outs = fn(*xs)
    seeds = masks.seed_vector(7, 3, DEVICE).cpu()
    for k, (o, p) in enumerate(zip(outs, (0.5, 0.3, 0.2))):
        assert torch.equal((o != 0).cpu(), masks.inductor_keep(int(seeds[k]), o.shape, p, DEVICE))
    torch._dynamo.reset()


def test_the_x4_candidates_pass(tmp_path, floor):
    # the baseline: both regions fire in one step, their recorded masks injected, within the floor
    r = _parity([_candidate(tmp_path, cid) for cid in X4], floor)
    assert r.ok is True and r.recorded == 2 and r.dropouts == 2, r


def test_recording_copies_only_the_masks(tmp_path):
    # DeBERTa-v2 on the H100 (2026-12-06): copies of every output of every recorded launch (~7 GB: the attention
    # region's fp32 and bf16 [16, 12, 512, 512]) sat beside the judge's eager step, which ran out of memory
    from miner.runtime import rewrite

    cands = [_candidate(tmp_path, cid) for cid in X4]
    gp = rewrite.FusionPass([rewrite.entry_for(c.path / "pattern.py", c.id) for c in cands])
    got = masks.observe_compiled(_built(), "train", DEVICE, graph_pass=gp, autocast=True, seed=0)
    assert {d.pattern_id for d in got.calls} == {c.kernel_module.PATTERN_ID for c in cands}
    for d in got.calls:
        kept = [o for o in d.outputs if o is not None]
        assert kept and all(o.dtype == torch.bool for o in kept), d.pattern_id
        assert len(kept) < len(d.outputs), d.pattern_id  # each also outputs values: not copied


def test_fails_on_a_scale_of_one(tmp_path, floor):
    # planted: relu + dropout without the 1/(1-p) scale (the mask right, the values at half their size)
    bad = _candidate(tmp_path, "pf4693d7449_x4", "s1", {"kernel.py": [("v6 = (v5 * c2)", "v6 = (v5 * 1.0)")]})
    r = _parity([bad], floor)
    assert r.ok is False and r.error["grads"] > 0.1, r  # the norm after it hides much of it from the loss


def test_fails_when_the_mask_output_is_another_draw(tmp_path, floor):
    # planted: the values use the mask of seed s, the mask output (what the backward reads) is drawn at s + 1
    old = "store_mask(out0_ptr, rows * n_cols + cols, v3, mask,"
    new = "store_mask(out0_ptr, rows * n_cols + cols, (uniform_at(v0 + 1, lin) > c1), mask,"
    bad = _candidate(tmp_path, "p010eaa2cbb_x4", "m1", {"kernel.py": [(old, new)]})
    r = _parity([bad], floor)
    assert r.ok is False, r


def test_fails_when_the_backward_reads_another_mask(tmp_path, floor):
    # planted: the replacement hands the backward a mask Inductor draws again (its own stream, the same
    # seed), not the one the kernel applied: the recompute bug of pytorch/pytorch#198333
    old = "    return (out[0], out[1], *shared(x0, x1, c0, c1, c2))\n"
    new = ("    seed = torch.ops.prims.inductor_lookup_seed.default(x0, int(c0))\n"
           "    again = torch.ops.prims.inductor_random.default(list(x1.shape), seed, 'rand')\n"
           "    return (torch.ops.aten.gt.Scalar(again, c1), out[1], *shared(x0, x1, c0, c1, c2))\n")
    bad = _candidate(tmp_path, "pf4693d7449_x4", "b1", {"pattern.py": [(old, new)]})
    r = _parity([bad], floor)
    assert r.ok is False and "grads" in r.reason.split(";")[0], r



def test_ab_judges_a_variant_with_a_philox4_fusion_by_injected_masks(tmp_path):
    # the A/B's hook: a variant holding an _x4 candidate gets the masks-injected parity (ok here), one
    # without gets None (its own parity stands); without such a fusion there is no judge at all
    import types

    from miner.check import ab
    from miner.check.verify import make_parity
    from miner.runtime import rewrite

    cand = _candidate(tmp_path, "pf4693d7449_x4")
    module = rewrite.load_module(cand.path / "pattern.py", rewrite.module_name(cand.path / "pattern.py", "pattern"))
    built = _built()
    empty = masks.ab_judge(built, built.inputs, {}, mode="train", device=DEVICE)  # the step has dropout: a judge
    judge = masks.ab_judge(built, built.inputs, {"x4": module}, mode="train", device=DEVICE)

    def live(name, fusions, graph_pass):
        with torch._inductor.config.patch(force_disable_caches=True):
            return ab.prepare(ab.VariantSpec(name, graph_pass, tuple(fusions)), built, built.inputs,
                              ab.ABCase("m", "train", "default"), ab.ABOptions(preset="tiny", device=DEVICE, warmup=1))
    default = live("default", (), None)
    x4 = live("x4", ["x4"], rewrite.FusionPass([rewrite.Entry("x4", module, ())]))
    assert x4.res.matches == {"x4": 1}
    before = make_parity(1.0, 1.0, None, None, {}, {})
    assert empty(default, default, before) is None  # a variant without fusions keeps its own parity
    p = judge(default, x4, before)
    assert p.judged == masks.METHOD and p.ok is True and p.error is not None, p
    other = types.SimpleNamespace(res=types.SimpleNamespace(fusions=["rms_norm"], knob="sdpa_reduced_math"))
    assert judge(default, other, before) is None  # a knob's variant without the _x4 fusion keeps its parity
    # an _x4 fusion that matched nothing changed nothing: the default's graph, its own parity stands (DeBERTa's
    # attention region at B16 S512 was judged anyway and the judge ran out of memory: "not judged")
    idle = types.SimpleNamespace(res=types.SimpleNamespace(fusions=["x4"], matches={"x4": 0}, knob=None))
    assert judge(default, idle, before) is None
    # a step with more dropout elements than the reference reproduces is not judged, and says where it
    # is (a t5-base step's 2.4e9 elements stalled the H200 A/B past its 10-minute call)
    old = masks.MAX_ELEMENTS, masks.MAX_ELEMENTS_GPU
    try:
        masks.MAX_ELEMENTS = masks.MAX_ELEMENTS_GPU = 1
        big = masks.ab_judge(built, built.inputs, {"x4": module}, mode="train", device=DEVICE)
        p = big(default, x4, before)
        assert p.ok is False and "not judged" in p.judged and "miner validate" in p.reason, p
    finally:
        masks.MAX_ELEMENTS, masks.MAX_ELEMENTS_GPU = old


def test_a_judge_that_does_not_fit_judges_the_same_fusions_at_a_smaller_batch(tmp_path):
    # DeBERTa-v2 B16 S512 on an 80 GB H100: the step's eager float32 reference did not fit beside the A/B's
    # variants (twice). The same fusions, compiled afresh at batch 2 of the same model, are judged there; a
    # planted wrong scale fails there as in the step
    from miner.check import ab
    from miner.check.verify import make_parity
    from miner.runtime import rewrite
    from miner_models import Built

    def module_of(cand):
        return rewrite.load_module(cand.path / "pattern.py", rewrite.module_name(cand.path / "pattern.py", "pattern"))

    ab.raise_compile_limits()  # as an A/B does: more than 8 compiles of FF.forward below
    torch.manual_seed(1)
    built = Built(FF().to(DEVICE), {"x": torch.randn(4, 4, 32, device=DEVICE)}, lambda out: out)
    good, bad = _candidate(tmp_path, "pf4693d7449_x4"), _candidate(
        tmp_path, "pf4693d7449_x4", "s2", {"kernel.py": [("v6 = (v5 * c2)", "v6 = (v5 * 1.0)")]})
    modules = {"good": module_of(good), "bad": module_of(bad)}

    def graph_pass(names):
        return rewrite.FusionPass([rewrite.Entry(n, modules[n], ()) for n in names])

    def live(name, fusions):
        with torch._inductor.config.patch(force_disable_caches=True):
            return ab.prepare(ab.VariantSpec(name, graph_pass(fusions) if fusions else None, tuple(fusions)), built,
                              built.inputs, ab.ABCase("m", "train", "default"),
                              ab.ABOptions(preset="tiny", device=DEVICE, warmup=1))
    judge = masks.ab_judge(built, built.inputs, modules, mode="train", device=DEVICE, graph_pass=graph_pass)
    default = live("default", [])

    class OutOfMemoryError(RuntimeError):
        pass

    def no_room_for_the_step(d, v, parity, batch=None):
        if batch is None:
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 3.91 GiB.")
        return judge(d, v, parity, batch=batch)

    lives = [default]
    for name, ok in (("good", True), ("bad", False)):
        v = live(name, [name])
        lives.append(v)
        v.res.parity = make_parity(1.0, 1.0, None, None, {}, {})
        p = ab._judged(no_room_for_the_step, default, v, DEVICE)
        assert p.judged == "masks injected at batch 2" and p.ok is ok, p.reason
        # what the judge asked for stays in the reason (the next run sizes its variants by it)
        assert p.reason.startswith("the step's judge ran out of device memory (it asked for 3.91 GiB more); at batch "
                                   "2: "), p.reason
    # a variant on top of a knob (t5 B32 S512 on the H100: "a knob's variant is judged in its own step only", so
    # 1.326x stayed unjudged): its fusions compiled at batch 2 under the knob, its context entered, CUDA graphs off
    from miner.check.knobs import CUDAGRAPHS, Knob

    entered = []

    @contextlib.contextmanager
    def counting():
        entered.append(1)
        yield

    knob = Knob("counting", "counts its steps", options={CUDAGRAPHS: True}, context=counting)
    assert masks.judged_knob(knob).options == {} and masks.judged_knob(None) is None
    for name, ok in (("good", True), ("bad", False)):
        v = live(f"knob:counting+{name}", [name])  # its own name: its own compile options, its own frame
        assert v.res.matches[name]
        v.knob, v.res.knob = replace(knob, options={}), knob.name
        v.res.parity = make_parity(1.0, 1.0, None, None, {}, {})
        before = len(entered)
        p = ab._judged(no_room_for_the_step, default, v, DEVICE)
        assert p.judged == "masks injected at batch 2" and p.ok is ok, p.reason
        assert len(entered) > before  # the judge's compile and step ran inside the knob's context
    # the A/B's variants still run their compiled frames (a Dynamo reset would compile them again, in a timed round)
    frames = torch._dynamo.utils.counters["frames"]["ok"]
    for v in lives:
        v.step()
    assert torch._dynamo.utils.counters["frames"]["ok"] == frames
    assert masks.first_rows({"x": torch.zeros(2, 3), "n": 5}, 2) is None  # no larger batch to cut
    assert masks.first_rows({"x": torch.zeros(4, 3), "w": torch.zeros(3)}, 2)["x"].shape == (2, 3)
    out_of_time = masks.ab_judge(built, built.inputs, modules, mode="train", device=DEVICE, graph_pass=graph_pass,
                                 room=lambda n: f"{n} compiles do not fit")
    p = out_of_time(default, lives[1], lives[1].res.parity, batch=2)
    assert p.judged == "masks injected at batch 2 (not judged)" and p.reason == "not judged: 2 compiles do not fit"


@pytest.mark.parametrize("seed", [0, 12345, -(2**62) + 7, 2**63 - 1])
def test_inductor_masks_drawn_by_triton_equal_the_int64_reference(seed):
    """The GPU path of Inductor's stream (``tl.rand`` in a Triton kernel, what the A/B uses for
    t5-base's 2.4e9 elements) draws bit-for-bit the numbers of the int64 torch Philox (under the
    interpreter here; the committed H200 run compares them on the GPU), for negative and large
    seeds too; and one planted change (the next counter) is caught."""
    from miner.runtime import philox

    if DEVICE == "cpu":
        from miner.runtime.launch import interpreting
        if not interpreting():
            pytest.skip("needs TRITON_INTERPRET=1")
    n = 1000
    got = masks.triton_uniform(seed, n, DEVICE).cpu()
    want = philox.to_uniform(philox.philox4x32(seed, torch.arange(n))[0])
    assert torch.equal(got, want)
    shifted = philox.to_uniform(philox.philox4x32(seed, torch.arange(1, n + 1))[0])
    assert not torch.equal(got, shifted)


def test_ab_judges_a_fusion_drawing_no_stream_of_its_own_by_inductors_masks(tmp_path):
    # a variant whose fusions draw Inductor's own numbers (or none: a matmul rewrite) is judged against
    # the same eager reference as the default, every mask Inductor's, instead of a fixed tolerance on a
    # bf16 step; a wrong scale fails it; a knob variant and a variant the float32 floor judged keep theirs
    import dataclasses

    from miner.check import ab
    from miner.check.verify import make_parity
    from miner.runtime import rewrite

    torch._dynamo.reset()  # a frame an earlier test compiled from the same model class would be reused unpassed
    built = _built()

    def live(name, cand):
        module = rewrite.load_module(cand.path / "pattern.py", rewrite.module_name(cand.path / "pattern.py", "pattern"))
        gp = rewrite.FusionPass([rewrite.Entry(name, module, ())]) if cand else None
        with torch._inductor.config.patch(force_disable_caches=True):
            return module, ab.prepare(ab.VariantSpec(name, gp, (name,)), built, built.inputs,
                                      ab.ABCase("m", "train", "default"),
                                      ab.ABOptions(preset="tiny", device=DEVICE, warmup=1))

    with torch._inductor.config.patch(force_disable_caches=True):
        default = ab.prepare(ab.VariantSpec("default"), built, built.inputs, ab.ABCase("m", "train", "default"),
                             ab.ABOptions(preset="tiny", device=DEVICE, warmup=1))
    # the RMS norm after the dropouts (no random op: on the CPU a region drawing "Inductor's" numbers
    # draws Triton's, which are Inductor's on CUDA only)
    good_module, good = live("rms", _candidate(tmp_path, "p0ef2a90522", "i1"))
    assert good.res.matches == {"rms": 1}
    judge = masks.ab_judge(built, built.inputs, {"rms": good_module}, mode="train", device=DEVICE)
    fixed = make_parity(1.0, 1.0, None, None, {}, {})
    p = judge(default, good, fixed)
    assert p.judged == masks.INDUCTOR_METHOD and p.ok is True and p.error is not None, p
    # the planted bug: the norm's epsilon 0.5 too large
    old = "    return torch.ops.miner.cp0ef2a90522i2(x0, x1, c0, c1)\n"
    new = "    return torch.ops.miner.cp0ef2a90522i2(x0, x1, c0, c1 + 0.5)\n"
    bad_module, bad = live("wrong_scale", _candidate(tmp_path, "p0ef2a90522", "i2", {"pattern.py": [(old, new)]}))
    assert bad.res.matches == {"wrong_scale": 1}
    p = masks.ab_judge(built, built.inputs, {"wrong_scale": bad_module}, mode="train", device=DEVICE)(default, bad, fixed)
    assert p.judged == masks.INDUCTOR_METHOD and p.ok is False, p
    # kept as they are: a knob's variant, and one the float32 floor decided
    assert judge(default, dataclasses.replace(good, res=dataclasses.replace(good.res, knob="k")), fixed) is None
    assert judge(default, good, dataclasses.replace(fixed, judged="float32 floor")) is None


def test_dropout_calls_run_one_eager_step_per_model_mode_and_shape(monkeypatch):
    """The judge asks for the step's dropout calls once per variant it judges: one eager dry run serves them all,
    a new input shape (the batch-2 judge) or another model runs its own."""
    import types

    runs = []

    def eager(built, mode, device, mask_of, seed):
        runs.append((id(built.model), mode, tuple(built.inputs["x"].shape)))
        return None, types.SimpleNamespace(calls=[((2, 3), 0.1)])

    monkeypatch.setattr(masks, "eager_reference", eager)
    model = torch.nn.Linear(3, 3)
    built = types.SimpleNamespace(model=model, inputs={"x": torch.zeros(2, 3)})
    for _ in range(3):
        assert masks.dropout_calls(built, "train", "cpu") == [((2, 3), 0.1)]
    assert len(runs) == 1
    masks.dropout_calls(types.SimpleNamespace(model=model, inputs={"x": torch.zeros(1, 3)}), "train", "cpu")
    masks.dropout_calls(types.SimpleNamespace(model=torch.nn.Linear(3, 3), inputs={"x": torch.zeros(2, 3)}),
                        "train", "cpu")
    masks.dropout_calls(types.SimpleNamespace(model=types.SimpleNamespace(), inputs={"x": torch.zeros(2, 3)}),
                        "train", "cpu")  # no weak reference: counted, not kept
    assert len(runs) == 4
