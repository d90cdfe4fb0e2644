"""The in-model gate: a promoted fusion fires on CUDA only in contexts an in-model A/B showed faster."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch._subclasses import FakeTensorMode

from miner.runtime import decisions, evidence, gate, rewrite
from miner.runtime.rewrite import decide, device_reasons, match_reasons, match_vals, wins_gate

F32, BF16 = "float32", "bfloat16"
SIG = (((8192, 768), F32),)
SITE = "float32[8192,768] | producer:fusable consumer:none"


def record(verdict, speedup, *, sites=(SITE,), compile="default", model="bert"):
    return {"model": model, "mode": "train", "compile": compile, "preset": "base", "speedup": speedup,
            "band": 0.004, "verdict": verdict, "matches": 3, "contexts": {s: 1 for s in sites}}


def wins_with(*records, isolated=1.3):
    """A wins.json payload: an isolated row that says the kernel wins, plus in-model records."""
    row = {"inputs": [{"shape": [8192, 768], "dtype": F32, "stride": None}], "speedup_vs_inductor": isolated}
    return {"name": "layer_norm", "wins": [row], "loses": [], "in_model": {"schema": 1, "records": list(records)}}


def test_an_isolated_benchmark_alone_never_enables_a_firing():
    fire, reason = decide(SIG, wins_with(), producer_fusable=True)
    assert not fire and reason.startswith("unmeasured in a model")
    assert not decide(SIG, None, producer_fusable=True)[0]


def test_a_measured_step_win_fires_in_its_context_only():
    wins = wins_with(record("win", 1.02))
    fire, reason = decide(SIG, wins, producer_fusable=True)
    assert fire and "bert train/default B16 S512 1.020x" in reason
    assert not decide(SIG, wins, producer_fusable=False)[0]  # another neighbourhood is another context
    assert not decide((((4096, 768), F32),), wins, producer_fusable=True)[0]  # another shape
    assert not decide((((8192, 768), BF16),), wins, producer_fusable=True)[0]  # another dtype


def test_a_loss_anywhere_in_the_context_declines():
    wins = wins_with(record("win", 1.02), record("loss", 0.96, model="gpt2"))
    fire, reason = decide(SIG, wins, producer_fusable=True)
    assert not fire and "gpt2" in reason and "0.960x" in reason


def test_within_noise_declines():
    fire, reason = decide(SIG, wins_with(record("noise", 1.001)), producer_fusable=True)
    assert not fire and reason.startswith("within noise")


def test_the_mode_decides_where_it_was_measured_and_other_modes_must_agree():
    wins = wins_with(record("win", 1.02), record("loss", 0.97, compile="reduce-overhead"))
    assert decide(SIG, wins, producer_fusable=True, mode="default")[0]
    assert not decide(SIG, wins, producer_fusable=True, mode="reduce-overhead")[0]
    only_default = wins_with(record("win", 1.02))
    fire, reason = decide(SIG, only_default, producer_fusable=True, mode="reduce-overhead")
    assert fire and "not reduce-overhead" in reason
    mixed = wins_with(record("win", 1.02), record("noise", 1.0, compile="dynamic"))
    assert not decide(SIG, mixed, producer_fusable=True, mode="reduce-overhead")[0]


def test_a_passs_records_of_this_run_count_as_evidence_and_replace_the_same_models_record():
    p = rewrite.FusionPass([], records={"layer_norm": [record("win", 1.03)]})
    ctx = evidence.Context(SIG, True, False)

    def fires(wins):
        return evidence.decide(ctx, gate.in_model_records(wins, p))[0]
    assert fires(wins_with())
    assert fires(wins_with(record("loss", 0.9)))  # bert re-measured
    assert not fires(wins_with(record("loss", 0.9, model="t5")))
    assert not evidence.decide(ctx, gate.in_model_records(wins_with()))[0]  # another pass: not its evidence


def test_merged_records_replace_the_same_model_and_mode():
    merged = evidence.with_records(wins_with(record("loss", 0.9)), "layer_norm", [record("win", 1.05)])
    recs = merged["in_model"]["records"]
    assert len(recs) == 1 and recs[0]["verdict"] == "win" and merged["wins"]  # isolated rows kept
    fresh = evidence.with_records(None, "rms_norm", [record("win", 1.05, model="llama")])
    assert fresh["kind"] == "FusionWins" and fresh["name"] == "rms_norm" and fresh["wins"] == []


def test_merge_keeps_one_record_per_key_the_newest():
    """A re-promotion passes the candidate's record and the fusion's copy of it: one survives."""
    old, new = dict(record("noise", 1.0), date="2026-12-02T10:00:00Z"), dict(record("win", 1.05), date="2026-12-03T10:00:00Z")
    for records in ([old, new], [new, old], [new, dict(new)]):
        recs = evidence.with_records(wins_with(new), "layer_norm", records)["in_model"]["records"]
        assert [evidence.InModelRecord.from_json(r) for r in recs] == [evidence.InModelRecord.from_json(new)], recs
        assert recs[0]["verdict"] == "win" and recs[0]["date"] == new["date"]


# --------------------------------------------------------------------------- on FX graphs

def _graph_match(producer: str):
    """A real FX graph: x -> (producer) -> softmax chain -> consumer; the match covers the chain."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    with FakeTensorMode():
        val = torch.empty(4, 8, device="cuda" if False else "cpu")
    a = g.call_function(torch.ops.aten.add.Tensor, (x, 1.0)) if producer == "pointwise" else \
        g.call_function(torch.ops.aten.mm.default, (x, x))
    a.meta["val"] = val
    m = g.call_function(torch.ops.aten.amax.default, (a, [1], True))
    s = g.call_function(torch.ops.aten.sub.Tensor, (a, m))
    out = g.call_function(torch.ops.aten.mm.default, (s, x))
    g.output(out)
    match = SimpleNamespace(kwargs={"x0": a}, nodes=[m, s], outputs=[s])
    match.output_nodes = lambda: [s]
    return match, val


@pytest.mark.parametrize("producer, fusable", [("pointwise", True), ("matmul", False)])
def test_context_reads_the_neighbourhood(producer, fusable):
    match, val = _graph_match(producer)
    ctx = gate.context_of(match, [val], mode="default")
    assert ctx.producer_fusable is fusable and ctx.consumer_fusable is False  # the consumer is a mm
    assert ctx.site == f"float32[4,8] | producer:{'fusable' if fusable else 'none'} consumer:none"
    assert ctx.key.endswith("mode:default")


def match_of(*vals):
    return SimpleNamespace(kwargs={f"x{k}": SimpleNamespace(meta={"val": v}, op="placeholder", users={})
                                   for k, v in enumerate(vals)}, nodes=[], outputs=[])


def fake(shape, dtype, device):
    with FakeTensorMode(allow_non_fake_inputs=True):
        return torch.empty(shape, dtype=dtype, device=device)


def test_gate_on_cuda_decides_and_counts_with_its_reason():
    m = match_of(fake((8192, 768), torch.float32, "cuda"))
    site = "float32[8192,768] | producer:none consumer:none"
    p = rewrite.FusionPass([])
    with decisions.applying(p, "layer_norm"):
        assert not wins_gate(m, wins_with(), 1)
        assert wins_gate(m, wins_with(record("win", 1.02, sites=(site,))), 1)
    new = p.log.lines
    assert any(k.startswith("layer_norm decline ") and "unmeasured" in k for k in new)
    assert any(k.startswith("layer_norm fire ") and "step faster" in k for k in new)


def test_a_pass_with_its_gate_open_fires_and_still_counts_what_it_would_decide():
    m = match_of(fake((8192, 768), torch.float32, "cuda"))
    opened, on = rewrite.FusionPass([], gate="open"), rewrite.FusionPass([])
    with decisions.applying(opened, "layer_norm"):
        assert wins_gate(m, wins_with(), 1)
    with decisions.applying(on, "layer_norm"):
        assert not wins_gate(m, wins_with(), 1)
    for p in (opened, on):
        seen = p.log.contexts["layer_norm"]
        assert sum(seen.values()) == 1 and all(not c.producer_fusable for c in seen)
    assert all(k.endswith("[gate forced open]") for k in opened.log.lines)
    assert not any(k.endswith("[gate forced open]") for k in on.log.lines)
    assert not wins_gate(m, wins_with(), 1)  # outside a pass: the gate is on, nothing is logged


def test_gate_passes_on_cpu_where_the_timings_do_not_apply():
    assert wins_gate(match_of(fake((4, 8), torch.float32, "cpu")), wins_with(record("loss", 0.5)), 1)


def test_gate_declines_a_match_without_tensor_metas():
    assert not wins_gate(SimpleNamespace(kwargs={"x0": SimpleNamespace(meta={})}), None, 1)
    assert match_reasons(SimpleNamespace(kwargs={}), 1, ("float",)) == ["meta: an input is not a tensor"]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_kinds_check_still_sees_fake_inputs(device):
    vals = match_vals(match_of(fake((4, 8), torch.float32, device)), 1)
    assert [tuple(v.shape) for v in vals] == [(4, 8)] and device_reasons(vals) == []


def test_compile_mode_follows_inductor_config():
    import torch._inductor.config as config

    assert gate.compile_mode() == "default"
    with config.patch({"triton.cudagraphs": True}):
        assert gate.compile_mode() == "reduce-overhead"


def test_uuid_covers_the_evidence(tmp_path):
    from miner.runtime import rewrite

    pattern = tmp_path / "f" / "pattern.py"
    pattern.parent.mkdir()
    pattern.write_text("x = 1\n")
    p = rewrite.FusionPass([rewrite.entry_for(pattern, "f", module=SimpleNamespace())])
    before = p.uuid()
    (tmp_path / "f" / "wins.json").write_text('{"in_model": {"records": []}}')
    assert p.uuid() != before


def test_uuid_covers_the_shared_rules(tmp_path, monkeypatch):
    """The extra checks apply the miner/rules/ package (safety, contract, upcast, recompute, graph): editing a
    rule changes the uuid (Inductor's FX graph cache key), so a cached graph made under the old rule is not reused."""
    from miner import rules
    from miner.runtime import rewrite

    package = Path(rules.__file__).parent
    assert {Path(f).name for f in rewrite.RULE_FILES} == {p.name for p in package.glob("*.py")}
    assert {"safety.py", "contract.py", "upcast.py", "recompute.py", "graph.py"} <= {Path(f).name for f in rewrite.RULE_FILES}
    assert all(Path(f).is_file() for f in rewrite.RULE_FILES)
    pattern = tmp_path / "f" / "pattern.py"
    pattern.parent.mkdir()
    pattern.write_text("x = 1\n")
    rule = tmp_path / "rule.py"
    rule.write_text("A = 1\n")
    monkeypatch.setattr(rewrite, "RULE_FILES", (str(rule),))
    p = rewrite.FusionPass([rewrite.entry_for(pattern, "f", module=SimpleNamespace())])
    before = p.uuid()
    rule.write_text("A = 2\n")
    assert p.uuid() != before


def symbolic_fake(device):
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    with FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True) as mode:
        real = torch.empty(4, 8)
        return mode.from_tensor(real, symbolic_context=None).new_empty(
            (mode.shape_env.create_unbacked_symint(), 8), device=device)


def test_symbolic_sizes_on_cuda_decline_with_their_reason_and_fire_when_held_open():
    """dynamic=True on CUDA: no in-model evidence covers a symbolic context. The match declines with
    a reason, counted once in the pass's log (its ``declined`` and its lines) (before: silently, no count)."""
    v = symbolic_fake("cuda")
    assert not all(isinstance(s, int) for s in v.shape)
    node = SimpleNamespace(name="out", graph=object.__new__(torch.fx.Graph))
    m = match_of(v)
    m.output_node = lambda: node
    p = rewrite.FusionPass([])
    with decisions.applying(p, "layer_norm"):
        assert not wins_gate(m, wins_with(record("win", 1.5)), 1)
        with p.gate_held("open"):
            assert wins_gate(m, wins_with(), 1)
    new = p.log.lines
    assert any(k.startswith("layer_norm decline ") and gate.SYMBOLIC_REASON in k for k in new), new
    assert any(k.startswith("layer_norm fire symbolic") and "forced open" in k for k in new), new
    assert p.declined["layer_norm"][gate.SYMBOLIC_REASON] == 1


def test_symbolic_sizes_on_cpu_pass():
    assert wins_gate(match_of(symbolic_fake("cpu")), wins_with(record("loss", 0.5)), 1)


# --------------------------------------------------------------------------- beyond the measured shape (issue 31)

def t5_site(batch, seq=512, dtype=F32, producer="fusable"):
    """The upcast matmul's site in t5 at (batch, seq): QK^T of [batch*12, seq, 64] x [batch*12, 64, seq]."""
    return (f"{dtype}[{batch * 12},{seq},64] {dtype}[{batch * 12},64,{seq}] | producer:{producer} "
            f"consumer:fusable")


def t5_sig(batch, seq=512, dtype=F32):
    return (((batch * 12, seq, 64), dtype), ((batch * 12, 64, seq), dtype))


def shaped(verdict, speedup, batch, seq=512, **kw):
    r = record(verdict, speedup, sites=(t5_site(batch, seq),), model="t5", **kw)
    return {**r, "batch": batch, "seq": seq}


def t5_wins(*records):
    return {"name": "upcast_matmul", "wins": [], "loses": [], "in_model": {"schema": 1, "records": list(records)}}


def test_wins_that_bracket_a_shape_fire_there():
    wins = t5_wins(shaped("win", 1.05, 8, 256), shaped("win", 1.06, 32, 1024))
    fire, reason = decide(t5_sig(16, 512), wins, producer_fusable=True, consumer_fusable=True)
    assert fire and reason.startswith("bracketed by in-model wins") and "x0 dim 0 in [96, 384]" in reason, reason
    assert "t5 train/default B8 S256 1.050x" in reason


def test_a_shape_outside_the_measured_range_declines_with_the_size_that_is_outside():
    wins = t5_wins(shaped("win", 1.05, 8), shaped("win", 1.06, 16))
    fire, reason = decide(t5_sig(32), wins, producer_fusable=True, consumer_fusable=True)
    assert not fire and reason == "outside the in-model evidence: x0 dim 0 = 384 outside measured [96, 192]"
    # a dim equal in every win must be equal: both wins at seq 512, so seq 256 is outside
    fire, reason = decide(t5_sig(16, 256), wins, producer_fusable=True, consumer_fusable=True)
    assert not fire and "x0 dim 1 = 256 outside measured [512, 512]" in reason


def test_a_loss_inside_the_bracket_declines():
    wins = t5_wins(shaped("win", 1.05, 8), shaped("loss", 0.97, 16), shaped("win", 1.06, 32))
    fire, reason = decide(t5_sig(24), wins, producer_fusable=True, consumer_fusable=True)
    assert not fire and reason.startswith("bracketed, but slower inside the bracket") and "B16" in reason
    parity = t5_wins(shaped("win", 1.05, 8), shaped("parity-fail", 1.02, 16), shaped("win", 1.06, 32))
    assert not decide(t5_sig(24), parity, producer_fusable=True, consumer_fusable=True)[0]


def test_another_dtype_neighbourhood_or_mode_is_not_bracketed():
    wins = t5_wins(shaped("win", 1.05, 8), shaped("win", 1.06, 32))
    assert decide(t5_sig(16), wins, producer_fusable=True, consumer_fusable=True)[0]
    fire, reason = decide(t5_sig(16, dtype=BF16), wins, producer_fusable=True, consumer_fusable=True)
    assert not fire and "no in-model win of this class" in reason
    assert not decide(t5_sig(16), wins, producer_fusable=False, consumer_fusable=True)[0]
    assert not decide(t5_sig(16), wins, producer_fusable=True, consumer_fusable=True, mode="reduce-overhead")[0]


def test_one_measured_shape_fires_only_at_that_shape():
    wins = t5_wins(shaped("win", 1.05, 16))
    assert decide(t5_sig(16), wins, producer_fusable=True, consumer_fusable=True)[0]
    fire, reason = decide(t5_sig(8), wins, producer_fusable=True, consumer_fusable=True)
    assert not fire and reason.endswith("x0 dim 0 = 96 outside measured [192, 192]")


def test_an_exactly_measured_noise_is_not_overruled_by_a_bracket():
    wins = t5_wins(shaped("win", 1.05, 8), shaped("noise", 1.0, 16), shaped("win", 1.06, 32))
    fire, reason = decide(t5_sig(16), wins, producer_fusable=True, consumer_fusable=True)
    assert not fire and reason.startswith("within noise")


def test_a_slower_isolated_kernel_row_inside_the_bracket_declines():
    wins = t5_wins(shaped("win", 1.05, 8), shaped("win", 1.06, 32))
    wins["loses"] = [{"inputs": [{"shape": [192, 512, 64], "dtype": F32}, {"shape": [192, 64, 512], "dtype": F32}],
                      "speedup_vs_inductor": 0.9}]
    fire, reason = decide(t5_sig(24), wins, producer_fusable=True, consumer_fusable=True)
    assert not fire and "kernel alone is slower inside the bracket (0.90x)" in reason


def test_bracket_is_pure_on_ranges():
    q = evidence.Query.of(t5_sig(16), True, True)
    measured = [evidence.Query.of(t5_sig(b), True, True) for b in (8, 32)]
    assert evidence.bracket(q, measured)[0]
    wide = evidence.Query(((((64, 512), (512, 512), (64, 64)), F32), (((64, 512), (64, 64), (512, 512)), F32)),
                          True, True)
    ok, reason = evidence.bracket(wide, measured)
    assert not ok and reason == "x0 dim 0 = [64, 512] outside measured [96, 384]"
    assert evidence.parse_site(t5_site(16)) == q


def test_symbolic_sizes_within_the_evidence_fire_and_unbounded_ones_decline():
    """dynamic=True: a size-generic fusion fires where the range the compile allows (a SymInt's bounds)
    lies inside the bracket; Dynamo's default range [2, inf) never does."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    env = ShapeEnv()
    sym = env.create_symbol(16, ConstantSource("b"), dynamic_dim=DimDynamic.DYNAMIC)
    assert gate.dim_range(env.create_symintnode(sym, hint=16)) is None  # [2, inf)
    env.constrain_symbol_range(sym, compiler_min=8, compiler_max=32)
    assert gate.dim_range(env.create_symintnode(sym, hint=16)) == (8, 32)
    assert gate.dim_range(7) == (7, 7)
    wins = t5_wins(shaped("win", 1.05, 8), shaped("win", 1.06, 32))
    records = gate.in_model_records(wins)
    inside = evidence.Query(((((96, 384), (512, 512), (64, 64)), F32), (((96, 384), (64, 64), (512, 512)), F32)),
                            True, True, "default")
    assert evidence.decide(inside, records)[0]
    beyond = evidence.Query(((((96, 768), (512, 512), (64, 64)), F32), (((96, 768), (64, 64), (512, 512)), F32)),
                            True, True, "default")
    assert not evidence.decide(beyond, records)[0]


def test_coverage_says_where_it_fires():
    wins = t5_wins(shaped("win", 1.05, 8, 256), shaped("win", 1.06, 32, 1024))
    lines = evidence.coverage(gate.in_model_records(wins))
    assert lines == ["fires at float32[96..384,256..1024,64] float32[96..384,64,256..1024] | "
                     "producer:fusable consumer:fusable | mode:default"], lines


def test_records_of_other_shapes_do_not_replace_each_other():
    merged = evidence.merge([], [shaped("win", 1.05, 8), shaped("win", 1.06, 32)])
    assert len(merged) == 2
    again = evidence.merge(merged, [{**shaped("loss", 0.9, 8), "date": "z"}])
    assert sorted(r.verdict for r in again) == ["loss", "win"]
    old = record("win", 1.0, model="t5")  # no batch/seq: the base preset's B16 S512
    assert evidence.InModelRecord.from_json(old).shape == (16, 512) == evidence.shape_of(old)


def test_a_parity_failure_declines_and_says_so_not_slower():
    # seen on the H200: an _x4 variant 1.009x faster whose parity was not judged was reported by the
    # gate as "step slower in ... 1.009x"
    fire, reason = decide(SIG, wins_with(record("parity-fail", 1.009)), producer_fusable=True)
    assert not fire and reason.startswith("parity failed or not judged in") and "slower" not in reason
    fire, reason = decide(SIG, wins_with(record("loss", 0.97)), producer_fusable=True)
    assert not fire and reason.startswith("step slower in")


def test_the_committed_t5_records_bracket_what_they_span():
    """The decisions the gate made on the H100 (reports/gpu/2026-12-07-h100-t5-shapes*/): with t5's attention
    region measured over the same knob at B8 S512 (an H100), B16 S512 (an H200) and B32 S256 (an H100), B12 and
    B24 at S512 and B16 at S256 fire, whichever card each record came from; B48, S1024 and the one shape
    measured as noise (B8 S256) decline, each with its reason."""
    wins = json.loads((Path(__file__).resolve().parents[1]
                       / "fusions/attention_position_bias_softmax_dropout/wins.json").read_text())
    records = evidence.records_of(wins)
    assert {(r.batch, r.seq) for r in records if r.verdict == "win"} >= {(8, 512), (16, 512), (32, 256)}
    assert len({r.gpu for r in records}) > 1  # the class does not key on the GPU

    def site(batch, seq=512):
        return evidence.Site(f"int64[112] bfloat16[{batch},12,{seq},{seq}] bool[1,1,{seq},{seq}] float32[32,12] "
                             f"int64[{seq},{seq}] | producer:fusable consumer:fusable", "reduce-overhead")

    for batch, seq in ((12, 512), (24, 512), (16, 256)):
        fire, reason = evidence.decide(site(batch, seq), records, evidence.isolated_rows(wins))
        assert fire and "x1 dim 0 in [8, 32], x1 dim 2 in [256, 512]" in reason, (batch, seq, reason)
    fire, reason = evidence.decide(site(48), records, evidence.isolated_rows(wins))
    assert not fire and reason == "outside the in-model evidence: x1 dim 0 = 48 outside measured [8, 32]", reason
    fire, reason = evidence.decide(site(16, 1024), records, evidence.isolated_rows(wins))
    assert not fire and reason == "outside the in-model evidence: x1 dim 2 = 1024 outside measured [256, 512]"
    fire, reason = evidence.decide(site(8, 256), records, evidence.isolated_rows(wins))  # measured: noise there
    assert not fire and reason.startswith("within noise in ") and "B8 S256 1.032x (noise +-10.3%)" in reason
    # the same site under the default compile mode is another class: no record there brackets it
    fire, reason = evidence.decide(evidence.Site(site(12).site, "default"), records, evidence.isolated_rows(wins))
    assert not fire and "no in-model win of this class" in reason
