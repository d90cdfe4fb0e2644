"""The evidence that decides a firing: in-model A/B records, where they live, and the rule that reads them.

One rule, stated once (:data:`RULE`): on CUDA a fusion fires only where an in-model A/B
(``miner verify --ab``: the model's step with the fusion alone against the default compile,
alternating, with a default-vs-default control giving the noise band) measured the step faster
beyond noise, and nowhere one measured it slower or broke parity. An isolated benchmark (``miner
bench``: the kernel alone against Inductor's) never enables a firing on its own; it enters only as
supporting evidence of the bracket rule (:data:`BRACKET_RULE`): at a shape between measured in-model
wins, an isolated row slower than Inductor inside that box keeps the fusion off.

* :class:`InModelRecord`: one A/B measurement of one fusion alone in one model step (its
  :attr:`~InModelRecord.key`, :attr:`~InModelRecord.verdict`, :meth:`~InModelRecord.describe`,
  ``to_json`` / ``from_json``, tolerant of the older records committed before ``batch`` / ``seq``).
* The store: :func:`evidence_file` names the file a fusion or candidate keeps its records in
  (``fusions/<name>/wins.json``, section ``in_model``; ``candidates/<id>/in_model.json``);
  :func:`read`, :func:`merge` and :func:`write` read, merge and write either kind.
* :func:`decide`: the only entry point the gate (``miner.runtime.gate``) uses: a :class:`Context`
  (an exact site) or a :class:`Query` (a box of sizes, for symbolic shapes) against the records.

Pure: imports only the standard library and ``miner.core`` (the preset sizes of records older than
``batch`` / ``seq`` are read from ``miner_models`` when it is importable).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Sequence

RULE = ("on CUDA a fusion fires only where an in-model A/B measured the model's step faster beyond "
        "noise and none measured it slower or broke parity; an isolated benchmark never enables a firing "
        "alone (between measured in-model wins, a slower isolated row keeps it off: the bracket rule)")

IN_MODEL_SCHEMA = 1
VERDICTS = ("win", "loss", "noise", "parity-fail", "not-judged")  # not-judged: parity unknown, never a win
BLOCKING = ("loss", "parity-fail")  # a record with one of these verdicts keeps the fusion off around it
UNMEASURED_REASON = "unmeasured in a model: no in-model A/B covers this context (`miner verify --ab --record`)"

FUSION_FILE, FUSION_KIND, FUSION_SCHEMA = "wins.json", "FusionWins", 1  # a fusion's: isolated rows + in_model
CANDIDATE_FILE, CANDIDATE_KIND, CANDIDATE_SCHEMA = "in_model.json", "InModelEvidence", 1  # a candidate's


# --------------------------------------------------------------------------- the record

@dataclass(frozen=True)
class InModelRecord:
    """One in-model A/B measurement of one fusion (or candidate) alone in one model step.

    ``speedup`` is the default's step over the fused one (> 1: faster), ``band`` the control's
    noise band (relative), ``verdict`` one of :data:`VERDICTS`, ``contexts`` the match sites it
    fired in (``Context.site`` -> matches). ``batch`` / ``seq`` None: measured at its preset's sizes
    (records written before they were stored). Fields this version does not know stay in ``extra``.
    """

    model: str
    mode: str  # train / infer
    speedup: float
    band: float
    verdict: str
    compile: str = "default"  # default / dynamic / reduce-overhead
    preset: str | None = None
    batch: int | None = None
    seq: int | None = None
    matches: int | None = None  # None: not recorded (counted as firing)
    contexts: dict = field(default_factory=dict, compare=False)
    gpu: str | None = None
    torch: str | None = None
    date: str | None = None
    source: str | None = None
    # measured on top of this knob (``miner.check.knobs``): ``speedup`` is the knob's step over the knob's
    # with the fusion alone (``knob:<k>+alone:<f>``); None: over the default compile
    knob: str | None = None
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def shape(self) -> tuple:
        """(batch, seq) it was measured at: its own, else its preset's (``miner_models.base.SHAPES``)."""
        if self.batch is not None and self.seq is not None:
            return self.batch, self.seq
        b, s = _preset_shape(self.preset)
        return (b if self.batch is None else self.batch), (s if self.seq is None else self.seq)

    @property
    def key(self) -> tuple:
        """What a newer record replaces an older one by: model, mode, compile, preset, batch, seq, knob."""
        return (self.model, self.mode, self.compile, self.preset) + self.shape + (self.knob,)

    @property
    def where(self) -> str:
        return f"{self.model} {self.mode}/{self.compile}" + (f" over knob {self.knob}" if self.knob else "")

    def describe(self, *, full: bool = False) -> str:
        """``bert train/default B16 S512 1.030x (noise +-1.0%)``; ``full``: with its matches and verdict."""
        batch, seq = self.shape
        size = f" B{batch} S{seq}" if batch is not None else ""
        more = f"; {'?' if self.matches is None else self.matches} matches, {self.verdict}" if full else ""
        return f"{self.where}{size} {self.speedup:.3f}x (noise +-{100 * self.band:.1f}%{more})"

    def to_json(self) -> dict:
        """The record as stored (the committed files' key order; fields this version does not know last)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        order = ("model", "mode", "compile", "preset", "batch", "seq", "speedup", "band", "verdict", "matches",
                 "contexts", "gpu", "torch", "date", "source") + (("knob",) if self.knob else ())
        return {**{k: out[k] for k in order}, **self.extra}

    @staticmethod
    def from_json(d: dict) -> "InModelRecord":
        """A stored record (any version: missing optional fields default, unknown ones kept in ``extra``)."""
        known = {f.name for f in fields(InModelRecord)} - {"extra"}
        kw = {k: v for k, v in d.items() if k in known}
        kw["contexts"] = dict(kw.get("contexts") or {})
        kw["speedup"], kw["band"] = float(kw["speedup"]), float(kw.get("band") or 0.0)
        kw["compile"] = kw.get("compile") or "default"
        return InModelRecord(**kw, extra={k: v for k, v in d.items() if k not in known})


def as_record(r: "InModelRecord | dict") -> InModelRecord:
    return r if isinstance(r, InModelRecord) else InModelRecord.from_json(r)


def as_records(records: Iterable["InModelRecord | dict"]) -> list[InModelRecord]:
    return [as_record(r) for r in records]


def _preset_shape(preset: str | None) -> tuple:
    try:
        from miner_models.base import SHAPES
    except ImportError:
        return None, None
    return SHAPES.get(preset, (None, None))


def shape_of(r: Any) -> tuple:
    """(batch, seq) of a record or an A/B result (``miner.check.ab.ABResult``): its own, else its preset's."""
    get = r.get if isinstance(r, dict) else lambda k: getattr(r, k, None)
    batch, seq = get("batch"), get("seq")
    if batch is None or seq is None:
        b, s = _preset_shape(get("preset"))
        batch, seq = (b if batch is None else batch), (s if seq is None else seq)
    return batch, seq


# --------------------------------------------------------------------------- the store

def evidence_file(root: str | Path, name: str, *, fusion: bool) -> Path:
    """The file fusion ``name`` (``fusions/<name>/wins.json``) or candidate ``name``
    (``candidates/<name>/in_model.json``) of the workspace ``root`` keeps its records in."""
    root = Path(root)
    return root / "fusions" / name / FUSION_FILE if fusion else root / "candidates" / name / CANDIDATE_FILE


def records_of(payload: dict | None) -> list[InModelRecord]:
    """The records of a loaded file of either kind (its ``in_model`` section); a malformed record is skipped."""
    out = []
    for r in ((payload or {}).get("in_model") or {}).get("records", ()) or ():
        try:
            out.append(InModelRecord.from_json(r))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def read(path: str | Path) -> list[InModelRecord]:
    """The records in ``path`` (a fusion's ``wins.json`` or a candidate's ``in_model.json``); [] when
    it is absent or unreadable."""
    from miner.core.errors import MinerError
    from miner.core.workspace import read_json

    path = Path(path)
    try:
        return records_of(read_json(path)) if path.exists() else []
    except MinerError:
        return []


def merge(old: Iterable[InModelRecord | dict], new: Iterable[InModelRecord | dict]) -> list[InModelRecord]:
    """``old`` with ``new`` added: a record of ``new`` replaces every older one of its :attr:`~InModelRecord.key`;
    among ``new`` records of one key, the newest by date (the first on a tie: a re-promotion passes the
    candidate's own record first, then the fusion's copy of it)."""
    newest: dict[tuple, InModelRecord] = {}
    for r in as_records(new):
        if r.key not in newest or str(r.date or "") > str(newest[r.key].date or ""):
            newest[r.key] = r
    return [r for r in as_records(old) if r.key not in newest] + list(newest.values())


def with_records(payload: dict | None, name: str, records: Iterable[InModelRecord | dict]) -> dict:
    """A fusion's ``wins.json`` payload with ``records`` merged into its ``in_model`` section
    (:func:`merge`); a fusion without one gets a minimal payload (no isolated rows)."""
    base: dict[str, Any] = dict(payload) if payload else {"schema": FUSION_SCHEMA, "kind": FUSION_KIND, "name": name,
                                                          "wins": [], "loses": []}
    merged = merge(records_of(base), records)
    base["in_model"] = {"schema": IN_MODEL_SCHEMA, "records": [r.to_json() for r in merged]}
    return base


def write(path: str | Path, name: str, records: Iterable[InModelRecord | dict]) -> Path:
    """Merge ``records`` into ``path``: a fusion's ``wins.json`` (its other sections kept) or a
    candidate's ``in_model.json`` (by the file's name, :func:`evidence_file`)."""
    from miner.core.workspace import read_json, write_json

    path = Path(path)
    old = read_json(path) if path.exists() else None
    if path.name == CANDIDATE_FILE:
        merged = with_records(old, name, records)["in_model"]
        return write_json(path, {"schema": CANDIDATE_SCHEMA, "kind": CANDIDATE_KIND, "candidate": name,
                                 "in_model": merged})
    return write_json(path, with_records(old, name, records))


# --------------------------------------------------------------------------- where: contexts and queries

@dataclass(frozen=True)
class Context:
    """Where a match sits: input signature, neighbourhood, compile mode.

    The neighbourhood says whether any input is produced by, or any output consumed by, a pointwise
    or reduction node Inductor would have fused into the same kernel (a replacement there splits
    that kernel); the mode is the compile's (``default``, ``reduce-overhead``, ``max-autotune``).
    """

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



@dataclass(frozen=True)
class Site:
    """A context known by its site key only (as records store it: ``Context.site``) and its mode."""

    site: str
    mode: str = "default"


@dataclass(frozen=True)
class Query:
    """A box of sites to decide: per input ``(((lo, hi) per dim), dtype)`` (lo == hi for a static size),
    its neighbourhood (see :class:`Context`) and compile mode."""

    inputs: tuple
    producer_fusable: bool
    consumer_fusable: bool
    mode: str = "default"

    @staticmethod
    def of(signature, producer_fusable: bool, consumer_fusable: bool, mode: str = "default") -> "Query":
        """The query of a static signature: per input ``(shape, dtype)``."""
        return Query(tuple((tuple((int(d), int(d)) for d in shape), dtype) for shape, dtype in signature),
                     producer_fusable, consumer_fusable, mode)


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


# --------------------------------------------------------------------------- the rule

def decide(where: Context | Site | Query, records: Iterable[InModelRecord | dict],
           isolated: Sequence[tuple] = ()) -> tuple[bool, str]:
    """Whether to fire at ``where``, and why (:data:`RULE`). Pure.

    A :class:`Context` or :class:`Site` (an exact site): when some record measured its site, records of its mode
    decide; when there are none, records of other modes decide only if they agree on a win (then
    the mode does not matter for this site). A site no record measured, or a :class:`Query` (the
    sizes a symbolic shape may take): the bracket rule (:data:`BRACKET_RULE`), where ``isolated``
    (the fusion's isolated bench rows, :func:`isolated_rows`) may only keep it off.
    """
    records = as_records(records)
    if isinstance(where, Query):
        return _decide_range(where, records, isolated)
    covering = [r for r in records if where.site in r.contexts]
    if not covering:
        query = parse_site(where.site)
        if query is None:
            return False, UNMEASURED_REASON
        return _decide_range(Query(query.inputs, query.producer_fusable, query.consumer_fusable, where.mode),
                             records, isolated)
    same = [r for r in covering if r.compile == where.mode]
    pool, note = (same, "") if same else (covering, f" (measured under other modes, not {where.mode})")
    losses = [r for r in pool if r.verdict in BLOCKING]
    if losses:
        slower = [r for r in losses if r.verdict == "loss"]
        failed = [r for r in losses if r.verdict != "loss"]
        return False, "; ".join(
            [("step slower in " + _described(slower)) if slower else ""]
            + [("parity failed or not judged in " + _described(failed)) if failed else ""]).strip("; ") + note
    wins = [r for r in pool if r.verdict == "win"]
    if not same and len(wins) < len(pool):
        return False, "other modes disagree: " + _described(pool) + note
    if wins:
        return True, "step faster in " + _described(wins) + note
    return False, "within noise in " + _described(pool) + note


def _described(records: Iterable[InModelRecord]) -> str:
    return "; ".join(r.describe() for r in records)


BRACKET_RULE = (
    "fires at a site an in-model A/B measured as a step win (and none as a loss or a parity failure); at an "
    "unmeasured site only when in-model wins of the same class (compile mode, neighbourhood, inputs of the "
    "same dtypes and ranks) bracket it: each size between the smallest and largest measured for that "
    "dimension (a size equal in every win must be equal), no in-model loss or parity failure and no slower "
    "isolated kernel row (where bench rows are recorded) inside that box; one measured shape brackets only "
    "itself; symbolic sizes (dynamic=True) count by the range the compile allows, so an unbounded one declines; "
    "records of any CUDA GPU count alike (each keeps its GPU's name; the class does not)")


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
    neighbourhood, speedup over Inductor): supporting evidence of the bracket rule only."""
    out = []
    for row in list((wins or {}).get("wins") or ()) + list((wins or {}).get("loses") or ()):
        try:
            sig = tuple((tuple(i["shape"]), i["dtype"]) for i in row["inputs"])
            out.append((Query.of(sig, False, False), float(row["speedup_vs_inductor"])))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def _decide_range(query: Query, records: Sequence[InModelRecord], isolated: Sequence[tuple] = ()) -> tuple[bool, str]:
    """Fire at an unmeasured site when in-model wins of its class bracket it (:data:`BRACKET_RULE`).

    Records of ``query.mode`` only (another compile mode is another class). Pure.
    """
    mode = query.mode
    sites = [(q, r) for r in records if r.compile == mode
             for q in map(parse_site, r.contexts) if q is not None and _same_class(query, q)]
    wins = [(q, r) for q, r in sites if r.verdict == "win"]
    if not wins:
        return False, UNMEASURED_REASON + (f"; no in-model win of this class (dtypes, ranks, neighbourhood, "
                                           f"mode {mode}) to bracket it")
    ok, where = bracket(query, [q for q, _ in wins])
    if not ok:
        return False, f"outside the in-model evidence: {where}"
    box = _box([q for q, _ in wins])
    bad = [r for q, r in sites if r.verdict in BLOCKING and _inside(q, box)]
    if bad:
        return False, "bracketed, but slower inside the bracket: " + _described(bad)
    slow = [s for q, s in isolated if s < 1.0 and _same_class(Query(q.inputs, query.producer_fusable,
                                                                     query.consumer_fusable), query)
            and _inside(q, box)]
    if slow:
        return False, f"bracketed, but the kernel alone is slower inside the bracket ({min(slow):.2f}x)"
    return True, "bracketed by in-model wins: " + where + "; " + "; ".join(
        dict.fromkeys(r.describe() for _, r in wins))


def coverage(records: Iterable[InModelRecord | dict], isolated: Sequence[tuple] = ()) -> list[str]:
    """Where the gate fires, in words: per class of measured win sites (mode, neighbourhood, dtypes,
    ranks), the box of sizes it brackets (for ``miner candidates show``)."""
    records = as_records(records)
    out = []
    classes: dict[tuple, list[Query]] = {}
    for r in records:
        for site in r.contexts:
            q = parse_site(site)
            if q is not None and r.verdict == "win":
                key = (r.compile, q.producer_fusable, q.consumer_fusable, tuple((len(d), t) for d, t in q.inputs))
                classes.setdefault(key, []).append(q)
    for (mode, prod, cons, ranks), qs in classes.items():
        box = _box(qs)
        sig = " ".join(t + "[" + ",".join(str(lo) if lo == hi else f"{lo}..{hi}" for lo, hi in box[k]) + "]"
                       for k, (_, t) in enumerate(ranks))
        fire, why = decide(Query(tuple((tuple(b), t) for b, (_, t) in zip(box, ranks)), prod, cons, mode),
                           records, isolated)
        hood = f"producer:{'fusable' if prod else 'none'} consumer:{'fusable' if cons else 'none'}"
        out.append(f"{'fires' if fire else 'declines'} at {sig} | {hood} | mode:{mode}"
                   + ("" if fire else f" ({why})"))
    return out


def fires_in(records: Iterable[InModelRecord | dict]) -> tuple[str, ...]:
    """Where the gate fires with these records: ``model mode/compile`` of each record in one of whose
    measured sites :func:`decide` fires (a ``dynamic`` compile's gate reads the ``default`` mode)."""
    records = as_records(records)
    out = []
    for r in records:
        mode = "default" if r.compile == "dynamic" else r.compile
        if any(decide(Site(s, mode), records)[0] for s in r.contexts):
            out.append(r.where)
    return tuple(dict.fromkeys(out))


__all__ = ["BLOCKING", "BRACKET_RULE", "CANDIDATE_FILE", "CANDIDATE_KIND", "CANDIDATE_SCHEMA", "Context",
           "FUSION_FILE", "FUSION_KIND", "FUSION_SCHEMA", "IN_MODEL_SCHEMA", "INF", "InModelRecord", "Query", "RULE", "Site",
           "UNMEASURED_REASON", "VERDICTS", "as_record", "as_records", "bracket", "coverage", "decide",
           "evidence_file", "fires_in", "isolated_rows", "merge", "parse_site", "read", "records_of", "shape_of",
           "with_records", "write"]
