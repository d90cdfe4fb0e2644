"""The model zoo: HuggingFace models built from their configs (random weights, no hub).

``resolve(name)`` -> ``ModelSpec``; ``spec.build(preset, mode, device)`` -> ``Built``
(a model in train/eval mode on ``device`` and the keyword inputs for one step; in train
mode the inputs include labels so that ``built.loss(model(**inputs))`` is a scalar).
``expand(names)`` expands the groups (``hf-suite``, ``all``) and validates every name.
An unknown name raises ``UsageError`` listing the valid ones.

Name forms ``resolve`` accepts, first match wins:

1. a hand-written spec (``models.specs``): bert, gpt2, t5, llama, roberta, distilbert, bart, opt;
2. an entry of PyTorch's HF dynamo benchmark list (``models.suite``), e.g. ``AlbertForMaskedLM``;
3. any transformers ``model_type`` (``models.generic``), e.g. ``qwen2``, ``mistral``, ``electra``;
4. a local checkpoint directory holding ``config.json`` (``models.local``);
5. ``package.module:factory``, a user's callable (``models.local`` documents its contract).
"""

from __future__ import annotations

import dataclasses

import difflib
import re

from miner.core.errors import UsageError
from .base import PRESETS, Built, Dims, ModelSpec  # noqa: F401  (public API)
from .local import FACTORY_RE, checkpoint_spec, factory_spec, is_checkpoint_dir
from .specs import dims, hand_registry  # noqa: F401  (public API)

REGISTRY: dict[str, ModelSpec] = hand_registry()
GROUPS = ("hf-suite", "all")


def _suite() -> dict[str, ModelSpec]:
    from .suite import suite_registry
    return suite_registry()


def _canonical(name: str) -> str:
    from .suite import zoo_name
    return zoo_name(name) if zoo_name(name) in _suite() else name


def _generic() -> dict[str, ModelSpec]:
    from .generic import generic_registry
    return generic_registry()


def available() -> list[str]:
    """Every name ``resolve`` knows without a path or factory: hand-written, suite, model types."""
    return sorted(set(REGISTRY) | set(_suite()) | set(_generic()))


def hand_written() -> list[str]:
    return sorted(REGISTRY)


def group(name: str) -> list[str]:
    """The members of a group name: ``hf-suite`` (the benchmark list), ``all`` (every generic model_type)."""
    if name == "hf-suite":
        return list(_suite())
    if name == "all":
        return sorted(_generic())
    raise UsageError(f"unknown group {name!r}; groups: {', '.join(GROUPS)}")


def resolve(name: str) -> ModelSpec:
    """The spec of one model name (see the module docstring for the accepted forms).

    ``<name>@<knob>`` is ``<name>``'s model under the label ``<name>@<knob>``: miner compiles it with
    that knob (``miner profile --models t5@sdpa_reduced_math``); the zoo builds the same model."""
    base, at, knob = name.partition("@")
    if at:
        if not knob or not base:
            raise UsageError(f"{name!r}: a knob label is <model>@<knob>, e.g. t5@sdpa_reduced_math")
        spec = resolve(base)
        return dataclasses.replace(spec, name=f"{spec.name}@{knob}")
    name = _canonical(name)
    for registry in (lambda: REGISTRY, _suite, _generic):
        spec = registry().get(name)
        if spec is not None:
            return spec
    if name in GROUPS:
        raise UsageError(f"{name!r} is a group of models; expand it with models.expand([{name!r}])")
    if is_checkpoint_dir(name):
        return checkpoint_spec(name)
    if FACTORY_RE.match(name):
        return factory_spec(name)
    raise UsageError(unknown_message(name))


def expand(names: list[str]) -> list[str]:
    """Expand group names and validate every name (UsageError for an unknown one).

    Returns zoo names (``resolve(n).name``: ``org/model`` suite names become ``org--model``), in
    order, without repeats.
    """
    out: list[str] = []
    for name in names:
        for n in group(name) if name in GROUPS else [name]:
            n = resolve(n).name
            if n not in out:
                out.append(n)
    return out


def unknown_message(name: str) -> str:
    known = available()
    close = difflib.get_close_matches(name, known + list(GROUPS), n=5, cutoff=0.6)
    hint = f"; did you mean: {', '.join(close)}" if close else ""
    return (f"unknown model {name!r}{hint}. Valid names: hand-written {', '.join(hand_written())}; "
            f"groups {', '.join(GROUPS)}; the {len(_suite())} hf-suite entries and {len(_generic())} "
            f"transformers model_types listed by `miner models`; a directory with config.json; "
            f"or package.module:factory")


def slug(name: str) -> str:
    """A file-system-safe form of a model name (checkpoint paths, factories, hub-style suite names)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "model"
