"""Mined patterns, their occurrences and safety verdicts: the records and their JSON form.

A :class:`Pattern` is a small DAG of aten ops in *canonical order* (a topological order that
depends only on the structure, see ``miner.mine.canon``). Each :class:`PatternNode` holds the op
target and its arguments, encoded as JSON values:

- ``{"input": k}``  the k-th external input of the pattern (a tensor produced outside it),
- ``{"node": j}``   the value of pattern node j (always ``j <`` the node's own index),
- ``{"const": c}``  the c-th abstracted scalar (``mul(x, 0.5)``: the 0.5 is kept per
  occurrence in :attr:`Occurrence.scalars`, so ``mul(x, 0.5)`` and ``mul(x, 0.7071)`` are one
  pattern),
- any other value is a literal *structural* constant and part of the pattern's identity:
  dims lists, ``keepdim``, ``correction``, ``{"dtype": "float32"}``, ``{"device": "cpu"}``,
  ``{"enum": "torch.contiguous_format"}``, ``None``, ...

The pattern's ``id`` is ``"p"`` + the first 10 hex digits of the SHA-1 of :meth:`Pattern.canonical`
(the exact canonical form). Two patterns are the same pattern iff their canonical forms are
equal; ``miner.mine.canon`` guarantees that equal structure gives an equal form.

Reading a pattern as code: :meth:`Pattern.to_source` / :meth:`Pattern.to_fx_function` give a
plain Python function of aten ops (``miner.core.source``, the renderer of every generated file)::

    def pattern(x0, x1, c0):
        v0 = torch.ops.aten.mul.Tensor(x0, c0)
        v1 = torch.ops.aten.exp.default(v0)
        ...
        return (v3,)

and :meth:`Pattern.evaluate` runs it eagerly on tensors.

The file ``mined/patterns.json`` holds a :class:`MiningResult` (versioned by
``PATTERNS_SCHEMA``); :func:`save_patterns` writes it atomically, :func:`load_patterns` /
:func:`load_mining` read it and raise ``WorkspaceError`` naming the file when it is missing,
corrupt or of another schema.

The canonical form (the dims rule, :func:`canonical_form`, :func:`pattern_id`,
:func:`ops_summary`) lives in ``miner.core.canonical``; its names are re-exported here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from miner.core import source
from miner.core.canonical import canonical_form, pattern_id, short_name
from miner.core.canonical import (DIM_TARGETS, canonical_dims, canonical_nodes, dim_position,  # noqa: F401 re-exported
                                  ops_summary, with_canonical_dims)
from miner.core.errors import WorkspaceError
from miner.core.records import GraphKey, KernelRef, to_json
from miner.core.tensors import TensorSpec

PATTERNS_SCHEMA = 1
PATTERNS_FILE = "patterns.json"


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class PatternNode:
    """One op of a pattern.

    Attributes
    ----------
    target : str
        The op, as in ``NodeRecord.target``: ``"aten.sum.dim_IntList"``, ``"operator.getitem"``.
    category : str
        ``"pointwise"``, ``"reduction"`` or ``"view"`` (``operator.getitem`` of a multi-output
        op such as ``var_mean`` is a view here).
    args, kwargs
        Encoded arguments (see the module docstring): ``{"input": k}``, ``{"node": j}``,
        ``{"const": c}`` or a literal structural constant.
    """

    target: str
    category: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        # One in-memory form whatever the source (code or JSON): nested lists become tuples.
        object.__setattr__(self, "args", tuple(_tuple(list(self.args))))
        object.__setattr__(self, "kwargs", {k: _tuple(v) for k, v in self.kwargs.items()})

    @property
    def short(self) -> str:
        """Readable op name: ``aten.sum.dim_IntList`` -> ``sum``, ``operator.getitem`` -> ``getitem``."""
        return short_name(self.target)

    @property
    def is_compute(self) -> bool:
        return self.category in ("pointwise", "reduction")

    def refs(self) -> list[tuple[str, int]]:
        """Every ``("input"|"node"|"const", index)`` reference in args then kwargs (sorted by name)."""
        out: list[tuple[str, int]] = []
        for v in list(self.args) + [self.kwargs[k] for k in sorted(self.kwargs)]:
            _collect_refs(v, out)
        return out


@dataclass(frozen=True)
class Verdict:
    """The safety verdict of one occurrence (``miner.rules.safety.check``).

    ``ok`` is False iff ``reasons`` is non-empty. A reason reads ``"<rule>: <text>"`` (rules:
    users, aliasing, mutation, meta, randomness) and names pattern nodes as ``n<j>`` rather
    than FX names, so equal reasons group across occurrences. ``extra_outputs`` are the
    pattern nodes that are not sinks but whose value is used outside the occurrence: the fused
    op must also return them (accepted up to a cap; beyond it the occurrence is rejected).
    ``notes`` are non-blocking observations (e.g. a reduction that is not over the last dim
    but still fine for a generic kernel).
    """

    ok: bool
    reasons: tuple[str, ...] = ()
    extra_outputs: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.ok

    @staticmethod
    def of(reasons: Iterable[str], extra_outputs: Iterable[int] = (), notes: Iterable[str] = ()) -> "Verdict":
        reasons = tuple(reasons)
        return Verdict(ok=not reasons, reasons=reasons, extra_outputs=tuple(sorted(set(extra_outputs))),
                       notes=tuple(notes))


@dataclass(frozen=True)
class Occurrence:
    """One embedding of a pattern in one captured graph.

    Attributes
    ----------
    graph : GraphKey
        Which graph.
    nodes : tuple[str, ...]
        FX node names, aligned with ``Pattern.nodes``.
    inputs : tuple[str, ...]
        FX names of the producers of the pattern's external inputs, aligned with ``{"input": k}``.
    scalars : tuple
        Values of the ``{"const": c}`` slots, aligned with c.
    outputs : tuple[int, ...]
        Pattern nodes whose values leave the pattern here: its sinks plus any interior node
        used outside (those are also in ``verdict.extra_outputs``).
    input_meta, output_meta : tuple[TensorSpec | None, ...]
        Shape, dtype and stride of each input / each output (aligned with ``outputs``).
    phase : str
        ``forward``, ``backward`` or ``inference`` (from ``graph``).
    verdict : Verdict
        ``miner.rules.safety.check``'s verdict.
    node_kernels : tuple[tuple[str, ...], ...]
        The Inductor kernels each pattern node landed in (empty for views and getitem).
    kernels : tuple[KernelRef, ...]
        The distinct kernels of all its nodes, in first-seen order.
    """

    graph: GraphKey
    nodes: tuple[str, ...]
    inputs: tuple[str, ...] = ()
    scalars: tuple[Any, ...] = ()
    outputs: tuple[int, ...] = ()
    input_meta: tuple[TensorSpec | None, ...] = ()
    output_meta: tuple[TensorSpec | None, ...] = ()
    phase: str = ""
    verdict: Verdict = Verdict(ok=True)
    node_kernels: tuple[tuple[str, ...], ...] = ()
    kernels: tuple[KernelRef, ...] = ()

    @property
    def n_kernels(self) -> int:
        """Number of distinct generated kernels the pattern's nodes landed in (0 if unmapped)."""
        return len(self.kernels)

    @property
    def in_one_kernel(self) -> bool | None:
        """True when one kernel holds every mapped node (Inductor fused it all, recomputing
        producers where needed); None when no node was mapped to a kernel."""
        sets = [set(ks) for ks in self.node_kernels if ks]
        if not sets:
            return None
        return bool(set.intersection(*sets))

    @property
    def recomputed(self) -> tuple[str, ...]:
        """FX nodes of this occurrence that Inductor put in more than one kernel (recomputed)."""
        return tuple(n for n, ks in zip(self.nodes, self.node_kernels) if len(set(ks)) > 1)


@dataclass(frozen=True)
class Support:
    """Where a pattern occurs: the models and the graphs (``str(GraphKey)``) holding it."""

    models: tuple[str, ...] = ()
    graphs: tuple[str, ...] = ()

    @property
    def n_models(self) -> int:
        return len(self.models)

    @property
    def n_graphs(self) -> int:
        return len(self.graphs)


@dataclass(frozen=True)
class Counts:
    """Occurrence counts.

    ``total``: distinct embeddings (distinct node sets); ``non_overlapping``: a greedy maximal
    set of pairwise node-disjoint embeddings (embeddings taken in graph order, each kept if it
    shares no node with one already kept; greedy, not a maximum independent set);
    ``safe``: the non-overlapping ones whose verdict is ok; ``by_phase``: non-overlapping per phase;
    ``bounded``: non-overlapping ones that are a whole fusable region (every input made and every
    output read by a non-fusable op: a matmul, a graph input or output, ...), i.e. a natural
    block such as a GELU between two matmuls rather than a window cut out of a larger region.
    """

    total: int = 0
    non_overlapping: int = 0
    safe: int = 0
    by_phase: dict[str, int] = field(default_factory=dict)
    bounded: int = 0  # non-overlapping occurrences that are a whole fusable region (see mine._bounded)

    @property
    def safe_share(self) -> float:
        return self.safe / self.non_overlapping if self.non_overlapping else 0.0


@dataclass(frozen=True)
class InductorView:
    """How Inductor compiled the pattern's (non-overlapping) occurrences.

    ``kernels_hist``: {number of distinct kernels its nodes landed in -> number of occurrences}
    (keys are strings in JSON). ``one_kernel``: occurrences with one kernel holding all their
    nodes (:attr:`Occurrence.in_one_kernel`; a producer Inductor recomputed in a second kernel
    does not count as a split). ``missed_fusion``: True when most mapped occurrences have no
    such kernel. ``splits``: {"n<i>:<op> -> n<j>:<op>": count} over the split occurrences, the
    pattern edges whose two ends share no kernel (where Inductor split). ``recomputed``:
    occurrences with a node placed in more than one kernel.
    """

    kernels_hist: dict[str, int] = field(default_factory=dict)
    one_kernel: int = 0
    missed_fusion: bool = False
    splits: dict[str, int] = field(default_factory=dict)
    recomputed: int = 0

    @property
    def typical_kernels(self) -> int | None:
        """The most common number of kernels per occurrence (None when nothing was mapped)."""
        if not self.kernels_hist:
            return None
        return int(max(self.kernels_hist.items(), key=lambda kv: (kv[1], -int(kv[0])))[0])


@dataclass(frozen=True)
class Pattern:
    """A mined pattern: its canonical DAG, where it occurs, safety and Inductor's view.

    Attributes
    ----------
    id : str
        ``"p"`` + 10 hex digits of SHA-1 of :meth:`canonical`.
    nodes : tuple[PatternNode, ...]
        Canonical, topological order.
    n_inputs, n_consts : int
        Number of ``{"input": k}`` / ``{"const": c}`` slots.
    outputs : tuple[int, ...]
        The sinks: nodes not used inside the pattern, whose values always leave it.
    extra_outputs : tuple[int, ...]
        Interior nodes that leave the pattern in at least one accepted occurrence (a fused op
        covering every accepted occurrence returns ``outputs + extra_outputs``).
    ops : str
        Readable summary of the compute ops in canonical order: ``"amax -> sub -> exp -> sum -> div"``.
    support, counts, inductor
        See :class:`Support`, :class:`Counts`, :class:`InductorView`.
    rejections : dict[str, int]
        {reason: number of non-overlapping occurrences rejected for it}.
    occurrences : tuple[Occurrence, ...]
        A capped sample of the non-overlapping occurrences (spread over graphs, rejected ones
        included); the counts above cover all of them.
    closed : bool
        False when every occurrence lies inside an occurrence of a larger pattern with the same
        support (only stored when mining keeps non-closed patterns).
    """

    id: str
    nodes: tuple[PatternNode, ...]
    n_inputs: int
    n_consts: int = 0
    outputs: tuple[int, ...] = ()
    extra_outputs: tuple[int, ...] = ()
    ops: str = ""
    support: Support = Support()
    counts: Counts = Counts()
    inductor: InductorView = InductorView()
    rejections: dict[str, int] = field(default_factory=dict)
    occurrences: tuple[Occurrence, ...] = ()
    closed: bool = True

    # ---- identity
    def canonical(self) -> str:
        """The exact canonical form: JSON of (nodes, n_inputs, n_consts, outputs).

        Two patterns are the same iff their canonical forms are equal.
        """
        return canonical_form(self.nodes, self.n_inputs, self.n_consts)

    @property
    def n_compute(self) -> int:
        """Number of pointwise/reduction nodes (views and getitem excluded)."""
        return sum(1 for n in self.nodes if n.is_compute)

    @property
    def all_outputs(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.outputs) | set(self.extra_outputs)))

    # ---- as code
    def to_source(self, name: str = "pattern", scalars: tuple[Any, ...] | None = None,
                  outputs: Iterable[int] | None = None) -> str:
        """Python source of a function of aten ops equivalent to the pattern (``miner.core.source.render``).

        Parameters
        ----------
        name : str
            Function name.
        scalars : tuple, optional
            Values for the const slots, inlined as literals. When None, the slots become
            trailing parameters ``c0, c1, ...`` after the inputs ``x0, x1, ...``.
        outputs : iterable of int, optional
            Which pattern nodes to return (default: :attr:`outputs`), always as a tuple.

        The source uses the name ``torch`` (import it where it is exec'd).
        """
        if scalars is not None and len(scalars) != self.n_consts:
            raise ValueError(f"{self.id}: {self.n_consts} scalars expected, got {len(scalars)}")
        return source.render(self.nodes, self.n_inputs, self.n_consts, self.outputs if outputs is None else outputs,
                             name, scalars)

    def to_fx_function(self, scalars: tuple[Any, ...] | None = None,
                       outputs: Iterable[int] | None = None, name: str = "pattern") -> Callable:
        """The function of :meth:`to_source`, compiled (traceable by ``make_fx`` / ``fx.symbolic_trace``)."""
        return source.compile_function(self.to_source(name, scalars, outputs), name, f"<pattern {self.id}>")

    def evaluate(self, inputs: Iterable[Any], scalars: Iterable[Any] = (),
                 outputs: Iterable[int] | None = None) -> tuple[Any, ...]:
        """Run the pattern eagerly; returns the output values as a tuple (even for one output)."""
        return tuple(self.to_fx_function(scalars=tuple(scalars), outputs=outputs)(*inputs))

    def summary(self) -> str:
        return (f"{self.id} {self.ops} [{self.support.n_models} models, {self.support.n_graphs} graphs, "
                f"{self.counts.non_overlapping} occ, {self.counts.safe} safe]")


@dataclass(frozen=True)
class MiningResult:
    """Everything ``miner mine`` saves: the patterns, the parameters and run statistics."""

    patterns: tuple[Pattern, ...]
    params: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)

    def by_id(self) -> dict[str, Pattern]:
        return {p.id: p for p in self.patterns}


# --------------------------------------------------------------------------- helpers


def _collect_refs(v: Any, out: list[tuple[str, int]]) -> None:
    if isinstance(v, dict) and len(v) == 1:
        (k, x), = v.items()
        if k in ("input", "node", "const") and isinstance(x, int):
            out.append((k, x))
            return
    if isinstance(v, (list, tuple)):
        for x in v:
            _collect_refs(x, out)


# --------------------------------------------------------------------------- JSON


def _tuple(v: Any) -> Any:
    """JSON lists back to tuples, recursively (args, shapes); dicts kept."""
    if isinstance(v, list):
        return tuple(_tuple(x) for x in v)
    if isinstance(v, dict):
        return {k: _tuple(x) for k, x in v.items()}
    return v


def _meta(d: Any) -> TensorSpec | None:
    return None if d is None else TensorSpec.from_json(d)


def verdict_from_json(d: dict) -> Verdict:
    return Verdict(ok=bool(d["ok"]), reasons=tuple(d.get("reasons", ())),
                   extra_outputs=tuple(d.get("extra_outputs", ())), notes=tuple(d.get("notes", ())))


def node_from_json(d: dict) -> PatternNode:
    return PatternNode(target=d["target"], category=d["category"], args=_tuple(d.get("args", [])),
                       kwargs=_tuple(d.get("kwargs", {})))


def occurrence_from_json(d: dict) -> Occurrence:
    return Occurrence(
        graph=GraphKey(**d["graph"]),
        nodes=tuple(d["nodes"]),
        inputs=tuple(d.get("inputs", ())),
        scalars=tuple(d.get("scalars", ())),
        outputs=tuple(d.get("outputs", ())),
        input_meta=tuple(_meta(m) for m in d.get("input_meta", ())),
        output_meta=tuple(_meta(m) for m in d.get("output_meta", ())),
        phase=d.get("phase", ""),
        verdict=verdict_from_json(d.get("verdict", {"ok": True})),
        node_kernels=_node_kernels_from_json(d.get("node_kernels", ()), d.get("kernels", ())),
        kernels=tuple(KernelRef(**k) for k in d.get("kernels", ())),
    )


def _node_kernels_from_json(node_kernels: Any, kernels: Any) -> tuple[tuple[str, ...], ...]:
    # Stored as indices into the occurrence's ``kernels`` (kernel names are long and repeat).
    names = [k["name"] for k in kernels]
    return tuple(tuple(names[x] if isinstance(x, int) else x for x in ks) for ks in node_kernels)


def occurrence_to_json(o: Occurrence) -> dict:
    """:func:`to_json` of an occurrence, with ``node_kernels`` as indices into ``kernels``."""
    d = to_json(o)
    index = {k.name: i for i, k in enumerate(o.kernels)}
    d["node_kernels"] = [[index.get(k, k) for k in ks] for ks in o.node_kernels]
    return d


def pattern_to_json(p: Pattern) -> dict:
    """:func:`to_json` of a pattern, occurrences compacted (:func:`occurrence_to_json`)."""
    d = to_json(p)
    d["occurrences"] = [occurrence_to_json(o) for o in p.occurrences]
    return d


def pattern_from_json(d: dict, prepared: bool = False) -> Pattern:
    """Rebuild a :class:`Pattern` from :func:`to_json` output; checks that the id matches the form, unless
    ``prepared``: a region pattern rewritten for lowering (``miner.generate.region.prepare``, a candidate's
    ``pattern``) keeps the id of the region it was made from."""
    sup, cnt, ind = d.get("support", {}), d.get("counts", {}), d.get("inductor", {})
    p = Pattern(
        id=d["id"],
        nodes=tuple(node_from_json(n) for n in d["nodes"]),
        n_inputs=int(d["n_inputs"]),
        n_consts=int(d.get("n_consts", 0)),
        outputs=tuple(d.get("outputs", ())),
        extra_outputs=tuple(d.get("extra_outputs", ())),
        ops=d.get("ops", ""),
        support=Support(models=tuple(sup.get("models", ())), graphs=tuple(sup.get("graphs", ()))),
        counts=Counts(total=cnt.get("total", 0), non_overlapping=cnt.get("non_overlapping", 0),
                      safe=cnt.get("safe", 0), by_phase=dict(cnt.get("by_phase", {})),
                      bounded=cnt.get("bounded", 0)),
        inductor=InductorView(kernels_hist=dict(ind.get("kernels_hist", {})), one_kernel=ind.get("one_kernel", 0),
                              missed_fusion=bool(ind.get("missed_fusion", False)),
                              splits=dict(ind.get("splits", {})), recomputed=ind.get("recomputed", 0)),
        rejections=dict(d.get("rejections", {})),
        occurrences=tuple(occurrence_from_json(o) for o in d.get("occurrences", ())),
        closed=bool(d.get("closed", True)),
    )
    if not prepared and pattern_id(p.canonical()) != p.id:
        raise ValueError(f"pattern {p.id}: id does not match its canonical form")
    return p


def patterns_path(workspace: Any) -> Path:
    """``<workspace>/mined/patterns.json`` (``workspace``: a ``Workspace`` or a root path)."""
    mined = getattr(workspace, "mined", None)
    return (Path(mined) if mined is not None else Path(workspace) / "mined") / PATTERNS_FILE


def save_patterns(workspace: Any, patterns: Iterable[Pattern], params: dict | None = None,
                  stats: dict | None = None) -> Path:
    """Write ``mined/patterns.json`` atomically (one compact pattern per line); returns its path."""
    from miner.core.workspace import write_text

    result = MiningResult(patterns=tuple(patterns), params=dict(params or {}), stats=dict(stats or {}))
    data = {"schema": PATTERNS_SCHEMA, "kind": "MiningResult",
            "result": {"params": to_json(result.params), "stats": to_json(result.stats),
                       "patterns": [pattern_to_json(p) for p in result.patterns]}}
    # One pattern per line, compact: thousands of patterns stay small and diff line by line.
    head = json.dumps({k: v for k, v in data.items() if k != "result"})[:-1]
    res = data["result"]
    lines = [head + ', "result": {"params": ' + json.dumps(res["params"]) + ', "stats": '
             + json.dumps(res["stats"], separators=(",", ":")) + ', "patterns": [']
    lines += [json.dumps(p, separators=(",", ":")) + ("," if i < len(res["patterns"]) - 1 else "")
              for i, p in enumerate(res["patterns"])]
    lines.append("]}}")
    return write_text(patterns_path(workspace), "\n".join(lines) + "\n")


def load_mining(workspace: Any) -> MiningResult:
    """Read ``mined/patterns.json``; raises ``WorkspaceError`` naming the file if it is unusable."""
    from miner.core.workspace import read_envelope

    path = patterns_path(workspace)
    if not path.exists():
        raise WorkspaceError(f"{path}: no mined patterns yet; run `miner mine` (after `miner scan`)")
    data = read_envelope(path, "MiningResult", PATTERNS_SCHEMA, "miner mine")
    try:
        r = data["result"]
        return MiningResult(patterns=tuple(pattern_from_json(p) for p in r["patterns"]),
                            params=dict(r.get("params", {})), stats=dict(r.get("stats", {})))
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise WorkspaceError(f"{path}: malformed patterns file ({e}); re-run `miner mine`") from None


def load_patterns(workspace: Any) -> list[Pattern]:
    """The patterns of ``mined/patterns.json``, in the saved (ranked) order."""
    return list(load_mining(workspace).patterns)
