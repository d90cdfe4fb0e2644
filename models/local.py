"""Models from outside the zoo: a local checkpoint directory, or a user's ``package.module:factory``.

Checkpoint directory
    Any directory with a ``config.json`` (what ``save_pretrained`` writes). The config is read
    with ``AutoConfig.from_pretrained(path, local_files_only=True)``; the head is chosen like the
    generic path does (``models.generic.pick_head``). With weights in the directory
    (``*.safetensors`` or ``pytorch_model*.bin``) the model is loaded with the real
    ``AutoModelFor*.from_pretrained(path, local_files_only=True)``; without, it gets random
    weights. The model's size is the checkpoint's: the preset only picks batch and sequence length.

Factory ``package.module:factory``
    ``factory(preset: str, mode: str, device: str)``, or ``factory()`` taking no arguments,
    returns either a ``models.Built`` (used as is) or a pair ``(model, inputs)``: an ``nn.Module``
    and the keyword inputs of one step. For a pair, miner puts the model in train/eval mode, moves
    model and tensor inputs to ``device``, and trains on ``out.loss`` where the output has one
    (a HuggingFace model given labels), else on the mean of its first floating-point output (what
    a capture needs: a backward graph through every op of the forward).
"""

from __future__ import annotations

import importlib
import re
from functools import partial
from pathlib import Path
from typing import Any

import torch

from miner.core.errors import UsageError
from .base import Built, ModelSpec, finish, loss_or_mean, ready

FACTORY_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin")


def is_checkpoint_dir(name: str) -> bool:
    return (Path(name) / "config.json").is_file()


def has_weights(path: Path) -> bool:
    return any(next(path.glob(g), None) is not None for g in WEIGHT_GLOBS)


def build_checkpoint(path: str, preset: str, mode: str, device: str) -> Built:
    from transformers import AutoConfig

    from .generic import pick_head
    root = Path(path)
    cfg = AutoConfig.from_pretrained(root, local_files_only=True)
    head = pick_head(cfg.model_type)
    if head is None:
        raise UsageError(f"{path}: no task head with a loss for model_type {cfg.model_type!r}")
    task, auto_cls = head
    if has_weights(root):
        model = auto_cls.from_pretrained(root, local_files_only=True).to(device)
    else:
        torch.manual_seed(0)
        model = auto_cls.from_config(cfg)
    if getattr(model, "loss_type", "") is None and task == "causal-lm":
        model.loss_type = "ForCausalLM"
    return finish(model, model.config, task, preset, mode, device)


def checkpoint_spec(path: str) -> ModelSpec:
    weights = "with weights" if has_weights(Path(path)) else "random weights (no weight files)"
    return ModelSpec(path, partial(build_checkpoint, path), note=f"checkpoint {path}, {weights}",
                     source="checkpoint")


def load_factory(ref: str) -> Any:
    """The callable ``ref`` names, imported as ``python -m`` would from the current directory (the
    user's own module there; appended last to ``sys.path``, so it shadows nothing)."""
    import os
    import sys

    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    module_name, attr = ref.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UsageError(f"{ref}: cannot import {module_name!r} ({e})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise UsageError(f"{ref}: {module_name} has no callable {attr!r}")
    return fn


def call_factory(ref: str, fn: Any, preset: str, mode: str, device: str) -> Any:
    """``fn(preset, mode, device)``, or ``fn()`` for a factory that takes no arguments."""
    import inspect

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable: no signature to read
        return fn(preset, mode, device)
    for args in ((preset, mode, device), ()):
        try:
            sig.bind(*args)
        except TypeError:
            continue
        return fn(*args)
    raise UsageError(f"{ref} takes {sig}; a factory takes (preset, mode, device) or no arguments")


def build_factory(ref: str, preset: str, mode: str, device: str) -> Built:
    out = call_factory(ref, load_factory(ref), preset, mode, device)
    if isinstance(out, Built):
        return out
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], torch.nn.Module) and isinstance(out[1], dict):
        return ready(out[0], out[1], mode, device, loss=loss_or_mean)
    raise UsageError(f"{ref} returned {type(out).__name__}; expected a models.Built or (nn.Module, inputs dict)")


def factory_spec(ref: str) -> ModelSpec:
    load_factory(ref)  # fail now, not in the scan's subprocess
    return ModelSpec(ref, partial(build_factory, ref), note=f"user factory {ref}", source="factory")
