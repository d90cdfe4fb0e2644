"""The evidence that decides firing (``miner.runtime.evidence``) and a pass's own decision log.

A record round-trips through JSON (the committed files included, byte for byte), the store merges
records of both file kinds the same way (a newer record of a key replaces the older), and two passes
in one process keep separate logs (what the module-level counters they replaced could not).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from miner.runtime import decisions, evidence, fusions, rewrite

REPO = Path(__file__).resolve().parents[1]
COMMITTED = sorted(REPO.glob("fusions/*/wins.json")) + sorted(REPO.glob("candidates/*/in_model.json"))


def _record(**kw) -> dict:
    base = {"model": "bert", "mode": "train", "compile": "default", "preset": "base", "batch": None, "seq": None,
            "speedup": 1.03, "band": 0.01, "verdict": "win", "matches": 3, "contexts": {"float32[4,8] | x": 2},
            "gpu": "NVIDIA H200", "torch": "2.11.0", "date": "2026-12-03T10:00:00Z", "source": "run/verify.json"}
    return {**base, **kw}


def test_committed_records_round_trip_byte_for_byte():
    assert any("in_model" in json.loads(p.read_text()) for p in COMMITTED)
    for path in COMMITTED:
        payload = json.loads(path.read_text())
        for raw in (payload.get("in_model") or {}).get("records", ()):
            rec = evidence.InModelRecord.from_json(raw)
            assert json.dumps(rec.to_json()) == json.dumps(raw), path
            assert rec.key[:4] == (raw["model"], raw["mode"], raw["compile"], raw["preset"])


def test_rewriting_a_committed_file_with_no_new_record_changes_nothing(tmp_path):
    for path in (p for p in COMMITTED if "in_model" in json.loads(p.read_text())):
        copy = tmp_path / path.parent.name / path.name
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, copy)
        evidence.write(copy, path.parent.name, [])
        assert copy.read_text() == path.read_text(), path


def test_an_older_record_reads_with_defaults_and_keeps_what_it_does_not_know():
    old = {"model": "t5", "mode": "train", "speedup": 0.98, "band": 0.004, "verdict": "loss", "note": "hand-made"}
    rec = evidence.InModelRecord.from_json(old)
    assert (rec.compile, rec.matches, rec.contexts, rec.shape) == ("default", None, {}, (None, None))
    assert rec.to_json()["note"] == "hand-made" and rec.to_json()["compile"] == "default"
    assert evidence.InModelRecord.from_json(dict(old, preset="base")).shape == (16, 512)  # the preset's sizes
    assert rec.describe() == "t5 train/default 0.980x (noise +-0.4%)"
    assert rec.describe(full=True) == "t5 train/default 0.980x (noise +-0.4%; ? matches, loss)"


def test_a_newer_record_of_the_same_key_replaces_the_older_in_both_file_kinds(tmp_path):
    older, other = _record(verdict="loss", speedup=0.97), _record(model="gpt2")
    newer = _record(verdict="win", speedup=1.05, date="2026-12-04T10:00:00Z")
    for path in (evidence.evidence_file(tmp_path, "ln", fusion=True),
                 evidence.evidence_file(tmp_path, "pabc", fusion=False)):
        path.parent.mkdir(parents=True)
        evidence.write(path, path.parent.name, [older, other])
        evidence.write(path, path.parent.name, [newer])
        got = evidence.read(path)
        assert [(r.model, r.verdict, r.speedup) for r in got] == [("gpt2", "win", 1.03), ("bert", "win", 1.05)]
        kind = json.loads(path.read_text())["kind"]
        assert kind == (evidence.FUSION_KIND if path.name == evidence.FUSION_FILE else evidence.CANDIDATE_KIND)
    assert [r.key for r in evidence.merge([_record(seq=128)], [_record(seq=256)])] == [
        ("bert", "train", "default", "base", 16, 128, None), ("bert", "train", "default", "base", 16, 256, None)]


def test_decide_fires_only_on_in_model_evidence():
    ctx = evidence.Context((((4, 8), "float32"),), False, False)
    win = _record(contexts={ctx.site: 1})
    assert evidence.decide(ctx, [win]) == (True, "step faster in bert train/default B16 S512 1.030x (noise +-1.0%)")
    isolated = evidence.isolated_rows({"wins": [{"inputs": [{"shape": [4, 8], "dtype": "float32"}],
                                                 "speedup_vs_inductor": 2.0}]})
    assert not evidence.decide(ctx, [], isolated)[0]  # an isolated win alone never fires


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.ln = torch.nn.Linear(8, 32), torch.nn.LayerNorm(32)

    def forward(self, x):
        return self.ln(self.a(x))


def _compile_with(p) -> None:
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True), torch.no_grad():
        torch.compile(Net(), dynamic=False, options=rewrite.inductor_options(p))(torch.randn(4, 8))
    torch._dynamo.reset()


def test_two_passes_in_one_process_keep_their_own_logs():
    entries = fusions.graph_pass(REPO, ["layer_norm"]).entries
    declining, firing = rewrite.FusionPass(entries, interpret=False), rewrite.FusionPass(entries, interpret=True)
    _compile_with(declining)
    _compile_with(firing)
    assert declining.counts == {} and list(declining.declined["layer_norm"]) == [rewrite.CPU_NOT_ASKED]
    assert firing.counts == {"layer_norm": 1} and firing.declined == {}
    assert not any(rewrite.CPU_NOT_ASKED in line for line in firing.log.lines)
    assert decisions.current() is None  # nothing is left applying after a compile


def test_a_passs_cache_key_covers_its_gate_mode_and_its_records_of_this_run():
    entries = fusions.graph_pass(REPO, ["layer_norm"]).entries
    base = rewrite.FusionPass(entries).uuid()
    rec = evidence.InModelRecord.from_json(_record())
    assert rewrite.FusionPass(entries, gate="open").uuid() != base
    assert rewrite.FusionPass(entries, records={"layer_norm": [rec]}).uuid() != base
    assert rewrite.FusionPass(entries, records={"rms_norm": [rec]}).uuid() == base  # not one of its fusions
    assert rewrite.FusionPass(entries).uuid() == base
