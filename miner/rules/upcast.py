"""Matmuls whose float32 operands are exact upcasts of bf16/fp16 values: one rule, for mining and the rewrite.

SDPA's math path (taken when an attention bias requires grad, e.g. t5's position bias) converts
bf16 q/k/v to float32 and runs ``aten.bmm.default`` in float32: a cuBLAS FFMA GEMM without tensor
cores. When both operands are exact upcasts of bf16 (or both of fp16) values, the product of two
such numbers is exact in float32, so ``aten.bmm.dtype(a16, b16, torch.float32)`` (a tensor-core GEMM
with float32 accumulation and output) computes the same result up to the order of the float32 sums.

The rule (:func:`check`) reads a graph through one tiny interface, ``node(name) -> NodeRecord``
(``miner.rules.graph``): a ``CapturedGraph`` when mining (``miner.mine.upcast``), ``FxNodes`` (FX nodes
converted on demand) at compile time (``miner.runtime.rewrite.upcast_decision``). A matmul may be
rewritten iff

- its target is ``aten.bmm.default`` or ``aten.mm.default`` and its output is float32 on CUDA
  (``aten.*.dtype`` has no CPU kernel) and the running torch has the ``.dtype`` overload;
- each operand is an exact upcast: walking back from it through :data:`LAYOUT` ops (view, reshape,
  permute, transpose, t, expand, clone, contiguous, alias) and multiplications by the Python scalar
  exactly 1.0, it reaches a float32 ``convert_element_type`` (or ``_to_copy`` changing only the
  dtype) of a bfloat16 or float16 tensor, with no symbolic size on the way;
- both sources have the same dtype.

The demoting variant (``check(..., demote=True)``, candidate ``d...``) takes the matmul where exactly
one operand is such an upcast of bf16 and the other a computed float32 value (t5's PV: the
dropout-scaled probabilities times upcast v), when the float32 output is only ever seen rounded to
bf16 (every use, through layout ops, is a ``convert_element_type`` to bf16): it rounds the float32
operand to bf16 and runs the same ``.dtype`` GEMM. Not exact: each product gains at most one bf16
rounding (2^-9 relative) before the float32 sum, the output is rounded to bf16 anyway, and this is
how SDPA's fused bf16 kernels compute PV (FlashAttention rounds P to the input dtype). bf16 keeps
float32's exponent range, so the rounding cannot overflow; fp16 is declined (a float32 value beyond
65504 would become inf). Its validation bounds the error after the output's rounding against the
float32 GEMM's.

Every refusal is a reason string; nothing here raises on a graph it does not understand.
Mining every float32 matmul of the captured graphs into ``mined/upcasts.json`` is ``miner.mine.upcast``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from miner.core.records import NodeRecord
from miner.rules.graph import Graph

# matmul -> its overload taking an out_dtype (cuBLAS low-precision GEMM, float32 accumulate and output)
MATMULS = {"aten.bmm.default": "aten.bmm.dtype", "aten.mm.default": "aten.mm.dtype"}
LAYOUT = frozenset({
    "aten.view.default", "aten.reshape.default", "aten._unsafe_view.default", "aten.permute.default",
    "aten.transpose.int", "aten.t.default", "aten.expand.default", "aten.clone.default",
    "aten.contiguous.default", "aten.alias.default",
})
UNIT_MULS = frozenset({"aten.mul.Tensor", "aten.mul.Scalar"})
CONVERTS = frozenset({"prims.convert_element_type.default", "aten._to_copy.default"})
LOW = ("bfloat16", "float16")
DEMOTE_TO = ("bfloat16",)  # the demoting rule rounds to these only: float32's exponent range, no overflow
MAX_STEPS = 32  # a longer chain is declined, not walked


@dataclass(frozen=True)
class Upcast:
    """One operand as an exact upcast: its bf16/fp16 ``source`` node and the layout ops to replay on it.

    ``steps`` are the node names from the source outwards, the convert and unit multiplications left out.
    """

    source: str
    dtype: str
    steps: tuple[str, ...]
    demote: str | None = None  # the demoting rule: a float32 ``source`` rounded to this dtype before the GEMM


@dataclass(frozen=True)
class Decision:
    """Whether matmul ``node`` may become ``out_target`` on its operands' sources, and why not."""

    node: str
    target: str
    out_target: str | None
    reasons: tuple[str, ...]
    operands: tuple[Upcast | None, ...] = ()
    applies: bool = True  # a bmm/mm with a float32 output: the rule's subject (others are no candidates)

    @property
    def ok(self) -> bool:
        return not self.reasons


def _dtype(rec: NodeRecord) -> str | None:
    return rec.meta[0].dtype if rec.meta else None


def node_ref(value: Any) -> str | None:
    """The node an argument names (``{"node": name}``), else None."""
    return value["node"] if isinstance(value, dict) and set(value) == {"node"} else None


def _is_unit(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and float(value) == 1.0


def operand_upcast(graph: Graph, name: str, k: int = 0) -> tuple[Upcast | None, str | None]:
    """Operand ``name`` (position ``k``) as an exact upcast, or (None, the reason it is not one)."""
    steps: list[str] = []
    cur = name
    for _ in range(MAX_STEPS):
        rec = graph.node(cur)
        t = rec.target
        if rec.op != "call_function":
            return None, f"operand {k} is {_dtype(rec)} at its source (a graph input, no upcast)"
        first = node_ref(rec.args[0]) if rec.args else None
        if t in LAYOUT:
            if first is None:
                return None, f"operand {k}: {t} of no tensor"
            if len(rec.inputs()) > 1:
                return None, f"operand {k}: {t} has a symbolic size"
            steps.append(cur)
            cur = first
        elif t in UNIT_MULS:
            other = rec.args[1] if len(rec.args) > 1 else None
            if first is None or rec.kwargs:
                return None, f"operand {k}: {t} of no tensor"
            if node_ref(other) is not None:
                return None, f"operand {k}: {t} by a tensor is not exact"
            if not _is_unit(other):
                return None, f"operand {k}: {t} by {other!r} is not exact"
            cur = first  # x * 1.0 == x: left out of the replay
        elif t in CONVERTS:
            return _convert(graph, rec, first, steps, k)
        else:
            return None, f"operand {k} is {_dtype(rec)} at its source ({t}, no upcast)"
    return None, f"operand {k}: more than {MAX_STEPS} layout ops"


def _convert(graph: Graph, rec: NodeRecord, first: str | None, steps: list[str], k: int):
    if first is None:
        return None, f"operand {k}: {rec.target} of no tensor"
    if rec.target == "aten._to_copy.default" and set(rec.kwargs) - {"dtype"}:
        return None, f"operand {k}: {rec.target} changes more than the dtype"
    if _dtype(rec) != "float32":
        return None, f"operand {k}: converts to {_dtype(rec)}, not float32"
    src = _dtype(graph.node(first))
    if src not in LOW:
        return None, f"operand {k} is {src} at its source ({rec.target} from {src} is no bf16/fp16 upcast)"
    return Upcast(first, src, tuple(reversed(steps))), None


def has_overload(target: str) -> bool:
    """True when the running torch has ``target`` (``"aten.bmm.dtype"``)."""
    import torch

    _, op, overload = target.split(".")
    return hasattr(getattr(torch.ops.aten, op, None), overload)


def check(graph: Graph, name: str, demote: bool = False) -> Decision:
    """The rule: may matmul ``name`` of ``graph`` run as a bf16/fp16 GEMM with float32 output?

    Parameters
    ----------
    graph
        Anything with ``node(name) -> NodeRecord``: a ``CapturedGraph`` or ``miner.rules.graph.FxNodes``.
    name : str
        The matmul node.
    demote : bool
        The demoting rule (module docstring): exactly one operand an exact upcast, the other a
        float32 value rounded to its dtype, the output only seen rounded to that dtype. A matmul the
        exact rule takes is no candidate here (``applies`` False), and vice versa.

    Returns
    -------
    Decision
        ``ok`` with both operands' :class:`Upcast`, or every reason it may not (device, torch's
        overload, each operand, mixed source dtypes). ``applies`` is False for what is no candidate
        at all (another op, a matmul whose output is not float32). Never raises on an unknown op.
    """
    rec = graph.node(name)
    out_target = MATMULS.get(rec.target)
    if out_target is None:
        return Decision(name, rec.target, None, (f"{rec.target} is not bmm/mm",), applies=False)
    meta = rec.meta[0] if rec.meta else None
    if meta is None or meta.dtype != "float32":
        return Decision(name, rec.target, out_target,
                        (f"output is {meta.dtype if meta else 'no tensor'}, not float32",), applies=False)
    reasons = []
    if meta.device.split(":")[0] != "cuda":
        reasons.append(f"out_dtype matmul needs CUDA (device {meta.device})")
    if not has_overload(out_target):
        reasons.append(f"torch has no {out_target}")
    operands, whys = [], []
    for k, arg in enumerate(rec.args[:2]):
        ref = node_ref(arg)
        up, why = operand_upcast(graph, ref, k) if ref is not None else (None, f"operand {k} is no tensor")
        operands.append(up)
        whys.append(why)
    if demote:
        return _demote(graph, rec, out_target, reasons, operands, whys, meta)
    reasons += [w for w in whys if w]
    srcs = {u.dtype for u in operands if u is not None}
    if len(srcs) > 1:
        reasons.append(f"operands from {' and '.join(sorted(srcs))} sources")
    reasons += _gemm_size_reasons(graph, rec, meta)
    return Decision(name, rec.target, out_target, tuple(reasons), tuple(operands))


def _demote(graph: Graph, rec: NodeRecord, out_target: str, reasons: list[str], operands: list, whys: list,
            meta) -> Decision:
    """The demoting rule on matmul ``rec`` (see :func:`check`), given the exact rule's operand walk."""
    exact = [u for u in operands if u is not None]
    if len(exact) != 1:
        why = ("both operands are exact upcasts (the exact rule's)" if len(exact) == 2 else
               "no operand is an exact bf16/fp16 upcast: " + "; ".join(w for w in whys if w))
        return Decision(rec.name, rec.target, out_target, (why,), tuple(operands), applies=False)
    low = exact[0].dtype
    if low not in DEMOTE_TO:
        reasons.append(f"rounding a float32 value to {low} can overflow (its largest finite value is 65504; "
                       f"bfloat16 keeps float32's range)")
    k = operands.index(None)
    ref = node_ref(rec.args[k])
    src = graph.node(ref) if ref is not None else None
    if src is None or _dtype(src) != "float32":
        reasons.append(f"operand {k} is {_dtype(src) if src else 'no tensor'}, not a float32 value to round")
    else:
        operands[k] = Upcast(ref, "float32", (), demote=low)
    reasons += _rounded_output_reasons(graph, rec.name, low)
    reasons += _gemm_size_reasons(graph, rec, meta)
    return Decision(rec.name, rec.target, out_target, tuple(reasons), tuple(operands))


def _rounded_output_reasons(graph: Graph, name: str, low: str) -> list[str]:
    """Why the float32 output of ``name`` may be seen unrounded: every use, walked through
    :data:`LAYOUT` ops, must be a convert to ``low`` (no use: a graph output is seen as it is)."""
    todo, seen = [name], 0
    while todo:
        seen += 1
        if seen > MAX_STEPS:
            return [f"output: more than {MAX_STEPS} layout ops before its rounding"]
        rec = graph.node(todo.pop())
        if not rec.users:
            return [f"output: {rec.name} has no users (a graph output is seen unrounded)"]
        for u in rec.users:
            use = graph.node(u)
            if use.target in LAYOUT and node_ref(use.args[0] if use.args else None) == rec.name:
                todo.append(u)
            elif use.target in CONVERTS and not (set(use.kwargs) - {"dtype"}) and _dtype(use) == low:
                continue
            else:
                return [f"output: used unrounded by {use.target} ({use.name}), not only converted to {low}"]
    return []


def _gemm_size_reasons(graph: Graph, rec: NodeRecord, meta) -> list[str]:
    """M, N and K must be known and above 1: Inductor decomposes a GEMM with a size-1 dim into a
    pointwise product (``torch/_inductor/decomposition.py`` ``bmm``/``mm`` under ``pw_cast_for_opmath``)
    whose result it casts back to the inputs' dtype: the float32 output would come back rounded to
    bf16 (found by the property test: K = 1 gave a bf16-rounded product)."""
    ref = node_ref(rec.args[0]) if rec.args else None
    metas = graph.node(ref).meta if ref is not None else ()
    a = metas[0] if metas else None
    if a is None or len(meta.shape) < 2 or not a.shape:
        return ["the GEMM's sizes are unknown"]
    sizes = {"M": meta.shape[-2], "N": meta.shape[-1], "K": a.shape[-1]}
    out = []
    for dim, v in sizes.items():
        if not isinstance(v, int):
            out.append(f"GEMM size {dim} is symbolic ({v})")
        elif v == 1:
            out.append(f"GEMM size {dim} = 1: Inductor decomposes it into a product cast back to the inputs' dtype")
    return out
