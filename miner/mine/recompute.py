"""Values Inductor recomputes in several kernels: small transcendental values broadcast into larger ones.

Inductor inlines a pointwise value into every kernel that reads it unless a heuristic realizes it
(``ir.StorageBox.should_realize_on_reuse``: on CUDA, many reads or a large inner function; the
transcendental-op rule applies to CPU kernels only). A value such as llama's RoPE ``cos``/``sin``
table (``[1, 512, 64]``, computed from the positions and the inverse frequencies) is then recomputed
in each of the 32 RoPE kernels of a 16-layer forward, per element of the ``[16, 32, 512, 64]`` q or k
it multiplies: two libdevice transcendentals per element where a load of a 128 KiB table would do.

The rule (:func:`check`, the same for mining and at compile time: it reads a graph through
``node(name) -> NodeRecord``, a ``CapturedGraph`` or ``miner.mine.upcast.FxNodes``) takes a value when

- its op is a transcendental (:data:`HEAVY`) with a known, static output size;
- walking its users through nodes smaller than :data:`RATIO` times its size (the rest of the small
  table's computation: scaling, dtype casts, views), at least two pointwise nodes each produce
  :data:`RATIO` times its elements or more (broadcast consumers, each of which Inductor would inline
  the value into and recompute it per element; a value as large as its consumers, e.g. bert's GELU
  ``erf`` in the backward, is recomputed more cheaply than written and read back: declined with
  that reason).

Mining (:func:`find`) reports the values the captured node-to-kernel map (``NodeRecord.kernels``, one
entry per kernel call site) shows in two or more kernels, with the rule's verdict;
``mined/recomputed.json`` (``kind: Recomputed``) lists them with their kernels. Inductor
realizes a value once when it passes through ``prims.inductor_force_stride_order`` (its lowering
copies an unrealized input into a buffer, ``ir.ExternKernel.require_strides``): the rewrite that
follows from this report, measured in a model step, is the next step (tests/test_recompute.py
checks the mechanism on Inductor's CPU backend).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Iterable

from miner.core.records import CapturedGraph

KIND, SCHEMA = "Recomputed", 1
RECOMPUTED_FILE = "recomputed.json"  # under mined/
HEAVY = frozenset({"aten.sin.default", "aten.cos.default", "aten.tan.default", "aten.exp.default",
                   "aten.exp2.default", "aten.log.default", "aten.tanh.default", "aten.erf.default",
                   "aten.sigmoid.default"})
RATIO = 8  # a consumer kernel must do at least this many times the value's elements
FORCE = "prims.inductor_force_stride_order.default"  # what the rewrite puts after the value


@dataclass(frozen=True)
class Recomputed:
    """One transcendental value of a captured graph that ended up in several kernel call sites."""

    model: str
    preset: str
    mode: str
    phase: str
    graph: str
    node: str
    target: str
    shape: tuple
    kernels: tuple[str, ...]  # the kernel call sites it is computed in
    consumer_numel: int | None  # the smallest, over those kernels, of the largest output numel in the kernel
    ok: bool  # realizing it once would spare each kernel its recomputation
    reasons: tuple[str, ...] = ()
    module: str | None = None


def _numel(shape) -> int | None:
    return math.prod(shape) if all(isinstance(s, int) for s in shape) else None


@dataclass(frozen=True)
class Decision:
    """Whether value ``node`` should be computed once (``ok``), and why not; ``applies``: a static
    :data:`HEAVY` value at all; ``consumers``: its broadcast consumers."""

    node: str
    reasons: tuple[str, ...]
    applies: bool = True
    consumers: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.applies and not self.reasons


MAX_DEPTH = 6  # users walked from a value (the small table's own computation is a few ops: scale, cast, view)


def check(graph, name: str) -> Decision:
    """The rule on value ``name`` of ``graph`` (anything with ``node(name) -> NodeRecord``). Never raises
    on an op it does not know: such a user is simply not a broadcast consumer."""
    rec = graph.node(name)
    if rec.op != "call_function" or rec.target not in HEAVY or not rec.meta:
        return Decision(name, (f"{rec.target} is no transcendental",), applies=False)
    if any(graph.node(u).target == FORCE for u in rec.users):
        return Decision(name, ("already computed once",), applies=False)  # the pass's second slot
    numel = _numel(rec.meta[0].shape)
    if numel is None:
        return Decision(name, (f"symbolic size {list(rec.meta[0].shape)}",))
    consumers, seen, level, largest = [], {name}, [name], 0
    for _ in range(MAX_DEPTH):
        nxt = []
        for cur in level:
            for u in graph.node(cur).users:
                if u in seen:
                    continue
                seen.add(u)
                use = graph.node(u)
                n = _numel(use.meta[0].shape) if use.meta else None
                if n is None:
                    continue  # the output node, a symbolic size: no consumer to count
                largest = max(largest, n)
                if n >= RATIO * numel:
                    if use.category == "pointwise":
                        consumers.append(u)
                else:
                    nxt.append(u)  # still the small value's own computation
        level = nxt
    if len(consumers) < 2:
        why = (f"{len(consumers)} broadcast consumer(s): nothing to share" if largest >= RATIO * numel else
               f"as large as its consumers ({numel} vs {largest} elements): recomputing is cheaper than a "
               f"round trip through memory")
        return Decision(name, (why,), consumers=tuple(consumers))
    return Decision(name, (), consumers=tuple(consumers))


def find(graph: CapturedGraph) -> list[Recomputed]:
    """Every :data:`HEAVY` value of ``graph`` the kernel map shows in two or more kernel call sites,
    with the rule's verdict (:func:`check`)."""
    by_kernel: dict[str, list] = defaultdict(list)
    for rec in graph.nodes:
        for k in rec.kernels:
            by_kernel[k.name].append(rec)
    out = []
    for rec in graph.nodes:
        if rec.op != "call_function" or rec.target not in HEAVY or not rec.meta:
            continue
        sites = tuple(dict.fromkeys(k.name for k in rec.kernels if k.kind != "extern"))
        if len(sites) < 2:
            continue
        d = check(graph, rec.name)
        largest = [max((_numel(r.meta[0].shape) or 0 for r in by_kernel[s] if r.meta), default=0) for s in sites]
        k = graph.key
        out.append(Recomputed(k.model, k.preset, k.mode, k.phase, k.slug, rec.name, rec.target,
                              tuple(rec.meta[0].shape), sites, min(largest), d.ok, d.reasons, rec.module))
    return out


def mine(graphs: Iterable[CapturedGraph]) -> dict:
    """``mined/recomputed.json``'s payload: every recomputed transcendental value and the rule's verdict."""
    graphs = list(graphs)
    found = [f for g in graphs for f in find(g)]
    return {"schema": SCHEMA, "kind": KIND, "graphs": [str(g.key) for g in graphs],
            "found": [asdict(f) for f in found],
            "counts": {"realizable": sum(f.ok for f in found), "declined": sum(not f.ok for f in found),
                       "kernel_sites": sum(len(f.kernels) for f in found if f.ok)}}


def save(workspace, payload: dict):
    """Write ``mined/recomputed.json`` atomically; returns its path."""
    from miner.core.workspace import write_json

    return write_json(workspace.mined / RECOMPUTED_FILE, payload)


def summary(payload: dict) -> str:
    """One line: which small transcendental values are recomputed in how many kernels."""
    ok = [f for f in payload["found"] if f["ok"]]
    if not ok:
        return "recomputed values: none (no small transcendental value is computed in several kernels)"
    groups: dict[tuple, int] = defaultdict(int)
    for f in ok:
        groups[(f["model"], f["target"].split(".")[1], tuple(f["shape"]))] += len(f["kernels"])
    parts = [f"{m} {op}{list(s)} in {n} kernels" for (m, op, s), n in sorted(groups.items())]
    return (f"recomputed values: {len(ok)} small transcendental values recomputed per element in "
            f"{payload['counts']['kernel_sites']} kernel call sites ({'; '.join(parts)}): computed once, "
            f"those kernels would load them")


def load(path) -> dict:
    """A ``mined/recomputed.json`` (``WorkspaceError`` when missing, corrupt or of another schema)."""
    from miner.core.workspace import read_envelope

    return read_envelope(path, KIND, SCHEMA, "miner mine")


__all__ = ["Decision", "HEAVY", "KIND", "MAX_DEPTH", "RATIO", "RECOMPUTED_FILE", "Recomputed", "SCHEMA", "check",
           "FORCE", "find", "load", "mine", "save", "summary"]
