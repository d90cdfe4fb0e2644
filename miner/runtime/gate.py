"""The in-model gate: a promoted fusion fires on CUDA only where in-model A/B evidence says the step is faster.

The rule and the evidence live in :mod:`miner.runtime.evidence` (:data:`~miner.runtime.evidence.RULE`):
an isolated benchmark never enables a firing alone; in-model A/B records (``miner verify --ab
--record``, in the fusion's ``wins.json`` ``in_model``) decide, exactly at a measured site and, between
measured wins, by the bracket rule (:data:`~miner.runtime.evidence.BRACKET_RULE`), where isolated rows
may only keep a fusion off. This module is the FX side: it reads a match's :class:`Context` (input
signature, neighbourhood, compile mode) and asks :func:`miner.runtime.evidence.decide`.

The pass applying the fusion (``miner.runtime.decisions.current``) sets the gate's mode (``"on"``,
or ``"open"``: the A/B harness asks "what would it do if it fired", and every CUDA match fires while
the decision it would have taken is still logged), adds the in-model records of its run not yet
written to ``wins.json``, and logs each decision and context. ``wins.json`` is hashed by
``FusionPass.uuid()``, so the cache key covers the evidence. On the CPU (the Triton interpreter:
tests, validation) the gate passes, as the timings do not apply there.
"""

from __future__ import annotations

import logging

from miner.runtime import decisions, evidence
from miner.runtime.evidence import BRACKET_RULE, Context, InModelRecord, Query, isolated_rows

FUSABLE = ("pointwise", "reduction")  # what Inductor fuses into one kernel with a neighbour

log = logging.getLogger(__name__)


def compile_mode() -> str:
    """The mode of the compile in progress, from Inductor's config (torch applies the mode's options)."""
    import torch._inductor.config as config

    return mode_of(bool(getattr(config.triton, "cudagraphs", False)),
                   bool(getattr(config, "max_autotune", False) or getattr(config, "max_autotune_pointwise", False)))


def mode_of(cudagraphs: bool, max_autotune: bool, base: str = "default") -> str:
    """The name the gate gives a compile: ``reduce-overhead`` under CUDA graphs, else ``max-autotune``, else
    ``base``. Pure: the A/B names a record over a knob by it too (``miner.check.ab.knob_mode``)."""
    return "reduce-overhead" if cudagraphs else "max-autotune" if max_autotune else base


def _fusable(node, hops: int = 4) -> bool:
    """A call_function node that is pointwise or a reduction, looking through views and getitem."""
    from miner.core.ops import categorize

    for _ in range(hops):
        if getattr(node, "op", None) != "call_function":
            return False
        target = node.target
        if getattr(target, "__name__", "") == "getitem":
            node = node.args[0]
            continue
        category = categorize(target)
        if category in FUSABLE:
            return True
        if category != "view" or not node.args:
            return False
        node = node.args[0]
    return False


def _consumers_fusable(node, inside: set, hops: int = 4) -> bool:
    for user in getattr(node, "users", ()):
        if user in inside:
            continue
        if _fusable(user, 1):
            return True
        from miner.core.ops import categorize

        if hops > 1 and getattr(user, "op", None) == "call_function" and (
                categorize(user.target) == "view" or getattr(user.target, "__name__", "") == "getitem"):
            if _consumers_fusable(user, inside, hops - 1):
                return True
    return False


def neighbourhood(match, n_inputs: int) -> tuple[bool, bool]:
    """(some input is made by a fusable node, some output feeds one outside the match)."""
    inputs = [match.kwargs.get(f"x{k}") for k in range(n_inputs)]
    inside = set(getattr(match, "nodes", ()) or ())
    producer = any(_fusable(n) for n in inputs if n is not None)
    try:
        outputs = [n for n in match.output_nodes() if n is not None]
    except Exception:  # a match object without the pattern context (tests' stand-ins)
        outputs = list(getattr(match, "outputs", ()))
    return producer, any(_consumers_fusable(n, inside) for n in outputs)


def context_of(match, vals, mode: str | None = None) -> Context:
    """The match's context: ``vals`` are its input metas (``rewrite.match_vals``)."""
    producer, consumer = neighbourhood(match, len(vals))
    signature = tuple((tuple(int(s) for s in v.shape), _dtype_name(v.dtype)) for v in vals)
    return Context(signature, producer, consumer, mode or compile_mode())


def _dtype_name(dtype) -> str:
    from miner.core import dtypes

    return dtypes.name(dtype)


def in_model_records(wins: dict | None, graph_pass=None) -> list[InModelRecord]:
    """The in-model records a fusion's gate reads: its wins.json ``in_model`` section, merged with the
    records of this run the pass ``graph_pass`` holds (a re-measured model and mode replaces the older)."""
    extra = graph_pass.records.get((wins or {}).get("name", ""), ()) if graph_pass is not None else ()
    return evidence.merge(evidence.records_of(wins), extra)


def decide(signature, wins: dict | None, *, producer_fusable: bool = False, consumer_fusable: bool = False,
           mode: str = "default") -> tuple[bool, str]:
    """:func:`miner.runtime.evidence.decide` for a signature and neighbourhood (pure: no torch, no FX)."""
    signature = tuple((tuple(shape), dtype) for shape, dtype in signature)
    return evidence.decide(Context(signature, producer_fusable, consumer_fusable, mode), in_model_records(wins),
                           isolated_rows(wins))


def _active():
    """(pass, its log or None, gate held open) of the pass applying its patterns now."""
    now = decisions.current()
    p = now[0] if now else None
    return p, getattr(p, "log", None), getattr(p, "gate", "on") == "open"


def wins_gate(match, wins: dict | None, n_inputs: int) -> bool:
    """The gate part of a fusion's ``extra_check`` (``rewrite.wins_gate`` delegates here).

    CPU tensors pass (interpreter; the timings are GPU timings). On CUDA: :func:`miner.runtime.evidence.decide`
    on the match's context (its exact site, else a bracket of measured wins, :data:`BRACKET_RULE`); inputs
    with symbolic sizes (``dynamic=True``) are decided on the range of sizes the compile allows
    (:func:`_symbolic`). While the applying pass holds the gate open (``FusionPass.gate == "open"``)
    every match fires. Every decision and context goes into the applying pass's ``log``.
    """
    from miner.runtime.decisions import match_vals

    vals = match_vals(match, n_inputs)
    if vals is None:
        return False
    name = (wins or {}).get("name", "?")
    if not all(isinstance(s, int) for v in vals for s in v.shape):
        if any(v.device.type != "cuda" for v in vals):
            return True
        return _symbolic(match, vals, wins, name)
    try:
        ctx = context_of(match, vals)
    except Exception as e:  # never break a compile over the neighbourhood: the context says it is unknown
        log.warning("%s: match context failed (%s: %s); deciding without the neighbourhood", name, type(e).__name__, e)
        ctx = Context(tuple((tuple(int(s) for s in v.shape), _dtype_name(v.dtype)) for v in vals), True, True,
                      compile_mode())
    p, plog, forced = _active()
    if any(v.device.type != "cuda" for v in vals):
        if plog is not None:
            plog.saw(name, ctx, True)
        return True
    fire, reason = evidence.decide(ctx, in_model_records(wins, p), isolated_rows(wins))
    if plog is not None:
        plog.saw(name, ctx, fire)
        plog.decided(name, ctx.key, fire, reason, forced=forced)
    log.debug("%s %s %s: %s", name, "fire" if fire else "decline", ctx.key, reason)
    return True if forced else fire


SYMBOLIC_REASON = ("symbolic sizes (dynamic shapes) whose range the compile leaves unbounded: in-model evidence "
                   "covers only the sizes it measured (torch._dynamo.mark_dynamic(t, dim, min=, max=) inside them "
                   "lets the bracket rule decide)")


def dim_range(size) -> tuple[int, int] | None:
    """The sizes a dim may take in this compile: ``(n, n)`` for a static size; for a SymInt, the bounds
    its ShapeEnv knows (``bound_sympy``: ``mark_dynamic(..., min=, max=)`` sets them); None when the
    upper bound is infinite or cannot be read."""
    if isinstance(size, int):
        return size, size
    try:
        node = size.node
        vr = node.shape_env.bound_sympy(node.expr)
        lo, hi = vr.lower, vr.upper
        if not (getattr(hi, "is_finite", False) or isinstance(hi, int)) or getattr(hi, "is_integer", True) is False:
            return None
        return int(lo), int(hi)
    except Exception:  # no shape env, an unbacked symbol without bounds, an infinite bound
        return None


def _symbolic(match, vals, wins: dict | None, name: str) -> bool:
    """A CUDA match with symbolic sizes: decided by :func:`miner.runtime.evidence.decide` on the
    :class:`Query` of the sizes the compile allows (every dim's :func:`dim_range`); an unbounded range
    declines with :data:`SYMBOLIC_REASON`, counted like a safety decline. With the gate held open it
    fires (the kernels are size-generic)."""
    from miner.runtime import decisions as rewrite  # record_declines

    p, plog, forced = _active()
    if forced:
        if plog is not None:
            plog.decided(name, "symbolic sizes", True, SYMBOLIC_REASON, forced=True)
        return True
    ranges = [tuple(dim_range(s) for s in v.shape) for v in vals]
    if any(r is None for dims in ranges for r in dims):
        rewrite.record_declines(match, name, len(vals), [SYMBOLIC_REASON])
        return False
    try:
        producer, consumer = neighbourhood(match, len(vals))
    except Exception:  # unknown neighbourhood: the strictest class
        producer = consumer = True
    query = Query(tuple((dims, _dtype_name(v.dtype)) for dims, v in zip(ranges, vals)), producer, consumer,
                  compile_mode())
    fire, reason = evidence.decide(query, in_model_records(wins, p), isolated_rows(wins))
    if plog is not None:
        plog.decided(name, f"symbolic sizes {query.inputs}", fire, reason)
    if not fire:
        rewrite.record_declines(match, name, len(vals), [f"symbolic sizes: {reason}"])
    return fire


def observe(match, name: str, n_inputs: int) -> bool:
    """Log the match's context under ``name`` in the applying pass's log and pass (for ungated
    candidates in an A/B: their in-model records say where they fired)."""
    from miner.runtime.decisions import match_vals

    _, plog, _ = _active()
    vals = match_vals(match, n_inputs)
    if plog is not None and vals is not None and all(isinstance(s, int) for v in vals for s in v.shape):
        plog.saw(name, context_of(match, vals), True)
    return True


__all__ = ["BRACKET_RULE", "SYMBOLIC_REASON", "Context", "Query", "compile_mode", "context_of", "decide", "dim_range",
           "mode_of", "in_model_records", "isolated_rows", "neighbourhood", "observe", "wins_gate"]
