"""The model zoo: HuggingFace models built from their configs (random weights, no hub).

``resolve(name)`` -> ``ModelSpec``; ``spec.build(preset, mode, device)`` -> ``Built``
(a model in train/eval mode on ``device`` and the keyword inputs for one step; in train
mode the inputs include labels so that ``built.loss(model(**inputs))`` is a scalar).
An unknown name raises ``UsageError`` listing the valid ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from miner.errors import UsageError

PRESETS = ("tiny", "base")


@dataclass
class Built:
    model: torch.nn.Module
    inputs: dict[str, Any]
    loss: Callable[[Any], torch.Tensor] = lambda out: out.loss


@dataclass(frozen=True)
class ModelSpec:
    name: str
    build_fn: Callable[[str, str, str], Built]
    presets: tuple[str, ...] = PRESETS
    note: str = ""

    def build(self, preset: str = "tiny", mode: str = "train", device: str = "cpu") -> Built:
        if preset not in self.presets:
            raise UsageError(f"model {self.name!r} has no preset {preset!r}; presets: {', '.join(self.presets)}")
        return self.build_fn(preset, mode, device)


_SIZES = {"tiny": dict(layers=2, hidden=128, heads=4, inter=512, vocab=1000, batch=2, seq=64),
          "base": dict(layers=12, hidden=768, heads=12, inter=3072, vocab=None, batch=16, seq=512)}


def _finish(model: torch.nn.Module, cfg, preset: str, mode: str, device: str, extra: dict | None = None) -> Built:
    s = _SIZES[preset]
    vocab = cfg.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (s["batch"], s["seq"]), generator=g)
    inputs: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    inputs.update(extra or {})
    if mode == "train":
        inputs["labels"] = ids.clone()
        model.train()
    else:
        model.eval()
    model.to(device)
    return Built(model, {k: v.to(device) if torch.is_tensor(v) else v for k, v in inputs.items()})


def _bert(preset: str, mode: str, device: str) -> Built:
    from transformers import BertConfig, BertForMaskedLM
    s = _SIZES[preset]
    cfg = BertConfig() if preset == "base" else BertConfig(
        num_hidden_layers=s["layers"], hidden_size=s["hidden"], num_attention_heads=s["heads"],
        intermediate_size=s["inter"], vocab_size=s["vocab"], max_position_embeddings=512)
    return _finish(BertForMaskedLM(cfg), cfg, preset, mode, device)


def _gpt2(preset: str, mode: str, device: str) -> Built:
    from transformers import GPT2Config, GPT2LMHeadModel
    s = _SIZES[preset]
    cfg = GPT2Config() if preset == "base" else GPT2Config(
        n_layer=s["layers"], n_embd=s["hidden"], n_head=s["heads"], vocab_size=s["vocab"], n_positions=512)
    model = GPT2LMHeadModel(cfg)
    model.loss_type = "ForCausalLM"  # None triggers a logger.warning_once graph break
    return _finish(model, cfg, preset, mode, device)


REGISTRY: dict[str, ModelSpec] = {
    "bert": ModelSpec("bert", _bert),
    "gpt2": ModelSpec("gpt2", _gpt2),
}


def available() -> list[str]:
    return sorted(REGISTRY)


def resolve(name: str) -> ModelSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise UsageError(f"unknown model {name!r}; valid names: {', '.join(available())}") from None
