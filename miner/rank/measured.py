"""Rank by measured recoverable time: what the GPU step profile says a fusion could win.

On a workspace with step profiles (``miner profile``: ``profiles/<model>/<preset>/<mode>.profile.json``),
each kernel call site of the step has a measured time and a floor (Inductor's byte count at the copy
bandwidth measured in the same run). A fusion can at best bring the kernels it replaces down to the
floor of its own traffic, so:

**The credit rule.** For one occurrence O of a pattern (its FX nodes in one captured graph), let K be
the kernel call sites holding any of its nodes (Inductor's kernel map, ``Occurrence.node_kernels``).

- If some site in K also holds a node outside O, replacing O **splits that kernel**: Inductor already
  keeps O's intermediates on chip there, and a separate kernel for O would add a write and a read of
  every cut edge. Credit 0 (the note names the kernel). The time above floor of that kernel is
  credited to its *region pattern* instead (every kernel's whole FX-node set, ``miner.mine.regions``),
  which ranks as a row of its own: a kernel replacing the whole region is what can recover it.
  (We do not pro-rate by bytes: a sub-pattern removes no traffic from a kernel that already fuses it.)
- Otherwise O replaces the sites in K entirely. Credit = time of K - floor of the one fused kernel,
  floored at 0: with one site, that site's own floor (Inductor's count); with several (Inductor split
  O: a missed fusion), O's external inputs + outputs (captured metas) at the copy bandwidth.

A pattern's saving per step is the credit summed over its *safe* occurrences (an unsafe one is
never rewritten): the stored sample's mean credit times ``counts.safe`` (exact when ``miner mine
--max-stored`` keeps them all). A pattern with no occurrence in a profiled graph keeps the cost
model's prediction (marked ``~``, source "model"/"analytical"); measured rows rank first.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable, Sequence

from miner.core.pattern import Occurrence, Pattern

SOURCE = "measured"


@dataclass(frozen=True)
class Site:
    """One measured kernel call site: the FX nodes the kernel map puts in it, time and floor per step."""

    graph: str
    kernel: str  # "name:handle"
    nodes: frozenset
    us_per_step: float
    floor_us_per_step: float | None
    region: str  # region pattern id


@dataclass(frozen=True)
class Credit:
    """Measured recoverable time of one pattern (us per step) and how it was reached."""

    pattern: str
    us_per_step: float
    occurrences: int  # stored occurrences credited (measured)
    regions: tuple[str, ...]  # region pattern ids that hold its occurrences
    notes: tuple[str, ...] = ()

    @property
    def ms_per_step(self) -> float:
        return self.us_per_step / 1e3


class SiteIndex:
    """Measured call sites by ``(graph, kernel ref)``, and the copy bandwidth of each model's profile."""

    def __init__(self, region_patterns: Iterable[Any], bandwidth: dict[str, float]):
        self.sites: dict[tuple[str, str], Site] = {}
        for rp in region_patterns:
            for o in rp.occurrences:
                if o.us_per_step is None:
                    continue
                r = o.region
                occ = r.occurrence
                mapped = frozenset(n for n, ks in zip(occ.nodes, occ.node_kernels) if r.kernel.name in ks) \
                    or frozenset(r.nodes)
                self.sites[(str(r.graph), r.kernel.name)] = Site(str(r.graph), r.kernel.name, mapped, o.us_per_step,
                                                                 o.floor_us_per_step, rp.id)
        self.bandwidth = bandwidth  # model -> bytes/s
        self.graphs = {g for g, _ in self.sites}

    def __bool__(self) -> bool:
        return bool(self.sites)


def _bytes(specs: Sequence[Any]) -> int | None:
    total = 0
    for s in specs:
        if s is None:
            return None
        try:
            total += s.nbytes
        except (TypeError, ValueError):
            return None
    return total


def credit_occurrence(occ: Occurrence, index: SiteIndex) -> tuple[float | None, tuple[str, ...], str | None]:
    """``(us per step or None when unmeasured, region ids touched, note)`` for one occurrence (see the rule)."""
    g = str(occ.graph)
    if g not in index.graphs:
        return None, (), None
    refs = dict.fromkeys(k for ks in occ.node_kernels for k in ks)
    sites = [index.sites.get((g, k)) for k in refs]
    if not refs:
        return 0.0, (), "in no generated kernel"
    if any(s is None for s in sites):
        missing = next(k for k, s in zip(refs, sites) if s is None)
        return None, (), f"kernel {missing} not measured"
    regions = tuple(dict.fromkeys(s.region for s in sites))
    inside = set(occ.nodes)
    for s in sites:
        if not s.nodes <= inside:
            return 0.0, regions, f"splits {s.kernel.rpartition(':')[0]} (region {s.region})"
    time_us = sum(s.us_per_step for s in sites)
    if len(sites) == 1:
        floor = sites[0].floor_us_per_step
    else:
        nbytes = _bytes(occ.input_meta + occ.output_meta)
        bw = index.bandwidth.get(occ.graph.model)
        floor = None if nbytes is None or not bw else nbytes / bw * 1e6
    if floor is None:
        return None, regions, "no byte count for its floor"
    return max(0.0, time_us - floor), regions, None


def credit_pattern(p: Pattern, index: SiteIndex) -> Credit | None:
    """The measured saving of ``p`` per step, or None when none of its safe occurrences was profiled."""
    safe = [o for o in p.occurrences if o.verdict.ok]
    if not safe and any(str(o.graph) in index.graphs for o in p.occurrences):
        regions = [r for o in p.occurrences for r in credit_occurrence(o, index)[1]]
        return Credit(p.id, 0.0, 0, tuple(dict.fromkeys(regions)), ("no safe occurrence: none would be rewritten",))
    got, regions, notes = [], [], []
    for o in safe:
        us, regs, note = credit_occurrence(o, index)
        regions += regs
        if note:
            notes.append(note)
        if us is not None:
            got.append(us)
    if not got:
        return None
    n = max(p.counts.safe, len(got))
    if n > len(got):
        notes.append(f"mean of {len(got)} stored of {n} safe occurrences, times {n}")
    return Credit(p.id, sum(got) / len(got) * n, len(got), tuple(dict.fromkeys(regions)), tuple(dict.fromkeys(notes)))


def region_credit(rp: Any) -> Credit:
    """A region pattern's measured time above floor: what one kernel replacing each region could win."""
    return Credit(rp.id, rp.above_floor_us, rp.measured, (rp.id,), ("whole kernel (region)",))


def load_index(ws: Any) -> tuple[SiteIndex, list]:
    """The measured sites of the workspace and its region patterns (regrouped from the captures and
    profiles when ``mined/regions.json`` is missing or carries no times)."""
    from miner.mine import regions
    from miner.scan import profile as prof

    profiles = prof.load_all(ws)
    if not profiles:
        return SiteIndex((), {}), []
    try:
        rps = regions.load(ws)
    except Exception:  # missing or stale: regroup (a few seconds)
        rps = []
    if not any(rp.measured for rp in rps):
        rps = regions.group(ws.load_graphs(), profiles)
    bw = {p.model: p.copy_bw for p in profiles}
    return SiteIndex(rps, bw), rps


def apply(review: Any, ws: Any) -> Any:
    """``review`` re-ranked by measured recoverable time where the workspace has step profiles.

    Rows whose pattern has profiled occurrences get ``saved_ms = Estimate(ms, "measured")``; region
    patterns with time above floor and no row of their own are added (status ``region``); the other
    rows keep their predicted saving. Measured rows first, each group by saving.
    """
    from miner.rank import families
    from miner.rank.records import Estimate, Ranked

    index, rps = load_index(ws)
    if not index:
        return review
    credits: dict[str, Credit] = {}
    rows = []
    for r in review.rows:
        c = credit_pattern(r.pattern, index)
        if c is not None:
            credits[r.id] = c
            r = replace(r, saved_ms=Estimate(c.ms_per_step, SOURCE))
        rows.append(r)
    have = {r.pattern.id for r in rows}
    skipped = dict(review.skipped)
    for rp in rps:
        if rp.id in have or not rp.measured or rp.above_floor_us <= 0:
            continue
        c = credits[rp.id] = region_credit(rp)
        skipped[rp.id] = "region: one whole Inductor kernel per occurrence (not safety-checked, not mined)"
        hist = {int(k): v for k, v in rp.pattern.inductor.kernels_hist.items()}
        rows.append(Ranked(id=rp.id, pattern=rp.pattern, candidate=None,
                           family=families.Family(rp.id, rp.ops, (rp.id,)), status="region",
                           occurrences=len(rp.occurrences), safe=0, missed_share=0.0 if hist else None,
                           inductor_kernels=1, calls=(), speedup=None,
                           saved_ms=Estimate(c.ms_per_step, SOURCE)))
    rows.sort(key=lambda r: (not r.saved_ms.measured, -r.saved_ms.value, -r.support[0], -r.support[1],
                             -r.occurrences, r.id))
    order = {r.id: i for i, r in enumerate(rows)}
    known = {m for f in review.families for m in f.members}
    fams = list(review.families) + [r.family for r in rows if r.id not in known]
    fams.sort(key=lambda f: order.get(f.id, len(order)))
    fam_of = {m: f for f in fams for m in f.members}
    rows = [replace(r, family=fam_of.get(r.id, r.family)) for r in rows]
    n_measured = sum(r.saved_ms.measured for r in rows)
    basis = (f"Ranked by measured recoverable time on the GPU step profiles of {', '.join(sorted(index.bandwidth))}: "
             f"per occurrence, the measured time of the kernels it would replace minus the floor of one fused "
             f"kernel at the copy bandwidth (0 when it would split a kernel; region rows: a whole kernel's time "
             f"above floor); {n_measured} of {len(rows)} rows measured, the others predicted (~).")
    out = replace(review, rows=tuple(rows), families=tuple(fams), basis=basis, skipped=skipped)
    return replace(out, measured=credits) if hasattr(out, "measured") else out
