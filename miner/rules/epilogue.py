"""A GEMM whose bias and activation cuBLASLt can apply in its epilogue: one rule, for mining and the rewrite.

Inductor runs ``addmm(bias, x, w)`` followed by an activation as a cuBLAS GEMM and a Triton kernel that
reads the GEMM's output back, adds the bias and applies the activation: for gpt2's feed-forward
(8192 x 3072 bf16 at B16 S512) that kernel moves as many bytes as the GEMM writes. ``aten._addmm_activation``
(``use_gelu``) asks cuBLASLt for the bias and the activation in the GEMM's epilogue instead: the output is
written once, activated. On CUDA its GELU is the tanh approximation (``gelu(x, approximate="tanh")``),
its other activation ReLU; on the CPU it applies the erf GELU, so the rewrite is CUDA-only.

The rule (:func:`check`) reads a graph through ``node(name) -> NodeRecord`` (``miner.rules.graph``), like
``miner.rules.upcast``. An ``aten.addmm.default`` may be rewritten iff

- its ``beta`` and ``alpha`` are 1, ``x`` and ``w`` are 2-D, the bias is 1-D with the output's columns,
  every size is concrete, the output is bf16, fp16 or float32, on CUDA;
- what follows it is a *chain*: nodes of :data:`CHAIN_OPS` whose only tensor operands are the GEMM's
  output or other nodes of the chain, ending in one node (the *exit*) whose users are outside it; every
  other node of the chain, the GEMM included, is read only inside it (nothing saved for a backward, no
  second reader of the pre-activation);
- the chain computes a function of the GEMM's output alone that is :data:`ACTIVATIONS`' ``gelu_tanh`` or
  ``relu``: evaluated in float64 at :data:`SAMPLES` points in [-12, 12] and at +-1e3 it agrees with the
  reference within :data:`RTOL` relative (constants written in float32 stay inside it; the erf GELU,
  4.7e-4 away at x = -2.7, does not). Elementwise chains of these ops that agree at every sample compute the
  same function up to that tolerance: a chain that needs another op, another input or a reduction is
  declined, never guessed;
- the exit holds the GEMM's dtype, or is float32 (autocast computes gelu_new's ``pow``/``tanh`` in
  float32) and every user of it converts it to the GEMM's dtype: the epilogue rounds once, where the
  chain rounded the GEMM's output first (so the rewrite is at least as precise as the code it replaces).

Every refusal is a reason string; nothing here raises on a graph it does not understand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from miner.core.records import NodeRecord
from miner.rules.graph import Graph
from miner.rules.upcast import CONVERTS, node_ref  # CONVERTS: aten._to_copy here only when it changes the dtype alone

TARGET = "aten.addmm.default"
DTYPES = ("bfloat16", "float16", "float32")
LAYOUT = frozenset({"aten.view.default", "aten.reshape.default", "aten._unsafe_view.default",
                    "aten.clone.default", "aten.alias.default"})
# the elementwise ops a chain may hold (layout ops act on whole tensors: the identity on a flat sample)
UNARY = {"aten.tanh.default": "tanh", "aten.relu.default": "relu", "aten.neg.default": "neg",
         "aten.sigmoid.default": "sigmoid", "aten.erf.default": "erf", "aten.exp.default": "exp", "aten.reciprocal.default": "reciprocal"}
BINARY = {"aten.mul.Tensor": "mul", "aten.mul.Scalar": "mul", "aten.add.Tensor": "add", "aten.add.Scalar": "add",
          "aten.sub.Tensor": "sub", "aten.sub.Scalar": "sub", "aten.div.Tensor": "div", "aten.div.Scalar": "div",
          "aten.pow.Tensor_Scalar": "pow", "aten.clamp_min.default": "clamp_min"}
ACTIVATION_OPS = frozenset(set(UNARY) - {"aten.neg.default", "aten.reciprocal.default"} | {"aten.clamp_min.default"})
CHAIN_OPS = frozenset(LAYOUT | CONVERTS | set(UNARY) | set(BINARY))
MAX_CHAIN = 24  # a longer chain is declined, not evaluated
SAMPLES = 481
RTOL = 1e-6
DEVICE_REASON = "the epilogue is cuBLASLt's, CUDA only"  # how a decline for the device starts (mining counts them)


def _gelu_tanh(x):
    import torch

    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def _relu(x):
    return x.clamp_min(0.0)


ACTIVATIONS = {"gelu_tanh": _gelu_tanh, "relu": _relu}  # name -> float64 reference; use_gelu = name == gelu_tanh


@dataclass(frozen=True)
class Decision:
    """Whether ``node`` (an addmm) and the chain after it may become one ``_addmm_activation``, and why not.

    ``chain``: the chain's nodes in graph order; ``replaced``: the nodes whose uses the epilogue's output (reshaped
    to each one's shape) takes: the exit, or the exit's converts to the GEMM's dtype."""

    node: str
    reasons: tuple[str, ...]
    activation: str | None = None
    chain: tuple[str, ...] = ()
    replaced: tuple[str, ...] = ()
    applies: bool = True  # an addmm: the rule's subject (other nodes are no candidates)

    @property
    def ok(self) -> bool:
        return not self.reasons

    @property
    def use_gelu(self) -> bool:
        return self.activation == "gelu_tanh"


def _spec(rec: NodeRecord):
    return rec.meta[0] if rec.meta else None


def _concrete(spec) -> bool:
    return spec is not None and all(isinstance(s, int) for s in spec.shape)


def operand_reasons(graph: Graph, rec: NodeRecord) -> list[str]:
    """Why the GEMM ``rec`` (its output one of :data:`DTYPES`) itself may not take an epilogue ([]: it may)."""
    out = _spec(rec)
    reasons = []
    if (out.device or "").split(":")[0] != "cuda":
        reasons.append(f"{DEVICE_REASON} (the CPU's _addmm_activation applies the erf GELU; device {out.device})")
    if any(float(rec.kwargs.get(k, 1)) != 1.0 for k in ("beta", "alpha")) or len(rec.args) > 3:
        reasons.append("beta or alpha is not 1")
    refs = [node_ref(a) for a in rec.args[:3]]
    if len(refs) < 3 or None in refs:
        return reasons + ["an operand is no tensor"]
    bias, x, w = (_spec(graph.node(r)) for r in refs)
    if not all(_concrete(s) for s in (bias, x, w, out)):
        return reasons + ["a symbolic size"]
    if len(x.shape) != 2 or len(w.shape) != 2:
        reasons.append("x or w is not 2-D")
    if len(bias.shape) != 1 or bias.shape[0] != out.shape[-1]:
        reasons.append(f"bias {list(bias.shape)} is not 1-D over the {out.shape[-1]} columns")
    if {bias.dtype, x.dtype, w.dtype} != {out.dtype}:
        reasons.append(f"operands {bias.dtype}, {x.dtype}, {w.dtype} for a {out.dtype} output")
    return reasons


def chain_of(graph: Graph, name: str) -> tuple[list[str], str | None, str | None]:
    """(the chain's nodes, its exit, None) or ([], None, why there is no chain) after GEMM ``name``.

    The chain is every node of :data:`CHAIN_OPS` computable from the GEMM's output alone: grown from the GEMM, a
    user joins once every tensor it reads is the GEMM or already in the chain (a residual add, a dropout mask, a
    second input keep it out: it reads the chain from outside). A convert to the GEMM's own dtype of a float32
    value of the chain stays out too: it is the exit's reader, the node the epilogue's output replaces."""
    low = _spec(graph.node(name)).dtype
    inside: dict[str, NodeRecord] = {name: graph.node(name)}
    grown = True
    while grown:
        grown = False
        for user in sorted({u for rec in list(inside.values()) for u in rec.users} - set(inside)):
            rec = graph.node(user)
            if (rec.op != "call_function" or rec.target not in CHAIN_OPS or _reads_low(rec, low, inside)
                    or set(rec.kwargs) - ({"dtype"} if rec.target in CONVERTS else set())
                    or any(r not in inside for _, r in rec.inputs())):
                continue  # a reader from outside the chain
            inside[user] = rec
            grown = True
            if len(inside) > MAX_CHAIN + 1:
                return [], None, f"a chain of more than {MAX_CHAIN} ops"
    if len(inside) == 1:
        return [], None, "no elementwise op follows"
    exits = [n for n, rec in inside.items() if any(u not in inside for u in rec.users)]
    if exits == [name] or not exits:  # the chain's values unused (dead code)
        return [], None, "nothing reads the chain"
    if len(exits) > 1:
        pre = [n for n in exits if _layout_of(graph, n, name)]
        readers = sorted({u for n in (pre or exits) for u in graph.node(n).users if u not in inside})
        return [], None, (f"the pre-activation is read outside the chain (by {', '.join(readers[:3])}): saved for a "
                          f"backward or used again" if pre else
                          f"{len(exits)} values of the chain are read outside it ({', '.join(exits[:3])}): one "
                          f"epilogue output cannot replace them")
    return _topological(inside, name), exits[0], None


def _layout_of(graph: Graph, node: str, gemm: str) -> bool:
    """Whether ``node`` is the GEMM's output itself or a layout op (view, convert) of it."""
    for _ in range(MAX_CHAIN):
        if node == gemm:
            return True
        rec = graph.node(node)
        if rec.target not in LAYOUT | CONVERTS or not rec.args or node_ref(rec.args[0]) is None:
            return False
        node = node_ref(rec.args[0])
    return False


def _topological(inside: dict, first: str) -> list[str]:
    """The chain's nodes (``first`` left out) with each after the nodes it reads."""
    done, order = {first}, []
    pending = [n for n in inside if n != first]
    while pending:
        ready = [n for n in pending if all(r in done for _, r in inside[n].inputs())]
        if not ready:  # never on a graph (a DAG): the rest in the order found rather than a loop
            return order + pending
        order += ready
        done.update(ready)
        pending = [n for n in pending if n not in done]
    return order


def _reads_low(rec: NodeRecord, low: str, inside: dict) -> bool:
    """A convert to the GEMM's dtype of a float32 value of the chain: the chain's reader, not part of it."""
    if rec.target not in CONVERTS:
        return False
    src = node_ref(rec.args[0]) if rec.args else None
    spec = _spec(rec)
    return spec is not None and spec.dtype == low and src in inside and _spec(inside[src]).dtype != low


def evaluate(graph: Graph, gemm: str, chain: list[str], exit_: str, x) -> tuple[Any, str | None]:
    """The chain's exit as a function of the GEMM's output, evaluated on the float64 sample ``x`` (a 1-D tensor),
    or (None, why it cannot be)."""
    import torch

    vals = {gemm: x}
    for name in chain:
        rec = graph.node(name)
        t = rec.target
        args = [vals[r] if (r := node_ref(a)) is not None else a for a in rec.args]
        if t in LAYOUT or t in CONVERTS:
            vals[name] = args[0]
        elif t in UNARY and len(args) == 1 and not rec.kwargs:
            vals[name] = getattr(torch, UNARY[t])(args[0])
        elif t in BINARY and len(args) == 2 and not rec.kwargs:
            a, b = args
            if not all(isinstance(v, torch.Tensor) or _number(v) for v in (a, b)):
                return None, f"{name}: {t} of {a!r}, {b!r}"
            vals[name] = _binary(BINARY[t], a, b)
        else:
            return None, f"{name}: {t} with arguments {rec.args!r}{' ' + repr(rec.kwargs) if rec.kwargs else ''}"
    return vals[exit_], None


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _binary(op: str, a, b):
    """``torch.<op>(a, b)`` (mul, add, sub, div, pow, clamp_min), a Python number first made a float64 tensor."""
    import torch

    return getattr(torch, op)(a if isinstance(a, torch.Tensor) else torch.as_tensor(a, dtype=torch.float64), b)


def samples():
    """The float64 points every chain is evaluated at: [-12, 12] and the tails +-1e3."""
    import torch

    return torch.cat([torch.linspace(-12.0, 12.0, SAMPLES, dtype=torch.float64),
                      torch.tensor([-1e3, -50.0, 50.0, 1e3], dtype=torch.float64)])


def identify(graph: Graph, gemm: str, chain: list[str], exit_: str) -> tuple[str | None, str | None]:
    """(the activation the chain computes, None) or (None, why none of :data:`ACTIVATIONS` is it)."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():  # a compile's graph pass runs under its fake mode: these are real numbers
        x = samples()
        got, why = evaluate(graph, gemm, chain, exit_, x)
        if why:
            return None, why
        if not isinstance(got, torch.Tensor) or got.shape != x.shape:
            return None, "the chain is not elementwise in the GEMM's output"
        worst = {}
        for name, ref in ACTIVATIONS.items():
            want = ref(x)
            err = ((got - want).abs() / want.abs().clamp_min(1.0)).max().item()
            if err <= RTOL:
                return name, None
            worst[name] = err
    return None, "computes none of " + ", ".join(f"{k} (off by {v:.2g})" for k, v in worst.items())


def check(graph: Graph, name: str) -> Decision:
    """The rule: may addmm ``name`` of ``graph`` and the chain after it run as one ``_addmm_activation``?

    Parameters
    ----------
    graph
        Anything with ``node(name) -> NodeRecord``: a ``CapturedGraph`` or ``miner.rules.graph.FxNodes``.
    name : str
        The addmm node.

    Returns
    -------
    Decision
        ``ok`` with the activation, the chain and the nodes the epilogue's output replaces, or every reason it may
        not. ``applies`` is False for what is no candidate at all (another op, an addmm followed by no chain of
        these ops). Never raises on an unknown op.
    """
    rec = graph.node(name)
    if rec.target != TARGET:
        return Decision(name, (f"{rec.target} is not addmm",), applies=False)
    out = _spec(rec)
    if out is None or out.dtype not in DTYPES:
        return Decision(name, (f"output is {out.dtype if out else 'no tensor'}, not one of {', '.join(DTYPES)}",),
                        applies=False)
    reasons = operand_reasons(graph, rec)
    chain, exit_, why = chain_of(graph, name)
    if why:
        return Decision(name, tuple(reasons + [why]), applies=why != "no elementwise op follows")
    if not any(graph.node(n).target in ACTIVATION_OPS for n in chain):
        return Decision(name, tuple(reasons + ["no activation follows"]), chain=tuple(chain), applies=False)
    activation, why = identify(graph, name, chain, exit_)
    if why:
        return Decision(name, tuple(reasons + [why]), chain=tuple(chain))
    replaced, why = _replaced(graph, name, exit_)
    if why:
        reasons.append(why)
    return Decision(name, tuple(reasons), activation, tuple(chain), replaced)


def _replaced(graph: Graph, gemm: str, exit_: str) -> tuple[tuple[str, ...], str | None]:
    low = _spec(graph.node(gemm)).dtype
    ex = graph.node(exit_)
    if _spec(ex) is None or not _concrete(_spec(ex)):
        return (), "the chain's output has no concrete shape"
    if _spec(ex).dtype == low:
        return (exit_,), None
    readers = [graph.node(u) for u in ex.users]
    if readers and all(r.target in CONVERTS and _spec(r) is not None and _spec(r).dtype == low for r in readers):
        return tuple(r.name for r in readers), None
    return (), (f"the activation is read in {_spec(ex).dtype} (by {', '.join(r.name for r in readers[:3])}): "
                f"the epilogue writes {low}")


__all__ = ["ACTIVATIONS", "DEVICE_REASON", "Decision", "TARGET", "chain_of", "check", "identify"]
