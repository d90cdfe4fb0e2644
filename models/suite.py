"""``hf-suite``: the model list of PyTorch's HuggingFace dynamo benchmark.

The names are those of ``benchmarks/dynamo/huggingface_models_list.txt`` in pytorch/pytorch
(``SUITE_LIST``, with the benchmark's batch size), in its order; a hub-style name ``org/model``
is ``org--model`` in the zoo (it names a folder under ``captures/``), and ``resolve`` takes both. Each maps to a transformers model
class (``SUITE``); its config is the generic path's tiny config of the class's model_type
(``models.generic.tiny_config``) plus the entry's own keywords, and the task follows the class's
head. ``base`` is the benchmark's own choice: the config class's defaults for the class-named
entries, the published size for the checkpoint-named ones (written out here, no hub access).
A name whose class is missing from the installed transformers is listed by ``unsupported()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import Any

import torch

from .base import SHAPES, Built, ModelSpec, finish, instantiate, no_cache_inputs, ready, token_ids

# name, benchmark batch size (as in huggingface_models_list.txt)
SUITE_LIST: tuple[tuple[str, int], ...] = (
    ("AlbertForMaskedLM", 8), ("AlbertForQuestionAnswering", 8), ("AllenaiLongformerBase", 8),
    ("BartForCausalLM", 8), ("BartForConditionalGeneration", 4), ("BertForMaskedLM", 32),
    ("BertForQuestionAnswering", 32), ("BlenderbotForCausalLM", 32), ("BlenderbotForConditionalGeneration", 16),
    ("BlenderbotSmallForCausalLM", 256), ("BlenderbotSmallForConditionalGeneration", 128), ("CamemBert", 32),
    ("DebertaV2ForMaskedLM", 8), ("DebertaV2ForQuestionAnswering", 8), ("DistilBertForMaskedLM", 256),
    ("DistilBertForQuestionAnswering", 512), ("DistillGPT2", 32), ("ElectraForCausalLM", 64),
    ("ElectraForQuestionAnswering", 128), ("GPT2ForSequenceClassification", 8), ("GPTJForCausalLM", 1),
    ("GPTJForQuestionAnswering", 1), ("GPTNeoForCausalLM", 32), ("GPTNeoForSequenceClassification", 32),
    ("GoogleFnet", 32), ("LayoutLMForMaskedLM", 32), ("LayoutLMForSequenceClassification", 32),
    ("M2M100ForConditionalGeneration", 64), ("MBartForCausalLM", 8), ("MBartForConditionalGeneration", 4),
    ("MT5ForConditionalGeneration", 32), ("MegatronBertForCausalLM", 16), ("MegatronBertForQuestionAnswering", 16),
    ("MobileBertForMaskedLM", 256), ("MobileBertForQuestionAnswering", 256), ("OPTForCausalLM", 4),
    ("PLBartForCausalLM", 16), ("PLBartForConditionalGeneration", 8), ("PegasusForCausalLM", 128),
    ("PegasusForConditionalGeneration", 64), ("RobertaForCausalLM", 32), ("RobertaForQuestionAnswering", 32),
    ("T5ForConditionalGeneration", 8), ("T5Small", 8), ("TrOCRForCausalLM", 64), ("XGLMForCausalLM", 32),
    ("XLNetLMHeadModel", 16), ("YituTechConvBert", 32), ("meta-llama/Llama-3.2-1B", 8), ("google/gemma-2-2b", 8),
    ("google/gemma-3-4b-it", 8), ("openai/whisper-tiny", 8), ("Qwen/Qwen3-0.6B", 8),
    ("mistralai/Mistral-7B-Instruct-v0.3", 8), ("openai/gpt-oss-20b", 8),
)


@dataclass(frozen=True)
class SuiteEntry:
    """How one suite name is built: a transformers model class plus config keywords."""

    model_cls: str
    tiny: dict[str, Any] = field(default_factory=dict)  # on top of the generic tiny config
    base: dict[str, Any] = field(default_factory=dict)  # on top of the config class defaults
    note: str = ""


# Names that are not a transformers class name (the benchmark's aliases and hub checkpoints).
ALIASES: dict[str, SuiteEntry] = {
    "AllenaiLongformerBase": SuiteEntry("LongformerForMaskedLM", note="allenai/longformer-base-4096"),
    "CamemBert": SuiteEntry("CamembertForMaskedLM", note="camembert-base"),
    "DistillGPT2": SuiteEntry("GPT2LMHeadModel", base=dict(n_layer=6), note="distilgpt2"),
    "GoogleFnet": SuiteEntry("FNetForMaskedLM", note="google/fnet-base"),
    "YituTechConvBert": SuiteEntry("ConvBertForMaskedLM", note="YituTech/conv-bert-base"),
    "T5Small": SuiteEntry("T5ForConditionalGeneration", note="t5-small"),
    "meta-llama/Llama-3.2-1B": SuiteEntry(
        "LlamaForCausalLM",
        base=dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                  intermediate_size=8192, vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0,
                  tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128001)),
    "google/gemma-2-2b": SuiteEntry(
        "Gemma2ForCausalLM",
        base=dict(hidden_size=2304, num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                  intermediate_size=9216, vocab_size=256000)),
    "google/gemma-3-4b-it": SuiteEntry(
        "Gemma3ForCausalLM",
        base=dict(hidden_size=2560, num_hidden_layers=34, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                  intermediate_size=10240, vocab_size=262208),
        note="text model only (Gemma3ForCausalLM), as AutoModelForCausalLM loads it"),
    "openai/whisper-tiny": SuiteEntry(
        "WhisperForConditionalGeneration", tiny=dict(max_source_positions=64, num_mel_bins=80),
        base=dict(d_model=384, encoder_layers=4, decoder_layers=4, encoder_attention_heads=6,
                  decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536, vocab_size=51865,
                  num_mel_bins=80),
        note="input_features of 2 * max_source_positions frames"),
    "Qwen/Qwen3-0.6B": SuiteEntry(
        "Qwen3ForCausalLM",
        base=dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                  intermediate_size=3072, vocab_size=151936, tie_word_embeddings=True)),
    "mistralai/Mistral-7B-Instruct-v0.3": SuiteEntry(
        "MistralForCausalLM",
        base=dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                  intermediate_size=14336, vocab_size=32768, sliding_window=None)),
    "openai/gpt-oss-20b": SuiteEntry(
        "GptOssForCausalLM",
        base=dict(hidden_size=2880, num_hidden_layers=24, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
                  intermediate_size=2880, num_local_experts=32, num_experts_per_tok=4, vocab_size=201088),
        note="base: 21B parameters, training in fp32 does not fit one GPU"),
}


def entry(name: str) -> SuiteEntry:
    return ALIASES.get(name) or SuiteEntry(name)


def task_of(model_cls: str) -> str:
    """The zoo task of a transformers head class, from its name."""
    for suffix, task in (("ForMaskedLM", "masked-lm"), ("ForCausalLM", "causal-lm"), ("LMHeadModel", "causal-lm"),
                         ("ForConditionalGeneration", "seq2seq-lm"), ("ForQuestionAnswering", "qa"),
                         ("ForSequenceClassification", "seq-cls")):
        if model_cls.endswith(suffix):
            return task
    raise ValueError(f"{model_cls}: no task for this head")


def build_suite(name: str, preset: str, mode: str, device: str) -> Built:
    import transformers

    from .generic import tiny_config
    e = entry(name)
    cls = getattr(transformers, e.model_cls)
    model_type = cls.config_class.model_type
    if preset == "tiny":
        cfg = tiny_config(model_type)
        for k, v in e.tiny.items():
            setattr(cfg, k, v)
    else:
        cfg = cls.config_class(**e.base)
    task = task_of(e.model_cls)
    if task == "seq-cls" and getattr(cfg, "pad_token_id", None) is None:
        cfg.pad_token_id = 0
    model = instantiate(cls, cfg, device)
    if model_type == "whisper":
        return _whisper(model, cfg, preset, mode, device)
    return finish(model, cfg, task, preset, mode, device, no_cache_inputs(model, task))


def _whisper(model: torch.nn.Module, cfg: Any, preset: str, mode: str, device: str) -> Built:
    """Whisper's encoder takes log-mel features, not token ids."""
    batch, seq = SHAPES[preset]
    gen = torch.Generator().manual_seed(0)
    frames = 2 * cfg.max_source_positions
    dec = token_ids(cfg, batch, min(seq, cfg.max_target_positions), gen)
    inputs = {"input_features": torch.randn(batch, cfg.num_mel_bins, frames, generator=gen),
              "decoder_input_ids": dec, "use_cache": False}
    if mode == "train":
        inputs["labels"] = dec.clone()
    return ready(model, inputs, mode, device)


def unsupported() -> dict[str, str]:
    """Suite names that cannot be built with the installed transformers, with the reason."""
    import transformers
    exported = set(dir(transformers))  # the lazy module's names: importing no modeling module
    out = {}
    for name, _ in SUITE_LIST:
        cls = entry(name).model_cls
        if cls not in exported:
            out[name] = f"transformers {transformers.__version__} has no {cls}"
    return out


def zoo_name(name: str) -> str:
    """The zoo name of a suite entry: hub-style ``org/model`` becomes ``org--model`` (a folder name)."""
    return name.replace("/", "--")


@lru_cache(maxsize=1)
def suite_registry() -> dict[str, ModelSpec]:
    """Zoo name -> spec for every suite entry the installed transformers can build."""
    missing = unsupported()
    specs = {}
    for name, batch in SUITE_LIST:
        if name in missing:
            continue
        e = entry(name)
        note = f"{e.model_cls} ({task_of(e.model_cls)}); benchmark batch {batch}" + (f"; {e.note}" if e.note else "")
        specs[zoo_name(name)] = ModelSpec(zoo_name(name), partial(build_suite, name), note=note, source="suite")
    return specs
