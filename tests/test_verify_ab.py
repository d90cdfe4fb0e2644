"""miner verify --ab end to end on the CPU: real torch.compile, the repository's fusions (interpreter)."""

from __future__ import annotations

import json
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
import torch

from miner.check import ab, abrun


@dataclass
class _Built:
    model: torch.nn.Module
    inputs: dict[str, Any]
    loss: Callable = field(default=lambda out: out["logits"].float().pow(2).mean())


class _Norm(torch.nn.Module):
    """embedding -> LayerNorm -> head: the layer-norm chain the `layer_norm` fusion matches."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 32)
        self.ln = torch.nn.LayerNorm(32)
        self.head = torch.nn.Linear(32, 50)

    def forward(self, input_ids):
        return {"logits": self.head(self.ln(self.emb(input_ids)))}


def _build() -> _Built:
    torch.manual_seed(0)
    return _Built(_Norm(), {"input_ids": torch.randint(0, 50, (2, 8))})


def test_run_ab_on_a_small_model_with_the_repository_fusions():
    from miner.runtime.fusions import Fusions

    fusions = Fusions(Path(__file__).resolve().parents[1])
    logs = []
    r = ab.run_ab(_build, ab.ABCase("norm", "infer", "default"), fusions,
                  ab.ABOptions(preset="tiny", device="cpu", warmup=1, rounds=2, profile_steps=1), log=logs.append)
    names = [v.name for v in r.variants]
    assert names[:3] == ["default", "control", "all"] and names[-1] == "gated"
    assert r.fires["layer_norm"] >= 1 and r.fires["softmax_like"] == 0  # the gate-open compile found the match
    control = r.variant("control")
    assert control.fx_cache_hits and "FX graph cache hit" in control.note  # the second default compile
    every = r.variant("all")
    assert every.compile_s is not None and every.parity.ok and every.matches["layer_norm"] >= 1
    assert every.parity.judged == "float32 floor", every.parity.reason  # against the float32 step
    assert (r.batch, r.seq) == (2, 8)  # the step's token shape, recorded
    assert "layer_norm" in every.contexts  # the match's context, as the gate saw it
    assert r.noise_band is not None and all(v.step.steps == 2 for v in r.variants[:3])
    assert every.kernels is not None and "delta_us" in every.kernels  # profiled and diffed
    assert r.variant("gated").note.startswith("same graph as `all`")  # CPU: the gate passes
    # what miner's pass added to the compile: the patterns traced once, every fusion tried on the graph
    assert {"(build)", "layer_norm"} <= set(every.pass_s), every.pass_s  # parts under 0.5 ms left out
    assert 0 < sum(every.pass_s.values()) < every.compile_s and not r.variant("default").pass_s
    assert any("miner's pass" in line and ": compiling" not in line for line in logs if " all:" in line), logs
    md = abrun.markdown([r])
    assert "layer_norm x" in md and "| all | open |" in md and "(miner's pass " in md
    assert ab.ab_from_json(json.loads(json.dumps(ab.ab_to_json(r)))).variant("all").pass_s == every.pass_s


def test_pass_text_names_the_largest_parts_first():
    assert ab.pass_text({}) == ""
    assert ab.pass_text({"a": 0.5, "(build)": 2.0, "b": 8.25}) == ", miner's pass 10.8 s (b 8.2, (build) 2.0, ...)"
    assert ab.pass_text({"a": 1.0}) == ", miner's pass 1.0 s (a 1.0)"


@pytest.mark.slow
def test_cli_smoke_tiny_bert_on_cpu(tmp_path, capsys):
    from miner import cli

    out = tmp_path / "run"
    assert cli.main(["verify", "--ab", "--allow-cpu", "--models", "bert", "--mode", "infer", "--rounds", "2",
                     "--warmup", "1", "--profile-steps", "1", "--out", str(out)]) == 0
    data = json.loads((out / "verify.json").read_text())
    assert data["kind"] == "VerifyAB" and data["results"][0]["fires"]["layer_norm"] > 0
    assert "noise band" in (out / "verify.md").read_text()


@pytest.mark.gpu
def test_gpu_ab_tiny_bert_train_and_reduce_overhead_infer():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    run = abrun.ABRun(ab.ABOptions(preset="tiny", device="cuda", warmup=3, rounds=3, profile_steps=1),
                      modes=("train", "infer"), compile_modes=("default", "reduce-overhead"))
    results = abrun.run_all(["bert"], run, workspace=Path(__file__).resolve().parents[1], log=lambda s: None)
    assert [(r.mode, r.compile) for r in results] == [("train", "default"), ("infer", "default"),
                                                       ("infer", "reduce-overhead")]
    for r in results:
        assert r.error is None, r.error
        assert r.noise_band is not None and r.variant("gated") is not None
        assert all(v.parity is None or v.parity.ok for v in r.variants), r
        assert r.variant("control").kernels is not None  # profiled on CUDA


def test_exit_one_says_why_a_variant_failed_or_went_unjudged():
    """`miner verify --ab` exits 1 when a variant's parity failed or was not judged (a t5-large run exited 1
    with no word why): each reason is one line naming the model and the variant."""
    from miner.check.verify import FIXED, Parity
    from miner.commands.verify import failures

    def parity(ok: bool, judged: str = FIXED) -> Parity:
        return Parity(1.0, 1.0, 0.0, 0.0, 0.0, None, None, ok, judged=judged)

    r = ab.ABResult("t5-large", "train", "default", "base", 8, 512)
    r.variants = [ab.VariantResult("default", [], "-"), ab.VariantResult("knob:k", [], "-", parity=parity(True))]
    assert failures([r]) == []
    r.variants.append(ab.VariantResult("knob:k+fusions", ["f"], "-", parity=parity(False, "masks injected (not judged)")))
    r.variants.append(ab.VariantResult("alone:f", ["f"], "open", parity=parity(False)))
    skipped = ab.ABResult("bert", "infer", "default", "base", None, None, error="skipped: no CUDA")
    broken = ab.ABResult("gpt2", "infer", "default", "base", None, None, error="compile failed: boom")
    assert failures([r, skipped, broken]) == ["gpt2 infer/default: compile failed: boom",
                                              "t5-large train/default knob:k+fusions: parity not judged",
                                              "t5-large train/default alone:f: parity failed"]


def test_a_model_fed_features_is_named_by_its_inputs_not_the_presets_sizes():
    """`--batch`/`--seq` size token inputs only: a model of one's own fed ``x [4, 32, 64]`` ran at that size, and the
    A/B said "B2 S64" (the tiny preset's). Its rows and setup now name the inputs; token models keep B/S."""
    r = ab.ABResult("mynet:build", "train", "default", "tiny", 2, 64, env={"device": "cpu", "gpu": "cpu"})
    assert abrun.size_text(r) == "B2 S64"
    sizes = ab.untokenized_sizes({"x": torch.randn(4, 32, 64), "scale": 2.0})
    assert sizes == "x float32[4,32,64]"
    assert ab.untokenized_sizes({"input_ids": torch.zeros(2, 8, dtype=torch.long), "x": torch.randn(2, 3)}) is None
    r.env = {**r.env, "inputs": sizes}
    assert abrun.size_text(r) == sizes and "tiny x float32[4,32,64]" in ab.setup_of(r)
