"""miner verify --ab: noise band, verdicts, kernel diff, plan, evidence, promotion rule, peers, files."""

from __future__ import annotations

import argparse
import json

import pytest

from miner.check import ab, abrun, explain, peers, promotion
from miner.check.ab import ABResult, VariantResult
from miner.check.verify import StepStats
from miner.core.errors import UsageError, WorkspaceError


def stats(median, spread=0.2, steps=15, peak=2**30):
    return StepStats(median, median - spread / 2, median + spread / 2, steps, peak, 10.0)


def test_noise_band_is_the_measured_control_offset_or_the_median_error():
    assert ab.noise_band([100 / 101] * 15) == pytest.approx(1 - 100 / 101)
    tight = ab.noise_band([0.9999, 1.0001] * 8)
    wide = ab.noise_band([0.9, 1.1] * 8)
    assert 0 < tight < wide
    _, lo, hi = ab.ratio_stats([0.9, 1.1] * 8)
    assert wide == pytest.approx(2 * 1.2533 * (hi - lo) / 1.683 / 16 ** 0.5)
    assert ab.noise_band([]) == 0.0


def test_speedup_is_paired_per_round_so_drift_between_rounds_cancels():
    # both variants drift together from 10 to 20 ms; the candidate is 5% faster in every round
    base = [10.0 + r for r in range(11)]
    fast = [b / 1.05 for b in base]
    m, lo, hi = ab.ratio_stats(ab.paired_ratios(base, fast))
    assert m == pytest.approx(1.05) and lo == pytest.approx(1.05) and hi == pytest.approx(1.05)
    # the ratio of medians would be the same here, but not when the variant's slow rounds differ
    assert ab.paired_ratios([10.0, 10.0], [5.0, 0.0]) == [2.0]


def test_rounds_for_a_band_follow_the_median_error_down_to_the_controls_offset():
    assert ab.rounds_for(0.0303, 0.004, 15) == (138, 0.01)  # llama, 15 rounds: 15 * 3.03^2
    assert ab.rounds_for(0.008, 0.004, 15) is None  # already within 1%
    assert ab.rounds_for(0.03, 0.03, 15) is None  # the offset sets it: more rounds do not help
    need, reach = ab.rounds_for(0.08, 0.02, 15)  # down to the offset, not below
    assert reach == 0.02 and need == 240
    # the error part of noise_band shrinks as 1/sqrt(rounds): the predicted count reaches the target
    spread = [0.97, 1.03] * 8
    band = ab.noise_band(spread)
    need, reach = ab.rounds_for(band, 0.0, len(spread), target=band / 2)
    assert need == 4 * len(spread) and ab.noise_band(spread * 4) == pytest.approx(band / 2)


def test_verdict_beyond_the_band():
    assert ab.verdict(1.02, 0.01) == "win"
    assert ab.verdict(0.97, 0.01) == "loss"
    assert ab.verdict(1.005, 0.01) == "noise"
    assert ab.verdict(None, 0.01) is None


def test_kernel_diff_strips_inductor_numbers_and_names_what_changed():
    before = [{"name": "triton_per_fused__log_softmax_7", "us_per_step": 300.0, "calls_per_step": 1},
              {"name": "triton_red_fused_nll_loss_8", "us_per_step": 100.0, "calls_per_step": 1},
              {"name": "sm90_gemm", "us_per_step": 1000.0, "calls_per_step": 10}]
    after = [{"name": "log_softmax_kernel", "us_per_step": 250.0, "calls_per_step": 1},
             {"name": "triton_red_fused_nll_loss_9", "us_per_step": 190.0, "calls_per_step": 1},
             {"name": "sm90_gemm", "us_per_step": 1001.0, "calls_per_step": 10}]
    d = explain.diff(before, after)
    assert d["removed"] == [["triton_per_fused__log_softmax", 300.0, 1.0]]
    assert d["added"] == [["log_softmax_kernel", 250.0, 1.0]]
    assert d["changed"] == [["triton_red_fused_nll_loss", 100.0, 190.0, 90.0]]  # gemm +1 us is no change
    assert d["delta_us"] == pytest.approx(41.0)
    line = explain.describe(d)
    assert "removed triton_per_fused__log_softmax (-300.0)" in line and "nll_loss +90.0" in line


def test_plan_runs_default_compiles_first_and_reduce_overhead_for_inference_only():
    assert abrun.plan(["train", "infer"], ["dynamic", "reduce-overhead", "default"]) == [
        ("train", "default"), ("infer", "default"), ("infer", "reduce-overhead"), ("train", "dynamic"),
        ("infer", "dynamic")]
    with pytest.raises(UsageError, match="max"):
        abrun.plan(["train"], ["max"])
    with pytest.raises(UsageError, match="inference"):
        abrun.plan(["train"], ["reduce-overhead"])


def test_compile_options_differ_per_variant_but_not_in_what_inductor_caches():
    a = ab.compile_options("default", None, cache=True, tag="default")
    b = ab.compile_options("default", None, cache=True, tag="control")
    assert a != b and {k for k in a if a[k] != b[k]} == {"trace.debug_dir"}
    ro = ab.compile_options("reduce-overhead", "P", cache=False, tag="all")
    assert ro["triton.cudagraphs"] is True and ro["fx_graph_cache"] is False and ro["post_grad_custom_pre_pass"] == "P"


SITE = "float32[8192,768] | producer:fusable consumer:none"


def result(alone_speedup=1.03, band=0.005, device="cuda") -> ABResult:
    r = ABResult("bert", "train", "default", "base", None, None, noise_band=band,
                 fires={"layer_norm": 25, "log_softmax": 1, "rms_norm": 0},
                 env={"device": device, "gpu": "NVIDIA H200", "torch": "2.11", "date": "2026-12-03"})
    r.variants = [VariantResult("default", [], "-", stats(20.0), 1.0),
                  VariantResult("control", [], "-", stats(20.05), 20 / 20.05, "noise"),
                  VariantResult("all", ["layer_norm", "log_softmax", "rms_norm"], "open", stats(21.0), 20 / 21, "loss",
                                matches={"layer_norm": 25, "log_softmax": 1}),
                  VariantResult("alone:layer_norm", ["layer_norm"], "open", stats(20 / alone_speedup),
                                alone_speedup, ab.verdict(alone_speedup, band), matches={"layer_norm": 25},
                                contexts={"layer_norm": {SITE: 25}}),
                  VariantResult("alone:log_softmax", ["log_softmax"], "open", stats(21.0), 20 / 21, "loss",
                                matches={"log_softmax": 1}, contexts={"log_softmax": {"x": 1}})]
    return r


def test_alone_records_carry_the_contexts_and_the_numbers():
    recs = ab.alone_records(result())
    assert set(recs) == {"layer_norm", "log_softmax"}  # rms_norm does not fire: no record
    ln = recs["layer_norm"]
    assert ln.verdict == "win" and ln.contexts == {SITE: 25} and ln.speedup == pytest.approx(1.03)
    assert ln.band == 0.005 and ln.matches == 25
    assert recs["log_softmax"].verdict == "loss"


def test_results_round_trip_and_markdown(tmp_path):
    r = result()
    r.variants.append(VariantResult("gated", ["layer_norm"], "on", stats(20.3), 20 / 20.3, "loss"))
    r.variants[3].kernels = explain.diff([{"name": "k_1", "us_per_step": 5.0, "calls_per_step": 1}], [])
    skipped = ABResult("gpt2", "train", "default", "base", None, None, error="skipped: --time-budget 60 s spent")
    rows = [{"variant": "compile", "ms": 102.9, "p20": 102.2, "p80": 105.8, "steps": 15, "peak_gib": 11.5,
             "liger": None, "speedup": 1.0, "error": None},
            {"variant": "compile+liger-flce", "liger": "0.8.5", "error": "TypeError: fake tensor"}]
    paths = abrun.save([r, skipped], tmp_path, rows)
    back, peer_rows = abrun.load(paths[0])
    assert back[0] == r and back[1] == skipped and peer_rows == rows
    md = paths[1].read_text()
    assert "removed k (-5.0)" in md and "layer_norm x25 (1.030x win)" in md and "rms_norm x0 (does not fire)" in md
    assert "the slowest step is bert train/default at 0.985x (BELOW the 0.99x target)" in md
    assert "skipped: --time-budget" in md and "TypeError: fake tensor" in md and "102.90 (102.20-105.80)" in md
    assert "Noise band (default vs control): +-0.50%." in md  # within 1%: no hint
    wide = result(band=0.0303)
    assert "about 138 rounds would narrow it to +-1.00% (`--rounds 138`)" in abrun.detail(wide)
    wide.variants[1].speedup, wide.noise_band = 1.0303, 0.0303  # the control itself 3.03% off: rounds do not help
    assert "the control's own offset (3.03%" in abrun.detail(wide)


def test_step_peak_is_not_shown_under_cuda_graphs():
    """Under reduce-overhead the graphs' pool is allocated at capture: the timed step's own peak reads
    0 bytes, which is no measurement (the H200 run printed 0.00 GiB for every variant)."""
    r = result()
    for v in r.variants:
        v.step = stats(20.0, peak=3 * 2**30)
    assert "| 3.00 |" in abrun.detail(r)
    r.compile = "reduce-overhead"
    assert "| 3.00 |" not in abrun.detail(r)


def _workspace(tmp_path, with_fusion=True):
    f = tmp_path / "fusions" / "layer_norm"
    f.mkdir(parents=True)
    (f / "pattern.py").write_text("")
    (f / "fusion.json").write_text(json.dumps({"name": "layer_norm", "pattern_id": "pabc"}))
    (tmp_path / "candidates" / "pabc").mkdir(parents=True)
    return tmp_path


def test_record_writes_the_gates_evidence_and_only_from_cuda_runs(tmp_path):
    ws = _workspace(tmp_path)
    assert abrun.record(ws, [result(device="cpu")]) == []
    (path,) = abrun.record(ws, [result()], source="run/verify.json")
    data = json.loads(path.read_text())
    assert data["kind"] == "FusionWins" and data["in_model"]["records"][0]["contexts"] == {SITE: 25}
    assert data["in_model"]["records"][0]["source"] == "run/verify.json"


def test_a_candidate_measured_again_reaches_the_gate_of_the_fusion_promoted_from_it(tmp_path):
    """``--candidates <id> --record`` after promotion (e.g. at another shape) updates the fusion's wins.json too."""
    from miner.runtime import evidence

    ws = _workspace(tmp_path)
    r = result()
    r.fires = {"pabc": 25}
    r.variants = r.variants[:2] + [VariantResult("all", ["pabc"], "open", stats(20 / 1.03), 1.03, "win",
                                                 matches={"pabc": 25}, contexts={"pabc": {SITE: 25}})]
    r.batch, r.seq = 8, 512
    written = abrun.record(ws, [r])
    assert sorted(p.relative_to(ws).as_posix() for p in written) == ["candidates/pabc/in_model.json",
                                                                     "fusions/layer_norm/wins.json"]
    (rec,) = evidence.read(ws / "fusions" / "layer_norm" / "wins.json")
    assert (rec.batch, rec.seq, rec.verdict, rec.contexts) == (8, 512, "win", {SITE: 25})
    (ws / "fusions" / "layer_norm" / "fusion.json").write_text("{broken")  # a corrupt file: one line, nothing written
    before = (ws / "candidates" / "pabc" / "in_model.json").read_bytes()
    r.batch = 32
    with pytest.raises(WorkspaceError, match=r"fusion\.json: corrupt JSON .*miner promote"):
        abrun.record(ws, [r])
    assert (ws / "candidates" / "pabc" / "in_model.json").read_bytes() == before


def test_promotion_needs_a_measured_in_model_win(tmp_path):
    ws = _workspace(tmp_path)
    with pytest.raises(UsageError, match="no in-model GPU evidence.*miner verify --ab --candidates pabc "
                       "--models bert,gpt2,llama,t5 --mode train,infer"):  # no candidate.json: every zoo model
        promotion.require_in_model_win(ws, "pabc")
    (ws / "candidates" / "pabc" / "candidate.json").write_text(json.dumps(
        {"id": "pabc", "occurrences": {"mynet:build": {"backward": 2}, "bert": {"inference": 1}}}))
    with pytest.raises(UsageError, match="--candidates pabc --models bert,mynet:build --mode train,infer --record"):
        promotion.require_in_model_win(ws, "pabc")  # the models it was mined from, in the modes seen
    promotion.write_evidence(ws, "pabc", [ab.alone_records(result(1.002))["layer_norm"]])
    with pytest.raises(UsageError, match=r"no step win beyond noise.*1\.002x"):
        promotion.require_in_model_win(ws, "pabc")
    abrun.record(ws, [result(1.03)])  # the promoted fusion of the same pattern: its wins.json counts
    assert promotion.require_in_model_win(ws, "pabc")
    gpt2 = result(0.97)
    gpt2.model = "gpt2"
    promotion.write_evidence(ws, "pabc", [ab.alone_records(gpt2)["layer_norm"]])
    with pytest.raises(UsageError, match=r"slower where it fires: gpt2 train/default B16 S512 0\.970x"):
        promotion.require_in_model_win(ws, "pabc")
    # a loss vetoes its own compile mode only: a win under CUDA graphs (a record over reduce_overhead) promotes,
    # and the gate fires there alone (gpt2's dropout + LayerNorm region, H200 2026-12-06)
    import dataclasses

    from miner.runtime import evidence

    under_graphs = dataclasses.replace(ab.alone_records(result(1.03))["layer_norm"], model="gpt2",
                                       knob="reduce_overhead", compile="reduce-overhead")
    promotion.write_evidence(ws, "pabc", [under_graphs])
    recs = promotion.require_in_model_win(ws, "pabc")
    assert evidence.decide(evidence.Site(SITE, "reduce-overhead"), recs)[0]
    assert not evidence.decide(evidence.Site(SITE, "default"), recs)[0]


def test_gate_verdicts_and_the_gated_shortcut_follow_the_evidence():
    r = result()
    r.variants = [v for v in r.variants if v.name != "alone:log_softmax"]
    r.gate = ab.gate_verdicts(r, {}, "default")
    assert r.gate["layer_norm"][SITE].startswith("decline: unmeasured in a model")
    assert ab._gated_shortcut(r) == "default"  # no evidence: nothing fires
    this_run = {"layer_norm": [ab.alone_records(r)["layer_norm"]]}
    r.gate = ab.gate_verdicts(r, {}, "default", this_run)
    assert r.gate["layer_norm"][SITE].startswith("fire: step faster in bert train/default B16 S512 1.030x")
    assert ab._gated_shortcut(r) == "all"
    r.gate = ab.gate_verdicts(r, {}, "reduce-overhead", this_run)  # other modes agree: fires, saying so
    assert "not reduce-overhead" in r.gate["layer_norm"][SITE]
    r.gate = {"a": {"s1": "fire: x", "s2": "decline: y"}}
    assert ab._gated_shortcut(r) is None  # mixed: compile it


def test_knob_plus_candidates_is_compiled_though_the_gate_would_decline_them():
    """The 2026-12-06 t5 run on an H100: with ``--candidates`` and no evidence the gate declines every
    context, and ``knob:<k>+fusions`` was reported as the knob's own graph although candidates are
    ungated and fire (``all`` fired 131 matches). Only a gated set skips it."""
    from miner.check.abrun import CandidateSet, NoFusions

    r = result()
    r.variants = [v for v in r.variants if v.name != "alone:log_softmax"]
    r.gate = ab.gate_verdicts(r, {}, "default")
    shortcut = ab._gated_shortcut(r)
    assert shortcut == "default"
    assert not ab.knob_graph_only(shortcut, CandidateSet.gated)  # candidates: compile knob+fusions
    assert ab.knob_graph_only(shortcut, True)  # promoted fusions the gate declines: the knob's graph
    assert not ab.knob_graph_only("all", True) and not ab.knob_graph_only(None, True)
    assert NoFusions.gated is False


def test_peer_rows_without_liger_say_so(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_liger(name, *a, **k):
        if name.startswith("liger_kernel"):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_liger)
    row = peers.run_variant("compile+liger", preset="tiny", device="cpu", steps=1, warmup=1)
    assert row["error"] == peers.MISSING
    assert "not installed" in peers.peer_table([row])
    assert peers.run_variant("nope", device="cpu")["error"].startswith("unknown peer variant")


def test_candidate_set_counts_each_match_context_for_ungated_candidates():
    from pathlib import Path
    from types import SimpleNamespace

    import torch
    from torch._subclasses import FakeTensorMode

    from miner.runtime import decisions

    root = Path(__file__).resolve().parents[1]
    cid = json.loads((root / "fusions" / "log_softmax" / "fusion.json").read_text())["pattern_id"]
    cands = abrun.CandidateSet(root, [cid])
    assert cands.names() == [cid] and cands.gated is False
    module = cands.load(cid)
    assert module.extra_check._miner_observed and cands.load(cid).extra_check is module.extra_check  # wrapped once
    # a real match: the candidate's own chain traced into an FX graph (the safety rules read the graph)
    from torch.fx.experimental.proxy_tensor import make_fx

    with FakeTensorMode():
        gm = make_fx(lambda x: module.pattern(x)[0])(torch.empty(4, 8))
    x0 = next(n for n in gm.graph.nodes if n.op == "placeholder")
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    match = SimpleNamespace(kwargs={"x0": x0}, graph=gm.graph,
                            nodes=[n for n in gm.graph.nodes if n.op == "call_function"], output_nodes=lambda: [out])
    p = cands.graph_pass()
    with decisions.applying(p, cid):  # as FusionPass.__call__ runs each entry's patterns
        assert module.extra_check(match)
    (ctx,) = p.log.contexts[cid]
    assert ctx.signature == (((4, 8), "float32"),)
    assert p.entries[0].name == cid


def test_model_steps_take_the_gated_variant_else_all_and_name_promoted_candidates():
    """The per-model step table the review leads with (``miner.rank.decision.model_steps``)."""
    from miner.check.verify import Parity
    from miner.rank.decision import model_step_cells, model_steps

    ok = Parity(1.0, 1.0, 0.0, 0.0, 0.0, None, None, True)
    t5 = ABResult("t5", "train", "default", "base", None, None, noise_band=0.005)
    t5.variants = [VariantResult("default", [], "-", stats(73.7)),
                   VariantResult("all", ["d1", "u1"], "open", stats(66.7), 1.104, "win", ok, {"d1": 24, "u1": 24},
                                 speedup_p20=1.101, speedup_p80=1.107)]
    bert = ABResult("bert", "train", "default", "base", None, None, noise_band=0.012)
    bert.variants = [VariantResult("default", [], "-", stats(20.9)),
                     VariantResult("all", ["layer_norm"], "open", stats(25.0), 0.83, "loss", ok, {"layer_norm": 26}),
                     VariantResult("gated", ["layer_norm"], "on", stats(20.9), 1.0, None, None, {"layer_norm": 0})]
    broken = ABResult("gpt2", "train", "default", "base", None, None, error="compile failed")
    rows = model_steps([("a.json", t5), ("b.json", bert), ("c.json", broken)], {"d1": "demote_matmul"})
    assert [(m.model, m.variant) for m in rows] == [("bert", "gated"), ("t5", "all")]  # no row for the failed run
    b, t = rows
    assert b.speedup == 1.0 and b.fired == {}  # with the gate on the loss never ships
    assert t.fired == {"demote_matmul": 24, "u1": 24} and (t.speedup_p20, t.speedup_p80) == (1.101, 1.107)
    cells = model_step_cells(t)
    assert cells[:5] == ["t5 train/default", "73.70", "66.70", "1.104x [1.101-1.107]", "win ±0.5%"]
    assert cells[6].endswith("(gate open)") and cells[7] == "ok"
    assert model_step_cells(b)[6] == "none (the gate keeps all off)"


def test_several_batch_and_seq_sizes_make_a_grid_of_ab_rows():
    from miner.check.abrun import shape_grid
    from miner.commands.verify import _single, _sizes
    from miner.core.errors import UsageError

    assert shape_grid([8, 32], [256, 1024]) == [(8, 256), (8, 1024), (32, 256), (32, 1024)]
    assert shape_grid(None, None) == [(None, None)] and shape_grid(16, None) == [(16, None)]
    assert _sizes("8,16,32") == [8, 16, 32] and _single([16], "batch") == 16
    with pytest.raises(UsageError, match="several sizes need --ab"):
        _single([8, 16], "batch")
    with pytest.raises(argparse.ArgumentTypeError):
        _sizes("8,x")
    with pytest.raises(UsageError):
        shape_grid([8, 8], None)


def test_compile_limits_are_raised_and_a_hit_is_an_error():
    # found merging the float32 parity reference: the 9th compile of one model's forward in a process
    # silently ran eager (0 matches, "0.0 s" compiles) and was timed as a variant
    import torch._dynamo.config as dc

    from miner.check import ab

    with dc.patch(recompile_limit=8, cache_size_limit=8, fail_on_recompile_limit_hit=False):
        ab.raise_compile_limits()
        assert dc.recompile_limit >= 64 and dc.fail_on_recompile_limit_hit is True


def test_each_rounds_gpu_and_host_times_are_kept_and_the_host_bound_rounds_counted():
    # the per-round GPU and host times go to verify.json (round trip) and the log says in how many
    # rounds the host took at least the GPU time: a step the host bounds shows everything the host does
    from miner.check.ab import ABResult, VariantResult, ab_from_json, ab_to_json, host_share

    v = VariantResult("all", ["f"], "open", round_ms=[60.0, 60.0, 60.0, 80.0], host_ms=[40.0, 61.0, 59.9, 80.5])
    assert host_share(v).endswith("as long as the GPU step or longer in 2 of 4 rounds"), host_share(v)
    r = ABResult("t5", "train", "default", "base", 16, 512, variants=[v])
    back = ab_from_json(ab_to_json(r)).variants[0]
    assert back.round_ms == v.round_ms and back.host_ms == v.host_ms
    old = ab_to_json(r)
    del old["variants"][0]["round_ms"], old["variants"][0]["host_ms"]  # a verify.json written before them
    assert ab_from_json(old).variants[0].host_ms == []


def knob_result(ln_ms=58.0, band=0.005, parity_ok=True) -> ABResult:
    """t5-like: two fusions fire only on top of the knob; each alone there, timed in the knob's rounds."""
    from miner.check.verify import Parity

    r = ABResult("t5", "train", "default", "base", 16, 512, noise_band=band, fires={},
                 env={"device": "cuda", "gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11", "date": "2026-12-06"})
    knob = [60.0, 61.0, 59.0, 60.0]
    ok = Parity(1.0, 1.0, 0.0, 0.0, 0.0, None, None, parity_ok) if parity_ok is not None else None

    def v(name, fusions, rounds, matches):
        return VariantResult(name, fusions, "open", stats(sum(rounds) / len(rounds)), 80 / (sum(rounds) / len(rounds)),
                             "win", matches=matches, contexts={f: {SITE: n} for f, n in matches.items()},
                             knob="sdpa", round_ms=rounds, parity=ok)
    r.variants = [VariantResult("default", [], "-", stats(80.0), 1.0, round_ms=[80.0] * 4),
                  VariantResult("control", [], "-", stats(80.1), 80 / 80.1, "noise", round_ms=[80.1] * 4),
                  v("knob:sdpa", [], knob, {}),
                  v("knob:sdpa+fusions", ["p_attn", "p_ln"], [55.0, 56.0, 54.0, 55.0], {"p_attn": 12, "p_ln": 58}),
                  v("knob:sdpa+alone:p_attn", ["p_attn"], [56.0, 57.0, 55.0, 56.0], {"p_attn": 12}),
                  v("knob:sdpa+alone:p_ln", ["p_ln"], [t * ln_ms / 60.0 for t in knob], {"p_ln": 58})]
    return r


def test_a_fusion_on_top_of_a_knob_is_judged_against_the_knobs_own_band():
    # t5 B8 S256 on the H100 (2026-12-07): the default host-bound, its band ±10.3%; over the knob the fusions
    # measured 1.018x and 1.032x: "noise" against the default's band, whatever the knob's own steps said
    loose = knob_result(ln_ms=58.0, band=0.10)
    assert dict(ab.knob_records(loose))["p_ln"].verdict == "noise"
    loose.knob_bands = {"sdpa": 0.01}  # the knob's step timed twice per round: ±1%
    rec = dict(ab.knob_records(loose))["p_ln"]
    assert rec.verdict == "win" and rec.band == 0.01  # the record keeps the band it was judged against
    assert ab.band_over_knob(loose, "sdpa") == 0.01 and ab.band_over_knob(loose, "other") == 0.10
    assert ab.band_over_knob(loose, None) == 0.10
    back = ab.ab_from_json(ab.ab_to_json(loose))
    assert back.knob_bands == {"sdpa": 0.01}
    old = ab.ab_to_json(loose)
    del old["knob_bands"]  # a verify.json written before knob bands: the run's band
    assert dict(ab.knob_records(ab.ab_from_json(old)))["p_ln"].verdict == "noise"


def test_a_knobs_band_comes_from_its_step_timed_twice_per_round():
    import torch

    knob = VariantResult("knob:k", [], "-", knob="k", round_ms=[20.0, 20.2, 19.8, 20.0, 20.1])
    live = ab._Live(knob, torch.nn.Linear(1, 1), lambda: None)
    twin = ab.knob_control(live)
    assert twin.step is live.step and twin.model is live.model and ab.is_knob_control(twin.res)
    assert not ab.is_knob_control(knob) and not ab.is_knob_control(VariantResult("control", [], "-"))
    twin.res.round_ms = [20.0, 20.0, 20.0, 20.2, 20.1]
    bands = ab.knob_bands([live, twin])
    ratios = ab.paired_ratios(knob.round_ms, twin.res.round_ms)
    assert bands == {"k": pytest.approx(ab.noise_band(ratios), abs=1e-6)} and 0 < bands["k"] < 0.02
    assert ab.knob_bands([live]) == {}  # no control timed: no band of its own


def test_a_fusion_alone_on_top_of_a_knob_is_recorded_against_the_knob_not_the_default():
    recs = dict(ab.knob_records(knob_result()))
    assert set(recs) == {"p_attn", "p_ln"}
    attn = recs["p_attn"]
    assert attn.knob == "sdpa" and attn.verdict == "win" and attn.matches == 12 and attn.contexts == {SITE: 12}
    assert attn.speedup == pytest.approx(60 / 56, abs=1e-4)  # the median of the per-round ratios, not of the steps
    assert recs["p_ln"].speedup == pytest.approx(60 / 58, abs=1e-4)  # the same ratio every round (stored to 4 places)
    # a variant that breaks parity or was not judged is never a win
    assert dict(ab.knob_records(knob_result(parity_ok=False)))["p_ln"].verdict == "parity-fail"
    assert dict(ab.knob_records(knob_result(ln_ms=61.0)))["p_ln"].verdict == "loss"
    # the record keeps its knob through the file, and does not replace a record over the default
    from miner.runtime import evidence

    stored = evidence.InModelRecord.from_json(attn.to_json())
    assert stored == attn and stored.knob == "sdpa" and "over knob sdpa" in stored.describe()
    plain = ab.alone_records(result())["layer_norm"]
    assert "knob" not in plain.to_json() and plain.key != replace_knob(plain).key
    assert len(evidence.merge([plain], [replace_knob(plain)])) == 2
    assert sorted(ab.run_records(knob_result())) == ["p_attn", "p_ln"]


def test_a_record_over_a_cuda_graph_knob_is_named_by_the_mode_the_gate_reads():
    r = knob_result()
    for v in r.variants:
        if v.knob:
            v.knob, v.name, v.cudagraphs = "reduce_overhead", v.name.replace("sdpa", "reduce_overhead"), True
    recs = dict(ab.knob_records(r))
    assert {rec.compile for rec in recs.values()} == {"reduce-overhead"} and recs["p_attn"].knob == "reduce_overhead"
    assert {rec.compile for _, rec in ab.knob_records(knob_result())} == {"default"}  # sdpa: no mode of its own
    assert ab.knob_mode(VariantResult("knob:max_autotune_no_cudagraphs", [], "-", knob="max_autotune_no_cudagraphs"),
                        "default") == "max-autotune"


def test_a_fusion_that_matched_nothing_alone_gives_no_record():
    """gpt2 (H200, 2026-12-06): a region fired x11 beside another and 0 times alone; its `alone` variant
    timed the default's graph, recorded as a 1.005x win of a fusion that never ran."""
    r = knob_result()
    r.variant("knob:sdpa+alone:p_ln").matches = {"p_ln": 0}
    assert [f for f, _ in ab.knob_records(r)] == ["p_attn"]
    plain = result()
    plain.variant("alone:layer_norm").matches = {"layer_norm": 0}
    assert "layer_norm" not in ab.alone_records(plain)
    assert "layer_norm x" in abrun.summary_table([plain]) and "0 matches, not measured alone" in abrun.summary_table([plain])


def replace_knob(rec, knob="sdpa"):
    import dataclasses

    return dataclasses.replace(rec, knob=knob)


def test_when_one_fusion_fires_on_a_knob_its_knob_plus_fusions_variant_is_it_alone():
    r = knob_result()
    r.variants = r.variants[:3] + [r.variants[5]]
    r.variants[3].name = "knob:sdpa+fusions"
    assert [f for f, _ in ab.knob_records(r)] == ["p_ln"]


def test_a_fusion_alone_on_a_knob_is_no_configuration_of_its_own():
    from miner.check import configs

    names = [c.name for c in configs.configurations(knob_result())]
    assert names == ["default", "sdpa", "sdpa+fusions"]


def test_record_that_writes_nothing_says_why():
    together = knob_result()
    together.variants = together.variants[:4]  # knob:sdpa+fusions only: the two fusions never alone
    assert "p_attn, p_ln fired only together" in abrun.nothing_recorded([together])
    assert "no result timed on CUDA" in abrun.nothing_recorded([result(device="cpu")])


def test_a_measurement_over_a_knob_keeps_its_knob_in_every_view():
    from miner.rank import decision

    steps = decision.ab_steps([("verify.json", knob_result())])["p_attn"]
    assert [(s.compile, s.knob) for s in steps] == [("default", "sdpa")] and "over knob sdpa" in steps[0].where
    # a record read back from a fusion's wins.json is shown as what it is, not as a step over the default
    [rec] = [rec for f, rec in ab.knob_records(knob_result()) if f == "p_attn"]
    [step] = decision.record_steps([rec], "wins.json")
    assert step.knob == "sdpa" and step.where == steps[0].where
    # over a CUDA-graph knob the record's compile is reduce-overhead: the A/B's row says so too (one row for
    # one measurement in `miner candidates show`, not a "default" row beside the record's)
    graphs = knob_result()
    for v in graphs.variants:
        v.cudagraphs = bool(v.knob)
    [graph_step] = decision.ab_steps([("verify.json", graphs)])["p_attn"]
    [graph_rec] = [rec for f, rec in ab.knob_records(graphs) if f == "p_attn"]
    assert graph_step.compile == graph_rec.compile == "reduce-overhead"
    assert graph_step.where == decision.record_steps([graph_rec], "wins.json")[0].where
