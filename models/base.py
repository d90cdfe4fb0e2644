"""The zoo's records and the helpers every model source shares.

``ModelSpec`` is what ``models.resolve(name)`` returns; ``spec.build(preset, mode, device)``
gives a ``Built``: the model (train or eval mode, on ``device``) and the keyword inputs of one
step. In train mode the inputs carry labels, so ``built.loss(model(**built.inputs))`` is a
scalar that ``backward()`` can start from.

Inputs are made from the config and a *task* (which head the model has):

=============  ===========================================================================
task           inputs (train mode adds the labels)
=============  ===========================================================================
causal-lm      input_ids, attention_mask; labels = input_ids
masked-lm      input_ids, attention_mask; labels = input_ids
seq2seq-lm     input_ids, attention_mask, decoder_input_ids; labels; use_cache=False
seq-cls        input_ids, attention_mask; labels of shape (batch,) in [0, num_labels)
qa             input_ids, attention_mask; start_positions, end_positions of shape (batch,)
base           input_ids, attention_mask; no labels, loss = mean of the first output
image-cls      pixel_values; labels of shape (batch,)
=============  ===========================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from miner.core.errors import UsageError

PRESETS = ("tiny", "base")
MODES = ("train", "infer")
TASKS = ("causal-lm", "masked-lm", "seq2seq-lm", "seq-cls", "qa", "base", "image-cls")

# Batch and sequence length of each preset (the model sizes live with each spec). Read at build
# time, so a process may override them (``miner scan --batch/--seq`` does, in its worker).
SHAPES: dict[str, tuple[int, int]] = {"tiny": (2, 64), "base": (16, 512)}

# The tiny model size every hand-written spec and the generic path shrink to.
TINY = dict(layers=2, hidden=128, heads=4, inter=512, vocab=1000)

SPECIAL_TOKEN_ATTRS = ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "cls_token_id",
                       "mask_token_id", "unk_token_id", "decoder_start_token_id", "forced_bos_token_id",
                       "forced_eos_token_id", "decoder_bos_token_id")


def _loss_of(out: Any) -> Any:
    """The output's ``loss`` (a key of a dict or ModelOutput, or an attribute); None when it has none."""
    return out.get("loss") if isinstance(out, dict) else getattr(out, "loss", None)


def _loss_attr(out: Any) -> torch.Tensor:
    loss = _loss_of(out)
    if loss is None:
        raise ValueError("the model returned no loss: train mode needs labels in the inputs")
    return loss


def first_float(out: Any) -> torch.Tensor | None:
    """The first floating-point tensor of a model's output (a tensor, a dict, a ModelOutput, a tuple)."""
    if torch.is_tensor(out):
        return out if out.is_floating_point() else None
    items = (out.to_tuple() if hasattr(out, "to_tuple") else out.values() if isinstance(out, dict)
             else out if isinstance(out, (list, tuple)) else ())
    return next((t for t in map(first_float, items) if t is not None), None)


def _loss_mean(out: Any) -> torch.Tensor:
    """Loss of a model without a head: the mean of its first floating-point output."""
    first = first_float(out)
    if first is None:
        raise ValueError("the model returned no loss and no floating-point tensor to train on")
    return first.float().mean()


def loss_or_mean(out: Any) -> torch.Tensor:
    """``out.loss`` where the output has one (a model given labels), else :func:`_loss_mean`."""
    loss = _loss_of(out)
    return loss if torch.is_tensor(loss) else _loss_mean(out)


@dataclass(frozen=True)
class Dims:
    """The sizes a preset gives a model: batch and sequence length, and the width of each layer."""

    batch: int
    seq: int
    hidden: int
    heads: int
    inter: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass
class Built:
    """A model ready for one step: ``loss(model(**inputs))`` (train mode) or ``model(**inputs)``."""

    model: torch.nn.Module
    inputs: dict[str, Any]
    loss: Callable[[Any], torch.Tensor] = _loss_attr


@dataclass(frozen=True)
class ModelSpec:
    """A buildable zoo entry.

    ``source`` says where it comes from: ``hand`` (a hand-written spec in ``models.specs``),
    ``generic`` (any transformers model_type, ``models.generic``), ``suite`` (an entry of the
    HF dynamo benchmark list, ``models.suite``), ``checkpoint`` (a local directory) or ``factory``
    (a user's ``package.module:factory``).
    """

    name: str
    build_fn: Callable[[str, str, str], Built]
    presets: tuple[str, ...] = PRESETS
    note: str = ""
    source: str = "hand"

    def build(self, preset: str = "tiny", mode: str = "train", device: str = "cpu") -> Built:
        if preset not in self.presets:
            raise UsageError(f"model {self.name!r} has no preset {preset!r}; presets: {', '.join(self.presets)}")
        if mode not in MODES:
            raise UsageError(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")
        return self.build_fn(preset, mode, device)


# --------------------------------------------------------------------------- config helpers

def fix_special_tokens(cfg: Any, vocab: int) -> None:
    """Move special token ids that fall outside a shrunk vocabulary back inside it."""
    for cfgs in _all_configs(cfg):
        for attr in SPECIAL_TOKEN_ATTRS:
            v = getattr(cfgs, attr, None)
            if isinstance(v, int) and v >= vocab:
                setattr(cfgs, attr, vocab - 1 - (SPECIAL_TOKEN_ATTRS.index(attr) % 4))
            elif isinstance(v, (list, tuple)) and any(isinstance(i, int) and i >= vocab for i in v):
                setattr(cfgs, attr, [i if i < vocab else vocab - 1 for i in v])


def _all_configs(cfg: Any) -> list[Any]:
    """The config and its nested sub-configs (text_config, encoder, decoder, ...)."""
    from transformers import PretrainedConfig
    out = [cfg]
    for v in vars(cfg).values():
        if isinstance(v, PretrainedConfig):
            out.extend(_all_configs(v))
    return out


def special_ids(cfg: Any) -> set[int]:
    ids: set[int] = set()
    for attr in SPECIAL_TOKEN_ATTRS:
        v = getattr(cfg, attr, None)
        if isinstance(v, int):
            ids.add(v)
        elif isinstance(v, (list, tuple)):
            ids.update(i for i in v if isinstance(i, int))
    return ids


def text_vocab(cfg: Any) -> int:
    v = getattr(cfg, "vocab_size", None)
    if v is None and hasattr(cfg, "get_text_config"):
        v = getattr(cfg.get_text_config(), "vocab_size", None)
    if not isinstance(v, int):
        raise ValueError(f"{type(cfg).__name__} has no vocab_size")
    return v


# --------------------------------------------------------------------------- inputs

def token_ids(cfg: Any, batch: int, seq: int, gen: torch.Generator) -> torch.Tensor:
    """Random token ids that avoid the special tokens (a pad token would change the masks)."""
    vocab = text_vocab(cfg)
    specials = special_ids(cfg)
    allowed = torch.tensor([i for i in range(vocab) if i not in specials] or list(range(vocab)))
    return allowed[torch.randint(0, len(allowed), (batch, seq), generator=gen)]


def make_inputs(cfg: Any, task: str, mode: str, batch: int, seq: int) -> dict[str, Any]:
    """The keyword inputs of one step of a model with head ``task`` (see the module docstring)."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; tasks: {', '.join(TASKS)}")
    gen = torch.Generator().manual_seed(0)
    train = mode == "train"
    if task == "image-cls":
        size = getattr(cfg, "image_size", 64)  # conv nets without image_size take any size
        size = size[0] if isinstance(size, (list, tuple)) else size
        channels = getattr(cfg, "num_channels", 3)
        inputs: dict[str, Any] = {"pixel_values": torch.randn(batch, channels, size, size, generator=gen)}
        if train:
            inputs["labels"] = torch.randint(0, cfg.num_labels, (batch,), generator=gen)
        return inputs
    ids = token_ids(cfg, batch, seq, gen)
    eos = getattr(cfg, "eos_token_id", None)
    if task == "seq-cls" and isinstance(eos, int) and cfg.is_encoder_decoder:
        ids[:, -1] = eos  # BART-style heads pool at the (single) eos token of each row
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if task == "seq2seq-lm" or (task in ("seq-cls", "qa") and getattr(cfg, "is_encoder_decoder", False)):
        inputs["use_cache"] = False
    if task == "seq2seq-lm":
        dec = token_ids(cfg, batch, seq, gen)
        inputs["decoder_input_ids"] = dec
        if train:
            inputs["labels"] = dec.clone()
    elif task in ("causal-lm", "masked-lm") and train:
        inputs["labels"] = ids.clone()
    elif task == "seq-cls" and train:
        inputs["labels"] = torch.randint(0, cfg.num_labels, (batch,), generator=gen)
    elif task == "qa" and train:
        inputs["start_positions"] = torch.randint(0, seq, (batch,), generator=gen)
        inputs["end_positions"] = torch.randint(0, seq, (batch,), generator=gen)
    return inputs


def finish(model: torch.nn.Module, cfg: Any, task: str, preset: str, mode: str, device: str,
           extra_inputs: dict[str, Any] | None = None, seq: int | None = None) -> Built:
    """Put ``model`` in ``mode`` on ``device`` and make its inputs for ``preset``."""
    batch, default_seq = SHAPES[preset]
    inputs = make_inputs(cfg, task, mode, batch, seq or default_seq)
    inputs.update(extra_inputs or {})
    return ready(model, inputs, mode, device, _loss_mean if task == "base" else _loss_attr)


def ready(model: torch.nn.Module, inputs: dict[str, Any], mode: str, device: str,
          loss: Callable[[Any], torch.Tensor] = _loss_attr) -> Built:
    """``model`` in train/eval mode per ``mode``, model and tensor inputs on ``device``."""
    model.train(mode == "train")
    model.to(device)
    return Built(model, {k: v.to(device) if torch.is_tensor(v) else v for k, v in inputs.items()}, loss)


def instantiate(model_cls: type, cfg: Any, device: str) -> torch.nn.Module:
    """Random-weight model of ``model_cls`` from ``cfg``; seeded so that builds repeat."""
    torch.manual_seed(0)
    with torch.device(device):
        model = model_cls(cfg)
    if hasattr(model, "loss_type") and model.loss_type is None and task_is_causal(model_cls):
        # GPT2LMHeadModel & co. match no LOSS_MAPPING key: loss_type None -> a warning_once graph break.
        model.loss_type = "ForCausalLM"
    return model


def task_is_causal(model_cls: type) -> bool:
    n = model_cls.__name__
    return n.endswith("ForCausalLM") or n.endswith("LMHeadModel")


def no_cache_inputs(model: torch.nn.Module, task: str) -> dict[str, Any]:
    """``use_cache=False`` for a causal LM whose forward takes it: a training step needs no KV cache,
    and hybrid linear-attention caches fail without a prefill (bamba, jamba, qwen3_next...)."""
    import inspect
    if task != "causal-lm":
        return {}
    return {"use_cache": False} if "use_cache" in inspect.signature(model.forward).parameters else {}


def config_for(model_cls: type, cfg: Any) -> Any:
    """The config ``model_cls`` takes: a composite config's text config for a text-only head class."""
    want = getattr(model_cls, "config_class", None)
    if want is not None and not isinstance(cfg, want) and hasattr(cfg, "get_text_config"):
        text = cfg.get_text_config()
        if isinstance(text, want):
            return text
    return cfg
