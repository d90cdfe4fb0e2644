"""The generic path (any transformers model_type) and the hf-suite entries, eager only (fast)."""

from __future__ import annotations

import pytest
import torch

import miner_models as models
from miner_models.generic import HEADS, INTER, LAYERS, shrink_dict, tiny_config

# (model_type, expected head class): none of them has a hand-written spec.
GENERIC = [
    ("qwen2", "Qwen2ForCausalLM"),
    ("mistral", "MistralForCausalLM"),
    ("electra", "ElectraForMaskedLM"),
    ("albert", "AlbertForMaskedLM"),
    ("gpt_neo", "GPTNeoForCausalLM"),
    ("mbart", "MBartForConditionalGeneration"),
    ("deberta-v2", "DebertaV2ForMaskedLM"),
    ("qwen3_moe", "Qwen3MoeForCausalLM"),
    ("vit", "ViTForImageClassification"),
]


def _layers(cfg) -> list[int]:
    names = ("num_hidden_layers", "n_layer", "num_layers", "encoder_layers", "decoder_layers")
    return [getattr(cfg, n) for n in names if isinstance(getattr(cfg, n, None), int)]


@pytest.mark.parametrize("model_type,head", GENERIC)
def test_generic_tiny_trains(model_type, head):
    assert model_type not in models.REGISTRY
    spec = models.resolve(model_type)
    assert spec.source == "generic"
    built = spec.build("tiny", "train", "cpu")
    assert type(built.model).__name__ == head
    cfg = built.model.config
    assert _layers(cfg) and max(_layers(cfg)) <= LAYERS
    assert getattr(cfg, "hidden_size", 128) <= 128
    assert sum(p.numel() for p in built.model.parameters()) < 5_000_000
    loss = built.loss(built.model(**built.inputs))
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert sum(p.grad is not None for p in built.model.parameters()) > 0


def test_generic_seq2seq_inputs():
    built = models.resolve("mbart").build("tiny", "train", "cpu")
    assert {"input_ids", "decoder_input_ids", "labels"} <= set(built.inputs)
    assert built.inputs["use_cache"] is False


def test_generic_ids_avoid_special_tokens():
    built = models.resolve("electra").build("tiny", "infer", "cpu")
    cfg = built.model.config
    ids = built.inputs["input_ids"]
    assert int(ids.max()) < cfg.vocab_size
    assert not (ids == cfg.pad_token_id).any()


def test_shrink_keeps_attention_kind():
    gqa = shrink_dict({"num_hidden_layers": 24, "hidden_size": 2048, "num_attention_heads": 32,
                       "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 32000})
    assert gqa == {"num_hidden_layers": LAYERS, "hidden_size": 128, "num_attention_heads": HEADS,
                   "num_key_value_heads": HEADS // 2, "intermediate_size": INTER, "vocab_size": 1000}
    assert shrink_dict({"num_attention_heads": 32, "num_key_value_heads": 32})["num_key_value_heads"] == HEADS
    assert shrink_dict({"num_attention_heads": 32, "num_key_value_heads": 1})["num_key_value_heads"] == 1


def test_shrink_per_layer_lists_and_subconfigs():
    out = shrink_dict({"num_hidden_layers": 12, "layer_types": ["a", "b"] * 6,
                       "text_config": {"model_type": "x", "hidden_size": 1024, "vocab_size": 50}})
    assert out["layer_types"] == ["a", "b"]
    assert out["text_config"] == {"model_type": "x", "hidden_size": 128, "vocab_size": 50}


def test_tiny_config_moe_experts():
    cfg = tiny_config("qwen3_moe")
    assert cfg.num_experts <= 4 and cfg.num_experts_per_tok <= 2


def test_generic_unknown_model_type():
    with pytest.raises(models.UsageError):
        models.resolve("qwen99")


@pytest.mark.parametrize("name", ["GoogleFnet", "XLNetLMHeadModel", "openai/whisper-tiny",
                                  "GPT2ForSequenceClassification", "BertForQuestionAnswering"])
def test_suite_entry_trains(name):
    built = models.resolve(name).build("tiny", "train", "cpu")
    loss = built.loss(built.model(**built.inputs))
    assert torch.isfinite(loss)
    loss.backward()


@pytest.mark.slow
def test_every_suite_entry_trains_eagerly():
    failures = {}
    for name in models.expand(["hf-suite"]):
        try:
            built = models.resolve(name).build("tiny", "train", "cpu")
            built.loss(built.model(**built.inputs)).backward()
        except Exception as e:  # noqa: BLE001 - collect them all
            failures[name] = f"{type(e).__name__}: {e}"
    assert not failures, failures
