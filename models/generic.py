"""The generic path: any transformers ``model_type``, built offline with a derived tiny preset.

``build_generic(model_type, preset, mode, device)``:

1. config: ``AutoConfig.for_model(model_type)`` (the class defaults, no hub);
2. ``tiny`` preset: ``shrink_dict(config.to_dict())`` rewrites every size attribute it recognises by name
   (layers, hidden size, heads, kv heads, head dims, intermediate sizes, vocab, positions,
   experts, per-layer lists, nested sub-configs) to the tiny size, consistently
   (hidden = heads * head_dim; kv heads keep MHA / GQA / MQA), and the config is rebuilt from
   those keywords so that its ``__init__`` recomputes derived fields (``layer_types`` ...);
   ``base`` preset: the config class's defaults, which for most types is the published size;
3. head: the first task whose auto mapping has this ``model_type`` (``HEAD_ORDER``: seq2seq LM,
   masked LM, causal LM, sequence classification, question answering, image classification);
4. inputs: ``models.base.make_inputs`` for that task.

A model_type with no such head is not supported; ``UNSUPPORTED`` names the model types that have
one but fail anyway (measured with ``probe``), with the reason. Hand-written specs override all.
"""

from __future__ import annotations

import re
from functools import lru_cache, partial
from typing import Any, Callable

from .base import (TINY, Built, ModelSpec, config_for, finish, fix_special_tokens, instantiate,
                         no_cache_inputs)

# (task, auto mapping name in transformers.models.auto.modeling_auto, Auto class name), in preference order.
HEAD_ORDER: tuple[tuple[str, str, str], ...] = (
    ("seq2seq-lm", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "AutoModelForSeq2SeqLM"),
    ("masked-lm", "MODEL_FOR_MASKED_LM_MAPPING_NAMES", "AutoModelForMaskedLM"),
    ("causal-lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "AutoModelForCausalLM"),
    ("seq-cls", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "AutoModelForSequenceClassification"),
    ("qa", "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES", "AutoModelForQuestionAnswering"),
    ("image-cls", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "AutoModelForImageClassification"),
)

LAYERS, HIDDEN, HEADS, HEAD_DIM, INTER, VOCAB = (TINY["layers"], TINY["hidden"], TINY["heads"],
                                                 TINY["hidden"] // TINY["heads"], TINY["inter"], TINY["vocab"])
MAX_POSITIONS = 512
IMAGE_SIZE = 64

# Config attribute names by role; a name not listed keeps the class default.
LAYER_KEYS = {"num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers", "decoder_layers",
              "num_decoder_layers", "num_encoder_layers", "num_text_layers", "num_vision_layers"}
HIDDEN_KEYS = {"hidden_size", "d_model", "n_embd", "n_embed", "dim", "embed_dim", "model_dim",
               "word_embed_proj_dim", "d_embed"}
HEAD_KEYS = {"num_attention_heads", "n_head", "n_heads", "encoder_attention_heads", "decoder_attention_heads",
             "num_heads"}
KV_KEYS = {"num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num", "n_head_kv"}
INTER_KEYS = {"intermediate_size", "d_ff", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "n_inner", "d_inner",
              "ffn_hidden_size", "moe_intermediate_size", "shared_expert_intermediate_size",
              "expert_intermediate_size", "dense_intermediate_size", "mlp_dim"}
VOCAB_KEYS = {"vocab_size", "entity_vocab_size"}
POSITION_KEYS = {"max_position_embeddings", "n_positions", "n_ctx", "max_target_positions", "max_source_positions"}
EXPERT_KEYS = {"num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"}
TOPK_KEYS = {"num_experts_per_tok", "moe_topk", "num_selected_experts", "top_k", "moe_k"}
GROUP_KEYS = {"n_group", "topk_group"}
EXPERTS, TOPK = 4, 2

# Per-model_type tiny keywords that the name rules cannot derive.
TINY_FIXES: dict[str, dict[str, Any]] = {
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},  # 1 pair = 2 layers
    "reformer": {"axial_pos_embds_dim": [64, 64], "axial_pos_shape": [8, 8]},  # sums to hidden, product = seq
    "mamba2": {"num_heads": 8},  # hidden * expand == num_heads * head_dim
    "layoutlmv3": {"coordinate_size": 16, "shape_size": 32},  # 4 * coordinate + 2 * shape == hidden
}

# Model types that have a head with a loss but do not build or take one eager training step on the
# generic path (measured with transformers 5.24 by `python -m models.generic`), with the error.
UNSUPPORTED: dict[str, str] = {
    'bailing_hybrid': "RuntimeError: shape '[-1, 8, 0]' is invalid for input of size 512",
    'bit': 'ValueError: num_channels (8) must be divisible by num_groups (32)',
    'blt': 'TimeoutError: no eager step within 60 s',
    'canine': 'ValueError: CanineConfig has no vocab_size',
    'cohere_compass_text': "KeyError: 'full_attention'",
    'dbrx': "AttributeError: 'DbrxAttentionConfig' object has no attribute 'rope_theta'",
    'dinat': 'ImportError: DinatForImageClassification requires the natten library but it was not found in your environment.',
    'donut-swin': 'IndexError: list index out of range',
    'dots1': 'TypeError: empty() takes 1 positional argument but 3 were given',
    'dots3_note': "StrictDataclassClassValidationError: Class validation error for validator 'validate_architecture': ValueError: SWA head_dim must equal qk_nope_head_di",
    'esm': "TypeError: empty(): argument 'size' (position 1) must be tuple of ints, but found element of type NoneType at pos 0",
    'gemma3n': 'ImportError: TimmWrapperModel requires the timm library but it was not found in your environment.',
    'gemma4_assistant': "StrictDataclassClassValidationError: Class validation error for validator 'validate_architecture': ValueError: hidden_size_per_layer_input must be 0, ",
    'gemma4_unified_assistant': 'ValueError: inputs_embeds and shared_kv_states cannot be None.',
    'git': 'ValueError: Expected input batch_size (92) to match target batch_size (126).',
    'granitemoehybrid': 'ValueError: `get_seq_length` can only be called on Attention layers, and the current Cache seem to only contain LinearAttention layers.',
    'hgnet_v2': 'RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x2048 and 256x2)',
    'imagegpt': 'ValueError: You have to specify either input_ids or inputs_embeds',
    'kimi_linear': 'RuntimeError: selected index k out of range',
    'layoutlmv2': 'ImportError: LayoutLMv2Model requires the detectron2 library but it was not found in your environment.',
    'lfm2_moe': "TypeError: 'NoneType' object is not subscriptable",
    'lilt': 'RuntimeError: mat1 and mat2 shapes cannot be multiplied (128x126 and 128x32)',
    'lxmert': 'ValueError: `visual_feats` cannot be `None`',
    'mistral4': 'RuntimeError: The size of tensor a (16) must match the size of tensor b (8) at non-singleton dimension 3',
    'musicgen': "ValueError: Multiple valid text configs were found in the model config: ['text_encoder', 'decoder']. In this case, using `get_text_config()` would be ",
    'musicgen_melody': "ValueError: Multiple valid text configs were found in the model config: ['text_encoder', 'decoder']. In this case, using `get_text_config()` would be ",
    'nemo_speechlm': "StrictDataclassClassValidationError: Class validation error for validator 'validate_architecture': ValueError: `head_config.audio_hidden_size` (512) m",
    'perceiver': 'ValueError: Expected input batch_size (1024) to match target batch_size (128).',
    'pp_lcnet': "KeyError: 'loss'",
    'pvt': 'ValueError: The hidden size (128) is not a multiple of the number of attention heads (5)',
    'pvt_v2': 'ValueError: The hidden size (128) is not a multiple of the number of attention heads (5)',
    'qwen4_exp': "TypeError: unsupported operand type(s) for //: 'NoneType' and 'NoneType'",
    'qwen4_exp_text': "TypeError: unsupported operand type(s) for //: 'NoneType' and 'NoneType'",
    'shieldgemma2': 'ValueError: You must specify exactly one of input_ids or inputs_embeds',
    'siglip2': 'RuntimeError: mat1 and mat2 shapes cannot be multiplied (384x64 and 768x128)',
    'swin': 'IndexError: list index out of range',
    'swinv2': 'IndexError: list index out of range',
    'textnet': 'RuntimeError: Given groups=1, weight of size [64, 32, 3, 3], expected input[2, 64, 320, 320] to have 32 channels, but got 64 channels instead',
    'timm_wrapper': 'ImportError: TimmWrapperForImageClassification requires the timm library but it was not found in your environment.',
    'voxtral_realtime': 'ValueError: You must specify exactly one of input_features or encoder_inputs_embeds',
    'xmod': 'ValueError: Input language unknown. Please call `XmodPreTrainedModel.set_default_language()`',
    'zamba': "ValueError: There is an issue with your definition of `tie_weights_keys` for ^layers.1.shared_transf:^layers.(?!1\\.)\\d+.shared_transf. We found ['laye",
}


@lru_cache(maxsize=None)
def _mapping(name: str) -> dict[str, str]:
    from transformers.models.auto import modeling_auto
    return dict(getattr(modeling_auto, name, {}))


def head_class_name(model_type: str) -> tuple[str, str] | None:
    """(task, model class name) of the first head in ``HEAD_ORDER`` that ``model_type`` has."""
    for task, mapping, _ in HEAD_ORDER:
        cls = _mapping(mapping).get(model_type)
        if isinstance(cls, (list, tuple)):
            cls = cls[0]
        if cls:
            return task, cls
    return None


def pick_head(model_type: str) -> tuple[str, Any] | None:
    """(task, Auto class) for ``model_type`` (used by checkpoint directories), or None."""
    import transformers
    for task, mapping, auto in HEAD_ORDER:
        if model_type in _mapping(mapping):
            return task, getattr(transformers, auto)
    return None


# --------------------------------------------------------------------------- shrinking

def _kv_heads(kv: int, heads: int) -> int:
    """Keep the attention kind: MHA stays MHA, MQA stays MQA, GQA becomes 2 groups of 2."""
    if kv >= heads:
        return HEADS
    return 1 if kv == 1 else HEADS // 2


KV_HEADS = object()  # in CAPS: key/value heads follow the (already capped) attention heads (``_kv_heads``)

# (which keys, the largest value the tiny preset keeps): the first row whose keys match and whose cap
# the value exceeds decides
CAPS: tuple[tuple[Callable[[str], bool], Any], ...] = (
    (lambda k: k in LAYER_KEYS, LAYERS),
    (lambda k: k in HIDDEN_KEYS, HIDDEN),
    (lambda k: k in HEAD_KEYS, HEADS),
    (lambda k: k in KV_KEYS, KV_HEADS),
    (lambda k: k.endswith("head_dim") or k in {"d_kv", "d_head", "attention_head_size", "kv_channels"}, HEAD_DIM),
    (lambda k: k == "rotary_dim", HEAD_DIM // 2),
    (lambda k: k.endswith("lora_rank"), 64),
    (lambda k: k in INTER_KEYS, INTER),
    (lambda k: k in VOCAB_KEYS, VOCAB),
    (lambda k: k in POSITION_KEYS, MAX_POSITIONS),
    (lambda k: k in EXPERT_KEYS, EXPERTS),
    (lambda k: k in TOPK_KEYS, TOPK),
    (lambda k: k in GROUP_KEYS, 1),
    (lambda k: k == "image_size", IMAGE_SIZE),
    (lambda k: k == "embedding_size", HIDDEN),
    (lambda k: k == "num_kv_shared_layers", 0),
)


def shrink_dict(d: dict[str, Any]) -> dict[str, Any]:
    """The tiny-preset keywords of one config dict (only the keys that change; sub-configs in full)."""
    out: dict[str, Any] = {}
    layers = next((d[k] for k in LAYER_KEYS if isinstance(d.get(k), int)), None)
    heads = next((d[k] for k in HEAD_KEYS if isinstance(d.get(k), int)), None)
    has_experts = any(isinstance(d.get(k), int) and d[k] > 1 for k in EXPERT_KEYS)
    for key, v in d.items():
        if isinstance(v, dict) and "model_type" in v:
            out[key] = {**v, **shrink_dict(v)}
        elif isinstance(v, dict) and v and all(str(k).isdigit() for k in v) and layers and layers > LAYERS:
            out[key] = {k: x for k, x in v.items() if int(k) < LAYERS}  # per-layer settings by layer index
        elif v is None and (key == "head_dim" or key in KV_KEYS) and heads:
            out[key] = HEAD_DIM if key == "head_dim" else HEADS
        elif v is None and key in TOPK_KEYS and has_experts:
            out[key] = TOPK
        elif isinstance(v, bool) or not isinstance(v, (int, list)):
            continue
        elif isinstance(v, list):
            if layers and len(v) == layers > LAYERS and key not in ("hidden_sizes", "depths"):
                out[key] = per_layer(v)  # layer_types, attention_window, ...
        else:
            for match, cap in CAPS:  # the first row that applies decides, as an elif chain would
                if cap is KV_HEADS and match(key) and heads:
                    out[key] = _kv_heads(v, heads)
                    break
                if cap is not KV_HEADS and match(key) and v > cap:
                    out[key] = cap
                    break
    if "qk_head_dim" in d and "qk_nope_head_dim" in d and "qk_rope_head_dim" in d:  # MLA: qk = nope + rope
        out["qk_head_dim"] = (out.get("qk_nope_head_dim", d["qk_nope_head_dim"])
                              + out.get("qk_rope_head_dim", d["qk_rope_head_dim"]))
    for key in ("depths", "hidden_sizes"):  # CNN / hierarchical vision stages
        v = d.get(key)
        if isinstance(v, list) and v and all(isinstance(i, int) for i in v):
            out[key] = [1] * len(v) if key == "depths" else [min(i, 32 * 2 ** n) for n, i in enumerate(v)]
    return out


def per_layer(values: list[Any]) -> list[Any]:
    """A per-layer list cut to ``LAYERS`` entries that keeps each kind of layer where it can
    (a hybrid model keeps one linear-attention and one full-attention layer, gemma3 one sliding
    and one global)."""
    firsts = [i for i, v in enumerate(values) if values.index(v) == i][:LAYERS]
    rest = [i for i in range(len(values)) if i not in firsts]
    return [values[i] for i in sorted(firsts + rest[:LAYERS - len(firsts)])]


def tiny_config(model_type: str) -> Any:
    from transformers import AutoConfig
    default = AutoConfig.for_model(model_type)
    overrides = {**shrink_dict(default.to_dict()), **TINY_FIXES.get(model_type, {})}
    cfg = AutoConfig.for_model(model_type, **overrides)
    for sub in [cfg, *(v for v in vars(cfg).values() if hasattr(v, "to_dict") and hasattr(v, "model_type"))]:
        if isinstance(getattr(sub, "vocab_size", None), int):
            fix_special_tokens(sub, sub.vocab_size)
    return cfg


def build_generic(model_type: str, preset: str, mode: str, device: str) -> Built:
    import transformers
    from transformers import AutoConfig
    head = head_class_name(model_type)
    if head is None:
        raise ValueError(f"{model_type}: no task head with a loss")
    task, cls_name = head
    cls = getattr(transformers, cls_name)
    cfg = config_for(cls, tiny_config(model_type) if preset == "tiny" else AutoConfig.for_model(model_type))
    if task == "seq-cls" and getattr(cfg, "pad_token_id", None) is None:
        cfg.pad_token_id = 0  # sequence classification of decoder models finds the last non-pad token
    model = instantiate(cls, cfg, device)
    return finish(model, cfg, task, preset, mode, device, no_cache_inputs(model, task))


def supported_model_types() -> list[str]:
    """Every model_type with a head in ``HEAD_ORDER`` whose class exists, minus ``UNSUPPORTED``."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    exported = set(dir(transformers))  # the lazy module's names: no modeling module gets imported
    out = []
    for mt in CONFIG_MAPPING_NAMES:
        head = head_class_name(mt)
        if head and mt not in UNSUPPORTED and head[1] in exported:
            out.append(mt)
    return sorted(out)


@lru_cache(maxsize=1)
def generic_registry() -> dict[str, ModelSpec]:
    specs = {}
    for mt in supported_model_types():
        task, cls = head_class_name(mt)
        specs[mt] = ModelSpec(mt, partial(build_generic, mt), note=f"{cls} ({task})", source="generic")
    return specs


def probe(model_type: str, mode: str = "train") -> str | None:
    """Build ``model_type`` tiny and run one eager step; None if it works, else the error in one line."""
    try:
        built = build_generic(model_type, "tiny", mode, "cpu")
        out = built.model(**built.inputs)
        if mode == "train":
            built.loss(out).backward()
    except Exception as e:  # noqa: BLE001 - the point is to record any failure
        return re.sub(r"\s+", " ", f"{type(e).__name__}: {e}")[:300]
    return None


def probe_all(model_types: list[str], mode: str = "train", seconds: int = 60) -> dict[str, str]:
    """``probe`` every model type (each under an alarm of ``seconds``); the failures with their errors."""
    import signal

    def _timeout(*_):
        raise TimeoutError(f"no eager step within {seconds} s")

    failures: dict[str, str] = {}
    old = signal.signal(signal.SIGALRM, _timeout)
    try:
        for mt in model_types:
            signal.alarm(seconds)
            try:
                error = probe(mt, mode)
            finally:
                signal.alarm(0)
            if error:
                failures[mt] = error
            print(f"{mt}: {error or 'ok'}", flush=True)
    finally:
        signal.signal(signal.SIGALRM, old)
    return failures


if __name__ == "__main__":  # python -m models.generic [model_type ...]: re-measure UNSUPPORTED
    import sys
    import transformers
    transformers.logging.set_verbosity_error()
    UNSUPPORTED.clear()
    types = sys.argv[1:] or supported_model_types()
    print("UNSUPPORTED =", probe_all(types))
