"""Hand-written zoo specs: the models whose sizes we pin by hand (they override the generic path).

Each ``HandSpec`` names a transformers config class and model class, the config keywords of the
``tiny`` preset (2 layers, hidden 128, 4 heads, intermediate 512, vocab 1000; batch 2, seq 64)
and of the ``base`` preset (the published size; batch 16, seq 512; llama: a ~1B config in the
shape of Llama-3.2-1B).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import Any

from .base import SHAPES, TINY, Built, Dims, ModelSpec, finish, fix_special_tokens, instantiate

L, H, A, I, V = TINY["layers"], TINY["hidden"], TINY["heads"], TINY["inter"], TINY["vocab"]


@dataclass(frozen=True)
class HandSpec:
    name: str
    config_cls: str  # a class name in ``transformers``
    model_cls: str
    task: str  # see models.base.TASKS
    tiny: dict[str, Any]
    base: dict[str, Any] = field(default_factory=dict)  # {} = the config class's defaults
    note: str = ""


def config(spec: HandSpec, preset: str) -> Any:
    """The transformers config of ``spec`` at ``preset`` (no weights)."""
    import transformers
    return getattr(transformers, spec.config_cls)(**(spec.tiny if preset == "tiny" else spec.base))


def build_hand(spec: HandSpec, preset: str, mode: str, device: str) -> Built:
    import transformers
    cfg = config(spec, preset)
    fix_special_tokens(cfg, cfg.vocab_size)
    model = instantiate(getattr(transformers, spec.model_cls), cfg, device)
    return finish(model, cfg, spec.task, preset, mode, device)


HAND_SPECS: tuple[HandSpec, ...] = (
    HandSpec("bert", "BertConfig", "BertForMaskedLM", "masked-lm",
             dict(num_hidden_layers=L, hidden_size=H, num_attention_heads=A, intermediate_size=I, vocab_size=V),
             note="bert-base-uncased"),
    HandSpec("gpt2", "GPT2Config", "GPT2LMHeadModel", "causal-lm",
             dict(n_layer=L, n_embd=H, n_head=A, n_inner=I, vocab_size=V, n_positions=512,
                  bos_token_id=V - 1, eos_token_id=V - 1),
             note="gpt2 (124M); loss_type set to ForCausalLM (else a graph break)"),
    HandSpec("t5", "T5Config", "T5ForConditionalGeneration", "seq2seq-lm",
             dict(num_layers=L, num_decoder_layers=L, d_model=H, num_heads=A, d_kv=H // A, d_ff=I, vocab_size=V),
             dict(num_layers=12, num_decoder_layers=12, d_model=768, num_heads=12, d_kv=64, d_ff=3072),
             note="t5-base; use_cache=False (else graph breaks from the encoder-decoder cache)"),
    HandSpec("llama", "LlamaConfig", "LlamaForCausalLM", "causal-lm",
             dict(num_hidden_layers=L, hidden_size=H, num_attention_heads=A, num_key_value_heads=A,
                  intermediate_size=I, vocab_size=V, max_position_embeddings=512),
             dict(num_hidden_layers=16, hidden_size=2048, num_attention_heads=32, num_key_value_heads=8,
                  intermediate_size=8192, vocab_size=32000, max_position_embeddings=2048, rope_theta=500000.0),
             note="~1.1B, the shape of Llama-3.2-1B with a 32000 vocabulary"),
    HandSpec("roberta", "RobertaConfig", "RobertaForMaskedLM", "masked-lm",
             dict(num_hidden_layers=L, hidden_size=H, num_attention_heads=A, intermediate_size=I, vocab_size=V,
                  max_position_embeddings=514, pad_token_id=1, type_vocab_size=1),
             dict(vocab_size=50265, max_position_embeddings=514, pad_token_id=1, type_vocab_size=1),
             note="roberta-base"),
    HandSpec("distilbert", "DistilBertConfig", "DistilBertForMaskedLM", "masked-lm",
             dict(n_layers=L, dim=H, n_heads=A, hidden_dim=I, vocab_size=V),
             note="distilbert-base-uncased"),
    HandSpec("bart", "BartConfig", "BartForConditionalGeneration", "seq2seq-lm",
             dict(encoder_layers=L, decoder_layers=L, d_model=H, encoder_attention_heads=A,
                  decoder_attention_heads=A, encoder_ffn_dim=I, decoder_ffn_dim=I, vocab_size=V,
                  max_position_embeddings=512),
             dict(encoder_layers=6, decoder_layers=6, d_model=768, encoder_attention_heads=12,
                  decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072, vocab_size=50265),
             note="bart-base; use_cache=False"),
    HandSpec("opt", "OPTConfig", "OPTForCausalLM", "causal-lm",
             dict(num_hidden_layers=L, hidden_size=H, num_attention_heads=A, ffn_dim=I, vocab_size=V,
                  word_embed_proj_dim=H, max_position_embeddings=512),
             dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, ffn_dim=3072, vocab_size=50272,
                  word_embed_proj_dim=768, max_position_embeddings=2048),
             note="opt-125m"),
)


def hand_registry() -> dict[str, ModelSpec]:
    return {s.name: ModelSpec(s.name, partial(build_hand, s), note=f"{s.model_cls} ({s.task}); base: {s.note}",
                              source="hand") for s in HAND_SPECS}


# The feed-forward width under its name in each config class (gpt2's n_inner None means 4 x hidden).
_INTER_ATTRS = ("intermediate_size", "n_inner", "d_ff", "hidden_dim", "ffn_dim", "encoder_ffn_dim")


@lru_cache(maxsize=None)
def dims(name: str, preset: str) -> Dims:
    """The sizes of hand-written model ``name`` at ``preset``, read from its config (once per process).

    Raises
    ------
    KeyError
        For a model without a hand-written spec (its sizes are not pinned).
    """
    spec = {s.name: s for s in HAND_SPECS}[name]
    cfg = config(spec, preset)
    inter = next((getattr(cfg, a) for a in _INTER_ATTRS if getattr(cfg, a, None)), 4 * cfg.hidden_size)
    batch, seq = SHAPES[preset]
    return Dims(batch, seq, cfg.hidden_size, cfg.num_attention_heads, inter, cfg.vocab_size)
