"""The in-model gate: a promoted fusion fires on CUDA only where an in-model A/B showed the step faster.

``miner verify --ab`` compiles each zoo model with each fusion alone (gate forced open: "what would
it do if it fired") and times it against the default compile, alternating steps, with a
default-vs-default control that measures the noise band. ``miner verify --ab --record`` writes
what it saw into the fusion's ``wins.json`` under ``in_model``::

    {"schema": 1, "records": [{"model", "mode", "compile", "preset", "speedup", "band",
      "verdict": "win" | "loss" | "noise", "matches", "contexts": {"<site key>": n}, "gpu", "torch",
      "date", "source"}]}

A *context* is what decides whether a replacement helps: the match's input signature (shapes,
dtypes), its neighbourhood (is any input produced by, or any output consumed by, a pointwise or
reduction node Inductor would have fused into the same kernel; a replacement there splits that
kernel) and the compile mode (``default``, ``reduce-overhead``, ``max-autotune``: read from
Inductor's config while compiling). ``decide_context`` fires only on a context some record
measured as a step win beyond noise and none as a loss; an isolated benchmark (``wins``/``loses``
rows) never enables a firing; an unmeasured context declines with its reason.

``wins.json`` is hashed by ``FusionPass.uuid()``, so the cache key covers the evidence. On the CPU
(the Triton interpreter: tests, validation) the gate passes, as the timings do not apply there.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterator

IN_MODEL_SCHEMA = 1
VERDICTS = ("win", "loss", "noise")
FUSABLE = ("pointwise", "reduction")  # what Inductor fuses into one kernel with a neighbour

log = logging.getLogger(__name__)

# Process state, set only by the A/B harness (``miner verify --ab``):
FORCE_OPEN = {"on": False}  # every CUDA match fires; the decision it would have taken is still counted
OVERLAY: dict[str, list[dict]] = {}  # fusion name -> in-model records not yet in its wins.json (this run)
# (fusion, Context, would fire) -> matches the gate saw in this process (per-variant deltas tell
# which contexts a variant fired in)
OBSERVED: Counter[tuple[str, "Context", bool]] = Counter()


@dataclass(frozen=True)
class Context:
    """Where a match sits: input signature, neighbourhood, compile mode."""

    signature: tuple  # per input (shape tuple, dtype name)
    producer_fusable: bool  # some input is made by a pointwise/reduction node (through views)
    consumer_fusable: bool  # some output feeds a pointwise/reduction node outside the match
    mode: str = "default"

    @property
    def site(self) -> str:
        """The key without the mode: ``float32[8192,768] | producer:fusable consumer:none``."""
        sig = " ".join(f"{d}[{','.join(map(str, s))}]" for s, d in self.signature)
        return (f"{sig} | producer:{'fusable' if self.producer_fusable else 'none'} "
                f"consumer:{'fusable' if self.consumer_fusable else 'none'}")

    @property
    def key(self) -> str:
        return f"{self.site} | mode:{self.mode}"


def compile_mode() -> str:
    """The mode of the compile in progress, from Inductor's config (torch applies the mode's options)."""
    import torch._inductor.config as config

    if getattr(config.triton, "cudagraphs", False):
        return "reduce-overhead"
    if getattr(config, "max_autotune", False) or getattr(config, "max_autotune_pointwise", False):
        return "max-autotune"
    return "default"


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


def context_of(match, vals, mode: str | None = None) -> Context:
    """The match's context: ``vals`` are its input metas (``rewrite.match_vals``)."""
    inputs = [match.kwargs.get(f"x{k}") for k in range(len(vals))]
    inside = set(getattr(match, "nodes", ()) or ())
    producer = any(_fusable(n) for n in inputs if n is not None)
    try:
        outputs = [n for n in match.output_nodes() if n is not None]
    except Exception:  # a match object without the pattern context (tests' stand-ins)
        outputs = list(getattr(match, "outputs", ()))
    consumer = any(_consumers_fusable(n, inside) for n in outputs)
    signature = tuple((tuple(int(s) for s in v.shape), _dtype_name(v.dtype)) for v in vals)
    return Context(signature, producer, consumer, mode or compile_mode())


def _dtype_name(dtype) -> str:
    from miner.core import dtypes

    return dtypes.name(dtype)


def in_model_records(wins: dict | None) -> list[dict]:
    """The in-model A/B records of a fusion: its wins.json ``in_model`` section plus this run's overlay."""
    records = list(((wins or {}).get("in_model") or {}).get("records", ()))
    overlay = OVERLAY.get((wins or {}).get("name", ""), [])
    newer = {_record_key(r) for r in overlay}  # a re-measured model and mode replaces its older record
    return [r for r in records if _record_key(r) not in newer] + overlay


def _record_key(r: dict) -> tuple:
    return r["model"], r["mode"], r.get("compile", "default"), r.get("preset")


def _describe(r: dict) -> str:
    return (f"{r['model']} {r['mode']}/{r.get('compile', 'default')} {r['speedup']:.3f}x "
            f"(noise +-{100 * r['band']:.1f}%)")


def decide_context(ctx: Context, records: list[dict]) -> tuple[bool, str]:
    """Fire iff an in-model A/B covering ``ctx`` made the step faster beyond noise and none slower.

    Records of ``ctx.mode`` decide; when there are none, records of other modes decide only if
    they agree on a win (then the mode does not matter for this site); otherwise decline.
    """
    covering = [r for r in records if ctx.site in (r.get("contexts") or {})]
    if not covering:
        return False, "unmeasured in a model: no in-model A/B covers this context (`miner verify --ab --record`)"
    same = [r for r in covering if r.get("compile", "default") == ctx.mode]
    pool, note = (same, "") if same else (covering, f" (measured under other modes, not {ctx.mode})")
    losses = [r for r in pool if r["verdict"] == "loss"]
    if losses:
        return False, "step slower in " + "; ".join(map(_describe, losses)) + note
    wins = [r for r in pool if r["verdict"] == "win"]
    if not same and len(wins) < len(pool):
        return False, "other modes disagree: " + "; ".join(map(_describe, pool)) + note
    if wins:
        return True, "step faster in " + "; ".join(map(_describe, wins)) + note
    return False, "within noise in " + "; ".join(map(_describe, pool)) + note


def decide(signature, wins: dict | None, *, producer_fusable: bool = False, consumer_fusable: bool = False,
           mode: str = "default") -> tuple[bool, str]:
    """``decide_context`` for a signature and neighbourhood (pure: no torch, no FX)."""
    signature = tuple((tuple(shape), dtype) for shape, dtype in signature)
    return decide_context(Context(signature, producer_fusable, consumer_fusable, mode), in_model_records(wins))


def wins_gate(match, wins: dict | None, n_inputs: int, decisions: Counter | None = None) -> bool:
    """The gate part of a fusion's ``extra_check`` (``rewrite.wins_gate`` delegates here).

    CPU tensors pass (interpreter; the timings are GPU timings). On CUDA: inputs with symbolic
    sizes (``dynamic=True``) decline with :data:`SYMBOLIC_REASON`, counted like a safety decline
    (no A/B measures a size-generic context), or fire while the gate is held open; otherwise ``decide_context`` on the match's context, or fire anyway while the A/B
    harness holds the gate open (``forced_open``). Every decision is counted in ``decisions``
    (``rewrite.GATE_DECISIONS``) as ``"<fusion> fire|decline <context>: <reason>"`` and in
    ``OBSERVED``.
    """
    from miner.runtime.rewrite import match_vals

    vals = match_vals(match, n_inputs)
    if vals is None:
        return False
    name = (wins or {}).get("name", "?")
    if not all(isinstance(s, int) for v in vals for s in v.shape):
        if any(v.device.type != "cuda" for v in vals):
            return True
        return _symbolic(match, name, n_inputs, decisions)
    try:
        ctx = context_of(match, vals)
    except Exception as e:  # never break a compile over the neighbourhood: the context says it is unknown
        log.warning("%s: match context failed (%s: %s); deciding without the neighbourhood", name, type(e).__name__, e)
        ctx = Context(tuple((tuple(int(s) for s in v.shape), _dtype_name(v.dtype)) for v in vals), True, True,
                      compile_mode())
    if any(v.device.type != "cuda" for v in vals):
        OBSERVED[(name, ctx, True)] += 1
        return True
    fire, reason = decide_context(ctx, in_model_records(wins))
    OBSERVED[(name, ctx, fire)] += 1
    forced = FORCE_OPEN["on"]
    if decisions is not None:
        decisions[f"{name} {'fire' if fire else 'decline'} {ctx.key}: {reason}{' [gate forced open]' if forced else ''}"] += 1
    log.debug("%s %s %s: %s", name, "fire" if fire else "decline", ctx.key, reason)
    return True if forced else fire


SYMBOLIC_REASON = ("symbolic sizes (dynamic shapes): in-model evidence is per static shape, "
                   "none measures a size-generic context")


def _symbolic(match, name: str, n_inputs: int, decisions: Counter | None) -> bool:
    """A CUDA match with symbolic sizes: no A/B measured it, so it declines with that reason
    (counted like a safety decline); with the gate held open it fires (the kernels are size-generic)."""
    from miner.runtime import rewrite

    if FORCE_OPEN["on"]:
        if decisions is not None:
            decisions[f"{name} fire symbolic sizes: {SYMBOLIC_REASON} [gate forced open]"] += 1
        return True
    rewrite.record_declines(match, name, n_inputs, [SYMBOLIC_REASON])
    return False


def observe(match, name: str, n_inputs: int) -> bool:
    """Count the match's context under ``name`` in ``OBSERVED`` and pass (for ungated candidates in an A/B)."""
    from miner.runtime.rewrite import match_vals

    vals = match_vals(match, n_inputs)
    if vals is not None and all(isinstance(s, int) for v in vals for s in v.shape):
        OBSERVED[(name, context_of(match, vals), True)] += 1
    return True


@contextlib.contextmanager
def forced_open(on: bool = True) -> Iterator[None]:
    """Hold the gate open (every CUDA match fires) inside the block; decisions are still counted."""
    before = FORCE_OPEN["on"]
    FORCE_OPEN["on"] = on
    try:
        yield
    finally:
        FORCE_OPEN["on"] = before


def observed_since(before: Counter) -> dict[str, dict[Context, int]]:
    """fusion -> {Context: matches} seen since the snapshot ``before`` (a copy of ``OBSERVED``)."""
    out: dict[str, dict[Context, int]] = {}
    for (name, ctx, fire), n in OBSERVED.items():
        d = n - before.get((name, ctx, fire), 0)
        if d:
            out.setdefault(name, {}).setdefault(ctx, 0)
            out[name][ctx] += d
    return out


def merge_records(wins: dict | None, name: str, records: list[dict]) -> dict:
    """``wins`` with ``records`` added to its ``in_model`` section (same model/mode/compile/preset replaced;
    among ``records`` of one such key, the newest by date, the first on a tie: a re-promotion passes the
    candidate's own record first, then the fusion's copy of it).

    A fusion without a wins.json gets a minimal one (no isolated rows).
    """
    from miner.runtime.rewrite import WINS_KIND, WINS_SCHEMA

    base: dict[str, Any] = dict(wins) if wins else {"schema": WINS_SCHEMA, "kind": WINS_KIND, "name": name,
                                                    "wins": [], "loses": []}
    old = list((base.get("in_model") or {}).get("records", ()))
    newest: dict[tuple, dict] = {}
    for r in records:
        k = _record_key(r)
        if k not in newest or str(r.get("date", "")) > str(newest[k].get("date", "")):
            newest[k] = r
    kept = [r for r in old if _record_key(r) not in newest]
    base["in_model"] = {"schema": IN_MODEL_SCHEMA, "records": kept + list(newest.values())}
    return base


__all__ = ["Context", "FORCE_OPEN", "OBSERVED", "OVERLAY", "compile_mode", "context_of", "decide",
           "decide_context", "forced_open", "in_model_records", "merge_records", "observe", "observed_since",
           "wins_gate"]
