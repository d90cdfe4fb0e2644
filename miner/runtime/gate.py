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
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

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

    @staticmethod
    def of_site(site: str, mode: str = "default") -> "Context":
        """The context whose :attr:`site` is ``site`` (a record's key without the mode), in ``mode``.

        Raises
        ------
        ValueError
            When ``site`` is not a site key of static sizes.
        """
        q = parse_site(site)
        if q is None:
            raise ValueError(f"not a site key: {site!r}")
        ctx = Context(tuple((tuple(lo for lo, _ in dims), dtype) for dims, dtype in q.inputs), q.producer_fusable,
                      q.consumer_fusable, mode)
        if ctx.site != site:
            raise ValueError(f"not a site key: {site!r}")
        return ctx


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


def in_model_records(wins: dict | None) -> list[dict]:
    """The in-model A/B records of a fusion: its wins.json ``in_model`` section plus this run's overlay."""
    records = list(((wins or {}).get("in_model") or {}).get("records", ()))
    overlay = OVERLAY.get((wins or {}).get("name", ""), [])
    newer = {_record_key(r) for r in overlay}  # a re-measured model and mode replaces its older record
    return [r for r in records if _record_key(r) not in newer] + overlay


def _record_key(r: dict) -> tuple:
    return (r["model"], r["mode"], r.get("compile", "default"), r.get("preset")) + record_shape(r)


def record_shape(r) -> tuple:
    """(batch, seq) a record or A/B result (dict or object) was measured at; an older one without them
    was measured at its preset's (``miner_models.base.SHAPES``)."""
    get = r.get if isinstance(r, dict) else lambda k: getattr(r, k, None)
    batch, seq = get("batch"), get("seq")
    if batch is None or seq is None:
        try:
            from miner_models.base import SHAPES
        except ImportError:
            SHAPES = {}
        b, s = SHAPES.get(get("preset"), (None, None))
        batch, seq = (b if batch is None else batch), (s if seq is None else seq)
    return batch, seq


def _describe(r: dict) -> str:
    batch, seq = record_shape(r)
    shape = f" B{batch} S{seq}" if batch is not None else ""
    return (f"{r['model']} {r['mode']}/{r.get('compile', 'default')}{shape} {r['speedup']:.3f}x "
            f"(noise +-{100 * r['band']:.1f}%)")


def decide_context(ctx: Context, records: list[dict], isolated: Sequence[tuple] = ()) -> tuple[bool, str]:
    """Fire iff in-model A/B evidence covers ``ctx``: its exact site, else a bracket (:func:`bracket`).

    An exactly measured site: records of ``ctx.mode`` decide; when there are none, records of other
    modes decide only if they agree on a win (then the mode does not matter for this site);
    otherwise decline. A site no record measured: :func:`decide_range` on its sizes (``isolated``:
    the fusion's isolated bench rows, :func:`isolated_rows`).
    """
    covering = [r for r in records if ctx.site in (r.get("contexts") or {})]
    if not covering:
        query = parse_site(ctx.site)
        if query is None:
            return False, UNMEASURED_REASON
        return decide_range(query, ctx.mode, records, isolated)
    same = [r for r in covering if r.get("compile", "default") == ctx.mode]
    pool, note = (same, "") if same else (covering, f" (measured under other modes, not {ctx.mode})")
    losses = [r for r in pool if r["verdict"] in BLOCKING]
    if losses:
        slower = [r for r in losses if r["verdict"] == "loss"]
        failed = [r for r in losses if r["verdict"] != "loss"]
        return False, "; ".join(
            [("step slower in " + "; ".join(map(_describe, slower))) if slower else ""]
            + [("parity failed or not judged in " + "; ".join(map(_describe, failed))) if failed else ""]).strip("; ") + note
    wins = [r for r in pool if r["verdict"] == "win"]
    if not same and len(wins) < len(pool):
        return False, "other modes disagree: " + "; ".join(map(_describe, pool)) + note
    if wins:
        return True, "step faster in " + "; ".join(map(_describe, wins)) + note
    return False, "within noise in " + "; ".join(map(_describe, pool)) + note


UNMEASURED_REASON = "unmeasured in a model: no in-model A/B covers this context (`miner verify --ab --record`)"
BLOCKING = ("loss", "parity-fail")  # a record with one of these verdicts keeps the fusion off around it

# --------------------------------------------------------------------------- beyond the measured shapes

BRACKET_RULE = (
    "fires at a site an in-model A/B measured as a step win (and none as a loss or a parity failure); at an "
    "unmeasured site only when in-model wins of the same class (compile mode, neighbourhood, inputs of the "
    "same dtypes and ranks) bracket it: each size between the smallest and largest measured for that "
    "dimension (a size equal in every win must be equal), no in-model loss or parity failure and no slower "
    "isolated kernel row (where bench rows are recorded) inside that box; one measured shape brackets only "
    "itself; symbolic sizes (dynamic=True) count by the range the compile allows, so an unbounded one declines")


@dataclass(frozen=True)
class Query:
    """A site to decide: per input ``(((lo, hi) per dim), dtype)`` (lo == hi for a static size) and
    its neighbourhood (see :class:`Context`)."""

    inputs: tuple
    producer_fusable: bool
    consumer_fusable: bool

    @staticmethod
    def of(signature, producer_fusable: bool, consumer_fusable: bool) -> "Query":
        """The query of a static signature: per input ``(shape, dtype)``."""
        return Query(tuple((tuple((int(d), int(d)) for d in shape), dtype) for shape, dtype in signature),
                     producer_fusable, consumer_fusable)


_INPUT_RE = re.compile(r"(\w+)\[([0-9,]*)\]")


def parse_site(site: str) -> Query | None:
    """The :class:`Query` of a site key (``float32[8192,768] | producer:fusable consumer:none``); None when
    it does not parse."""
    head, _, hood = site.partition(" | ")
    inputs = []
    for token in head.split():
        m = _INPUT_RE.fullmatch(token)
        if m is None:
            return None
        inputs.append((tuple((int(d), int(d)) for d in m.group(2).split(",") if d), m.group(1)))
    return Query(tuple(inputs), "producer:fusable" in hood, "consumer:fusable" in hood)


def _same_class(q: Query, other: Query) -> bool:
    return (q.producer_fusable, q.consumer_fusable) == (other.producer_fusable, other.consumer_fusable) \
        and len(q.inputs) == len(other.inputs) \
        and all(a[1] == b[1] and len(a[0]) == len(b[0]) for a, b in zip(q.inputs, other.inputs))


def bracket(query: Query, measured: Sequence[Query]) -> tuple[bool, str]:
    """Whether the sizes of ``query`` lie inside those of ``measured`` (the rule :data:`BRACKET_RULE` states).

    Pure. ``measured`` are sites of the same class (neighbourhood, dtypes, ranks: the caller filters).
    For each input ``k`` and dim ``d`` the measured sizes span ``[min, max]``; the query's range (one
    size, or a symbolic size's ``[lo, hi]``) must lie inside it. A size equal in every measurement
    must be equal (a single measured shape brackets only itself).

    Returns
    -------
    (bool, str)
        True and the box in words (``x0 dim 0 in [8, 32]``), or False and the first size outside it
        (``x0 dim 0 = 64 outside measured [8, 32]``).
    """
    if not measured:
        return False, "no measured site of the same class"
    box = _box(measured)
    spans = []
    for k, (dims, _) in enumerate(query.inputs):
        for d, (lo, hi) in enumerate(dims):
            mlo, mhi = box[k][d]
            if lo < mlo or hi > mhi:
                size = str(lo) if lo == hi else f"[{lo}, {_inf(hi)}]"
                return False, f"x{k} dim {d} = {size} outside measured [{mlo}, {mhi}]"
            if mlo != mhi:
                spans.append(f"x{k} dim {d} in [{mlo}, {mhi}]")
    return True, (", ".join(spans) or "the one measured shape") + f" ({len(measured)} measured)"


def _box(measured: Sequence[Query]) -> list[list[tuple[int, int]]]:
    """Per input and dim, the smallest and largest measured size."""
    return [[(min(q.inputs[k][0][d][0] for q in measured), max(q.inputs[k][0][d][1] for q in measured))
             for d in range(len(dims))] for k, (dims, _) in enumerate(measured[0].inputs)]


def _inside(q: Query, box) -> bool:
    return all(box[k][d][0] <= lo and hi <= box[k][d][1]
               for k, (dims, _) in enumerate(q.inputs) for d, (lo, hi) in enumerate(dims))


def _inf(v) -> str:
    return "inf" if v == INF else str(v)


INF = 2 ** 63 - 1  # an unbounded symbolic size


def isolated_rows(wins: dict | None) -> list[tuple[Query, float]]:
    """The fusion's isolated bench rows of ``wins.json`` (``wins`` and ``loses``) as (site query of any
    neighbourhood, speedup over Inductor)."""
    out = []
    for row in list((wins or {}).get("wins") or ()) + list((wins or {}).get("loses") or ()):
        try:
            sig = tuple((tuple(i["shape"]), i["dtype"]) for i in row["inputs"])
            out.append((Query.of(sig, False, False), float(row["speedup_vs_inductor"])))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def decide_range(query: Query, mode: str, records: list[dict], isolated: Sequence[tuple] = ()) -> tuple[bool, str]:
    """Fire at an unmeasured site when in-model wins of its class bracket it (:data:`BRACKET_RULE`).

    Records of ``mode`` only (another compile mode is another class). Pure.
    """
    sites = [(q, r) for r in records if r.get("compile", "default") == mode
             for q in map(parse_site, (r.get("contexts") or {})) if q is not None and _same_class(query, q)]
    wins = [(q, r) for q, r in sites if r["verdict"] == "win"]
    if not wins:
        return False, UNMEASURED_REASON + (f"; no in-model win of this class (dtypes, ranks, neighbourhood, "
                                           f"mode {mode}) to bracket it")
    ok, where = bracket(query, [q for q, _ in wins])
    if not ok:
        return False, f"outside the in-model evidence: {where}"
    box = _box([q for q, _ in wins])
    bad = [r for q, r in sites if r["verdict"] in BLOCKING and _inside(q, box)]
    if bad:
        return False, "bracketed, but slower inside the bracket: " + "; ".join(map(_describe, bad))
    slow = [s for q, s in isolated if s < 1.0 and _same_class(Query(q.inputs, query.producer_fusable,
                                                                     query.consumer_fusable), query)
            and _inside(q, box)]
    if slow:
        return False, f"bracketed, but the kernel alone is slower inside the bracket ({min(slow):.2f}x)"
    return True, "bracketed by in-model wins: " + where + "; " + "; ".join(
        dict.fromkeys(_describe(r) for _, r in wins))


def coverage(records: list[dict], isolated: Sequence[tuple] = ()) -> list[str]:
    """Where the gate fires, in words: per class of measured win sites (mode, neighbourhood, dtypes,
    ranks), the box of sizes it brackets (for ``miner candidates show``)."""
    out = []
    classes: dict[tuple, list[Query]] = {}
    for r in records:
        mode = r.get("compile", "default")
        for site in r.get("contexts") or {}:
            q = parse_site(site)
            if q is not None and r["verdict"] == "win":
                key = (mode, q.producer_fusable, q.consumer_fusable, tuple((len(d), t) for d, t in q.inputs))
                classes.setdefault(key, []).append(q)
    for (mode, prod, cons, ranks), qs in classes.items():
        box = _box(qs)
        sig = " ".join(t + "[" + ",".join(str(lo) if lo == hi else f"{lo}..{hi}" for lo, hi in box[k]) + "]"
                       for k, (_, t) in enumerate(ranks))
        fire, why = decide_range(Query(tuple((tuple(b), t) for b, (_, t) in zip(box, ranks)), prod, cons),
                                 mode, records, isolated)
        hood = f"producer:{'fusable' if prod else 'none'} consumer:{'fusable' if cons else 'none'}"
        out.append(f"{'fires' if fire else 'declines'} at {sig} | {hood} | mode:{mode}"
                   + ("" if fire else f" ({why})"))
    return out


def decide(signature, wins: dict | None, *, producer_fusable: bool = False, consumer_fusable: bool = False,
           mode: str = "default") -> tuple[bool, str]:
    """``decide_context`` for a signature and neighbourhood (pure: no torch, no FX)."""
    signature = tuple((tuple(shape), dtype) for shape, dtype in signature)
    return decide_context(Context(signature, producer_fusable, consumer_fusable, mode), in_model_records(wins),
                          isolated_rows(wins))


def wins_gate(match, wins: dict | None, n_inputs: int, decisions: Counter | None = None) -> bool:
    """The gate part of a fusion's ``extra_check`` (``rewrite.wins_gate`` delegates here).

    CPU tensors pass (interpreter; the timings are GPU timings). On CUDA: ``decide_context`` on the
    match's context (its exact site, else a bracket of measured wins, :data:`BRACKET_RULE`); inputs
    with symbolic sizes (``dynamic=True``) are decided on the range of sizes the compile allows
    (:func:`_symbolic`). While the A/B harness holds the gate open (``forced_open``) every match
    fires. Every decision is counted in ``decisions`` (``rewrite.GATE_DECISIONS``) as ``"<fusion>
    fire|decline <context>: <reason>"`` and in ``OBSERVED``.
    """
    from miner.runtime.rewrite import match_vals

    vals = match_vals(match, n_inputs)
    if vals is None:
        return False
    name = (wins or {}).get("name", "?")
    if not all(isinstance(s, int) for v in vals for s in v.shape):
        if any(v.device.type != "cuda" for v in vals):
            return True
        return _symbolic(match, vals, wins, name, decisions)
    try:
        ctx = context_of(match, vals)
    except Exception as e:  # never break a compile over the neighbourhood: the context says it is unknown
        log.warning("%s: match context failed (%s: %s); deciding without the neighbourhood", name, type(e).__name__, e)
        ctx = Context(tuple((tuple(int(s) for s in v.shape), _dtype_name(v.dtype)) for v in vals), True, True,
                      compile_mode())
    if any(v.device.type != "cuda" for v in vals):
        OBSERVED[(name, ctx, True)] += 1
        return True
    fire, reason = decide_context(ctx, in_model_records(wins), isolated_rows(wins))
    OBSERVED[(name, ctx, fire)] += 1
    forced = FORCE_OPEN["on"]
    if decisions is not None:
        decisions[f"{name} {'fire' if fire else 'decline'} {ctx.key}: {reason}{' [gate forced open]' if forced else ''}"] += 1
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


def _symbolic(match, vals, wins: dict | None, name: str, decisions: Counter | None) -> bool:
    """A CUDA match with symbolic sizes: decided by :func:`decide_range` on the range of sizes the compile
    allows (every dim's :func:`dim_range`); an unbounded range declines with :data:`SYMBOLIC_REASON`,
    counted like a safety decline. With the gate held open it fires (the kernels are size-generic)."""
    from miner.runtime import rewrite

    if FORCE_OPEN["on"]:
        if decisions is not None:
            decisions[f"{name} fire symbolic sizes: {SYMBOLIC_REASON} [gate forced open]"] += 1
        return True
    ranges = [tuple(dim_range(s) for s in v.shape) for v in vals]
    if any(r is None for dims in ranges for r in dims):
        rewrite.record_declines(match, name, len(vals), [SYMBOLIC_REASON])
        return False
    try:
        producer, consumer = neighbourhood(match, len(vals))
    except Exception:  # unknown neighbourhood: the strictest class
        producer = consumer = True
    query = Query(tuple((dims, _dtype_name(v.dtype)) for dims, v in zip(ranges, vals)), producer, consumer)
    fire, reason = decide_range(query, compile_mode(), in_model_records(wins), isolated_rows(wins))
    if decisions is not None:
        decisions[f"{name} {'fire' if fire else 'decline'} symbolic sizes {query.inputs}: {reason}"] += 1
    if not fire:
        rewrite.record_declines(match, name, len(vals), [f"symbolic sizes: {reason}"])
    return fire


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


__all__ = ["BRACKET_RULE", "Context", "Query", "bracket", "coverage", "decide_range", "dim_range",
           "isolated_rows", "neighbourhood", "parse_site", "record_shape", "FORCE_OPEN", "OBSERVED", "OVERLAY", "compile_mode", "context_of", "decide",
           "decide_context", "forced_open", "in_model_records", "merge_records", "observe", "observed_since",
           "wins_gate"]
