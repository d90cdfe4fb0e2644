"""Model-step parity for dropout kernels that draw another random stream than Inductor's ("masks injected").

A ``--rng philox4`` candidate draws its dropout masks from its own stream, so a compiled step with it
and one without it drop different elements: comparing the two says nothing. Instead the masks the
compiled step *used* are injected into an eager float32 reference of the same model step, and the
compiled step is compared with that reference:

1. The compiled step with the candidate runs once under ``miner.runtime.launch.recording``: each
   launch of a dropout kernel keeps a copy of its outputs, among them the mask the backward reads
   (``mask_slots`` finds it in the candidate's pattern: the ``gt`` of the ``inductor_random`` drawn at
   seed ``inductor_lookup_seed(seeds, i)``), and the seed vector.
2. Every other dropout of the step is Inductor's own: its mask is recomputed from the same seed
   vector in Inductor's stream (:func:`inductor_uniform`: ``tl.rand(seed, L)`` on CUDA, the C++
   backend's ``normalized_rand_cpu`` on the CPU). Inductor numbers its random ops in program order
   (``fuse_seed_creation_pass``), so the ``k``-th dropout call of the eager model has seed index ``k``.
3. The eager reference (no autocast) runs with ``torch.nn.functional.dropout`` (and the dropout of
   ``scaled_dot_product_attention``, written out) replaced by ``x * mask_k * 1 / (1 - p)``: the
   model's own definition of dropout with the compiled step's masks, forward and backward.
4. The floor: the default compile (no candidate, Inductor's masks everywhere) against the same
   reference with its masks. ``miner.check.verify.judge_parity`` then asks whether the candidate's
   step is as close to its reference as the default's is to its own (loss, logits, gradients).

5. Dropout inside a fused attention kernel (cuDNN, memory-efficient or flash SDPA on a GPU: t5's
   cross-attention, whose mask needs no gradient) draws no Inductor seed. The kernel takes its
   Philox ``(seed, offset)`` from the CUDA generator and returns it; :func:`recording_fused_attention`
   keeps it from each call the compiled step makes. The reference asks, per ``scaled_dot_product_attention``
   call, which kernel the compiled step chose (``torch._fused_sdp_choice`` on the autocast dtype), and
   for a fused one runs that very kernel on the autocast dtype with the generator set to the recorded
   ``(seed, offset)``: the same mask, forward and backward (the backward reads the saved pair), held
   equal between the step and its reference. Those calls are then as precise as the kernel (bf16),
   in the candidate's reference and in the floor's alike.

What it catches: a wrong scale (the forward's values), a mask output that is not the mask applied to
the values, a backward that reads another mask than the forward applied (the gradients). What it
cannot judge (``ok=None``, with the reason): a step whose dropout calls do not match the compiled
graph's random ops and fused attention calls one to one, or a floor beyond ``PARITY_FLOOR_MAX``
(the default's own masks, or the fused kernels' replayed masks, not reproduced).
"""

from __future__ import annotations

import contextlib
import copy
import math
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

from miner.core.dtypes import PARITY_FLOOR_MAX

METHOD = "masks injected"  # the parity method's name in validation.json and the A/B's parity
INDUCTOR_METHOD = METHOD + " (Inductor's)"  # every mask Inductor's: a variant whose fusions draw no stream of their own
LOOKUP, RANDOM, GT, CAST = ("prims.inductor_lookup_seed.default", "prims.inductor_random.default", "aten.gt.Scalar",
                            "prims.convert_element_type.default")


@dataclass(frozen=True)
class MaskSlot:
    """Where one dropout of a region candidate sits in its signature: the seed-vector input, the
    scalar holding its seed index, and the output that is its mask."""

    seed_input: int
    index_scalar: int
    output: int


KNOB_SLOT = MaskSlot(0, 0, 0)  # what ``miner.runtime.keep_bits`` records: seed vector input 0, index scalar 0, mask output 0


def mask_slots(pattern: dict) -> list[MaskSlot]:
    """The dropout masks of a region pattern (``candidate.json``'s ``pattern``), one per
    ``inductor_lookup_seed``.

    Raises
    ------
    ValueError
        A random number whose mask is not a ``gt`` the region outputs (nothing to record).
    """
    nodes = pattern["nodes"]
    outs = sorted(set(pattern.get("outputs", [])) | set(pattern.get("extra_outputs", [])))
    slots = []
    for i, n in enumerate(nodes):
        if n["target"] != LOOKUP:
            continue
        seed_arg, index_arg = n["args"][0], n["args"][1]
        index = index_arg.get("int_const", index_arg.get("const")) if isinstance(index_arg, dict) else None
        frontier, mask = {i}, None
        for j, m in enumerate(nodes):  # nodes are in topological order: follow random -> cast -> gt
            if any(isinstance(a, dict) and a.get("node") in frontier for a in m["args"]):
                if m["target"] in (RANDOM, CAST):
                    frontier.add(j)
                elif m["target"] == GT:
                    mask = j
                    break
        if mask is None or mask not in outs or "input" not in seed_arg or index is None:
            raise ValueError(f"the mask drawn at seed node {i} is not a region output: nothing to record")
        slots.append(MaskSlot(seed_arg["input"], int(index), outs.index(mask)))
    return slots


# --------------------------------------------------------------------------- Inductor's own stream

def seed_vector(seed: int, count: int, device: str):
    """The ``inductor_seeds(count)`` a compiled step draws first after ``torch.manual_seed(seed)``
    (``aten.randint.low_out(int64 min, int64 max, [count])``, ``ir.RandomSeeds``)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randint(-2**63, 2**63 - 1, [count], generator=g, device=device)


def inductor_uniform(seed: int, n: int, device_type: str):
    """Inductor's ``inductor_random(..., "rand")`` numbers of elements ``0..n-1`` (float32, CPU).

    CUDA: ``tl.rand(seed, L)`` (word 0 of Philox4x32-10 at counter ``L``, Triton's conversion). CPU:
    the C++ backend's ``normalized_rand_cpu(uint32 seed, L)`` (``at::Philox4_32(seed, 0, L)()``, word
    0 at counter ``L`` under the seed's low 32 bits, ``(w & 0x7FFFFFFF) * 4.6566127342e-10``).
    """
    import torch

    from miner.runtime import philox

    if device_type == "cuda" and torch.cuda.is_available():
        return triton_uniform(seed, n, "cuda")
    L = torch.arange(n)
    if device_type == "cuda":
        return philox.to_uniform(philox.philox4x32(seed, L)[0])
    w = philox.philox4x32(int(seed) & philox.MASK32, L)[0]
    return (w & 0x7FFFFFFF).to(torch.float32) * torch.tensor(philox.SCALE, dtype=torch.float32)


def triton_uniform(seed: int, n: int, device: str):
    """Inductor's CUDA numbers of elements ``0..n-1`` drawn by the very call its kernels make
    (``tl.rand(seed, offset.to(tl.uint32))``, ``miner.runtime.launch.triton_rand``), on ``device``:
    milliseconds per 1e9 elements where the int64 torch arithmetic takes ~10 s per 1e8. Under
    ``TRITON_INTERPRET=1`` it runs on the CPU (the tests compare it with :mod:`miner.runtime.philox`)."""
    import torch

    from miner.runtime.launch import triton_rand

    seed_t = torch.tensor([int(seed)], dtype=torch.int64, device=device)
    return triton_rand((int(n),), seed_t, "rand")


def max_elements(device_type: str) -> int:
    """The dropout elements per step whose Inductor masks :func:`inductor_uniform` reproduces in
    reasonable time: with Triton on a GPU, ``MAX_ELEMENTS_GPU``; in int64 torch math, ``MAX_ELEMENTS``."""
    import torch

    return MAX_ELEMENTS_GPU if device_type == "cuda" and torch.cuda.is_available() else MAX_ELEMENTS


def inductor_keep(seed: int, shape, p: float, device_type: str):
    """Inductor's dropout keep mask (``u > p`` in float32) for a tensor of ``shape``."""
    return (inductor_uniform(seed, math.prod(shape), device_type) > p).reshape(tuple(shape))


# --------------------------------------------------------------------------- recorded masks

def recorded_masks(calls, slots_of: dict[str, list[MaskSlot]]) -> tuple[dict[int, Any], Any, list[str]]:
    """``(masks by seed index, the seed vector, problems)`` from ``launch.recording``'s calls.

    ``slots_of``: pattern id -> its :func:`mask_slots`. A seed index recorded twice must carry the
    same mask (a recompute in the backward); launches from several seed vectors (graph breaks) are
    a problem: the reference numbers one program-ordered list.
    """
    import torch

    masks: dict[int, Any] = {}
    seeds, problems = None, []
    for d in calls:
        for s in slots_of.get(d.pattern_id, []):
            vec, k, m = d.seeds[s.seed_input], int(d.scalars[s.index_scalar]), d.outputs[s.output]
            if seeds is None:
                seeds = vec
            elif not torch.equal(seeds, vec):
                problems.append(f"{d.pattern_id}: launches from more than one seed vector (graph breaks?)")
            if k in masks and not torch.equal(masks[k], m):
                problems.append(f"{d.pattern_id}: seed index {k} drawn twice with different masks")
            masks[k] = m
    return masks, seeds, problems


# --------------------------------------------------------------------------- dropout inside fused attention

FUSED_ATTENTION = {  # the CUDA attention ops that draw their own dropout -> the backend that runs them
    "_scaled_dot_product_cudnn_attention": "CUDNN_ATTENTION",
    "_scaled_dot_product_efficient_attention": "EFFICIENT_ATTENTION",
    "_scaled_dot_product_flash_attention": "FLASH_ATTENTION",
}


@dataclass(frozen=True)
class FusedDraw:
    """One call of a fused attention op with dropout in a compiled step: the op, the ``SDPBackend``
    name that runs it, its dropout ``p``, the query's shape, and the Philox ``(seed, offset)`` it
    drew from the CUDA generator."""

    op: str
    backend: str
    p: float
    shape: tuple
    seed: int
    offset: int


def arguments(op, args: tuple, kwargs: dict) -> dict:
    """An op call's arguments by name (its schema's defaults filled in)."""
    return {a.name: (args[i] if i < len(args) else kwargs.get(a.name, a.default_value))
            for i, a in enumerate(op._schema.arguments)}


def philox_pair(op, result) -> tuple[int, int]:
    """``(seed, offset)`` a fused attention call returned: ``philox_seed``/``philox_offset``, or
    flash's two-word ``rng_state``, found by the op's schema."""
    names = [r.name for r in op._schema.returns]
    if "philox_seed" in names:
        return int(result[names.index("philox_seed")].item()), int(result[names.index("philox_offset")].item())
    state = result[names.index("rng_state")].reshape(-1)
    return int(state[0].item()), int(state[1].item())


@contextlib.contextmanager
def recording_fused_attention(ops: dict | None = None):
    """Within it, each call of a fused attention op (``FUSED_ATTENTION``, or ``ops``: ``"ns::name"``
    -> backend) with dropout appends a :class:`FusedDraw` to the yielded list, in call order.

    Inductor's wrapper code calls a fallback op as ``torch.ops.aten.<name>.default(...)``, looked up
    at each call: the overload is replaced on its packet for the duration (compiled code only runs
    it; nothing is traced here)."""
    import torch

    draws: list = []
    saved = []
    ops = FUSED_ATTENTION if ops is None else ops
    for name in ops:
        namespace, _, op_name = name.rpartition("::")
        packet = getattr(getattr(torch.ops, namespace or "aten"), op_name, None)
        if packet is None:
            continue
        original = packet.default

        def recorded(*args, _op=original, _name=name, **kwargs):
            result = _op(*args, **kwargs)
            p = float(arguments(_op, args, kwargs).get("dropout_p") or 0.0)
            if p > 0:
                draws.append(FusedDraw(_name, ops[_name], p, tuple(args[0].shape), *philox_pair(_op, result)))
            return result

        saved.append((packet, original))
        setattr(packet, "default", recorded)
    try:
        yield draws
    finally:
        for packet, original in saved:
            setattr(packet, "default", original)


@dataclass(frozen=True)
class AttentionCall:
    """One ``scaled_dot_product_attention`` call's arguments."""

    q: Any
    k: Any
    v: Any
    attn_mask: Any = None
    dropout_p: float = 0.0
    is_causal: bool = False
    scale: float | None = None
    enable_gqa: bool = False

    def cast(self, dtype) -> "AttentionCall":
        """The floating tensors in ``dtype`` (as autocast casts them; None: unchanged)."""
        def cast(t):
            return t if t is None or dtype is None or not t.is_floating_point() else t.to(dtype)
        return AttentionCall(cast(self.q), cast(self.k), cast(self.v), cast(self.attn_mask), self.dropout_p,
                             self.is_causal, self.scale, self.enable_gqa)

    def run(self, sdpa: Callable):
        return sdpa(self.q, self.k, self.v, attn_mask=self.attn_mask, dropout_p=self.dropout_p,
                    is_causal=self.is_causal, scale=self.scale, enable_gqa=self.enable_gqa)


def fused_backend(call: AttentionCall, dtype) -> int:
    """The ``SDPBackend`` value the compiled step's ``scaled_dot_product_attention`` chose for this call
    under autocast to ``dtype`` (None: no autocast): ``torch._fused_sdp_choice``, which the composite
    op itself asks while it is traced."""
    import torch

    c = call.cast(dtype)
    return int(torch._fused_sdp_choice(c.q, c.k, c.v, c.attn_mask, c.dropout_p, c.is_causal, scale=c.scale,
                                       enable_gqa=c.enable_gqa))


@contextlib.contextmanager
def generator_at(device, seed: int, offset: int):
    """The CUDA generator of ``device`` set to ``(seed, offset)`` within, restored after."""
    import torch

    gen = torch.cuda.default_generators[torch.device(device).index or torch.cuda.current_device()]
    state = gen.get_state()
    gen.manual_seed(seed & 0xFFFF_FFFF_FFFF_FFFF)
    gen.set_offset(offset)
    try:
        yield
    finally:
        gen.set_state(state)


def replay_fused(sdpa: Callable, draw: FusedDraw, call: AttentionCall, dtype):
    """``draw``'s kernel run again on ``call`` cast to ``dtype`` with the generator at its
    ``(seed, offset)``: the compiled step's mask, forward and backward; the output in the query's dtype."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with generator_at(call.q.device, draw.seed, draw.offset), sdpa_kernel([getattr(SDPBackend, draw.backend)]):
        out = call.cast(dtype).run(sdpa)
    return out.to(call.q.dtype) if torch.is_tensor(out) else out


# --------------------------------------------------------------------------- the eager reference

class Injector:
    """Replaces ``torch.nn.functional.dropout`` (``nn.Dropout`` calls it) and the dropout of
    ``scaled_dot_product_attention`` (the math written out) with ``x * keep_k * (1 / (1 - p))``,
    ``keep_k = mask_of(k, shape, p)`` for the ``k``-th dropout call in training with ``p > 0`` that
    Inductor draws. An attention call the compiled step ran in a fused kernel (``fused``: its draws,
    in call order; ``choose(AttentionCall) -> bool`` says which calls) runs that kernel again at its
    recorded draw (:func:`replay_fused`; ``replay`` replaces it in tests).
    ``calls`` lists ``(shape, p)`` per dropout call; ``fused_calls`` counts the replayed ones."""

    def __init__(self, mask_of: Callable, fused: list | None = None, dtype=None, choose: Callable | None = None,
                 replay: Callable | None = None):
        import torch.nn.functional as F

        self.mask_of = mask_of
        self.fused = list(fused or [])
        self.dtype = dtype
        self.choose = choose or (lambda call: fused_backend(call, dtype) != 0)
        self.replay = replay or replay_fused
        self.sdpa_original = F.scaled_dot_product_attention
        self.calls: list[tuple[tuple, float]] = []
        self.fused_calls = 0
        self.unmatched: list[str] = []  # fused calls the reference could not pair with a recorded draw

    def dropout(self, input, p: float = 0.5, training: bool = True, inplace: bool = False):
        if not training or p == 0:
            return input
        keep = self.mask_of(len(self.calls) - self.fused_calls, tuple(input.shape), float(p))
        self.calls.append((tuple(input.shape), float(p)))
        return input * keep.to(device=input.device, dtype=input.dtype) * (1.0 / (1.0 - p))

    def sdpa(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        import torch

        call = AttentionCall(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        if self.fused and dropout_p > 0 and self.choose(call):
            i = self.fused_calls
            self.calls.append((tuple(q.shape[:-1]) + (k.size(-2),), float(dropout_p)))
            self.fused_calls += 1
            if i < len(self.fused) and self.fused[i].shape == tuple(q.shape) and self.fused[i].p == float(dropout_p):
                return self.replay(self.sdpa_original, self.fused[i], call, self.dtype)
            self.unmatched.append(f"fused attention call {i} {tuple(q.shape)} p={dropout_p}")
            dropout_p = 0.0  # the reference is discarded (``unmatched``); it only has to run on
        if enable_gqa and k.size(-3) != q.size(-3):
            k = k.repeat_interleave(q.size(-3) // k.size(-3), -3)
            v = v.repeat_interleave(q.size(-3) // v.size(-3), -3)
        s = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.size(-1)) if scale is None else scale)
        if is_causal:
            causal = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).tril()
            s = s.masked_fill(~causal, float("-inf"))
        if attn_mask is not None:
            s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
        return self.dropout(torch.softmax(s, dim=-1), dropout_p, dropout_p > 0) @ v

    @contextlib.contextmanager
    def active(self):
        import torch.nn.functional as F

        saved = F.dropout, F.scaled_dot_product_attention
        self.sdpa_original = saved[1]
        F.dropout, F.scaled_dot_product_attention = self.dropout, self.sdpa
        try:
            yield self
        finally:
            F.dropout, F.scaled_dot_product_attention = saved


def eager_reference(built, mode: str, device: str, mask_of: Callable, seed: int, *, fused: list | None = None,
                    autocast: bool = True) -> tuple[tuple, Injector]:
    """``(loss, logits, grads)`` of one eager step of a copy of ``built``'s model without autocast,
    its dropouts applying ``mask_of``'s masks and its fused attention calls replaying ``fused``
    (the compiled step's draws; ``autocast``: the compiled step ran under bf16 autocast, so its
    fused kernels ran in bf16), and the :class:`Injector` that says which calls it made."""
    import torch

    from miner.check.verify import make_step, observe_step

    model = copy.deepcopy(built.model)
    inj = Injector(mask_of, fused=fused, dtype=torch.bfloat16 if autocast else None)
    with inj.active():
        step = make_step(model, built.inputs, built.loss, mode, device, autocast=False)
        out = observe_step(step, model, mode=mode, device=device, seed=seed, grads_to_cpu=True)
    return out, inj


_CALLS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> {(mode, device, input shapes): calls}


def dropout_calls(built, mode: str, device: str) -> list[tuple[tuple, float]]:
    """The ``(shape, p)`` of each dropout call of one eager step (all elements kept: a dry run), run once per
    model, mode, device and input shapes (the A/B's judge asks again for every variant it judges: each time a
    whole eager step, forward and backward, of the model)."""
    import torch

    shapes = tuple(sorted((k, tuple(v.shape)) for k, v in built.inputs.items() if hasattr(v, "shape")))
    try:
        per_model = _CALLS.setdefault(built.model, {})
    except TypeError:  # a model object that takes no weak reference: counted every time
        per_model = {}
    key = (mode, str(device), shapes)
    if key not in per_model:
        per_model[key] = eager_reference(built, mode, device, lambda k, shape, p: torch.ones((), dtype=torch.bool),
                                         0)[1].calls
    return list(per_model[key])


# --------------------------------------------------------------------------- the parity

@dataclass(frozen=True)
class MaskedParity:
    """The verdict: ``ok`` (None: not judged, ``reason`` says why), the per-quantity relative errors
    of the candidate's step to its reference (``error``) and of the default's to its own (``floor``)."""

    ok: bool | None
    reason: str
    error: dict | None = None
    floor: dict | None = None
    recorded: int = 0  # dropouts whose masks the candidate's kernels drew
    dropouts: int = 0  # dropout calls of the step
    method: str = METHOD


@dataclass
class Compiled:
    """One observed compiled step: ``(loss, logits, grads)``, the dropout launches it recorded and the
    draws of its fused attention calls (:class:`FusedDraw`)."""

    observed: tuple
    calls: list
    fused: list = field(default_factory=list)
    repeated: int = 0  # fused draws recorded again with the same op, shape, seed and offset (left out of ``fused``)

    @classmethod
    def of(cls, observed: tuple, calls: list, fused: list) -> "Compiled":
        """The record of one step, a fused draw repeated exactly (same op, shape, ``(seed, offset)``:
        the same mask) kept once."""
        once = list(dict.fromkeys(fused))
        return cls(observed, calls, once, len(fused) - len(once))


def describe_draws(fused: list, repeated: int = 0) -> str:
    """The fused attention draws of a step in a few words: per op and shape, how many."""
    from collections import Counter

    counts = Counter((d.op.rpartition("::")[2].lstrip("_"), "x".join(map(str, d.shape))) for d in fused)
    text = ", ".join(f"{n} {op} {shape}" for (op, shape), n in counts.most_common(4))
    return text + (f"; {repeated} more repeated exactly" if repeated else "")


def observe_runner(runner: tuple, mode: str, device: str, *, seed: int) -> Compiled:
    """One seeded step of an already compiled ``runner`` ``(step, model)`` (an A/B's variant), recorded
    as :func:`observe_compiled` records one."""
    from miner.check.verify import observe_step
    from miner.runtime import launch

    step, model = runner
    with launch.recording() as calls, recording_fused_attention() as fused, graphs_run_eagerly():
        return Compiled.of(observe_step(step, model, mode=mode, device=device, seed=seed, grads_to_cpu=True),
                           calls, fused)


def observe_compiled(built, mode: str, device: str, *, graph_pass=None, autocast: bool, seed: int,
                     gate_open: bool = True, reset: bool = True) -> Compiled:
    """One seeded compiled step of a copy of ``built``'s model (``graph_pass`` installed; Inductor's
    random ops, caches off), recorded by ``launch.recording``. ``reset``: Dynamo's caches are reset
    before and after; not inside an A/B, whose variants' compiled frames would go with them (their next
    step would compile again, inside a timed round)."""
    import torch

    from miner.check.checks import gate_context
    from miner.check.verify import make_step, observe_step
    from miner.runtime import launch, rewrite

    if reset:
        torch._dynamo.reset()
    model = copy.deepcopy(built.model)
    options = rewrite.inductor_options(graph_pass) if graph_pass is not None else None
    try:
        compiled = torch.compile(model, options=options, dynamic=False)
        with torch._inductor.config.patch(force_disable_caches=True, fallback_random=False), \
                gate_context(graph_pass, gate_open):
            step = make_step(compiled, built.inputs, built.loss, mode, device, autocast=autocast)
            step()  # compiles
            with launch.recording() as calls, recording_fused_attention() as fused:
                return Compiled.of(observe_step(step, model, mode=mode, device=device, seed=seed, grads_to_cpu=True),
                                   calls, fused)
    finally:
        if reset:
            torch._dynamo.reset()


def judged_knob(knob):
    """``knob`` (a ``miner.check.knobs.Knob``) as a parity judge compiles it: its options without CUDA graphs,
    which change how the kernels are launched, not what they compute (a graph replay would also hide the
    launches the judge records); None for no knob."""
    if knob is None:
        return None
    from dataclasses import replace

    from miner.check import knobs

    return replace(knob, options={k: v for k, v in knob.options.items() if k != knobs.CUDAGRAPHS})


@contextlib.contextmanager
def knob_applied(knob):
    """``knob`` (:func:`judged_knob`) in force while a judge compiles and runs a step: its options patched into
    Inductor's config (what ``torch.compile(options=...)`` does for the compiles inside) and its context entered;
    nothing for no knob."""
    import torch._inductor.config as config

    from miner.check import knobs

    knob = judged_knob(knob)
    with contextlib.ExitStack() as stack:
        if knob is not None:
            stack.enter_context(config.patch(dict(knob.options)))
        stack.enter_context(knobs.holding(knob))
        yield


@contextlib.contextmanager
def graphs_run_eagerly():
    """A variant compiled with CUDA graphs (``reduce_overhead``) runs its compiled kernels without
    replaying a graph within (cudagraph trees' warm-up path, ``triton.force_cudagraphs_warmup``): a
    replay runs no Python, so neither the region kernels' launches nor the fused attention calls
    would be recorded. The same kernels run, on the same inputs."""
    import torch._inductor.config as config

    if not hasattr(config.triton, "force_cudagraphs_warmup"):
        yield
        return
    with config.patch({"triton.force_cudagraphs_warmup": True}):
        yield


def _mask_source(drawn: dict[int, Any], seeds, device_type: str) -> Callable:
    def mask_of(k, shape, p):
        if k in drawn:
            m = drawn[k]
            return m if tuple(m.shape) == tuple(shape) else m.reshape(shape)
        return inductor_keep(int(seeds[k]), shape, p, device_type)
    return mask_of


def _errors_to_reference(built, mode: str, device: str, compiled: Compiled, drawn: dict, seed: int,
                         count: int, autocast: bool) -> tuple[dict | None, str]:
    """The relative errors of ``compiled``'s step to the eager reference with its masks (Inductor's
    seed vector for the ``count`` dropout calls less the fused attention calls, which replay)."""
    from miner.check.verify import errors

    seeds = seed_vector(seed, count - len(compiled.fused), device).cpu()
    ref, inj = eager_reference(built, mode, device, _mask_source(drawn, seeds, device.split(":")[0]), seed,
                               fused=compiled.fused, autocast=autocast)
    if len(inj.calls) != count:
        return None, f"the reference made {len(inj.calls)} dropout calls, the dry run {count}"
    if inj.unmatched or inj.fused_calls != len(compiled.fused):
        return None, (f"the reference ran {inj.fused_calls} attention calls in a fused kernel, the compiled step "
                      f"{len(compiled.fused)}" + (f" ({inj.unmatched[0]} unmatched)" if inj.unmatched else ""))
    return errors(compiled.observed, ref), ""


def floor_of(built, mode: str, device: str, *, autocast: bool, seed: int, count: int,
             default: Compiled | None = None) -> tuple[dict | None, str]:
    """The default compile's relative errors to the eager reference with Inductor's own masks (and
    its fused attention calls' draws replayed)."""
    default = default or observe_compiled(built, mode, device, autocast=autocast, seed=seed)
    return _errors_to_reference(built, mode, device, default, {}, seed, count, autocast)


def masked_parity(built, compiled: Compiled, *, mode: str, device: str, slots_of: dict[str, list[MaskSlot]],
                  autocast: bool, seed: int = 0, floor: dict | None = None) -> MaskedParity:
    """The "masks injected" parity of one model step (see the module docstring).

    Parameters
    ----------
    built : miner_models.Built
        The model, its inputs and loss.
    compiled : Compiled
        The observed compiled step (:func:`observe_compiled`, the candidates' pass installed, from the
        RNG state ``seed``).
    slots_of : dict
        Pattern id -> :func:`mask_slots` of each candidate whose kernels draw their own stream.
    autocast : bool
        bf16 autocast in the compiled steps (the candidates' patterns hold bf16 casts).
    floor : dict, optional
        The default's errors (:func:`floor_of`), when already measured.
    """
    count = len(dropout_calls(built, mode, device))
    drawn, seeds, problems = recorded_masks(compiled.calls, slots_of)
    if not drawn:
        return MaskedParity(None, "no dropout kernel of the candidates ran in the step", dropouts=count)
    fused = len(compiled.fused)
    if len(seeds) + fused != count:
        return MaskedParity(None, f"the compiled step drew {len(seeds)} seeds and ran {fused} fused attention "
                            f"dropouts for {count} eager dropout calls ({describe_draws(compiled.fused, compiled.repeated)})",
                            recorded=len(drawn), dropouts=count)
    if not bool((seeds.cpu() == seed_vector(seed, len(seeds), device).cpu()).all()):
        problems.append("the recorded seed vector is not the one the step's RNG state draws")
    if problems:
        return MaskedParity(False, "; ".join(problems), recorded=len(drawn), dropouts=count)
    return _against_floor(_Reference(built, mode, device, autocast, seed, count), compiled, drawn, floor)


@dataclass(frozen=True)
class _Reference:
    """What the eager reference of one model step is built from: the model and its inputs, the step's
    mode, device, autocast, RNG seed, and the number of its dropout calls (:func:`dropout_calls`)."""

    built: Any
    mode: str
    device: str
    autocast: bool
    seed: int
    count: int


def _against_floor(ref: _Reference, compiled: Compiled, drawn: dict, floor: dict | None) -> MaskedParity:
    """``compiled``'s errors to the eager reference with its masks (``drawn``: the ones its own kernels
    drew; every other dropout Inductor's) judged against the default's ``floor`` (measured if None)."""
    from miner.check.verify import judge_parity

    built, mode, device, autocast, seed, count = ref.built, ref.mode, ref.device, ref.autocast, ref.seed, ref.count
    fused = len(compiled.fused)
    if floor is None:
        floor, why = floor_of(built, mode, device, autocast=autocast, seed=seed, count=count)
        if floor is None:
            return MaskedParity(None, why, recorded=len(drawn), dropouts=count)
    far = [q for q, v in floor.items() if v is not None and not v <= PARITY_FLOOR_MAX]
    if far:
        return MaskedParity(None, f"the default compile is {floor[far[0]]:.3g} from its own masks injected in "
                            f"{far[0]} (> {PARITY_FLOOR_MAX}): Inductor's stream"
                            + (" or the fused attention kernels' draws" if fused else "") + " not reproduced here",
                            floor=floor, recorded=len(drawn), dropouts=count)
    error, why = _errors_to_reference(built, mode, device, compiled, drawn, seed, count, autocast)
    if error is None:
        return MaskedParity(None, why, floor=floor, recorded=len(drawn), dropouts=count)
    ok, reason = judge_parity(error, floor, atol=atol_for(device))
    return MaskedParity(ok, reason, error, floor, len(drawn), count)


INTERPRETER_ROUNDING = 2.0 ** -6  # the interpreter rounds float32 -> bf16 toward zero (up to 2**-7 relative per store)


def atol_for(device: str) -> dict:
    """``judge_parity``'s atol: ``PARITY_ATOL``, plus one bf16 ulp (relative) where the kernels run
    in the Triton interpreter, which rounds their bf16 stores toward zero (a bias the compiled
    kernels on a GPU do not have; a wrong scale or mask is tens of times larger)."""
    from miner.core.dtypes import PARITY_ATOL
    from miner.runtime.launch import interpreting

    extra = INTERPRETER_ROUNDING if device == "cpu" and interpreting() else 0.0
    return {q: v + extra for q, v in PARITY_ATOL.items()}


def slots_of(cands) -> dict[str, list[MaskSlot]]:
    """Kernel pattern id (what ``launch.run`` records) -> mask slots, for each candidate (a
    ``Candidate``: ``kernel_module`` and ``meta``) whose kernel draws the four-per-call stream."""
    return {c.kernel_module.PATTERN_ID: mask_slots(c.meta["pattern"]) for c in cands
            if getattr(c.kernel_module, "RNG", None) == "philox4"}


def check_model(cand, model_name: str, mode: str, device: str):
    """``miner validate``'s model check for a candidate drawing its own stream: ``model_name``
    (tiny) compiled with only this candidate's pass under bf16 autocast (the patterns' casts come
    from it) on ``device``; the rewrite must fire and :func:`masked_parity` pass. Returns a
    ``miner.check.checks.Check`` (kind ``rewrite``; ``ok=None`` when not judged)."""
    import time

    from miner.check.checks import Check, models_build
    from miner.runtime import rewrite

    from miner.check import knobs

    t0 = time.perf_counter()
    label = f"{model_name}/tiny/{mode} ({METHOD}, bf16 autocast)"
    # the rewrite is what is checked here (a promoted fusion's gate declines these tiny CUDA shapes; the
    # gate is tests/test_gate.py's): held open
    graph_pass = rewrite.FusionPass([rewrite.entry_for(cand.path / "pattern.py", cand.id, cand.pattern_module)],
                                    gate="open")
    # a candidate found in ``<model>@<knob>``'s profile lives in the graph that knob makes: both compiled
    # steps (the candidate's and the default's floor) run under the knob's context
    knob = knobs.of_label(model_name)
    if knob is not None and knob.options:
        return Check("rewrite", label, None, f"{knob.name} sets Inductor options, which this check does not apply: "
                     "judge the candidate in `miner verify --ab --knobs` instead", seconds=0.0, device=device)
    try:
        built = models_build(model_name, mode, device)
        with knobs.holding(knob):
            r = masked_parity(built, observe_compiled(built, mode, device, graph_pass=graph_pass, autocast=True,
                                                      seed=0),
                              mode=mode, device=device, slots_of=slots_of([cand]), autocast=True)
    except Exception as e:  # noqa: BLE001 - a failure to compile or run is a failed check
        return Check("rewrite", label, False, f"{type(e).__name__}: {str(e).splitlines()[0][:300]}",
                     matches=graph_pass.total(), seconds=time.perf_counter() - t0, device=device)
    n = graph_pass.total()
    # A region is the set of nodes one kernel of the *profiled* step computed, outputs included; the tiny
    # step's graph can be cut differently: on the CPU (e.g. the partitioner saves relu's gradient mask in
    # the forward) and on the GPU too (DeBERTa's tiny attention saves the softmax's row max and sum for
    # the backward, interior values of the region at B16 S512). No match here is therefore not judged:
    # the A/B at the profiled shape shows whether it fires there and judges its parity (masks injected).
    ok = None if n == 0 else r.ok
    detail = (f"not judged: the rewrite did not fire in the tiny step (0 matches; its graph can be cut "
              f"differently from the profiled one's){'; judge it with --device cuda' if device == 'cpu' else ''}: "
              f"`miner verify --ab` at the profiled shape shows whether it fires there"
              if n == 0 else f"{n} match(es), {r.recorded} of {r.dropouts} dropouts drawn by the kernel: {r.reason}")
    worst = max((v for v in (r.error or {}).values() if v is not None), default=None)
    return Check("rewrite", label, ok, detail[:400], max_rel=worst, matches=n, seconds=time.perf_counter() - t0,
                 device=device)


def _meta_of(pattern_module) -> dict | None:
    """The ``candidate.json`` (or ``fusion.json``) beside a loaded pattern.py, if it holds the pattern."""
    import json
    from pathlib import Path

    for name in ("candidate.json", "fusion.json"):
        p = Path(pattern_module.__file__).with_name(name)
        if p.is_file():
            meta = json.loads(p.read_text())
            if "pattern" in meta:
                return meta
    return None


MAX_ELEMENTS = 100_000_000  # Inductor's masks reproduced in int64 torch math: ~10 s per 1e8
MAX_ELEMENTS_GPU = 20_000_000_000  # with Triton's own tl.rand on the GPU (t5-base B16 S512: 2.4e9)


JUDGE_BATCH = 2  # the batch of the judge's second try, when the step's own does not fit beside the variants


def ab_judge(built, inputs: dict, modules: dict[str, Any], *, mode: str, device: str, seed: int = 0,
             graph_pass: Callable[[list[str]], Any] | None = None,
             room: Callable[[int], str | None] | None = None) -> Callable | None:
    """For ``miner verify --ab``: ``judge(default_live, live, parity) -> Parity | None``, the "masks
    injected" parity of a variant (None: its own parity stands), its floor the default variant's step
    against its own masks (measured once); None when the step has no dropout and no fusion in
    ``modules`` (name -> pattern module) draws the four-per-call stream.

    - a variant holding a fusion that draws its own stream, or compiled under a knob that does (``Knob.draws``:
      ``philox4_dropout_bits``), alone or with fusions: its recorded masks injected (the direct comparison would
      compare two random streams);
    - a variant of fusions without a knob that draw no stream of their own (a matmul rewrite, a region
      drawing Inductor's numbers), where the float32 reference did not decide (absent, or itself drawing
      other dropout numbers): Inductor's masks injected (``INDUCTOR_METHOD``), instead of a fixed
      tolerance on a bf16 step (issue 31: MT5's matmul rewrites 0.055 against a fixed 0.05); where
      Inductor's masks cannot be reproduced here the variant's own parity stands;
    - every other variant (the default, a knob alone, a knob with such fusions): None.

    ``judge(default_live, live, parity, batch=JUDGE_BATCH)`` judges ``live``'s fusions at a smaller batch
    instead (:func:`smaller_batch_judge`): the default and the fusions (``graph_pass(names)``, gate open)
    compiled afresh at that batch, for when the step's own eager float32 reference does not fit beside the
    A/B's variants (DeBERTa-v2 at B16 S512 on an 80 GB H100). ``room(n)``: why ``n`` more compiles would not
    fit the time budget (None: they would)."""
    import dataclasses

    from miner.check.verify import FLOOR

    def kernel(m):
        k = getattr(m, "_kernel", None)  # a region pattern.py's loader of its kernel.py
        return k() if callable(k) else None

    stream = {f: m for f, m in modules.items() if getattr(kernel(m), "RNG", None) == "philox4"}
    built = dataclasses.replace(built, inputs=inputs)
    calls = dropout_calls(built, mode, device)
    if not stream and not calls:
        return None
    slots, missing = {}, []
    for f, m in stream.items():
        meta = _meta_of(m)
        if meta is None:
            missing.append(f)
        else:
            slots[kernel(m).PATTERN_ID] = mask_slots(meta["pattern"])
    count, elements = len(calls), sum(math.prod(shape) for shape, _ in calls)
    floors: dict = {}

    def judge(default_live, live, parity, batch: int | None = None):
        matches = getattr(live.res, "matches", None)
        # a fusion that matched nothing changed nothing: a variant where none fired runs the default's graph
        # (its own parity stands; DeBERTa's attention region, 0 matches at B16 S512, was judged anyway and
        # the judge ran out of device memory: "not judged" for a graph equal to the default's)
        fired = [f for f in live.res.fusions if matches is None or matches.get(f)]
        knob = getattr(live, "knob", None)
        draws = getattr(knob, "draws", "")  # a knob drawing masks of its own
        own = bool(set(fired) & set(stream)) or bool(draws)
        recorded = {**slots, draws: [KNOB_SLOT]} if draws else slots
        if not own and (not count or not fired or getattr(live.res, "knob", None)
                        or getattr(parity, "judged", "") == FLOOR):
            return None
        if own and missing:
            r = MaskedParity(None, f"{', '.join(missing)}: no pattern nodes beside pattern.py to find the masks")
        elif batch is not None and (why := room(2) if room is not None else None):
            r = MaskedParity(None, f"not judged: {why}")
        elif batch is not None:
            r = smaller_batch_judge(built, graph_pass(list(fired)) if graph_pass is not None else None, mode=mode,
                                    device=device, seed=seed, batch=batch, slots=recorded if own else None, knob=knob)
        elif elements > max_elements(device.split(":")[0]):
            r = MaskedParity(None, f"{elements / 1e6:.0f}M dropout elements per step, beyond the "
                                   f"{max_elements(device.split(':')[0]) / 1e6:.0f}M "
                                   f"whose masks this reference reproduces in plain torch: judge the candidates' masks "
                                   f"with `miner validate <id> --device cuda` (tiny model)")
        else:
            if "floor" not in floors:
                floors["floor"] = floor_of(built, mode, device, autocast=True, seed=seed, count=count,
                                           default=observe_runner((default_live.step, default_live.model), mode,
                                                                  device, seed=seed))
            got = observe_runner((live.step, live.model), mode, device, seed=seed)
            floor, why = floors["floor"]
            if floor is None:
                r = MaskedParity(None, why)
            elif own:
                r = masked_parity(built, got, mode=mode, device=device, slots_of=recorded, autocast=True, seed=seed,
                                  floor=floor)
            else:
                r = _against_floor(_Reference(built, mode, device, True, seed, count), got, {}, floor)
        if not own and r.ok is None and batch is None:  # Inductor's masks not reproduced: its own parity stands
            return None
        method = (METHOD if own else INDUCTOR_METHOD) + (f" at batch {batch}" if batch is not None else "")
        judged = method if r.ok is not None else f"{method} (not judged)"
        return dataclasses.replace(parity, ok=bool(r.ok), judged=judged, floor=r.floor, error=r.error,
                                   reason=r.reason[:300])
    return judge


def first_rows(inputs: dict, batch: int) -> dict | None:
    """``inputs`` cut to their first ``batch`` rows: every tensor whose leading size is the batch (the most
    common leading size among them) is sliced, the rest kept; None when that batch is not above ``batch``."""
    from collections import Counter

    lead = Counter(int(v.shape[0]) for v in inputs.values() if hasattr(v, "shape") and len(v.shape))
    if not lead:
        return None
    size = lead.most_common(1)[0][0]
    if size <= batch:
        return None
    return {k: (v[:batch].contiguous() if hasattr(v, "shape") and len(v.shape) and v.shape[0] == size else v)
            for k, v in inputs.items()}


def smaller_batch_judge(built, fusion_pass, *, mode: str, device: str, seed: int, batch: int, slots: dict | None,
                        knob=None) -> MaskedParity:
    """The masks-injected parity of a variant's fusions at ``batch``: the same model and sequence length,
    its inputs cut to ``batch`` rows, the default and the fusions (``fusion_pass``: a pass of the fusions that
    fired in the step, gate open) compiled afresh, each against the eager float32 step with its masks
    (``slots``: pattern id -> mask slots of the fusions drawing their own stream; None: every mask Inductor's).
    The same kernels and patterns as in the step, at another batch: a wrong scale or a mask the backward does
    not share fails it as in the step. ``knob`` (the variant's ``Knob``): the fusions compiled under it
    (:func:`knob_applied`: a fusion that exists only in the knob's graph, t5's attention regions under the SDPA
    flag, fires there only), held to the default's floor as the step's own judge holds them; a knob drawing masks of its
    own (``Knob.draws``) is judged by them, with or without fusions. Not judged without ``fusion_pass``, or when
    neither a fusion fires at ``batch`` nor the knob draws masks."""
    import dataclasses

    if fusion_pass is None:
        return MaskedParity(None, "not judged: no way to compile the fusions again")
    small = dataclasses.replace(built, inputs=first_rows(built.inputs, batch))
    if small.inputs is None:
        return MaskedParity(None, "not judged: the step's inputs have no larger batch to cut")
    count = len(dropout_calls(small, mode, device))
    # inside the A/B: Dynamo's caches are kept (its variants' compiled frames); the compiles at this batch
    # get their own entries (other shapes, another backend)
    floor, why = floor_of(small, mode, device, autocast=True, seed=seed, count=count,
                          default=observe_compiled(small, mode, device, autocast=True, seed=seed, reset=False))
    if floor is None:
        return MaskedParity(None, why)
    with knob_applied(knob):
        got = observe_compiled(small, mode, device, graph_pass=fusion_pass, autocast=True, seed=seed, gate_open=True,
                               reset=False)
    if not sum(getattr(fusion_pass, "counts", {}).values()) and not getattr(knob, "draws", ""):
        return MaskedParity(None, "no fusion fired: nothing to judge")
    if slots is not None:
        return masked_parity(small, got, mode=mode, device=device, slots_of=slots, autocast=True, seed=seed,
                             floor=floor)
    return _against_floor(_Reference(small, mode, device, True, seed, count), got, {}, floor)
