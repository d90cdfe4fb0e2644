"""miner verify: parity math, records, the no-CUDA error and the step loop on a small CPU model."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
import torch

from miner.check import verify
from miner.check.verify import Parity, StepStats, VerifyResult


def test_rel_diff_and_grads_parity():
    a = torch.randn(100, dtype=torch.float64)
    assert verify.rel_diff(a, a) == 0.0
    assert verify.rel_diff(a * 1.01, a) == pytest.approx(0.01)
    assert verify.rel_diff(torch.tensor(float("nan")), torch.tensor(1.0)) == float("inf")
    assert verify.rel_diff(a[:3], a) == float("inf")
    g = {"w": torch.ones(4), "b": torch.ones(2), "frozen": None}
    f = {"w": torch.ones(4), "b": torch.ones(2) * 1.5, "frozen": None}
    rel, worst, worst_rel = verify.grads_parity(f, g)
    assert worst == "b" and worst_rel == pytest.approx(0.5)
    assert rel == pytest.approx((2 * 0.25) ** 0.5 / 6 ** 0.5)
    assert verify.grads_parity({"w": None}, {"w": torch.ones(1)})[0] == float("inf")


def test_make_parity_uses_the_tolerances():
    g = {"w": torch.ones(8)}
    ok = verify.make_parity(2.0, 2.001, torch.ones(4), torch.ones(4), g, {"w": torch.ones(8) * 1.001})
    assert ok.ok and ok.loss_rel == pytest.approx(5e-4)
    bad = verify.make_parity(2.0, 2.5, None, None, g, g)
    assert not bad.ok and bad.logits_rel is None
    infer = verify.make_parity(None, None, torch.ones(4), torch.ones(4) * 1.5, {}, {})
    assert not infer.ok and infer.grads_rel is None


def test_resize_inputs():
    ids = torch.arange(8).reshape(2, 4)
    out = verify.resize_inputs({"input_ids": ids, "labels": torch.tensor([1, 0]), "use_cache": False}, 3, 6)
    assert out["input_ids"].shape == (3, 6) and out["labels"].tolist() == [1, 0, 1] and out["use_cache"] is False
    assert out["input_ids"][2, :4].tolist() == [0, 1, 2, 3]
    assert verify.resize_inputs({"x": ids}, 1, 2)["x"].tolist() == [[0, 1]]
    for b, s in ((1, 2), (2, 3), (3, 6)):  # shorter or longer: contiguous (t5's loss views labels as (-1,))
        got = verify.resize_inputs({"labels": ids}, b, s)["labels"]
        assert got.is_contiguous() and got.view(-1).numel() == b * s
    same = {"x": ids}
    assert verify.resize_inputs(same, None, None) is same


def _result() -> VerifyResult:
    s1 = StepStats(100.0, 99.0, 101.0, 20, 30 * 2**30, 60.0)
    s2 = StepStats(95.0, 94.0, 96.0, 20, 29 * 2**30, 62.0)
    p = Parity(10.4, 10.4001, 1e-5, 2e-3, 1e-2, "bert.encoder.layer.0.output.dense.weight", 3e-2, True)
    return VerifyResult("bert", "train", "base", 16, 512, s1, s2, p, {"softmax_like": 24},
                        env={"gpu": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0", "date": "2026-12-02T12:00:00Z"})


def test_result_round_trip_and_table(tmp_path):
    r = _result()
    assert r.speedup == pytest.approx(100 / 95)
    data = json.loads(json.dumps(verify.result_to_json(r)))
    assert verify.result_from_json(data) == r
    err = VerifyResult("gpt2", "train", "base", None, None, error="RuntimeError: x")
    md = verify.markdown_table([r, err])
    assert "1.053x" in md and "softmax_like=24" in md and "RuntimeError: x" in md
    paths = verify.save([r, err], tmp_path)
    assert verify.load(paths[0]) == [r, err]
    assert "NVIDIA H200" in paths[1].read_text()


def test_no_cuda_is_one_clear_line(monkeypatch, capsys, tmp_path):
    from miner import cli

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["--workspace", str(tmp_path), "verify", "--models", "bert"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a CUDA GPU" in err[0]


@dataclass
class _Built:
    model: torch.nn.Module
    inputs: dict[str, Any]
    loss: Callable = field(default=lambda out: out["logits"].float().pow(2).mean())


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.ln = torch.nn.LayerNorm(16)
        self.head = torch.nn.Linear(16, 50)

    def forward(self, input_ids):
        return {"logits": self.head(torch.softmax(self.ln(self.emb(input_ids)), -1))}


def _build() -> _Built:
    torch.manual_seed(0)
    return _Built(_Tiny(), {"input_ids": torch.randint(0, 50, (2, 8))})


@pytest.mark.parametrize("mode", ["train", "infer"])
def test_verify_model_step_loop_on_cpu(mode):
    """The whole comparison with an identity 'compiler': identical models give exact parity."""
    logs = []
    options = verify.VerifyOptions(preset="tiny", device="cpu", warmup=2, steps=3, compile_fn=lambda m, opts: m)
    r = verify.verify_model(_build, model="tiny", mode=mode, options=options, fused=verify.Fused({"x": 1}),
                            log=logs.append)
    assert r.error is None and r.default.steps == 3 and r.fused.steps == 3
    assert r.parity.ok and r.parity.logits_rel == 0.0
    if mode == "train":
        assert r.parity.loss_rel == 0.0 and r.parity.grads_rel == 0.0
    else:
        assert r.parity.loss_default is None and r.parity.grads_rel is None
    assert r.speedup > 0 and len(logs) == 6


def test_match_counts_reads_the_fusions_counters():
    class Fake:
        @staticmethod
        def match_counts():
            return {"softmax_like": 3}

    counts = verify.match_counts(Fake)
    assert counts["softmax_like"] == 3 and "inductor.pattern_matcher_count" in counts

    class Pass:  # fusions.graph_pass(): a FusionPass with a Counter
        counts = {"layer_norm": 2}

    assert verify.match_counts(Pass)["layer_norm"] == 2
    assert verify._delta({"a": 5, "b": 1}, {"a": 2}) == {"a": 3, "b": 1}


@pytest.mark.gpu
def test_gpu_verify_tiny_bert():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    pytest.importorskip("fusions")
    (r,) = verify.run_verify(["bert"], verify.VerifyOptions(preset="tiny", device="cuda", warmup=2, steps=3),
                             log=lambda s: None)
    assert r.error is None and r.parity.ok, r
