"""The zoo's public API: hand-written specs, name resolution, groups, checkpoints, factories."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

import miner_models as models
from miner.core.errors import UsageError

HAND = ("bert", "gpt2", "t5", "llama", "roberta", "distilbert", "bart", "opt")


def _step(built: models.Built) -> torch.Tensor:
    loss = built.loss(built.model(**built.inputs))
    loss.backward()
    return loss


@pytest.mark.parametrize("name", HAND)
def test_hand_spec_tiny_trains(name):
    built = models.resolve(name).build("tiny", "train", "cpu")
    assert built.model.training
    assert built.inputs["input_ids"].shape == (2, 64)
    assert "labels" in built.inputs
    loss = _step(built)
    assert loss.ndim == 0 and torch.isfinite(loss)
    grads = [p.grad for p in built.model.parameters() if p.requires_grad]
    assert sum(g is not None for g in grads) > 0.9 * len(grads)
    cfg = built.model.config
    assert cfg.vocab_size == 1000
    assert sum(p.numel() for p in built.model.parameters()) < 2_000_000


@pytest.mark.parametrize("name", HAND)
def test_hand_spec_infer_has_no_labels(name):
    built = models.resolve(name).build("tiny", "infer", "cpu")
    assert not built.model.training
    assert not {"labels", "start_positions"} & set(built.inputs)
    with torch.no_grad():
        out = built.model(**built.inputs)
    assert out.logits.shape[0] == 2


def test_known_graph_break_fixes():
    gpt2 = models.resolve("gpt2").build("tiny", "train", "cpu")
    assert gpt2.model.loss_type == "ForCausalLM"
    for name in ("t5", "bart"):
        built = models.resolve(name).build("tiny", "train", "cpu")
        assert built.inputs["use_cache"] is False
        assert built.inputs["decoder_input_ids"].shape == (2, 64)


# Published sizes (millions of parameters) of the base presets, built on the meta device.
BASE_MILLIONS = {"bert": (105, 115), "gpt2": (120, 128), "t5": (220, 225), "llama": (1000, 1300),
                 "roberta": (120, 130), "distilbert": (63, 70), "bart": (135, 145), "opt": (120, 130)}


@pytest.mark.parametrize("name", HAND)
def test_base_preset_is_published_size(name):
    built = models.resolve(name).build("base", "train", "meta")
    millions = sum(p.numel() for p in built.model.parameters()) / 1e6
    low, high = BASE_MILLIONS[name]
    assert low <= millions <= high, f"{name} base has {millions:.1f}M parameters"
    assert built.inputs["input_ids"].shape == (16, 512)


def test_unknown_name_lists_valid_names():
    with pytest.raises(UsageError) as e:
        models.resolve("no-such-model")
    msg = str(e.value)
    assert "no-such-model" in msg
    assert all(n in msg for n in HAND)
    assert "hf-suite" in msg and "all" in msg


def test_unknown_name_suggests_close_match():
    with pytest.raises(UsageError, match="did you mean: .*llama"):
        models.resolve("lama")


def test_unknown_preset_and_mode():
    with pytest.raises(UsageError, match="preset"):
        models.resolve("bert").build("huge", "train", "cpu")
    with pytest.raises(UsageError, match="mode"):
        models.resolve("bert").build("tiny", "fly", "cpu")


def test_expand_groups_and_validates():
    suite = models.expand(["hf-suite"])
    assert len(suite) >= 50
    assert "BertForMaskedLM" in suite and "meta-llama--Llama-3.2-1B" in suite
    assert all("/" not in n for n in suite)  # names are folder names under captures/
    everything = models.expand(["all"])
    assert {"qwen2", "mistral", "electra", "bert"} <= set(everything)
    assert models.expand(["bert", "gpt2", "bert"]) == ["bert", "gpt2"]
    assert models.expand(["meta-llama/Llama-3.2-1B"]) == ["meta-llama--Llama-3.2-1B"]
    with pytest.raises(UsageError, match="nope"):
        models.expand(["bert", "nope"])


def test_hand_written_overrides_generic():
    assert models.resolve("bert").source == "hand"
    assert models.resolve("qwen2").source == "generic"
    assert models.resolve("BertForMaskedLM").source == "suite"


def test_group_is_not_a_model():
    with pytest.raises(UsageError, match="group"):
        models.resolve("hf-suite")


def test_local_checkpoint_with_weights(tmp_path):
    src = models.resolve("bert").build("tiny", "infer", "cpu").model
    src.save_pretrained(tmp_path)
    spec = models.resolve(str(tmp_path))
    assert spec.source == "checkpoint" and "with weights" in spec.note
    built = spec.build("tiny", "train", "cpu")
    assert type(built.model).__name__ == "BertForMaskedLM"
    w = "bert.embeddings.word_embeddings.weight"
    torch.testing.assert_close(built.model.state_dict()[w], src.state_dict()[w])
    assert torch.isfinite(_step(built))


def test_local_checkpoint_config_only(tmp_path):
    models.resolve("llama").build("tiny", "infer", "cpu").model.config.save_pretrained(tmp_path)
    spec = models.resolve(str(tmp_path))
    assert "random weights" in spec.note
    built = spec.build("tiny", "train", "cpu")
    assert type(built.model).__name__ == "LlamaForCausalLM"
    assert torch.isfinite(_step(built))


FACTORY = """
import torch
from miner_models import Built

class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x, y=None):
        out = self.lin(x).relu()
        return {"loss": ((out - y) ** 2).mean() if y is not None else None, "out": out}

def pair(preset, mode, device):
    return Tiny(), {"x": torch.randn(4, 8), "y": torch.randn(4, 8)}

def built(preset, mode, device):
    return Built(Tiny(), {"x": torch.randn(4, 8)}, loss=lambda out: out["out"].sum())

def wrong(preset, mode, device):
    return 42

def plain():  # a project's own model: no arguments, a tensor out, no loss
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)), {"input": torch.randn(4, 8)}

def two(preset, mode):
    return Tiny(), {}
"""


@pytest.fixture
def factory_module(tmp_path, monkeypatch):
    (tmp_path / "my_zoo_factory.py").write_text(textwrap.dedent(FACTORY))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_zoo_factory"
    sys.modules.pop("my_zoo_factory", None)


def test_factory_pair(factory_module):
    spec = models.resolve(f"{factory_module}:pair")
    assert spec.source == "factory"
    built = spec.build("tiny", "infer", "cpu")
    assert not built.model.training
    built = spec.build("tiny", "train", "cpu")
    assert built.model.training
    assert torch.isfinite(_step(built))


def test_factory_built(factory_module):
    built = models.resolve(f"{factory_module}:built").build("tiny", "train", "cpu")
    assert built.inputs["x"].shape == (4, 8)
    _step(built)
    assert built.model.lin.weight.grad is not None


def test_factory_without_arguments_and_loss_trains_on_its_output(factory_module):
    built = models.resolve(f"{factory_module}:plain").build("tiny", "train", "cpu")
    assert torch.isfinite(_step(built))
    assert built.model[0].weight.grad is not None
    no_labels = models.resolve(f"{factory_module}:pair").build("tiny", "train", "cpu")
    no_labels.inputs.pop("y")  # a loss of None in the output: the mean of the first float output
    assert torch.isfinite(_step(no_labels))


def test_factory_in_the_current_directory_resolves_from_any_command(tmp_path, monkeypatch):
    """`miner validate` (in-process, not a scan worker) proves a candidate in the user's own model:
    its module lies in the current directory, which the console script does not put on sys.path."""
    (tmp_path / "my_cwd_model.py").write_text(textwrap.dedent(FACTORY))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    try:
        built = models.resolve("my_cwd_model:plain").build("tiny", "train", "cpu")
        assert torch.isfinite(_step(built))
    finally:
        sys.modules.pop("my_cwd_model", None)


def test_factory_errors(factory_module):
    with pytest.raises(UsageError, match=r"takes \(preset, mode\); a factory takes \(preset, mode, device\)"):
        models.resolve(f"{factory_module}:two").build("tiny", "train", "cpu")
    with pytest.raises(UsageError, match="expected a models.Built"):
        models.resolve(f"{factory_module}:wrong").build("tiny", "train", "cpu")
    with pytest.raises(UsageError, match="no callable"):
        models.resolve(f"{factory_module}:missing")
    with pytest.raises(UsageError, match="cannot import"):
        models.resolve("no_such_package_xyz.mod:fn")


def test_slug_is_a_folder_name():
    assert models.slug("/tmp/ckpt/my model") == "tmp_ckpt_my_model"
    assert models.slug("pkg.mod:factory") == "pkg.mod_factory"


def test_models_verb_lists_sources(capsys):
    from miner.cli import main
    assert main(["models", "--source", "hand", "--source", "suite"]) == 0
    out = capsys.readouterr().out
    assert all(n in out for n in HAND)
    assert "AlbertForMaskedLM" in out and "meta-llama--Llama-3.2-1B" in out
    assert "qwen2" not in out


def test_zoo_table_from_scan_results(tmp_path):
    from miner.core.records import GraphKey, ScanResult
    from miner.core.workspace import Workspace
    from miner_models.table import EagerCheck, render
    ws = Workspace(tmp_path)
    keys = tuple(GraphKey("BertForMaskedLM", "tiny", "train", p) for p in ("forward", "backward"))
    ws.save_scan(ScanResult("BertForMaskedLM", "tiny", "train", "cpu", True, graphs=keys, seconds=21.5,
                            nodes_by_category={"pointwise": 300, "view": 100}))
    ws.save_scan(ScanResult("qwen2", "tiny", "train", "cpu", False, error="RuntimeError: boom | bang", seconds=3.0))
    ws.save_scan(ScanResult("qwen2", "tiny", "infer", "cpu", True, graphs=keys[:1]))  # another mode: ignored
    text = render(ws.scans(), "tiny", "train", {"qwen2": EagerCheck(True, True, 1.0)})
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert "| BertForMaskedLM | suite | BertForMaskedLM (masked-lm) | - | yes | 2 | 400 | 0 | 21.5 |  |" in text
    assert "| yes | no |" in rows["qwen2"] and "boom \\| bang" in rows["qwen2"]
    assert "not scanned" in rows["mistral"]
    assert "## hf-suite (PyTorch's HF dynamo benchmark list): 1/55 (2%) captured on the CPU (1 scanned)" in text
    assert "CPU totals: 1 scanned, 1 captured, 0 failed; 2 graphs, 400 nodes; 0.4 min of scans" in text
    assert "cuda" not in text
    gpu = [ScanResult("BertForMaskedLM", "tiny", "train", "cuda", False, error="OOM", seconds=1.0)]
    text = render(ws.scans(), "tiny", "train", {}, gpu_scans=gpu)
    assert "0/55 (0%) on CUDA (1 scanned)" in text
    assert "| 21.5 | no |  | 1.0 | cuda: OOM |" in text  # CPU ok, CUDA failed: the CUDA error shows
