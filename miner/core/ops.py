"""Op categories, derived from torch's own op tags and schemas.

``categorize(target)`` is the single source of truth for what a node *is* to miner.
The rules (checked in this order) come from each ``OpOverload``'s schema and tags, so a
new aten op is categorized without touching this file; the small tables below only name
the exceptions that tags cannot tell (random ops, matmul-like ops).
"""

from __future__ import annotations

import importlib
import operator
from functools import lru_cache
from typing import Any

import torch

CATEGORIES = ("pointwise", "reduction", "view", "matmul", "mutation", "random", "other", "input", "output")

# Ops whose tags say nothing about randomness: any op whose schema takes a Generator, plus these.
RANDOM_NAMES = {"inductor_random", "inductor_randint", "inductor_seeds", "inductor_lookup_seed",
                 "native_dropout", "bernoulli", "rand", "randn", "rand_like", "randn_like", "randint",
                 "randperm", "normal", "uniform", "multinomial", "philox_rand"}
# Matrix products and the fused attention kernels that contain them.
_MATMUL_NAMES = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "convolution", "_convolution",
                 "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
                 "scaled_dot_product_attention", "_int_mm", "_scaled_mm", "addbmm", "einsum"}


def resolve_target(name: str):
    """The op object for a target string like ``"aten.exp.default"`` (None if unknown)."""
    if name.startswith("operator."):
        return getattr(operator, name.split(".", 1)[1], None)
    parts = name.split(".")
    if len(parts) < 2:
        return None
    if parts[0] == "prims":
        importlib.import_module("torch._inductor.inductor_prims")  # registers prims.inductor_random & co.
    try:
        packet = getattr(getattr(torch.ops, parts[0]), parts[1])
        return getattr(packet, parts[2] if len(parts) > 2 else "default")
    except (AttributeError, RuntimeError):
        return None


# An OpOverload's name and category depend on the op alone: read once per op (the rules at compile time ask
# for them for every node of every match; t5's backward graph: ~2 million calls per compile).
_OP_NAMES: dict[Any, str] = {}
_OP_CATEGORIES: dict[Any, str] = {}


def target_name(target) -> str:
    """Stable string for an FX call_function target."""
    if isinstance(target, torch._ops.OpOverload):
        name = _OP_NAMES.get(target)
        if name is None:
            name = _OP_NAMES[target] = f"{target.namespace}.{target._schema.name.split('::')[-1]}.{target._overloadname}"
        return name
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order.{target.name()}"
    module = getattr(target, "__module__", None) or ""
    if module in ("_operator", "operator"):
        return f"operator.{target.__name__}"
    return f"{module}.{getattr(target, '__name__', repr(target))}"


@lru_cache(maxsize=None)
def categorize_name(name: str) -> str:
    return categorize(resolve_target(name))


def categorize(target) -> str:
    """Category of an FX call_function target: one of ``CATEGORIES``.

    Order matters: a mutating op is "mutation" even if tagged pointwise (``add_``);
    randomness beats pointwise (``inductor_random`` is not pure); views come before
    pointwise because ``alias`` is both.
    """
    if not isinstance(target, torch._ops.OpOverload):
        return "other"
    category = _OP_CATEGORIES.get(target)
    if category is None:
        category = _OP_CATEGORIES[target] = _categorize(target)
    return category


def _categorize(target: torch._ops.OpOverload) -> str:
    """:func:`categorize` of an op, uncached."""
    schema = target._schema
    base = schema.name.split("::")[-1]
    if base in RANDOM_NAMES or any(a.type.kind() == "OptionalType" and "Generator" in str(a.type)
                                    for a in schema.arguments) or torch.Tag.nondeterministic_seeded in target.tags:
        return "random"
    if schema.is_mutable:
        return "mutation"
    if target.is_view:
        return "view"
    if base in _MATMUL_NAMES:
        return "matmul"
    if torch.Tag.pointwise in target.tags:
        return "pointwise"
    if torch.Tag.reduction in target.tags:
        return "reduction"
    return "other"


@lru_cache(maxsize=None)
def schema_arguments(target: str) -> tuple | None:
    """The schema arguments of op ``target`` (``torch._C.Argument`` objects); None without a schema."""
    schema = getattr(resolve_target(target), "_schema", None)
    return None if schema is None else tuple(schema.arguments)


def bind(target: str, args: tuple | list, kwargs: dict) -> dict[str, Any]:
    """The arguments of one call of ``target`` by schema name, defaults filled in.

    Parameters
    ----------
    target : str
        The op, as in ``NodeRecord.target`` (``"aten.sum.dim_IntList"``).
    args, kwargs
        The call's positional and keyword arguments, in any encoding (JSON values or objects).

    Returns
    -------
    dict
        ``{argument name: value}``. A required argument the call does not pass is absent (see
        :func:`missing`); for an op without a schema this is ``dict(kwargs)``.
    """
    schema = schema_arguments(target)
    if schema is None:
        return dict(kwargs)
    out = {a.name: a.default_value for a in schema if a.has_default_value()}
    positional = [a.name for a in schema if not a.kwarg_only]
    out.update(zip(positional, args))
    out.update(kwargs)
    return out


def missing(target: str, bound: dict) -> list[str]:
    """The required arguments of ``target`` that ``bound`` (from :func:`bind`) lacks."""
    return [a.name for a in schema_arguments(target) or () if a.name not in bound]


# --------------------------------------------------------------------------- op classes

#: Ops that torch's tags call "other", "random" or "view" but that Inductor fuses into its
#: kernels like any pointwise op: short op name -> class. They are part of regions
#: (``miner.mine.regions``) and of mined patterns (``miner.mine.mine``: a node of a class in
#: :data:`MINED_CLASSES` counts as a compute node). The generator's kernel contract covers none
#: of them (``miner.generate`` skips a pattern holding one, with the reason).
FUSABLE_CLASSES: dict[str, str] = {
    "cat": "concat", "slice": "slice", "slice_scatter": "slice", "select_scatter": "slice",
    "select": "slice", "narrow": "slice", "constant_pad_nd": "slice",
    "embedding": "gather", "embedding_dense_backward": "gather", "index": "gather", "gather": "gather",
    "index_select": "gather", "index_put": "gather", "scatter": "gather", "scatter_add": "gather",
    "iota": "fill", "full": "fill", "scalar_tensor": "fill", "arange": "fill", "zeros": "fill",
    "ones": "fill", "full_like": "fill", "zeros_like": "fill", "ones_like": "fill",
    "inductor_lookup_seed": "random", "inductor_random": "random", "inductor_randint": "random",
    "inductor_seeds": "random", "native_dropout": "random",
    "prepare_softmax_online": "online_softmax",
    "where": "mask", "masked_fill": "mask", "logical_not": "mask", "logical_and": "mask",
    "logical_or": "mask", "bitwise_and": "mask", "bitwise_or": "mask", "bitwise_not": "mask",
    "eq": "mask", "ne": "mask", "gt": "mask", "ge": "mask", "lt": "mask", "le": "mask",
}

#: Classes whose ops mining treats as compute nodes when their category is not already
#: pointwise/reduction (``slice`` and ``select`` stay views: connectors, as every view).
MINED_CLASSES = ("concat", "slice", "gather", "fill", "random", "online_softmax", "mask")
#: ... except constant fills: a ``full`` / ``scalar_tensor`` is a scalar broadcast that many ops
#: share; as a pattern node it would join unrelated patterns (on the tiny workspace it doubled the
#: frequent subgraphs); it stays an input of the patterns that read it. ``iota`` / ``arange`` are mined.
MINED_EXCLUDED = frozenset({"full", "scalar_tensor", "zeros", "ones", "full_like", "zeros_like", "ones_like"})

#: Integer arguments that are values, not structure (abstracted into scalar slots): which
#: dropout seed of the step a ``inductor_lookup_seed`` reads differs in every layer.
VALUE_INT_ARGS: dict[str, tuple[int, ...]] = {"prims.inductor_lookup_seed.default": (1,)}


def short_op(target: str) -> str:
    """``"aten.cat.default"`` -> ``"cat"``; ``"operator.getitem"`` -> ``"getitem"``."""
    parts = target.split(".")
    if parts[0] == "operator":
        return parts[-1]
    return parts[1] if len(parts) > 1 else target


def op_class(target: str, category: str) -> str:
    """The class of an op for regions and reports: a :data:`FUSABLE_CLASSES` class or its category."""
    return FUSABLE_CLASSES.get(short_op(target), category)


def fusable_extra(target: str, category: str) -> bool:
    """True for an op mining counts as compute although its category is not pointwise/reduction."""
    op = short_op(target)
    return category in ("other", "random") and FUSABLE_CLASSES.get(op) in MINED_CLASSES and op not in MINED_EXCLUDED
