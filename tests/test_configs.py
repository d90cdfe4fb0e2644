"""The configuration rule (miner.check.configs.recommend): ordered cases, each a rule of the docstring."""

from __future__ import annotations

import pytest

from miner.check.configs import Config, configurations, lines, markdown, recommend, recommendations

D = Config("default", speedup=1.0, parity_ok=None)


def c(name, speedup, verdict="win", *, parity=True, numerics="", error=None, rel=None):
    knob = None if name in ("default", "fusions") else name.removesuffix("+fusions")
    return Config(name, knob, name == "fusions" or name.endswith("+fusions"), speedup, verdict=verdict,
                  parity_ok=parity, numerics=numerics, error=error, error_rel=rel)


def test_rule_1_a_knob_that_fails_parity_is_never_recommended():
    rec = recommend([D, c("sdpa", 1.40, parity=False, rel=0.2), c("fusions", 1.05)], 0.01)
    assert rec.best.name == "fusions"
    assert "never recommended: sdpa: parity failed (max rel diff 2.0e-01)" in rec.reason
    assert rec.best_knob is None  # an unusable knob is no best knob either
    errored = recommend([D, c("ro", None, None, error="not compiled: --time-budget spent")], 0.01)
    assert errored.best.name == "default" and "not compiled" in errored.reason


def test_rule_2_nothing_beyond_the_band_keeps_the_default():
    rec = recommend([D, c("fusions", 1.008, "noise"), c("cd", 0.95, "loss")], 0.01)
    assert rec.best.name == "default"
    assert rec.reason.startswith("nothing measured faster than the default beyond the noise band ±1.0%")


def test_rule_3_the_fastest_unless_fewer_changes_are_within_the_band():
    rec = recommend([D, c("fusions", 1.07), c("sdpa", 1.13, numerics="bf16"), c("sdpa+fusions", 1.25)], 0.01)
    assert rec.best.name == "sdpa+fusions" and rec.best.changes == 2
    # the knob + fusions within the band of the knob alone: the knob alone (the fusions buy nothing measurable)
    rec = recommend([D, c("ro", 1.29), c("ro+fusions", 1.295)], 0.02)
    assert rec.best.name == "ro" and "within the band" in rec.reason
    # equal changes within the band: the one keeping the default's numerics first
    rec = recommend([D, c("sdpa", 1.100, numerics="bf16"), c("cd", 1.095)], 0.01)
    assert rec.best.name == "cd"


def test_rule_4_the_fusions_share_on_top_of_the_best_knob():
    rec = recommend([D, c("fusions", 1.07), c("sdpa", 1.13), c("sdpa+fusions", 1.25), c("ro", 1.10),
                     c("ro+fusions", 1.30)], 0.01)
    assert rec.best_knob.name == "sdpa" and rec.best_knob_fused.name == "sdpa+fusions"
    assert rec.share == pytest.approx(1.25 / 1.13) and rec.share_verdict == "win"
    assert rec.best.name == "ro+fusions"  # the best configuration is not necessarily on the best knob
    small = recommend([D, c("sdpa", 1.13), c("sdpa+fusions", 1.135)], 0.01)
    assert small.share_verdict == "noise"
    unfused = recommend([D, c("sdpa", 1.13)], 0.01)
    assert unfused.share is None and "not measured" in lines(unfused)[2]


def test_rule_4_the_recommended_knob_with_fusions_says_its_own_share_and_an_unmeasured_one_says_how():
    from dataclasses import replace

    # t5 on the H100: the masks drawn into bits the fastest knob alone, the SDPA flag with the fusions recommended
    k, bits, fused = c("k", 1.252), c("k+philox4_dropout_bits", 1.262), c("k+fusions", 1.462)
    k, bits, fused = replace(k, source="a"), replace(bits, source="a"), replace(fused, source="b")
    text = " ".join(lines(recommend([D, k, bits, fused], 0.007), width=1000))
    assert "fusions on top of the best knob (k+philox4_dropout_bits): not measured (`miner verify --ab" in text
    assert f"fusions on top of its own knob (k): {1.462 / 1.252:.3f}x (win against ±0.7%; the two from different runs" in text
    # the recommendation on the best knob itself: one share line, not two
    text = " ".join(lines(recommend([D, k, replace(fused, source="a")], 0.007), width=1000))
    assert "its own knob" not in text and "on top of the best knob (k): 1.168x" in text


def test_rule_4_on_top_of_a_knob_its_own_band_tells_the_two_apart():
    from dataclasses import replace

    # t5 B8 S256 on the H100: the default host-bound (band ±10.3%), the knob under CUDA graphs steady; the
    # fusions 1.08x on top of the knob are a measured gain against the knob's own band, not against ±10.3%
    ro, fused = c("ro", 2.705), c("ro+fusions", 2.945)
    rec = recommend([D, ro, fused], 0.103)
    assert rec.best.name == "ro" and rec.share_verdict == "noise" and rec.share_band == 0.103
    ro, fused = replace(ro, knob_band=0.012), replace(fused, knob_band=0.012)
    rec = recommend([D, ro, fused], 0.103)
    assert rec.best.name == "ro+fusions" and rec.share_verdict == "win" and rec.share_band == 0.012
    assert "against ±1.2%, the knob's own band" in " ".join(lines(rec, width=400))
    # configurations on different knobs are still told apart by the run's band
    rec = recommend([D, replace(c("sdpa", 2.80), knob_band=0.01), fused], 0.103)
    assert rec.best.name == "sdpa" and "within the band" in rec.reason


def test_rule_5_numerics_of_each_knob_with_its_measured_difference():
    rec = recommend([D, c("sdpa", 1.13, numerics="bf16 GEMMs", rel=3.1e-3), c("cd", 1.02)], 0.01)
    assert rec.numerics == ("sdpa: bf16 GEMMs; measured max rel diff to the default 3.1e-03",)


# --------------------------------------------------------------------------- from an ABResult

def _result():
    from miner.check.ab import ABResult, VariantResult
    from miner.check.verify import Parity, StepStats

    def v(name, ms, sp, verdict, *, knob=None, fusions=(), gate="-", numerics="", ok=True, rel=1e-3, graphs=False):
        return VariantResult(name, list(fusions), gate, step=StepStats(ms, ms * 0.98, ms * 1.02, 10, 2**30, 60.0),
                             speedup=sp, verdict=verdict, speedup_p20=sp * 0.99, speedup_p80=sp * 1.01,
                             parity=Parity(5.2, 5.2, rel, rel, rel, "w", rel, ok), compile_s=60.0, knob=knob,
                             numerics=numerics, cudagraphs=graphs)
    r = ABResult("t5", "train", "default", "base", 16, 512, noise_band=0.01, env={"date": "2026-12-04"})
    r.variants = [v("default", 75.0, 1.0, None), v("control", 75.2, 0.997, "noise"),
                  v("all", 70.0, 1.07, "win", fusions=["f"], gate="open"),
                  v("gated", 70.6, 1.069, "win", fusions=["f"], gate="on"),
                  v("knob:sdpa_reduced_math", 66.6, 1.133, "win", knob="sdpa_reduced_math", numerics="bf16"),
                  v("knob:sdpa_reduced_math+fusions", 60.0, 1.25, "win", knob="sdpa_reduced_math", fusions=["f"],
                    gate="on", numerics="bf16"),
                  v("knob:reduce_overhead", 70.0, 1.07, "win", knob="reduce_overhead", graphs=True, ok=False)]
    return r


def test_rule_6_a_leaner_win_is_named_where_memory_binds():
    from dataclasses import replace

    # t5 B16 S512 on the H100 (2026-12-07): the masks recomputed in the backward peak 2.0 GiB lower at 2.7% of
    # the step; bit-packed masks peak lower too but are slower; a leaner step's peak compares only with a peak
    # measured alike (both warm-up peaks of CUDA graphs here)
    knob = replace(c("k", 1.234), peak_gib=14.62, peak_warmup=True)
    recompute = replace(c("k+recompute", 1.202), peak_gib=12.62, peak_warmup=True)
    pack = replace(c("k+pack", 1.105), peak_gib=12.87, peak_warmup=True)
    rec = recommend([replace(D, peak_gib=14.38), knob, recompute, pack], 0.002)
    assert rec.best.name == "k" and rec.leaner.name == "k+recompute"
    assert ("where memory binds: k+recompute, warm-up peak (CUDA graphs' pool) 12.62 GiB (-13.7% of 14.62) at "
            "1.202x (2.7% slower)") in " ".join(lines(rec, 10**6))
    assert recommend([D, knob, replace(recompute, peak_gib=14.0)], 0.002).leaner is None  # 4% lower: not named
    assert recommend([D, knob, replace(recompute, peak_warmup=False)], 0.002).leaner is None  # measured unalike
    assert recommend([D, knob, replace(recompute, verdict="noise")], 0.002).leaner is None  # no faster than default
    assert not any("memory binds" in x for x in lines(recommend([D, knob], 0.002)))


def test_configurations_and_markdown_from_an_ab_result():
    r = _result()
    confs = {x.name: x for x in configurations(r)}
    assert set(confs) == {"default", "fusions", "sdpa_reduced_math", "sdpa_reduced_math+fusions", "reduce_overhead"}
    assert confs["fusions"].speedup == 1.069  # gated, not the gate-open `all`
    assert confs["reduce_overhead"].peak_gib is None  # CUDA graphs: not measured
    [rec] = recommendations([r], ["reports/x/verify.json"])
    assert rec.best.name == "sdpa_reduced_math+fusions" and rec.source == "reports/x/verify.json"
    assert "reduce_overhead: parity failed" in rec.reason
    md = markdown([r])
    assert "run `sdpa_reduced_math+fusions`" in md and "| reduce_overhead | 70.00 |" in md and "FAIL" in md
    assert all(len(line) <= 100 for line in lines(rec))
    r.variants = r.variants[:4]  # no knob measured: nothing to recommend here
    assert recommendations([r]) == []


def test_candidates_and_the_report_lead_with_the_recommendation(tmp_path, capsys):
    from miner import cli
    from miner.check import abrun

    abrun.save([_result()], tmp_path / "reports" / "gpu" / "run1")
    assert cli.main(["--workspace", str(tmp_path), "candidates"]) == 0
    out = capsys.readouterr().out
    assert "What to run" in out and "t5 train/default: run sdpa_reduced_math+fusions" in out
    assert out.index("What to run") < out.index("Adopt:")
    assert cli.main(["--workspace", str(tmp_path), "report", "--run", "r"]) == 0
    html = (tmp_path / "reports" / "r" / "index.html").read_text()
    assert "run <b>sdpa_reduced_math+fusions</b>" in html
    assert 'alt="configurations per model step" src="data:image/png;base64,' in html  # the figure leads
    assert html.index("configurations per model step") < html.index("run <b>sdpa_reduced_math+fusions</b>")
    assert "Configurations: knobs and fusions" in (tmp_path / "reports" / "gpu" / "run1" / "verify.md").read_text()


def test_the_configurations_figure_plots_every_measured_configuration_or_nothing():
    import dataclasses

    from miner.report.figures import configs_chart

    rec = recommend([D, c("fusions", 1.07), c("sdpa", 1.13, numerics="bf16"), c("sdpa+fusions", 1.25),
                     c("cd", 1.3, parity=False)], 0.01, model="t5", mode="train")
    png = configs_chart([rec], "")
    assert png.startswith("data:image/png;base64,") and len(png) > 1000
    assert configs_chart([recommend([D], 0.01)], "") is None  # only the default: nothing to plot
    rec = dataclasses.replace(rec, setup="NVIDIA H100 80GB HBM3, base B16 S512, bf16 autocast")
    assert configs_chart([rec], "NVIDIA H200, base B16 S512, bf16 autocast", only_headline=True) is None
    assert configs_chart([rec], "NVIDIA H200, base B16 S512, bf16 autocast") is not None  # labelled [H100]


def test_runs_of_one_model_step_split_over_calls_are_pooled():
    first, second = _result(), _result()
    first.variants = first.variants[:6]  # fusions and the sdpa knob
    second.variants = [second.variants[0], second.variants[1]] + [
        __import__("dataclasses").replace(second.variants[6], speedup=1.40, parity=first.variants[4].parity)]
    second.noise_band = 0.02
    [rec] = recommendations([first, second], ["a/verify.json", "b/verify.json"])
    names = {c.name for c in rec.configs}
    assert {"fusions", "sdpa_reduced_math", "sdpa_reduced_math+fusions", "reduce_overhead"} <= names
    assert rec.best.name == "reduce_overhead" and rec.band == 0.02  # the widest band of the pooled runs
    assert rec.source == "a/verify.json, b/verify.json"
    # a later measurement of the same configuration replaces the earlier one
    third = _result()
    third.variants = third.variants[:2] + [__import__("dataclasses").replace(third.variants[4], speedup=1.01,
                                                                             verdict="noise")]
    [rec] = recommendations([first, second, third])
    assert next(c for c in rec.configs if c.name == "sdpa_reduced_math").speedup == 1.01


def test_pooled_runs_of_other_fusions_on_one_knob_keep_both_measurements():
    """t5 B16 S512 on the H100: five candidates on top of the knob in one call (1.462x), one compute-once
    candidate in a later call (a loss): the later run measured another configuration, it does not replace
    the earlier one under the shared name ``<knob>+fusions``."""
    from dataclasses import replace

    def fused(r, speedup, matches):
        r.variants = r.variants[:2] + [r.variants[4], replace(r.variants[5], speedup=speedup, matches=matches,
                                                                 fusions=sorted(matches))]
        return r

    five = fused(_result(), 1.25, {"f": 3, "g": 2})
    once = fused(_result(), 1.10, {"h": 3})
    [rec] = recommendations([five, once])
    got = {c.name: c.speedup for c in rec.configs}
    assert got["sdpa_reduced_math+fusions [f, g]"] == 1.25 and got["sdpa_reduced_math+fusions [h]"] == 1.10
    assert rec.best.name == "sdpa_reduced_math+fusions [f, g]" and rec.share == pytest.approx(1.25 / 1.133)
    again = fused(_result(), 1.30, {"f": 3, "g": 2})  # the same fusions measured again: it replaces the first
    [rec] = recommendations([five, once, again])
    assert {c.name: c.speedup for c in rec.configs}["sdpa_reduced_math+fusions [f, g]"] == 1.30
    [rec] = recommendations([five, again])  # one set only: the plain name
    assert "sdpa_reduced_math+fusions" in {c.name for c in rec.configs}


def test_a_masks_injected_parity_shows_its_own_error_and_a_marginal_win_says_so():
    # a variant judged with its own masks injected (another random stream) shows the error to that
    # reference beside the default's floor, never the direct difference of two streams (0.56 on t5);
    # a win whose p20 is below 1.0 reads "marginal win" in the table
    import dataclasses

    from miner.check.configs import cells

    r = _result()
    fused = r.variants[5]
    r.variants[5] = dataclasses.replace(
        fused, speedup_p20=0.98, parity=dataclasses.replace(fused.parity, loss_rel=0.56, logits_rel=0.56, grads_rel=0.56,
                                                            judged="masks injected", error={"grads": 7.4e-3},
                                                            floor={"grads": 7.5e-3}))
    c = {x.name: x for x in configurations(r)}["sdpa_reduced_math+fusions"]
    assert c.error_rel == 7.4e-3 and c.floor_rel == 7.5e-3
    row = cells(c)
    assert row[3] == "marginal win" and "masks injected: 7.4e-03, the default's floor 7.5e-03" in row[6], row
    plain = {x.name: x for x in configurations(_result())}["sdpa_reduced_math+fusions"]
    assert plain.floor_rel is None and cells(plain)[3] == "win" and cells(plain)[6] == "ok (1.0e-03)"


def test_parity_that_could_not_be_judged_is_named_so_and_never_recommended():
    # the judge could not run (e.g. the compiled step ran more fused attention draws than eager has calls):
    # not a measured failure, not a win either; the table and the reason say "not judged" and why
    import dataclasses

    from miner.check.configs import cells

    r = _result()
    fused = r.variants[5]
    why = "the compiled step drew 112 seeds and ran 24 fused attention dropouts for 124 eager dropout calls"
    r.variants[5] = dataclasses.replace(fused, speedup=1.31, verdict="parity-fail", parity=dataclasses.replace(
        fused.parity, ok=False, loss_rel=0.56, judged="masks injected (not judged)", reason=why))
    c = {x.name: x for x in configurations(r)}["sdpa_reduced_math+fusions"]
    assert c.unjudged == why and not c.usable
    row = cells(c)
    assert row[3] == "unjudged" and row[6] == f"not judged ({why})" and "FAIL" not in row[6], row
    [rec] = recommendations([r])
    assert rec.best.name != "sdpa_reduced_math+fusions"
    assert f"sdpa_reduced_math+fusions: parity not judged ({why})" in rec.reason
    text = "\n".join(lines(rec, 10**6))
    assert "fusions on top of the best knob (sdpa_reduced_math): not usable: parity not judged" in text


def test_runs_on_two_gpus_never_pool_and_each_names_its_setup():
    # an H200 run and an H100 run of the same model step are two recommendations, each with its setup
    import dataclasses

    h200, h100 = _result(), _result()
    h200.env = {**h200.env, "gpu": "NVIDIA H200", "device": "cuda"}
    h100.env = {**h100.env, "gpu": "NVIDIA H100 80GB HBM3", "device": "cuda"}
    h100.variants = h100.variants[:2] + [dataclasses.replace(h100.variants[4], speedup=1.40)]
    recs = recommendations([h200, h100])
    assert len(recs) == 2
    by_gpu = {r.setup.split(",")[0]: r for r in recs}
    assert by_gpu["NVIDIA H200"].best.name == "sdpa_reduced_math+fusions"
    assert by_gpu["NVIDIA H100 80GB HBM3"].best.name == "sdpa_reduced_math"  # not the H200's 1.25x pooled in
    assert lines(by_gpu["NVIDIA H100 80GB HBM3"], setup="NVIDIA H100 80GB HBM3")[0].startswith(
        "t5 train/default [NVIDIA H100 80GB HBM3]: run sdpa_reduced_math")
    assert "|" in markdown([h200, h100])  # each table built from its own run


def test_a_candidate_measured_only_among_others_says_so_and_what_the_set_did():
    # candidates A/B'd together under a knob were listed "not measured": a user saw nothing of the
    # 1.25x configuration they were in. Now each shows the set, never as its own verdict.
    import dataclasses

    from miner.rank.decision import UNMEASURED, Decision, set_steps

    r = _result()
    fused = r.variants[5]
    r.variants[5] = dataclasses.replace(fused, fusions=["f", "g"], matches={"f": 24, "g": 0, "h": 58})
    sets = set_steps([("a/verify.json", r)])
    assert set(sets) == {"f", "h"}  # g did not fire
    [x] = sets["f"]
    assert x.config == "sdpa_reduced_math+fusions" and x.others == 1 and x.step.matches == 24
    assert abs(x.over_knob - 1.25 / 1.133) < 1e-9
    assert x.text.startswith("1.250x win as sdpa_reduced_math+fusions with 1 other (1.103x over the knob alone)")
    # a variant whose parity could not be judged reads so, never "win"
    r.variants[5] = dataclasses.replace(r.variants[5], parity=dataclasses.replace(
        fused.parity, ok=False, judged="masks injected (not judged)"), verdict="parity-fail")
    assert set_steps([("a/verify.json", r)])["f"][0].step.shown == "parity not judged"

    r = _result()
    r.variants[5] = dataclasses.replace(fused, fusions=["pcand"], matches={"pcand": 12})
    found = set_steps([("x", r)])["pcand"]  # alone under a knob: still a set (the knob with it)
    assert found[0].others == 0
    assert Decision("pcand", "label", "", False, UNMEASURED, "no A/B", together=tuple(found)).label == "not measured alone"
    assert Decision("pcand", "label", "", False, UNMEASURED, "no A/B").label == UNMEASURED


def test_a_cuda_graph_configuration_shows_its_warm_up_peak_marked_so():
    import dataclasses

    from miner.check.configs import cells

    r = _result()
    r.variants[6] = dataclasses.replace(r.variants[6], warmup_peak_bytes=3 * 2**30, parity=r.variants[4].parity)
    c = {x.name: x for x in configurations(r)}
    assert c["reduce_overhead"].peak_gib == 3.0 and c["reduce_overhead"].peak_warmup
    assert cells(c["reduce_overhead"])[4] == "3.00 (warm-up)"
    assert cells(c["sdpa_reduced_math"])[4] == "1.00"  # a timed step's peak, as before
    r.variants[6] = dataclasses.replace(r.variants[6], warmup_peak_bytes=None)
    assert cells({x.name: x for x in configurations(r)}["reduce_overhead"])[4] == "-"  # not measured


def test_the_recommendation_says_how_to_run_it_and_what_to_promote_first(tmp_path):
    from miner.check import configs, knobs
    from miner.core.workspace import Workspace

    best = Config("sdpa_reduced_math+reduce_overhead+fusions", "sdpa_reduced_math+reduce_overhead", True, 1.46,
                  verdict="win", fired=("layer_norm", "p_attn"))
    text = configs.how(best, {"layer_norm": "layer_norm"}, "ws")
    assert text.startswith("torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True); "
                           'miner.runtime.fusions.install("ws"); model = torch.compile(model, mode="reduce-overhead")')
    assert "first promote p_attn:" in text and "layer_norm," not in text  # a candidate measured, not yet promoted
    assert "first promote" not in configs.how(best, {"layer_norm": "layer_norm", "p_attn": "attention"}, "ws")
    # a knob of options: each written as the Inductor config line it is; no fusions, no install
    assert configs.how(Config("coordinate_descent", "coordinate_descent", speedup=1.02), {}) == (
        "torch._inductor.config.coordinate_descent_tuning = True; model = torch.compile(model)")
    assert knobs.code(knobs.Knob("mine", "test", options={"shape_padding": False})) == [
        "torch._inductor.config.shape_padding = False"]
    # every built-in knob says how (a line of code), never a context in words
    assert all(knobs.code(k) and "context" not in knobs.code(k)[-1] for k in knobs.KNOBS.values())
    # lines() shows it; the default needs no line
    rec = configs.with_how([recommend([D, best], 0.01)], Workspace(tmp_path))[0]
    assert any(x.startswith("  how: torch.backends") for x in lines(rec, 10**6))
    assert not any("how:" in x for x in lines(recommend([D], 0.01), 10**6))


def test_knobs_that_change_numerics_alike_share_one_line():
    rec = recommend([D, c("sdpa", 1.10, numerics="bf16", rel=5e-3), c("sdpa+ro", 1.20, numerics="bf16", rel=5e-3),
                     c("sdpa+pack", 1.05, numerics="bf16", rel=4e-3)], 0.01)
    assert rec.numerics == ("sdpa, sdpa+ro: bf16; measured max rel diff to the default 5.0e-03",
                            "sdpa+pack: bf16; measured max rel diff to the default 4.0e-03")
