"""The in-model gate: a promoted fusion fires on CUDA only in contexts an in-model A/B showed faster."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch._subclasses import FakeTensorMode

from miner.runtime import gate
from miner.runtime.rewrite import GATE_DECISIONS, decide, device_reasons, match_reasons, match_vals, wins_gate

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
    assert fire and "bert train/default 1.020x" in reason
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


def test_this_runs_overlay_counts_as_evidence_and_replaces_the_same_models_record():
    gate.OVERLAY["layer_norm"] = [record("win", 1.03)]
    try:
        assert decide(SIG, wins_with(), producer_fusable=True)[0]
        assert decide(SIG, wins_with(record("loss", 0.9)), producer_fusable=True)[0]  # bert re-measured
        assert not decide(SIG, wins_with(record("loss", 0.9, model="t5")), producer_fusable=True)[0]
    finally:
        gate.OVERLAY.pop("layer_norm")


def test_merge_records_replaces_the_same_model_and_mode():
    merged = gate.merge_records(wins_with(record("loss", 0.9)), "layer_norm", [record("win", 1.05)])
    recs = merged["in_model"]["records"]
    assert len(recs) == 1 and recs[0]["verdict"] == "win" and merged["wins"]  # isolated rows kept
    fresh = gate.merge_records(None, "rms_norm", [record("win", 1.05, model="llama")])
    assert fresh["kind"] == "FusionWins" and fresh["name"] == "rms_norm" and fresh["wins"] == []


def test_merge_records_keeps_one_record_per_key_the_newest():
    """A re-promotion passes the candidate's record and the fusion's copy of it: one survives."""
    old, new = dict(record("noise", 1.0), date="2026-12-02T10:00:00Z"), dict(record("win", 1.05), date="2026-12-03T10:00:00Z")
    for records in ([old, new], [new, old], [new, dict(new)]):
        recs = gate.merge_records(wins_with(new), "layer_norm", records)["in_model"]["records"]
        assert recs == [new], recs


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
    before = dict(GATE_DECISIONS)
    assert not wins_gate(m, wins_with(), 1)
    assert wins_gate(m, wins_with(record("win", 1.02, sites=(site,))), 1)
    new = {k: n - before.get(k, 0) for k, n in GATE_DECISIONS.items() if n != before.get(k, 0)}
    assert any(k.startswith("layer_norm decline ") and "unmeasured" in k for k in new)
    assert any(k.startswith("layer_norm fire ") and "step faster" in k for k in new)


def test_forced_open_fires_and_still_counts_what_it_would_decide():
    m = match_of(fake((8192, 768), torch.float32, "cuda"))
    before = gate.OBSERVED.copy()
    with gate.forced_open():
        assert wins_gate(m, wins_with(), 1)
    assert not wins_gate(m, wins_with(), 1)
    seen = gate.observed_since(before)["layer_norm"]
    assert sum(seen.values()) == 2 and all(not c.producer_fusable for c in seen)


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
    """The extra checks apply miner/mine/safety.py, upcast.py and recompute.py: editing a rule changes the uuid
    (Inductor's FX graph cache key), so a cached graph made under the old rule is not reused."""
    from miner.runtime import rewrite

    assert {Path(f).name for f in rewrite.RULE_FILES} == {"safety.py", "upcast.py", "recompute.py"}
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
    a reason, counted in GATE_DECISIONS and the pass's ``declined`` (before: silently, no count)."""
    from miner.runtime import rewrite

    v = symbolic_fake("cuda")
    assert not all(isinstance(s, int) for s in v.shape)
    node = SimpleNamespace(name="out", graph=object.__new__(torch.fx.Graph))
    m = match_of(v)
    m.output_node = lambda: node
    p = rewrite.FusionPass([])
    rewrite._ACTIVE.append((p, "layer_norm"))
    before = dict(GATE_DECISIONS)
    try:
        assert not wins_gate(m, wins_with(record("win", 1.5)), 1)
        with gate.forced_open():
            assert wins_gate(m, wins_with(), 1)
    finally:
        rewrite._ACTIVE.pop()
    new = {k: n - before.get(k, 0) for k, n in GATE_DECISIONS.items() if n != before.get(k, 0)}
    assert any(k.startswith("layer_norm decline ") and gate.SYMBOLIC_REASON in k for k in new), new
    assert any(k.startswith("layer_norm fire symbolic") and "forced open" in k for k in new), new
    assert p.declined["layer_norm"][gate.SYMBOLIC_REASON] == 1


def test_symbolic_sizes_on_cpu_pass():
    assert wins_gate(match_of(symbolic_fake("cpu")), wins_with(record("loss", 0.5)), 1)
