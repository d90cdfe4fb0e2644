"""The knob registry (miner.check.knobs) and knob variants in the in-model A/B (miner.check.ab), on the CPU."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest
import torch

from miner.check import ab, knobs
from miner.core.errors import UsageError


def test_builtin_knobs_say_what_they_change():
    assert set(knobs.KNOBS) == {"sdpa_reduced_math", "reduce_overhead", "max_autotune_no_cudagraphs",
                                "coordinate_descent", "combo_kernels", "benchmark_fusion", "pack_dropout_masks",
                                "pack_bool_masks", "recompute_dropout_masks", "philox4_dropout_bits",
                                "philox4_dropout_bits_in_region", "gemm_epilogues"}
    sdpa = knobs.get("sdpa_reduced_math")
    assert sdpa.context is not None and not sdpa.options and "bf16" in sdpa.numerics
    ro = knobs.get("reduce_overhead")
    assert ro.cudagraphs and ro.options == {"triton.cudagraphs": True} and not ro.numerics
    # the built-in options are what torch.compile's modes stand for in this torch version
    import torch._inductor
    assert dict(ro.options) == torch._inductor.list_mode_options("reduce-overhead")
    assert dict(knobs.get("max_autotune_no_cudagraphs").options) == \
        torch._inductor.list_mode_options("max-autotune-no-cudagraphs")
    known = set(torch._inductor.list_options())
    assert all(k in known for knob in knobs.KNOBS.values() for k in knob.options)


def test_unknown_knob_is_loud_and_lists_the_names():
    with pytest.raises(UsageError) as e:
        knobs.parse("sdpa_reduced_math,nope")
    assert "unknown knob 'nope'" in str(e.value)
    assert all(name in str(e.value) for name in knobs.KNOBS)


def test_parse_all_and_combined():
    assert [k.name for k in knobs.parse("all")] == list(knobs.KNOBS)
    assert [k.name for k in knobs.parse(" coordinate_descent, all ")][0] == "coordinate_descent"
    assert len(knobs.parse("coordinate_descent,all")) == len(knobs.KNOBS)  # no duplicate
    both = knobs.parse("sdpa_reduced_math+reduce_overhead")[0]
    assert both.name == "sdpa_reduced_math+reduce_overhead" and both.cudagraphs and both.context is not None
    assert "bf16" in both.numerics
    assert knobs.parse("") == [] and knobs.parse(None) == []
    clash = knobs.Knob("c", "cudagraphs off", options={"triton.cudagraphs": False})
    with pytest.raises(UsageError, match="triton.cudagraphs is set to"):
        knobs.combine([knobs.get("reduce_overhead"), clash])


def test_sdpa_context_is_set_while_the_step_runs_and_restored_after():
    flag = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed
    assert flag() is False
    seen = []
    step = knobs.get("sdpa_reduced_math").around(lambda: seen.append(flag()))
    step()
    assert seen == [True] and flag() is False

    def boom():
        assert flag() is True
        raise RuntimeError("step failed")
    with pytest.raises(RuntimeError):
        knobs.get("sdpa_reduced_math").around(boom)()
    assert flag() is False  # restored on the way out of a failing step too
    plain = knobs.get("coordinate_descent")
    f = lambda: 1  # noqa: E731
    assert plain.around(f) is f  # no context: the step itself


def test_a_users_knob_from_the_current_directory(tmp_path, monkeypatch):
    (tmp_path / "myknobs_t.py").write_text(
        "from miner.check.knobs import Knob\n"
        "no_padding = Knob('no_padding', 'shape padding off', options={'shape_padding': False})\n"
        "def made():\n    return Knob('made', 'from a function', options={'coordinate_descent_tuning': True})\n"
        "bad = Knob('bad', 'not an option', options={'no_such_option': 1})\n"
        "not_a_knob = 3\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    got = knobs.parse("myknobs_t:no_padding,myknobs_t:made")
    assert [k.name for k in got] == ["no_padding", "made"] and got[0].options == {"shape_padding": False}
    with pytest.raises(UsageError, match="'no_such_option' is not a torch._inductor.config option"):
        knobs.get("myknobs_t:bad")
    with pytest.raises(UsageError, match="int is not a miner.check.knobs.Knob"):
        knobs.get("myknobs_t:not_a_knob")
    with pytest.raises(UsageError, match="cannot import 'nosuchmod_xyz'"):
        knobs.get("nosuchmod_xyz:k")


# --------------------------------------------------------------------------- in the A/B

from tests.test_verify_ab import _Built, _Norm, _build  # noqa: E402  the small layer-norm model


@pytest.fixture
def counting_knob():
    """A knob whose context counts its entries and flips a global (restored after): what a flag knob does."""
    state = {"entered": 0, "on": False}

    @contextlib.contextmanager
    def ctx():
        state["entered"] += 1
        before, state["on"] = state["on"], True
        try:
            yield
        finally:
            state["on"] = before
    return knobs.Knob("counting", "test", options={"coordinate_descent_tuning": True}, context=ctx,
                      numerics="test numerics"), state


def test_run_ab_measures_each_knob_alone_and_with_the_fusions(counting_knob, monkeypatch):
    from miner.runtime.fusions import Fusions

    knob, state = counting_knob
    cached, prepare = {}, ab.prepare

    def spy(spec, *args, **kwargs):  # which variants Inductor's FX cache may serve
        cached[spec.name] = spec.cache
        return prepare(spec, *args, **kwargs)
    monkeypatch.setattr(ab, "prepare", spy)
    r = ab.run_ab(_build, ab.ABCase("norm", "infer", "default"), Fusions(Path(__file__).resolve().parents[1]),
                  ab.ABOptions(preset="tiny", device="cpu", warmup=1, rounds=2, profile_steps=0), knobs=[knob],
                  log=lambda s: None)
    names = [v.name for v in r.variants]
    assert names[:3] == ["default", "control", "all"]
    assert "knob:counting" in names and "knob:counting+fusions" in names
    alone, fused = r.variant("knob:counting"), r.variant("knob:counting+fusions")
    assert alone.knob == fused.knob == "counting" and alone.numerics == "test numerics"
    assert not alone.fusions and not any(alone.matches.values())
    assert fused.matches["layer_norm"] >= 1 and fused.gate == ab.GATE_ON  # the fusions as a user gets them
    for v in (alone, fused):
        assert v.step is not None and v.step.steps == 2 and v.speedup is not None and v.parity is not None
        assert v.parity.ok and v.verdict in ("win", "loss", "noise")
    # the context was entered for the compiling warm-up, the 2 timed rounds and the parity step, per variant
    # (and the knob's control, its compiled step timed again in each of the 2 rounds: the knob's own band)
    assert state["entered"] == 2 * (1 + 2 + 1) + 2 and state["on"] is False
    assert "counting" in r.knob_bands and not any(ab.is_knob_control(v) for v in r.variants)
    from miner.check import abrun

    assert "Noise band on top of knob:counting (its compiled step timed twice per round" in abrun.detail(r)
    assert r.variant("default").step.steps == 2  # phase A's numbers kept for default
    # the caches never serve a knob with a context (its flag is in no cache key) nor a variant with a pass
    assert cached == {"default": True, "control": True, "all": False, "knob:counting": False,
                      "knob:counting+fusions": False}
    options_only = knobs.Knob("opts", "test", options={"coordinate_descent_tuning": True})
    assert ab.cacheable(options_only, fused=False) and not ab.cacheable(options_only, fused=True)
    # one fusion fires on the knob: knob:counting+fusions is it alone there, the evidence over the knob
    [(f, rec)] = ab.knob_records(r)
    assert f == "layer_norm" and rec.knob == "counting" and rec.matches == fused.matches["layer_norm"]


def test_fusion_variants_alone_without_all_only_on_top_of_knobs():
    from miner.commands.verify import _fusion_variants

    assert _fusion_variants("alone,gated", knobs=True) == ("alone", "gated")
    with pytest.raises(UsageError, match="alone needs all or --knobs"):
        _fusion_variants("alone,gated")


def test_knobs_only_one_phase_without_fusion_variants(counting_knob):
    from miner.runtime.fusions import Fusions

    knob, _ = counting_knob
    r = ab.run_ab(_build, ab.ABCase("norm", "train", "default"), Fusions(Path(__file__).resolve().parents[1]),
                  ab.ABOptions(preset="tiny", device="cpu", warmup=1, rounds=2, profile_steps=0,
                               fusion_variants=("gated",)), knobs=[knob], log=lambda s: None)
    names = [v.name for v in r.variants]
    assert names == ["default", "control", "gated", "knob:counting", "knob:counting+fusions"]
    assert r.noise_band is not None and r.variant("control").verdict is not None
    assert r.variant("gated").matches["layer_norm"] >= 1 and r.variant("knob:counting").parity.grads_rel is not None


def test_fusion_variants_none_is_each_knob_with_and_without_the_gated_fusions(counting_knob):
    from miner.commands.verify import _fusion_variants
    from miner.runtime.fusions import Fusions

    with pytest.raises(UsageError, match="none: give --knobs"):
        _fusion_variants("none")
    with pytest.raises(UsageError, match="unknown 'none'"):
        _fusion_variants("none,gated", knobs=True)
    knob, _ = counting_knob
    r = ab.run_ab(_build, ab.ABCase("norm", "train", "default"), Fusions(Path(__file__).resolve().parents[1]),
                  ab.ABOptions(preset="tiny", device="cpu", warmup=1, rounds=2, profile_steps=0,
                               fusion_variants=_fusion_variants("none", knobs=True)), knobs=[knob], log=lambda s: None)
    assert [v.name for v in r.variants] == ["default", "control", "knob:counting", "knob:counting+fusions"]
    assert r.variant("knob:counting+fusions").gate == ab.GATE_ON and r.noise_band is not None


def test_knob_variants_out_of_time_are_recorded(counting_knob):
    from miner.check.abrun import NoFusions

    knob, _ = counting_knob
    r = ab.run_ab(_build, ab.ABCase("norm", "infer", "default"), NoFusions(),
                  ab.ABOptions(preset="tiny", device="cpu", warmup=1, rounds=2, profile_steps=0), knobs=[knob],
                  deadline=0.0, log=lambda s: None)
    assert [v.name for v in r.variants] == ["default", "control", "knob:counting"]  # no fusions: no +fusions
    assert r.variant("knob:counting").error.startswith("not compiled: --time-budget spent (~")
    assert r.noise_band is not None and r.variant("default").step.steps == 2  # the band still measured


def test_a_variant_is_compiled_only_when_its_compile_and_its_phase_end_within_the_budget():
    # MegatronBert on the H100 (2026-12-06): a 57 s compile began before the deadline, then 4 variants'
    # rounds and judges: `timeout` killed the 490 s tune at 560 s, nothing written
    assert ab.phase_room(None, 60.0, 10.0, 4) is None  # no budget
    assert ab.phase_room(100.0, 60.0, 10.0, 4, now=0.0) is None  # 100 s left, 60 + 4 x 10 needed
    why = ab.phase_room(100.0, 60.0, 10.0, 4, now=1.0)
    assert why.startswith("not compiled: --time-budget spent (~100 s needed") and "99 s left" in why
    assert ab.phase_room(100.0, 57.0, 0.0, 4, now=40.0) is None  # before the first phase: its compile only
    assert ab.phase_room(100.0, 57.0, 0.0, 4, now=44.0)  # 56 s left for a 57 s compile
    assert ab.phase_room(100.0, 0.0, 0.0, 1, now=101.0)  # past the deadline: nothing compiles


# --------------------------------------------------------------------------- CUDA-graph knobs and device memory

def test_graph_room_asks_for_twice_the_default_steps_peak_free():
    gib = 2 ** 30
    assert ab.graph_room(10 * gib, "cpu", free_total=(1, 2)) is None  # the CPU keeps no pools
    assert ab.graph_room(None, "cuda", free_total=(1, 2)) is None  # no peak measured: nothing to go by
    assert ab.graph_room(10 * gib, "cuda", free_total=(23 * gib, 80 * gib)) is None
    why = ab.graph_room(10 * gib, "cuda", free_total=(21 * gib, 80 * gib))  # 22 GiB needed
    assert why.startswith("not compiled") and "21.0 of 80.0 GiB are free" in why and "smaller batch" in why
    # DeBERTa-v2 base B16 S512 on the H100: a 31.6 GiB step beside its own pool (it ran out of memory)
    assert ab.graph_room(int(31.6 * gib), "cuda", free_total=(int(63.4 * gib), int(79.2 * gib)))


def test_a_second_cuda_graph_variant_asks_only_for_what_the_shared_pool_lacks():
    gib = 2 ** 30
    # t5-base B32 S512 on an H100 (a 33 GiB step): the knob's graphs fit (72.6 GiB asked, 77 free) ...
    assert ab.graph_room(33 * gib, "cuda", free_total=(77 * gib, 80 * gib)) is None
    # ... and then a fusion variant's graphs record into the same pool: a step beside it and its growth
    assert ab.graph_room(33 * gib, "cuda", free_total=(44 * gib, 80 * gib), pool=33 * gib) is None
    why = ab.graph_room(33 * gib, "cuda", free_total=(38 * gib, 80 * gib), pool=33 * gib)  # 36.3 + 3.3 needed
    assert why and "39.6 GiB" in why and "hold 33.0 GiB of the pool they share" in why
    # a smaller pool than this step: the difference is asked for again
    assert ab.graph_room(10 * gib, "cuda", free_total=(int(16.5 * gib), 80 * gib), pool=5 * gib)
    assert ab.graph_room(10 * gib, "cuda", free_total=(17 * gib, 80 * gib), pool=5 * gib) is None
    lives = [_live("default"), _live("knob:reduce_overhead", graphs=True), _live("knob:reduce_overhead+f", graphs=True)]
    lives[2].res.warmup_peak_bytes = 4 * gib
    assert ab.graph_pool(lives) == 4 * gib and ab.graph_pool(lives[:1]) == 0
    lives[2].step = None  # freed: its graphs no longer count
    assert ab.graph_pool(lives) == 3 * gib


def test_a_cuda_graph_knob_that_runs_out_of_memory_while_compiling_is_recorded_and_the_ab_goes_on(
        counting_knob, monkeypatch):
    from miner.check.abrun import NoFusions

    real_prepare = ab.prepare

    def prepare(spec, *a):
        if spec.name == "knob:graphs":
            raise _OOM("CUDA out of memory. Tried to allocate 2.00 GiB.\nmore")
        return real_prepare(spec, *a)

    monkeypatch.setattr(ab, "prepare", prepare)
    graphs = knobs.Knob("graphs", "test", options={"triton.cudagraphs": True})
    knob, _ = counting_knob
    r = ab.run_ab(_build, ab.ABCase("norm", "infer", "default"), NoFusions(),
                  ab.ABOptions(preset="tiny", device="cpu", warmup=1, rounds=2, profile_steps=0),
                  knobs=[graphs, knob], log=lambda s: None)
    v = r.variant("knob:graphs")
    assert v.error.startswith("not compiled: out of device memory while compiling") and "2.00 GiB" in v.error
    assert v.cudagraphs and v.step is None
    assert r.variant("knob:counting").step.steps == 2  # the A/B went on
    # any other error in a compile is not hidden
    monkeypatch.setattr(ab, "prepare", lambda spec, *a: 1 / 0 if spec.name == "knob:graphs" else real_prepare(spec, *a))
    with pytest.raises(ZeroDivisionError):
        ab._run_ab(_build, ab.ABCase("norm", "infer", "default"), NoFusions(),
                   ab.ABOptions(preset="tiny", device="cpu", warmup=1, rounds=2, profile_steps=0),
                   ab._SoFar(ab.ABResult("norm", "infer", "default", "tiny", None, None)),
                   knobs=[graphs, knob], deadline=None, log=lambda s: None)


def test_a_cuda_graph_knob_that_would_not_fit_is_recorded_not_compiled(counting_knob, monkeypatch):
    from miner.check.abrun import NoFusions

    compiled = []
    real_prepare = ab.prepare
    monkeypatch.setattr(ab, "prepare", lambda spec, *a: compiled.append(spec.name) or real_prepare(spec, *a))
    monkeypatch.setattr(ab, "graph_room", lambda peak, device, pool=0: "not compiled: no room (test)")
    graphs = knobs.Knob("graphs", "test", options={"triton.cudagraphs": True})
    knob, _ = counting_knob
    r = ab.run_ab(_build, ab.ABCase("norm", "infer", "default"), NoFusions(),
                  ab.ABOptions(preset="tiny", device="cpu", warmup=1, rounds=2, profile_steps=0),
                  knobs=[graphs, knob], log=lambda s: None)
    assert "knob:graphs" not in compiled and "knob:counting" in compiled  # only the graph knob is held back
    v = r.variant("knob:graphs")
    assert v.error == "not compiled: no room (test)" and v.cudagraphs and v.step is None
    assert r.variant("knob:counting").step.steps == 2


class _OOM(Exception):
    pass


_OOM.__name__ = "OutOfMemoryError"  # as torch.OutOfMemoryError is matched: by name (CUDA's and XPU's)


def _live(name, *, graphs=False, fail_at=None):
    calls = [0]

    def step():
        calls[0] += 1
        if fail_at is not None and calls[0] == fail_at:
            raise _OOM("CUDA out of memory. Tried to allocate 1.96 GiB.\nmore")
    res = ab.VariantResult(name, [], ab.NO_GATE, knob="reduce_overhead" if graphs else None, cudagraphs=graphs,
                           warmup_peak_bytes=3 * 2 ** 30 if graphs else None)
    return ab._Live(res, torch.nn.Linear(1, 1), step)


def test_out_of_memory_in_the_rounds_drops_the_graph_knobs_and_times_the_rest_again():
    lives = [_live("default", fail_at=3), _live("control"), _live("knob:reduce_overhead", graphs=True)]
    dropped = ab.interleave(lives, 3, "cpu")
    assert [lv.res.name for lv in lives] == ["default", "control"]
    assert all(len(lv.times) == 3 and len(lv.host) == 3 for lv in lives)  # rounds started over: still paired
    [gone] = dropped
    assert gone.res.error.startswith("dropped: out of device memory") and "1.96 GiB" in gone.res.error
    assert "pool held about 3.0 GiB" in gone.res.error and gone.step is None and not gone.times
    # nothing of that kind to drop: the error is the run's (a default that does not fit is not hidden)
    with pytest.raises(_OOM):
        ab.interleave([_live("default", fail_at=1), _live("control")], 2, "cpu")
    with pytest.raises(ZeroDivisionError):  # any other error propagates as it is
        ab.interleave([ab._Live(lives[0].res, torch.nn.Linear(1, 1), lambda: 1 / 0),
                       _live("knob:reduce_overhead", graphs=True)], 1, "cpu")


def test_the_knobs_variants_come_before_the_fusions_alone_within_the_budget():
    # bert and gpt2 on the H100 (2026-12-06): the `alone` variants spent gpt2's budget; its knob never compiled
    ro = knobs.get("reduce_overhead")
    assert ab.knob_reserve([ro], 25.0, deadline=None) is None  # no budget: everything compiles
    assert ab.knob_reserve([], 25.0, deadline=100.0, now=99.0) is None  # no knob to wait for
    assert ab.knob_reserve([ro], 25.0, deadline=100.0, now=50.0) is None  # 50 s left, 2 x 25 s needed
    why = ab.knob_reserve([ro], 25.0, deadline=100.0, now=51.0)
    assert why.startswith("not compiled: the knobs' 2 variants come first") and "49 s left" in why
    assert ab.knob_reserve([ro, ro], 25.0, deadline=100.0, now=0.0) is None
    assert ab.knob_reserve([ro, ro], 25.0, deadline=100.0, now=1.0)  # two knobs: four variants


def test_an_interrupted_ab_keeps_the_first_phase_and_names_what_it_did_not_measure():
    from miner.runtime.fusions import Fusions

    entered = [0]

    @contextlib.contextmanager
    def ctx():  # entered for each variant's compiling warm-up, then each timed round: Ctrl-C in the first round
        entered[0] += 1
        if entered[0] == 3:
            raise KeyboardInterrupt
        yield
    knob = knobs.Knob("cut", "test", options={"coordinate_descent_tuning": True}, context=ctx)
    with pytest.raises(ab.Interrupted) as e:
        ab.run_ab(_build, ab.ABCase("norm", "infer", "default"), Fusions(Path(__file__).resolve().parents[1]),
                  ab.ABOptions(preset="tiny", device="cpu", warmup=1, rounds=2, profile_steps=0), knobs=[knob],
                  log=lambda s: None)
    r = e.value.result
    assert r.error is None and r.variant("all").speedup is not None  # the first phase stands, measured
    assert r.variant("all").parity.ok and r.variant("default").step.steps == 2
    for name in ("knob:cut", "knob:cut+fusions"):  # compiled, never timed: recorded as such
        v = r.variant(name)
        assert v.step is None and v.speedup is None and v.error.startswith("not measured: interrupted")


def test_an_ab_interrupted_before_any_timed_phase_is_an_error_row():
    r = ab.interrupted(ab.ABResult("m", "train", "default", "base", 16, 512),
                       [ab.VariantResult("default", [], ab.NO_GATE)], 12.0)
    assert r.error == "interrupted 12 s into this A/B, before a timed phase finished"
    assert r.variants[0].error.startswith("not measured")


def test_an_interrupt_in_the_first_phases_parity_leaves_the_default_a_plain_row():
    timed = dict(step=ab.StepStats(10.0, 9.0, 11.0, 2, 0, 1.0), speedup=1.0)
    default = ab.VariantResult("default", [], ab.NO_GATE, **timed)
    control = ab.VariantResult("control", [], ab.NO_GATE, **timed)
    fused = ab.VariantResult("all", ["f"], ab.GATE_OPEN, **{**timed, "speedup": 1.2})
    r = ab.interrupted(ab.ABResult("m", "train", "default", "base", 16, 512), [default, control, fused], 30.0)
    assert r.error is None and [v.name for v in r.variants] == ["default", "control", "all"]
    assert default.verdict is None and control.verdict is None  # not variants whose parity is judged
    assert fused.verdict == ab.UNJUDGED and "parity not judged" in fused.note  # timed, never a win unjudged


class _NormSoftmax(_Norm):
    """The layer-norm model with a log_softmax on its logits: two of the repository's fusions match."""

    def forward(self, input_ids):
        return {"logits": torch.log_softmax(super().forward(input_ids)["logits"].float(), dim=-1)}


def test_each_fusion_firing_on_a_knob_is_measured_alone_on_top_of_it(counting_knob):
    knob, _ = counting_knob
    r = _ab_on_knob(_NormSoftmax, "norm_softmax", "infer", ("alone",), knob)
    fused = r.variant("knob:counting+fusions")
    fired = sorted(f for f, n in fused.matches.items() if n)
    assert len(fired) == 2, fused.matches
    names = [v.name for v in r.variants]
    assert names == ["default", "control", "knob:counting", "knob:counting+fusions"] + \
        [f"knob:counting+alone:{f}" for f in fired]
    for f in fired:
        v = r.variant(f"knob:counting+alone:{f}")
        assert v.knob == "counting" and [g for g, n in v.matches.items() if n] == [f] and v.parity.ok
        assert len(v.round_ms) == len(r.variant("knob:counting").round_ms) == 2
    assert sorted(f for f, _ in ab.knob_records(r)) == fired


def test_a_gated_knob_variant_where_no_match_fires_takes_the_knobs_numbers_untimed(counting_knob):
    """t5 at B24 on the H100 (2026-12-07): with the gate on every match declined, and timing that variant (the
    knob's own graph) ran the A/B out of time. Compiled, it keeps its compile and matches; it is not timed."""
    class _Plain(torch.nn.Module):  # nothing any repository fusion matches
        def __init__(self):
            super().__init__()
            self.emb, self.head = torch.nn.Embedding(50, 16), torch.nn.Linear(16, 50)

        def forward(self, input_ids):
            return {"logits": self.head(self.emb(input_ids))}

    knob, state = counting_knob
    r = _ab_on_knob(_Plain, "plain", "train", (), knob)
    assert [v.name for v in r.variants] == ["default", "control", "knob:counting", "knob:counting+fusions"]
    alone, fused = r.variant("knob:counting"), r.variant("knob:counting+fusions")
    assert not any(fused.matches.values()) and fused.compile_s is not None and fused.compile_s != alone.compile_s
    assert fused.note.startswith("same graph as `knob:counting`") and "not timed" in fused.note
    assert fused.step is alone.step and fused.speedup == alone.speedup and fused.parity is alone.parity
    # entered: each variant's compiling warm-up, the knob alone's 2 rounds and its parity step; never the copy's rounds
    assert state["entered"] == 2 + 2 + 1


def _ab_on_knob(model: type, name: str, mode: str, fusion_variants: tuple, knob) -> ab.ABResult:
    """``run_ab`` of ``model()`` on token ids with the repository's fusions and ``knob``, on the CPU."""
    from miner.runtime.fusions import Fusions

    def build():
        torch.manual_seed(0)
        return _Built(model(), {"input_ids": torch.randint(0, 50, (2, 8))})

    return ab.run_ab(build, ab.ABCase(name, mode, "default"), Fusions(Path(__file__).resolve().parents[1]),
                     ab.ABOptions(preset="tiny", device="cpu", warmup=1, rounds=2, profile_steps=0,
                                  fusion_variants=fusion_variants), knobs=[knob], log=lambda s: None)


def test_no_fusions_measures_the_knobs_alone(tmp_path, capsys):
    """``--no-fusions``: a workspace's promoted fusions are not loaded (one compile per knob, not two), and the
    flag refuses what it would silently ignore."""
    from miner.check.abrun import ABRun, CandidateSet, NoFusions, fusions_of
    from miner.cli import main
    from miner.runtime.fusions import Fusions

    repo = Path(__file__).resolve().parents[1]
    options = ab.ABOptions(preset="tiny", device="cpu")
    knob = knobs.parse("reduce_overhead")
    assert isinstance(fusions_of(ABRun(options, fusions=False), repo, knob), NoFusions)
    assert isinstance(fusions_of(ABRun(options, fusions=False, candidates=("x",)), repo, knob), NoFusions)
    assert isinstance(fusions_of(ABRun(options), repo, knob), Fusions)  # promoted ones, knobs or not
    assert isinstance(fusions_of(ABRun(options), tmp_path, knob), NoFusions)  # none promoted, knobs only
    assert isinstance(fusions_of(ABRun(options, candidates=("re332d220be",)), repo, knob), CandidateSet)
    for extra in ([], ["--knobs", "reduce_overhead", "--candidates", "p1"], ["--knobs", "reduce_overhead", "--record"]):
        assert main(["verify", "--ab", "--models", "t5", "--no-fusions", "--allow-cpu", *extra]) == 2
    assert "neither --candidates nor --record" in capsys.readouterr().err
