"""The glue between a pattern module (candidate or fusion) and torch.compile.

A pattern module (``candidates/<id>/pattern.py`` or ``fusions/<name>/pattern.py``) defines
``pattern`` (the subgraph in aten ops), ``replacement`` (a call of its custom op) and
``register(pass_dict)``. This module gives them:

- ``define_op``: the replacement as an op ``miner::<name>`` (``torch.library.Library``) with a fake
  implementation, so the rewritten post-grad graph stays valid and shapes propagate. Outputs are
  always fresh tensors (no aliasing). Defining the same op twice (a module imported under two
  names, e.g. by ``miner bench`` and ``miner validate``) returns the first definition.
- ``FusionPass``: ONE ``CustomGraphPass`` that runs every registered pattern (torch 2.11 accepts a
  single pass object per slot). ``uuid()`` hashes the pattern and kernel sources (and this file), so editing a
  fusion invalidates Inductor's FX graph cache. Each pattern has its own ``PatternMatcherPass``,
  so ``counts[name]`` says how often each one fired.
- ``wins_gate`` / ``decide``: the gate of a promoted fusion's ``extra_check``, delegated to
  ``miner.runtime.gate`` (the rule: ``miner.runtime.evidence.RULE``): on CUDA a fusion fires only
  where in-model A/B records (``fusions/<name>/wins.json`` ``in_model``) showed the model's step
  faster beyond noise; an isolated benchmark never enables a firing alone.
- the pass's ``log`` (``miner.runtime.decisions.DecisionLog``): every declined match with its reason,
  every gate decision, every context seen, per pass.
- ``inductor_options(pass)``: the ``torch.compile(options=...)`` dict. The pass goes in both
  post-grad slots: the *pre* slot runs before Inductor's own pattern passes (on CUDA Inductor
  rewrites ``amax/sub/exp/sum`` into its online-softmax prim there, which would hide the chain),
  the *post* slot is where the patterns were mined. A chain rewritten in the first never matches
  in the second.

Scalars: patterns abstract scalar operands (``mul(x, 0.125)``); ``register_replacement`` binds
them through ``scalar_workaround`` (each slot traced with an unusual value that no structural
constant can equal, which the matcher turns into a ``KeywordArg``), so one pattern matches every
value and passes it to the op.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import operator
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
import torch._inductor.inductor_prims  # noqa: F401 - prims.inductor_random & co., which region patterns call
from torch._inductor.custom_graph_pass import CustomGraphPass

from miner import rules
from miner.core.errors import MinerError
from miner.core.modules import load_module, module_name  # generated pattern.py files call them here too
from miner.runtime import bits, decisions, drawn
from miner.runtime.decisions import CPU_NOT_ASKED, match_vals, record_decline, record_declines  # noqa: F401 (generated files call them here)
from miner.runtime.evidence import FUSION_FILE as WINS_FILE, FUSION_KIND as WINS_KIND, FUSION_SCHEMA as WINS_SCHEMA

log = logging.getLogger(__name__)

GATE_MODES = ("on", "open")  # a pass's gate: decide from the evidence, or fire every CUDA match (A/B)


def interpreter_enabled() -> bool:
    """True when Triton kernels run on CPU tensors (``TRITON_INTERPRET=1`` before triton's import)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


INTERPRET_ENV = "MINER_INTERPRET"  # "1": a user's pass may run its kernels on CPU tensors (interpreted)


def interpret_requested(asked: bool | None = None) -> bool:
    """Whether a pass may run its kernels on CPU tensors: ``asked`` when given, else ``MINER_INTERPRET=1``.

    The Triton interpreter runs a fused kernel ~100x slower than the C++ Inductor makes on the CPU,
    so a user's CPU compile gets interpreted kernels only when it asks (tests and ``miner validate`` do).
    """
    return bool(asked) if asked is not None else os.environ.get(INTERPRET_ENV) == "1"


def scalar_trace_values(n: int) -> dict[str, float]:
    """Values to trace const slots with: unusual floats no dim, flag or literal will ever equal."""
    return {f"c{i}": 0.000123456789 + 0.001 * i for i in range(n)}


def op_schema(n_inputs: int, n_scalars: int, n_outputs: int) -> str:
    """A generated row kernel's op: its tensors, its scalars, and ``packed``: the bool outputs it returns as bits
    (``miner.runtime.bits.pack``'s layout, written by the kernel: :func:`pack_in_kernel`)."""
    params = [f"Tensor x{k}" for k in range(n_inputs)] + [f"float c{c}" for c in range(n_scalars)] + ["int[] packed=[]"]
    ret = "Tensor" if n_outputs == 1 else "(" + ", ".join(["Tensor"] * n_outputs) + ")"
    return f"({', '.join(params)}) -> {ret}"


_OPS: dict[str, Any] = {}
_LIBS: dict[str, Any] = {}  # namespace -> its torch.library.Library (registrations live as long as it does)


def define_op(qualname: str, n_inputs: int, n_scalars: int, n_outputs: int,
              impl: Callable[..., Any], fake: Callable[..., Any]):
    """The custom op ``qualname`` (``"miner::<name>"``): ``impl`` runs the kernel, ``fake`` gives metas.

    Returns the ``OpOverload`` (``torch.ops.miner.<name>.default``).
    """
    schema = op_schema(n_inputs, n_scalars, n_outputs)
    ns, name = qualname.split("::")
    if qualname not in _OPS and hasattr(getattr(torch.ops, ns), name):  # defined by another copy of this module
        _OPS[qualname] = getattr(getattr(torch.ops, ns), name).default
    if qualname in _OPS:
        have = _OPS[qualname]._schema
        if (len(have.arguments), len(have.returns)) != (n_inputs + n_scalars + 1, n_outputs):
            # two pattern modules of one pattern id with other outputs (a candidate is generated from one
            # occurrence's outputs): running one's op for the other's match would be wrong, so refuse
            raise MinerError(f"custom op {qualname} is already defined with {len(have.returns)} output(s) and "
                             f"{len(have.arguments)} argument(s); this module needs {n_outputs} and "
                             f"{n_inputs + n_scalars + 1}: load one of the two per process")
        return _OPS[qualname]
    n_args = n_inputs + n_scalars

    def fresh(outs):
        return outs[0] if n_outputs == 1 else tuple(outs)

    def split(args, kwargs):  # the pattern's arguments, and the outputs asked for as bits
        return args[:n_args], tuple(args[n_args] if len(args) > n_args else kwargs.get("packed", ()))

    def _impl(*args, **kwargs):
        args, packed = split(args, kwargs)
        return fresh(tuple(impl(*args, bits=packed) if packed else impl(*args)))

    def _fake(*args, **kwargs):
        args, packed = split(args, kwargs)
        outs = tuple(torch.empty_like(o, memory_format=torch.contiguous_format) for o in fake(*args))
        return fresh(tuple(o.new_empty((bits.packed_size(o.numel()),), dtype=torch.uint8) if k in packed else o
                           for k, o in enumerate(outs)))

    # a plain ``torch.library.Library`` registration, not ``torch.library.custom_op``: the op runs
    # on the host between Inductor's kernels on every call, and custom_op's Python wrapper costs ~30 us
    # more per call (measured on the CPU: 43.5 vs 12.5 us for an op that allocates one tensor). The op
    # only ever appears in post-grad graphs, after autograd, so it needs no autograd formula.
    if ns not in _LIBS:
        _LIBS[ns] = torch.library.Library(ns, "FRAGMENT")
    lib = _LIBS[ns]
    lib.define(f"{name}{schema}")
    lib.impl(name, _impl, "CompositeExplicitAutograd")
    torch.library.register_fake(qualname, _fake, lib=lib)
    _OPS[qualname] = getattr(getattr(torch.ops, ns), name).default
    return _OPS[qualname]


PACK_CHAIN = (bits.PACK, bits.BITS, bits.REPACK)  # the nodes of ``pack(mask)`` (a knob's, or drawn.fold's)


def pack_in_kernel(graph: torch.fx.Graph) -> int:
    """Each ``pack(mask)`` marked :data:`miner.runtime.bits.IN_KERNEL` whose ``mask`` is a bool output of a
    generated kernel's op (:func:`define_op`) that nothing else reads: the kernel stores that output as bits itself
    (the op's ``packed``), the pack's nodes gone. The mask the backward saves is then written once, at an eighth of
    its bytes, by the kernel that drew it, where a pass of its own read it back (t5's step: 106 launches, 2.0 ms
    on an H100). Only where a knob asks (``philox4_dropout_bits_in_region``): the first such kernel measured slower
    in t5's step than the pass it replaced (H100, 2026-12-08). Declined, and left as it was, where
    :func:`miner.rules.contract.bits_contract` refuses the output. Returns the outputs packed."""
    from miner.rules.contract import bits_contract

    ops = set(_OPS.values())
    done = 0
    for result in [n for n in graph.nodes if n.meta.get(bits.TAG) in PACK_CHAIN and n.meta.get(bits.IN_KERNEL)]:
        sources = bits.sources(result, frozenset(PACK_CHAIN))
        if len(sources) != 1:
            continue
        (mask,) = sources
        op = mask.args[0] if mask.target is operator.getitem else None
        if not (isinstance(op, torch.fx.Node) and op.target in ops and isinstance(mask.args[1], int)
                and not op.kwargs.get("packed")):
            continue
        k = mask.args[1]
        if any(u.meta.get(bits.TAG) not in PACK_CHAIN for u in mask.users) or any(
                g is not mask and g.target is operator.getitem and g.args[1] == k and g.users for g in op.users):
            continue  # the forward reads the mask too
        val = mask.meta.get("val")
        if not isinstance(val, torch.Tensor) or bits_contract(tuple(val.shape), str(val.dtype).removeprefix("torch."),
                                                                "vec"):
            continue
        op.kwargs = {**op.kwargs, "packed": [k]}
        if "eager_input_vals" in op.meta:  # Inductor constrains a custom op's arguments to these (a list by zip)
            args, kwargs = op.meta["eager_input_vals"]
            op.meta["eager_input_vals"] = (args, {**kwargs, "packed": [k]})
        vals = list(op.meta["val"])
        vals[k] = result.meta["val"]
        op.meta["val"] = tuple(vals)
        mask.meta["val"] = result.meta["val"]
        result.replace_all_uses_with(mask)
        bits.erase_unused(result, PACK_CHAIN)
        done += 1
    return done


def match_ok(match, op_name: str, n_inputs: int, input_kinds: Sequence[str], random: bool = False,
             region: bool = False) -> bool:
    """The safety part of every ``extra_check``: :func:`match_reasons`, each reason of a declined
    match counted (:func:`record_decline`). ``op_name`` is the pattern module's ``OP_NAME``;
    ``random``: a region kernel that draws its dropout numbers itself; ``region``: a kernel that
    replaces a whole Inductor kernel (``miner.rules.safety.check_meta``)."""
    reasons = match_reasons(match, n_inputs, input_kinds, random, region, kernel_outputs=op_outputs(op_name))
    record_declines(match, op_name, n_inputs, reasons)
    return not reasons


def device_reasons(vals: Sequence[torch.Tensor], interpret: bool | None = None) -> list[str]:
    """Where the kernel can run: one device, CUDA or the CPU under the Triton interpreter when the
    pass asked for it (``interpret``; None: the applying pass's ``interpret``, True outside a pass)."""
    devices = {v.device for v in vals}
    if len(devices) > 1:
        return [f"device: inputs on several devices {sorted(map(str, devices))}"]
    device = next(iter(devices))
    now = decisions.current()
    if interpret is None:
        interpret = now[0].interpret if now else True
    if device.type == "cpu" and now and getattr(now[0], "match_only", False):
        return []  # a rebuilt capture, matched and never run: no kernel runs anywhere
    if device.type == "cpu" and not interpret:
        return [CPU_NOT_ASKED]
    if device.type == "cpu" and not interpreter_enabled():
        return ["device: CPU tensors need the Triton interpreter (TRITON_INTERPRET=1)"]
    if device.type not in ("cpu", "cuda"):
        return [f"device: {device.type} tensors"]
    return []


def op_outputs(op_name: str) -> int | None:
    """How many tensors the custom op ``op_name`` (defined by :func:`define_op`) returns; None if unknown."""
    op = _OPS.get(op_name)
    return None if op is None else len(op._schema.returns)


def match_reasons(match, n_inputs: int, input_kinds: Sequence[str], random: bool = False,
                  region: bool = False, *, kernel_outputs: int | None = None) -> list[str]:
    """Why the fused op must not replace this match ([] when it may): devices, then
    ``miner.rules.safety.check_match`` (the rules mining applies, the kernel's shape contract
    included; ``random``: the kernel draws the match's random numbers itself; ``region``: it replaces
    a whole Inductor kernel; ``kernel_outputs``: the fused op's outputs, the match's first ones: a
    region's search returns its shared outputs after them). Never raises."""
    from miner.rules import safety

    vals = match_vals(match, n_inputs)
    if vals is None:
        return ["meta: an input is not a tensor"]
    reasons = device_reasons(vals) + (drawn_reasons(match) if random else [])
    return reasons or list(safety.check_match(match, n_inputs, input_kinds, random=random, region=region,
                                              kernel_outputs=kernel_outputs).reasons)


DRAWN_STREAM = ("randomness: a mask the philox4_dropout_bits knob draws (four per Philox call); this kernel draws "
                "another stream")


def drawn_reasons(match) -> list[str]:
    """A match holding a draw :func:`miner.runtime.drawn.fold` gave back: only a region drawing the knob's stream
    (its kernel's ``RNG == "philox4"``) may take it, the kernel of the fusion applying now (``decisions.current``)."""
    if not any(n.meta.get(bits.TAG) == bits.DRAWN for n in match.nodes):
        return []
    now = decisions.current()
    entry = next((e for e in getattr(now[0], "entries", ()) if e.name == now[1]), None) if now else None
    load = getattr(getattr(entry, "module", None), "_kernel", None)
    return [] if callable(load) and getattr(load(), "RNG", None) == "philox4" else [DRAWN_STREAM]


def upcast_decision(node: torch.fx.Node, demote: bool = False):
    """``miner.rules.upcast.check`` on FX matmul ``node``: the rule mining applied to upcast matmuls
    (a ``Decision``: ``ok``, ``reasons``, ``applies``, per operand its source and layout nodes);
    ``demote``: the demoting rule. A graph the rule cannot read declines with the error as its
    reason: a compile never fails here."""
    from miner.rules import upcast
    from miner.rules.graph import FxNodes

    try:
        return upcast.check(FxNodes(node.graph), node.name, demote=demote)
    except Exception as e:  # noqa: BLE001
        return upcast.Decision(node.name, str(node.target), None, (f"rule failed: {type(e).__name__}: {e}",))


def upcast_replace(match, d) -> None:
    """Replace ``match``'s matmul by the ``.dtype`` overload as decision ``d`` (``upcast_decision``, ok)
    says: each exact operand's layout ops replayed on its bf16/fp16 source, a demoted float32 operand
    rounded to its dtype (``prims.convert_element_type``), then ``aten.bmm.dtype`` / ``aten.mm.dtype``
    with a float32 output (``match.replace_by_example``)."""
    nodes = {n.name: n for n in match.output_node().graph.nodes}
    chains = [[nodes[s] for s in u.steps] for u in d.operands]
    casts = [getattr(torch, u.demote) if u.demote else None for u in d.operands]
    op = getattr(torch.ops.aten, d.out_target.split(".")[1]).dtype

    def repl(a, b):
        ops = []
        for t, chain, cast in zip((a, b), chains, casts):
            for n in chain:  # layout ops only: the same on a bf16 tensor as on its float32 copy
                t = n.target(t, *n.args[1:], **n.kwargs)
            ops.append(torch.ops.prims.convert_element_type.default(t, cast) if cast is not None else t)
        return op(ops[0], ops[1], torch.float32)

    match.replace_by_example(repl, [nodes[u.source] for u in d.operands])


def recompute_decision(node: torch.fx.Node):
    """``miner.rules.recompute.check`` on FX node ``node`` (a ``Decision``); a graph the rule cannot
    read declines with the error as its reason."""
    from miner.rules import recompute
    from miner.rules.graph import FxNodes

    try:
        return recompute.check(FxNodes(node.graph), node.name)
    except Exception as e:  # noqa: BLE001
        return recompute.Decision(node.name, (f"rule failed: {type(e).__name__}: {e}",))


def register_op_patterns(pass_dict, patterns, extra_check, handler) -> None:
    """Register ``handler`` for each ``(op, positional arguments, keyword names, x0's position)`` of
    ``patterns`` (a compute-once ``pattern.py``'s ``PATTERNS``): a ``CallFunction`` of that op whose input
    at position ``x0`` is ``KeywordArg("x0")`` and every other argument ``Ignored()``."""
    from torch._inductor.pattern_matcher import CallFunction, Ignored, KeywordArg, register_graph_pattern

    for target, n_args, kwargs, key in patterns:
        _, op, overload = target.split(".")
        args = [KeywordArg("x0") if k == key else Ignored() for k in range(n_args)]
        pattern = CallFunction(getattr(getattr(torch.ops.aten, op), overload), *args, **{k: Ignored() for k in kwargs})
        register_graph_pattern(pattern, extra_check=extra_check, pass_dict=pass_dict)(handler)


def realize_once(node: torch.fx.Node) -> torch.fx.Node:
    """Put ``prims.inductor_force_stride_order`` (same strides: an identity) after ``node`` and move
    every user onto it: Inductor then computes ``node`` into a buffer once (the lowering copies an
    unrealized input) and the kernels that read it load it instead of recomputing it inline."""
    graph = node.graph
    with graph.inserting_after(node):
        once = graph.call_function(torch.ops.prims.inductor_force_stride_order.default,
                                   (node, list(node.meta["val"].stride())))
    once.meta.update(node.meta)
    node.replace_all_uses_with(once, delete_user_cb=lambda u: u is not once)
    return once


# --------------------------------------------------------------------------- the gate
#
# ``wins.json`` (written by ``miner promote`` from ``candidates/<id>/bench.json``) holds the
# isolated GPU timings (``wins`` / ``loses``, per input shapes and dtypes) and, once ``miner verify
# --ab --record`` ran, the in-model A/B records (``in_model``) that decide a firing on CUDA
# (``miner.runtime.evidence.RULE``; isolated rows only keep a bracketed site off).

def load_wins(path: str | Path) -> dict | None:
    """A fusion's ``wins.json`` (its measured verdicts), or None when it has none (unmeasured)."""
    from miner.core.workspace import read_envelope

    path = Path(path)
    if not path.exists():
        return None
    return read_envelope(path, WINS_KIND, WINS_SCHEMA, "miner bench --import <run>/bench.json")


def decide(signature, wins: dict | None, **context) -> tuple[bool, str]:
    """Whether a fusion should fire on inputs ``signature`` (per input ``(shape, dtype name)``), and why:
    ``miner.runtime.gate.decide`` (the rule: ``miner.runtime.evidence.RULE``; an unmeasured context declines).
    ``context``: ``producer_fusable``, ``consumer_fusable``, ``mode``.
    """
    from miner.runtime import gate

    return gate.decide(signature, wins, **context)


def wins_gate(match, wins: dict | None, n_inputs: int) -> bool:
    """The gate part of a fusion's ``extra_check``: ``miner.runtime.gate.wins_gate`` (CPU passes)."""
    from miner.runtime import gate

    return gate.wins_gate(match, wins, n_inputs)


def canonicalize_dims(graph: torch.fx.Graph) -> int:
    """Rewrite every non-negative ``dim`` argument of the graph's reductions (and softmax ops) to
    its canonical negative form (``miner.core.pattern.canonical_dims``, the rule mining and
    generation apply), so a pattern mined with ``dim=-1`` matches ``dim=1`` of a 2-d operand.
    Same computation, other spelling. Returns the number of nodes changed."""
    from miner.core.ops import target_name
    from miner.core.pattern import with_canonical_dims

    changed = 0
    for node in graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        operand = node.args[0] if node.args else None
        val = getattr(operand, "meta", {}).get("val") if isinstance(operand, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor):
            continue
        args, kwargs = with_canonical_dims(target_name(node.target), tuple(node.args), dict(node.kwargs), val.dim())
        if args != tuple(node.args) or kwargs != dict(node.kwargs):
            node.args, node.kwargs = args, kwargs
            changed += 1
    return changed


def free_constants(pattern) -> int:
    """Let each constant node of ``pattern`` (a traced ``PatternExpr``; ``rules.safety.CONSTANT_OPS``: no tensor
    input) have users outside a match (``miner.rules.safety.is_constant``: the same rule for the safety check).

    Inductor's graph holds one node per distinct constant and shares it: t5's ``full([], 0)`` is the
    ``where`` fill of 26 nodes, the ``full([32, 12], 0)`` table is where both position-bias gradients
    accumulate. A traced pattern requires each inner node to have exactly its in-pattern users, so a
    region holding a shared constant never matched, anywhere. A constant is recomputed inside the
    fused op (it reads no tensor), and the matcher erases a matched node only once it has no users, so
    the graph keeps it for the others: the same computation. Returns the number of nodes relaxed."""
    from torch._inductor.pattern_matcher import MULTIPLE, CallFunction, MultiOutputPattern

    from miner.core.ops import target_name
    from miner.rules.safety import CONSTANT_OPS

    seen: set[int] = set()
    relaxed = 0

    def walk(expr) -> None:
        nonlocal relaxed
        if id(expr) in seen:
            return
        seen.add(id(expr))
        if isinstance(expr, MultiOutputPattern):
            for out in expr.outputs:
                if out is not None:
                    walk(out)
            return
        if not isinstance(expr, CallFunction):
            return
        if any(target_name(f) in CONSTANT_OPS for f in expr.fns) and expr.users is not MULTIPLE:
            expr.users = MULTIPLE
            relaxed += 1
        for arg in list(expr.args) + list(expr.kwargs.values()):
            for leaf in arg if isinstance(arg, (list, tuple)) else (arg,):
                walk(leaf)

    walk(pattern)
    return relaxed


@contextlib.contextmanager
def constants_free() -> Iterator[None]:
    """Inside the block every pattern Inductor traces (``pattern_matcher.fx_to_pattern``: at
    registration, and again per match in ``register_replacement``'s shape re-check) has its constants
    freed (:func:`free_constants`). Scoped to miner's own registration and matching: Inductor's passes
    outside it are untouched."""
    import torch._inductor.pattern_matcher as pm

    original = getattr(pm, "fx_to_pattern", None)
    if original is None:  # another torch: patterns as traced (a shared constant keeps its region off)
        yield
        return

    def traced(*args, **kwargs):
        pattern = original(*args, **kwargs)
        free_constants(pattern)
        return pattern

    pm.fx_to_pattern = traced
    try:
        yield
    finally:
        pm.fx_to_pattern = original


@dataclass
class Entry:
    """One pattern module in a FusionPass: its name, module and source files (hashed by uuid)."""

    name: str
    module: ModuleType
    files: tuple[str, ...]


class FusionPass(CustomGraphPass):
    """Runs every entry's pattern over a post-grad graph.

    Attributes
    ----------
    counts : Counter
        Matches per entry made by the compiles *this pass ran in*, in this process. A compile that
        Inductor serves from its FX graph cache (or AOTAutograd's) runs no pass, so its matches are
        not counted: :meth:`cache_hits` says how many compiles since the pass was made were served
        so (their fused ops do run). Set ``TORCHINDUCTOR_FX_GRAPH_CACHE=0`` and
        ``TORCHINDUCTOR_AUTOGRAD_CACHE=0`` to count every compile.
    log : DecisionLog
        What this pass decided (``miner.runtime.decisions``): declines, gate decisions, contexts.
    declined : dict
        Per entry, each reason a match was declined, with how many matches (``log.declined``).
    interpret : bool
        Whether matches on CPU tensors may run the kernels in the Triton interpreter (tests,
        ``miner validate``); False declines them with a reason and one logged warning.
    gate : str
        The in-model gate of its fusions: ``"on"`` (decide from the evidence) or ``"open"`` (every
        CUDA match fires; the decision it would take is still logged: the A/B harness).
    records : dict
        Fusion -> in-model records of this run not yet in its ``wins.json`` (``miner.runtime.evidence``
        ``InModelRecord``); the gate merges them over the file's (hashed by :meth:`uuid`).
    seconds : Counter
        Wall seconds this pass spent, per fusion (matching, its extra checks, the replacement, and the
        graph's re-sort after it), ``"(build)"`` tracing the patterns (once per pass) and ``"(prepare)"``
        its own graph rewrites before matching: what the pass adds to a compile (``miner verify --ab``
        reports it per variant beside the compile time).
    match_only : bool
        The graphs are only matched, never run (a captured graph rebuilt on the CPU,
        ``miner.check.validate.check_captured``): CPU tensors pass the device rule without the interpreter.
        Never for a pass given to ``torch.compile``.
    """

    def __init__(self, entries: Iterable[Entry], *, interpret: bool = True, gate: str = "on",
                 records: dict[str, Sequence[Any]] | None = None, match_only: bool = False):
        if gate not in GATE_MODES:
            raise ValueError(f"gate {gate!r}: one of {GATE_MODES}")
        self.entries = list(entries)
        self.interpret = interpret
        self.match_only = match_only
        self.gate = gate
        self.records = {k: list(v) for k, v in (records or {}).items()}
        self.warned = False
        self.counts: Counter[str] = Counter()
        self.seconds: Counter[str] = Counter()
        self.log = decisions.DecisionLog()
        self._passes: dict[str, Any] | None = None
        self._hits_at_start = _cache_hits()
        self.draws_taken = 0  # masks the philox4_dropout_bits knob drew that a region drew instead (miner.runtime.drawn)
        self.masks_packed = 0  # saved masks a region's kernel stores as bits itself (:func:`pack_in_kernel`)

    @property
    def declined(self) -> dict[str, Counter[str]]:
        """fusion -> reason -> declined matches (``log.declined``)."""
        return self.log.declined

    @contextlib.contextmanager
    def gate_held(self, mode: str = "open") -> Iterator[None]:
        """This pass's gate set to ``mode`` inside the block (a compile run there), restored after."""
        if mode not in GATE_MODES:
            raise ValueError(f"gate {mode!r}: one of {GATE_MODES}")
        before, self.gate = self.gate, mode
        try:
            yield
        finally:
            self.gate = before

    def cache_hits(self) -> int:
        """Compiles in this process served from Inductor's caches since this pass was made: the pass
        did not run for them, so their matches are missing from ``counts``."""
        now = _cache_hits()
        return max(a - b for a, b in zip(now, self._hits_at_start))

    def _build(self) -> dict[str, Any]:
        from torch._inductor.pattern_matcher import PatternMatcherPass

        passes = {}
        for e in self.entries:
            p = PatternMatcherPass(pass_name=f"miner_{e.name}")
            with constants_free():
                e.module.register(p)
            passes[e.name] = p
        return passes

    def __call__(self, graph: torch.fx.Graph) -> None:
        from torch._inductor.pattern_matcher import stable_topological_sort

        t = time.perf_counter()
        if self._passes is None:
            self._passes = self._build()
            t = self._lap("(build)", t)
        canonicalize_dims(graph)
        bits.fold_round_trips(graph)  # a packed mask's forward users read the mask again (patterns see it)
        folds = drawn.fold(graph)  # a mask the philox4_dropout_bits knob drew: its draw back, for a region to take
        t = self._lap("(prepare)", t)
        try:
            for name, p in self._passes.items():
                with decisions.applying(self, name), constants_free():
                    n = p.apply(graph)
                if n:
                    self.counts[name] += n
                    # The matcher inserts the replacement at the pattern's first node; an input defined
                    # later (a dropout mask drawn after the row max) must move above it.
                    stable_topological_sort(graph)
                    graph.eliminate_dead_code()
                t = self._lap(name, t)
        finally:
            if folds:  # the draws no region took: the knob's op draws them again, whatever happened above
                self.draws_taken += drawn.settle(graph, folds)
                stable_topological_sort(graph)
                t = self._lap("(prepare)", t)
        self.masks_packed += pack_in_kernel(graph)
        self._lap("(prepare)", t)

    def _lap(self, what: str, since: float) -> float:
        """Adds the seconds since ``since`` to ``seconds[what]``; returns now."""
        now = time.perf_counter()
        self.seconds[what] += now - since
        return now

    def uuid(self) -> bytes:
        # As torch's get_hash_for_files, but uncached: that one is lru_cached per path tuple, so an
        # edit within one process would keep the old hash.
        # A listed file may be absent (a fusion's wins.json before any GPU run): hashed as absent, so
        # the measurement appearing later changes the uuid too.
        files = tuple(sorted({f for e in self.entries for f in e.files} | {__file__, bits.__file__, drawn.__file__}
                             | set(RULE_FILES) | {EPILOGUE_FILE}))
        h = hashlib.sha256(",".join(e.name for e in self.entries).encode())
        # what a match's decision depends on besides the files: a graph compiled with the kernels
        # interpreted on CPU tensors must never be served to a process without the interpreter
        h.update(repr(decision_state(self)).encode())
        for f in files:
            path = Path(f)
            h.update(path.read_bytes() if path.exists() else f"absent:{path.name}".encode())
        return h.digest()

    def __deepcopy__(self, memo):  # torch.compile deep-copies the inductor config
        return self

    def total(self) -> int:
        return sum(self.counts.values())


def _cache_hits() -> tuple[int, int]:
    """Inductor FX-graph and AOTAutograd cache hits so far in this process (torch's own counters;
    an AOTAutograd hit also counts its graphs' FX-cache hits, so a caller takes the larger delta)."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["fxgraph_cache_hit"]), int(counters["aot_autograd"]["autograd_cache_hit"])


def decision_state(p: FusionPass) -> tuple:
    """What a match's decision reads besides the files (hashed by ``FusionPass.uuid``): the interpreter,
    the pass's ``interpret``, the compile mode, the pass's gate mode and its records of this run."""
    from miner.runtime import gate

    extra = {e.name: p.records.get(e.name) for e in p.entries if p.records.get(e.name)}
    return (("interpreter", interpreter_enabled()), ("interpret", p.interpret),
            ("mode", gate.compile_mode()), ("forced_open", p.gate == "open"),
            ("overlay", sorted((n, repr([getattr(r, "to_json", lambda r=r: r)() for r in rs]))
                               for n, rs in extra.items())))


# The rules every extra check applies (the ``miner.rules`` package: ``match_ok`` -> safety and contract,
# ``upcast_decision`` -> upcast, ``recompute_decision`` -> recompute): a change
# to them must change the pass's uuid, or Inductor's FX graph cache would serve graphs the old rule made.
RULE_FILES = rules.source_files()
EPILOGUE_FILE = str(Path(__file__).with_name("epilogue.py"))  # a GEMM-epilogue fusion's rewrite (its pattern.py imports it)


def inductor_options(graph_pass: FusionPass) -> dict[str, Any]:
    """Options for ``torch.compile(model, options=...)`` that install ``graph_pass``."""
    return {"post_grad_custom_pre_pass": graph_pass, "post_grad_custom_post_pass": graph_pass}


def trace_keeping_reshape(fn, args, *rest, **kwargs):
    """``torch._inductor.pattern_matcher.fwd_only`` with its ``aten.view`` nodes made ``aten.reshape``
    again: the trace decomposes ``reshape`` to ``view``, while the graphs every pattern is matched on
    hold ``reshape`` (``compile_fx`` runs Inductor's ``view_to_reshape`` before the post-grad passes,
    both custom slots included). A pattern with a view inside it (DeBERTa's attention region:
    ``mul -> reshape -> convert``) traced by ``fwd_only`` matches nothing (H100, 2026-12-06: 0 of 24)."""
    from torch._inductor.pattern_matcher import fwd_only

    gm = fwd_only(fn, args, *rest, **kwargs)
    for n in gm.graph.nodes:
        if n.target is torch.ops.aten.view.default:
            n.target = torch.ops.aten.reshape.default
    gm.recompile()
    return gm


def entry_for(pattern_path: str | Path, name: str, module: ModuleType | None = None) -> Entry:
    """An Entry for a pattern module file (its sibling kernel.py and wins.json are hashed too)."""
    path = Path(pattern_path)
    module = module or load_module(path, module_name(path, "pattern"))
    # wins.json may be absent (never timed): hashed as absent, so a measurement appearing later changes the uuid
    files = tuple(str(p) for p in (path, path.with_name("kernel.py"), path.with_name(WINS_FILE)))
    return Entry(name, module, files)


__all__ = ["Entry", "FusionPass", "GATE_MODES", "WINS_FILE", "decide", "define_op", "entry_for", "trace_keeping_reshape",
           "decision_state", "inductor_options", "interpret_requested", "interpreter_enabled", "load_module", "load_wins", "match_ok",
           "match_reasons", "match_vals", "record_decline", "record_declines", "upcast_decision", "canonicalize_dims",
           "module_name", "op_schema", "realize_once", "recompute_decision", "register_op_patterns", "scalar_trace_values",
           "upcast_replace",
           "wins_gate"]
