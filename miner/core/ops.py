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


def target_name(target) -> str:
    """Stable string for an FX call_function target."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._schema.name.split('::')[-1]}.{target._overloadname}"
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order.{target.name()}"
    module = getattr(target, "__module__", None) or ""
    if module in ("_operator", "operator"):
        return f"operator.{target.__name__}"
    return f"{module}.{getattr(target, '__name__', repr(target))}"


@lru_cache(maxsize=None)
def categorize_name(name: str) -> str:
    return categorize(resolve_target(name), name)


def categorize(target, name: str | None = None) -> str:
    """Category of an FX call_function target: one of ``CATEGORIES``.

    Order matters: a mutating op is "mutation" even if tagged pointwise (``add_``);
    randomness beats pointwise (``inductor_random`` is not pure); views come before
    pointwise because ``alias`` is both.
    """
    name = name or target_name(target)
    if not isinstance(target, torch._ops.OpOverload):
        return "other"
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
