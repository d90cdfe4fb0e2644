"""Knobs: the one-line changes a user could make instead of (or beside) miner's fusions.

A **knob** is a named, documented change to how a model is compiled or run: ``torch.compile``
options (Inductor config keys, e.g. ``coordinate_descent_tuning``; ``mode="reduce-overhead"`` is its
option ``triton.cudagraphs``) and/or a context that sets global state (e.g. an SDPA backend flag).
``miner verify --ab --knobs ...`` measures each knob alone and combined with the gated fusions in the
same alternating harness as the fusions (``miner.check.ab``).

The context is entered around **every call of the variant's step**: the first call compiles (so the
flag is set while Dynamo and Inductor trace) and every later one runs (parity, timed and profiled
steps), and it is left after each call, so a flag never leaks into the other variants that
alternate with it in one process. Each knob variant compiles with its own options (the A/B's
per-variant tag); Inductor's FX and AOT caches serve only a knob of options alone (``ab.cacheable``): a
global flag is in no cache key, so a hit would silently run the default's code.

Built in (``KNOBS``): ``sdpa_reduced_math``, ``reduce_overhead``, ``max_autotune_no_cudagraphs``,
``coordinate_descent``, ``combo_kernels``, ``benchmark_fusion``, ``pack_dropout_masks`` (a joint-graph
pass, ``miner.check.mask_bits``: training's dropout keep masks saved for the backward as one bit per
element instead of one byte; memory, not numerics), ``recompute_dropout_masks`` (no mask saved: the
backward draws Inductor's seeded masks again from the saved seed), ``pack_bool_masks`` (the same as
``pack_dropout_masks`` for every bool tensor the backward reads: dropout's and ReLU's masks), ``gemm_epilogues``
(``miner.runtime.epilogue``: an addmm read only by a tanh-GELU or ReLU runs as one cuBLASLt GEMM with that
activation in its epilogue; inference),
``philox4_dropout_bits`` (the masks drawn four per Philox call into bits by one kernel: another random stream,
judged by its masks injected; with the fusions, a dropout region drawing that stream draws its mask instead and the
bits are packed from it: ``miner.runtime.drawn``), ``philox4_dropout_bits_in_region`` (the same, the region's kernel
storing the saved bits itself: ``miner.runtime.rewrite.pack_in_kernel``). Your own: ``--knobs module:attr``
where ``attr`` is a :class:`Knob` (or a function returning one), imported from the current
directory like a model factory::

    # myknobs.py
    from miner.check.knobs import Knob
    no_padding = Knob("no_padding", "Inductor's shape padding off", options={"shape_padding": False})

``--knobs a+b`` measures knobs ``a`` and ``b`` together as one (``combine``); ``--knobs all``: every
built-in knob. A name that is not a knob fails with the list of valid names.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator, Mapping, Sequence

from miner.check.mask_bits import (DrawDropoutBits, DrawDropoutBitsInRegion, PackBoolMasks, PackDropoutMasks,
                                   RecomputeDropoutMasks)
from miner.core.errors import UsageError
from miner.runtime.epilogue import GemmEpilogues
from miner.runtime.keep_bits import PATTERN_ID as PHILOX4_BITS

CUDAGRAPHS = "triton.cudagraphs"  # the option mode="reduce-overhead" sets (torch._inductor.list_mode_options)


@dataclass(frozen=True)
class Knob:
    """One named change to how the model is compiled or run.

    Parameters
    ----------
    name : str
        How it is named on the command line and in results (letters, digits, ``_``).
    doc : str
        What it changes, in one line.
    options : mapping, optional
        ``torch.compile(options=...)`` entries (Inductor config keys).
    context : callable, optional
        Returns a context manager that sets the knob's global state; entered around every step
        of the variant (compile and run) and left after it.
    numerics : str, optional
        How it changes the numerics ("" when it does not): shown beside its measured parity.
    """

    name: str
    doc: str
    options: Mapping[str, Any] = field(default_factory=dict)
    context: Callable[[], ContextManager] | None = None
    numerics: str = ""
    needs: tuple[str, ...] = ()  # names of ops/kernels one of which a step must hold for the knob to change it
    # the line of code a user writes for it: a statement run before compiling, or a ``torch.compile(model, ...)``
    # call (a mode); "" for a knob of your own: its options are written out (:func:`code`)
    how: str = ""
    # the pattern id under which ``miner.runtime.launch.recording`` keeps the masks of a knob that draws a dropout
    # stream of its own (a parity judge injects them into its eager reference: ``miner.check.masks``); "" for none
    draws: str = ""

    @property
    def cudagraphs(self) -> bool:
        """Runs under CUDA graphs (each step must mark its start; peak memory is the graphs' pool)."""
        return bool(self.options.get(CUDAGRAPHS))

    def around(self, step: Callable) -> Callable:
        """``step`` with this knob's context entered for each call (a no-op wrapper when it has none)."""
        if self.context is None:
            return step

        def with_knob(*args, **kwargs):
            with self.context():
                return step(*args, **kwargs)
        return with_knob

    def applies(self, text: str) -> bool:
        """Whether the knob can change a step whose captured graphs and profile read as ``text``: a knob
        with ``needs`` acts only where one of those names occurs (an SDPA flag in a step without SDPA
        changes nothing and would only cost a compile in the A/B)."""
        return not self.needs or any(n in text for n in self.needs)


@contextlib.contextmanager
def sdpa_reduction_math() -> Iterator[None]:
    """``torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)`` inside, the previous value after."""
    import torch

    before = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
    torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)
    try:
        yield
    finally:
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(before)


def _mode_options(mode: str) -> dict:
    """The options ``torch.compile(mode=mode)`` stands for in this torch version."""
    import torch._inductor

    return dict(torch._inductor.list_mode_options(mode))



def _philox4(name: str, joint_pass, doc: str) -> Knob:
    """A knob whose joint-graph pass draws the dropout masks four per Philox call into bits (``joint_pass``)."""
    return Knob(name, doc, options={"joint_custom_post_pass": joint_pass},
                numerics="another dropout random stream (miner.runtime.philox: a function of the seed and the element's "
                         "index only, kept where u > p in float32): the same law, other masks; parity by its masks "
                         "injected",
                how=f"torch._inductor.config.joint_custom_post_pass = miner.check.mask_bits.{type(joint_pass).__name__}()",
                draws=PHILOX4_BITS)

KNOBS: dict[str, Knob] = {k.name: k for k in (
    Knob("sdpa_reduced_math",
         "torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True): SDPA's math path keeps fp16/bf16 "
         "(no float32 upcast of q, k, v)",
         context=sdpa_reduction_math,
         numerics="bf16 GEMMs and bf16 intermediates (scores, softmax, dropout) in SDPA's math path, where the "
                  "default upcasts to float32",
         needs=("scaled_dot_product", "_safe_softmax"),  # an SDPA call, or its math path decomposed
         how="torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)"),
    Knob("reduce_overhead", 'mode="reduce-overhead": CUDA graphs (training too)',
         options={CUDAGRAPHS: True}, how='torch.compile(model, mode="reduce-overhead")'),
    Knob("max_autotune_no_cudagraphs", 'mode="max-autotune-no-cudagraphs": GEMM and kernel autotuning',
         options={"max_autotune": True, "coordinate_descent_tuning": True},
         how='torch.compile(model, mode="max-autotune-no-cudagraphs")'),
    Knob("coordinate_descent", "Inductor coordinate_descent_tuning: tunes each Triton kernel's block sizes",
         options={"coordinate_descent_tuning": True}),
    Knob("combo_kernels", "Inductor combo_kernels: independent kernels launched as one", options={"combo_kernels": True}),
    Knob("benchmark_fusion", "Inductor benchmark_fusion: times fused vs unfused kernels before fusing",
         options={"benchmark_fusion": True}),
    Knob("pack_dropout_masks",
         "Inductor joint_custom_post_pass miner.check.mask_bits.PackDropoutMasks: in training, each dropout keep "
         "mask is saved for the backward as one bit per element (uint8, 8 per byte) instead of one bool byte, "
         "and unpacked where it is read; changes saved-activation memory (an eighth of the masks' bytes) and "
         "adds pack/unpack work, not the numerics (same random stream, same masks; only kernels split differently "
         "around the unpack may round differently in the last bits)",
         options={"joint_custom_post_pass": PackDropoutMasks()},
         how="torch._inductor.config.joint_custom_post_pass = miner.check.mask_bits.PackDropoutMasks()"),
    Knob("recompute_dropout_masks",
         "Inductor joint_custom_post_pass miner.check.mask_bits.RecomputeDropoutMasks: in training, each dropout "
         "keep mask Inductor draws from its seeded random op is not saved for the backward: the backward draws it "
         "again from the saved seed (a function of the seed and the element's index only); saves every mask's "
         "bytes and adds a Philox draw per element to the backward, not the numerics (the same masks)",
         options={"joint_custom_post_pass": RecomputeDropoutMasks()},
         how="torch._inductor.config.joint_custom_post_pass = miner.check.mask_bits.RecomputeDropoutMasks()"),
    _philox4("philox4_dropout_bits", DrawDropoutBits(),
             "Inductor joint_custom_post_pass miner.check.mask_bits.DrawDropoutBits: in training, each dropout keep "
             "mask Inductor draws from its seeded random op is drawn instead by one kernel four numbers per Philox "
             "call (Inductor: one call per element), straight into bits, which the forward and the backward unpack "
             "where they read the mask; saves seven eighths of the masks' bytes and most of their Philox work"),
    _philox4("philox4_dropout_bits_in_region", DrawDropoutBitsInRegion(),
             "philox4_dropout_bits (Inductor joint_custom_post_pass miner.check.mask_bits.DrawDropoutBitsInRegion), "
             "and where a dropout region of the fusions takes a mask's draw back its own kernel stores the saved "
             "bits (miner.runtime.rewrite.pack_in_kernel) instead of a packing pass reading the bool mask back; "
             "without the fusions the same as philox4_dropout_bits"),
    Knob("pack_bool_masks",
         "Inductor joint_custom_post_pass miner.check.mask_bits.PackBoolMasks: in training, every bool tensor of "
         "4096 elements or more that the backward reads and the forward can compute (dropout keep masks, a ReLU's "
         "le(out, 0) mask, ...) is saved as one bit per element instead of one byte, and unpacked where it is read; "
         "memory, not numerics (the same values; kernels split differently around the unpack may round "
         "differently in the last bits)",
         options={"joint_custom_post_pass": PackBoolMasks()},
         how="torch._inductor.config.joint_custom_post_pass = miner.check.mask_bits.PackBoolMasks()"),
    Knob("gemm_epilogues",
         "Inductor joint_custom_pre_pass miner.runtime.epilogue.GemmEpilogues: each addmm read only by a tanh-GELU or "
         "ReLU (miner.rules.epilogue: the chain evaluated and identified, nothing else reading the GEMM's output) runs "
         "as aten._addmm_activation: cuBLASLt adds the bias and applies the activation in the GEMM's epilogue, and "
         "Inductor's kernel that read the GEMM's output back is gone; CUDA, and only where no backward saves the "
         "pre-activation (inference: in training the backward's reads decline it)",
         options={"joint_custom_pre_pass": GemmEpilogues()},
         numerics="the activation computed from the GEMM's float32 accumulator and rounded once, where Inductor "
                  "rounds the GEMM's output to bf16/fp16 first: at least as precise",
         needs=("addmm",),
         how="torch._inductor.config.joint_custom_pre_pass = miner.runtime.epilogue.GemmEpilogues()"),
)}


def _check_options(knob: Knob) -> Knob:
    """``knob`` if every option is an Inductor config key, else a ``UsageError`` naming the first that is not."""
    import torch._inductor

    known = set(torch._inductor.list_options())
    bad = [k for k in knob.options if k not in known]
    if bad:
        raise UsageError(f"knob {knob.name}: {bad[0]!r} is not a torch._inductor.config option")
    return knob


def _user_knob(ref: str) -> Knob:
    """``module:attr`` imported from the current directory (appended last to ``sys.path``, as a model
    factory is): a Knob, or a function of no arguments returning one."""
    import importlib
    import os
    import sys

    module_name, _, attr = ref.partition(":")
    if not module_name or not attr or ":" in attr:
        raise UsageError(f"--knobs {ref}: a knob of your own is module:attr")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        obj = getattr(importlib.import_module(module_name), attr, None)
    except ImportError as e:
        raise UsageError(f"--knobs {ref}: cannot import {module_name!r} ({e})") from None
    if obj is not None and not isinstance(obj, Knob) and callable(obj):
        obj = obj()
    if not isinstance(obj, Knob):
        raise UsageError(f"--knobs {ref}: {type(obj).__name__} is not a miner.check.knobs.Knob")
    return _check_options(obj)


def get(name: str) -> Knob:
    """The knob ``name``: a built-in (``KNOBS``) or ``module:attr``; a ``UsageError`` listing the valid names."""
    if ":" in name:
        return _user_knob(name)
    try:
        return KNOBS[name]
    except KeyError:
        raise UsageError(f"unknown knob {name!r}; knobs: {', '.join(KNOBS)}, all, or module:attr "
                         f"(a miner.check.knobs.Knob of your own)") from None


def combine(knobs: Sequence[Knob]) -> Knob:
    """``knobs`` as one knob named ``a+b``: their options merged (a key set to two values is an error),
    their contexts entered in order."""
    if len(knobs) == 1:
        return knobs[0]
    options: dict = {}
    for k in knobs:
        for key, value in k.options.items():
            if key in options and options[key] != value:
                raise UsageError(f"knobs {'+'.join(x.name for x in knobs)}: {key} is set to {options[key]!r} "
                                 f"and {value!r}")
            options[key] = value
    contexts = [k.context for k in knobs if k.context is not None]

    @contextlib.contextmanager
    def together() -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for c in contexts:
                stack.enter_context(c())
            yield
    return Knob("+".join(k.name for k in knobs), "; ".join(k.doc for k in knobs), options,
                together if contexts else None, "; ".join(k.numerics for k in knobs if k.numerics),
                tuple(dict.fromkeys(n for k in knobs for n in k.needs)), draws=next((k.draws for k in knobs if k.draws), ""))


def of_label(model: str) -> Knob | None:
    """The knob a ``<model>@<knob>`` label compiles with (``a+b`` for two), None for a plain name. The
    captures, profiles and regions of such a model are those of the step a user runs with that knob:
    regions mined there are the ones left to take on top of it."""
    _, at, spec = model.partition("@")
    return parse(spec)[0] if at else None


def holding(knob: Knob | None) -> ContextManager:
    """``knob``'s context (nothing to hold for None or a knob without one)."""
    return knob.context() if knob is not None and knob.context is not None else contextlib.nullcontext()


def parse(spec: str | None) -> list[Knob]:
    """The knobs of ``--knobs``: comma-separated names, ``all`` (every built-in), ``a+b`` (one knob of
    both), ``module:attr`` (your own). Empty or None: none."""
    out: list[Knob] = []
    for item in (s.strip() for s in (spec or "").split(",")):
        if not item:
            continue
        if item == "all":
            out += [k for k in KNOBS.values() if k.name not in {o.name for o in out}]
            continue
        knob = combine([get(part.strip()) for part in item.split("+")])
        if knob.name not in {o.name for o in out}:
            out.append(knob)
    return out


def code(knob: Knob) -> list[str]:
    """The lines a user writes for ``knob``: its ``how``, else each option as an Inductor config assignment
    (a context of your own: entered around each step, said in words)."""
    if knob.how:
        return [knob.how]
    out = [f"torch._inductor.config.{k} = {v!r}" for k, v in knob.options.items()]
    if knob.context is not None:
        out.append(f"with {knob.name}'s context around each step")
    return out


def describe() -> str:
    """One line per built-in knob: name, what it changes, and its numerics where it changes them."""
    return "\n".join(f"{k.name}: {k.doc}" + (f" [numerics: {k.numerics}]" if k.numerics else "")
                     for k in KNOBS.values())
