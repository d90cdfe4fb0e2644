"""The review's decision: per promoted fusion and per candidate, adopt it or not, from measurements only.

``decide(review, ws)`` reads three kinds of evidence and returns ``Decisions``, which every view of
the review formats (``miner candidates``' first table, its ``--json`` / ``--csv``, the HTML report's
first section); no renderer decides anything itself.

* **In-model A/B** (``miner verify --ab``): every ``verify.json`` of kind ``VerifyAB`` under
  ``reports/``, the latest result of each (model, mode, compile mode, preset) by the files' environment
  dates (the files used are named in ``Decisions.ab_source``). Per fusion and (model, mode, compile
  mode): the step speedup of the fusion alone against the default compile, its p20-p80 range (the A/B's
  paired per-round ratios; older files: the default's median over the variant's p80 and p20), the noise band,
  the verdict (win / loss beyond the band, else noise), the peak-memory change and parity. Where those
  files do not cover a (model, mode, compile), the records of the gate's evidence stand in
  (``fusions/<name>/wins.json`` ``in_model``, ``candidates/<id>/in_model.json``: no p20-p80, no memory).
* **The gate's evidence** (``miner.runtime.evidence.decide`` over the same records the gate reads
  while compiling): where the fusion fires on CUDA. No records: it fires nowhere.
* **Isolated kernel timings** (``miner bench``): the range of speedups over Inductor across the shapes
  of the candidate's *latest* bench run only, with that run named.

The verdict, first rule that applies:

1. ``unsafe``: validation failed, or a measured A/B variant of it broke parity;
2. ``adopt``: some in-model A/B measured the step faster beyond the noise band and none slower;
3. ``fires only in``: wins in some models, losses in others (the gate fires only where it won);
4. ``not worth it``: measured in-model without a win, or (no in-model A/B) the kernel was slower
   than Inductor at every shape of its latest bench run;
5. ``not measured``: nothing of the above measured. Predicted numbers (cost model, roofline) never
   enter a verdict.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Iterable, Sequence

from miner.check.ab import MARGINAL, setup_of, step_label  # one definition: every view shows a measurement so
from miner.core.errors import MinerError
from miner.core.workspace import Workspace, read_json
from miner.rank.records import BenchRun, CandidateInfo, Review
from miner.runtime.evidence import evidence_file

ADOPT, ONLY, NOT_WORTH, UNSAFE, UNMEASURED = "adopt", "fires only in", "not worth it", "unsafe", "not measured"
VERDICTS = (ADOPT, ONLY, NOT_WORTH, UNSAFE, UNMEASURED)
ORDER = (ADOPT, ONLY, UNMEASURED, NOT_WORTH, UNSAFE)  # the table's: what to adopt, then what is worth measuring


@dataclass(frozen=True)
class StepChange:
    """One in-model A/B measurement of a fusion alone in a model step."""

    model: str
    mode: str  # train / infer
    compile: str  # default / dynamic / reduce-overhead
    speedup: float  # default median / fused median
    band: float  # the noise band (relative)
    verdict: str  # win / loss / noise
    lo: float | None = None  # p20-p80 of the speedup: default median / fused p80
    hi: float | None = None  # default median / fused p20
    mem_mib: float | None = None  # step peak memory change, MiB (fused - default)
    parity_ok: bool | None = None
    matches: int = 0
    source: str = ""  # the file it came from, relative to the workspace
    date: str = ""
    setup: str = ""  # GPU, preset, batch, seq, dtype (setup_of)
    knob: str | None = None  # measured on top of this knob, against the knob alone (``InModelRecord.knob``)

    @property
    def where(self) -> str:
        return f"{self.model} {self.mode}/{self.compile}" + (f" over knob {self.knob}" if self.knob else "")

    @property
    def shown(self) -> str:
        """The verdict as every view shows it (:func:`step_label`)."""
        return step_label(self.verdict, self.lo)


def is_gpu_run(r) -> bool:
    """An A/B result timed on a CUDA device (not the Triton interpreter on a CPU)."""
    env = getattr(r, "env", {}) or {}
    return env.get("device", "cuda") == "cuda" and not env.get("interpret")


@dataclass(frozen=True)
class SetChange:
    """A fusion measured among others in a model step: one A/B variant that held it and other fusions
    (every candidate with the gate open, or a knob with the fusions). It says what the set did, not
    what this fusion does alone: it never decides a verdict."""

    step: StepChange  # the variant against the default compile (``matches``: this fusion's)
    config: str  # the configuration: "fusions" or "<knob>+fusions"
    others: int  # how many other fusions fired in it
    over_knob: float | None = None  # its speedup over the same knob alone, in the same rounds

    @property
    def text(self) -> str:
        return (f"{self.step.speedup:.3f}x {self.step.shown} as {self.config}"
                + (f" with {self.others} other{'s' if self.others != 1 else ''}" if self.others else "")
                + (f" ({self.over_knob:.3f}x over the knob alone)" if self.over_knob is not None else ""))


@dataclass(frozen=True)
class KernelRange:
    """Isolated kernel speedups over Inductor across the shapes of one bench run."""

    lo: float
    hi: float
    shapes: int
    run: str  # the run's name: its reports/gpu/<run>/ folder, else its GPU and date


@dataclass(frozen=True)
class Decision:
    """The verdict on one fusion or candidate, with the measurements it stands on."""

    id: str  # candidate id (pattern id) or, for a fusion without its candidate here, the fusion name
    name: str  # the fusion's name, else the candidate's label, else ""
    ops: str
    promoted: bool
    verdict: str  # one of VERDICTS
    reason: str
    fires_in: tuple[str, ...] = ()  # "model mode/compile" where the gate fires (promoted fusions only)
    won: tuple[str, ...] = ()  # "model mode/compile" where the A/B measured a win
    steps: tuple[StepChange, ...] = ()
    kernel: KernelRange | None = None
    status: str = ""  # the candidate's status where no ranked row has it (an upcast candidate), else ""
    coverage: tuple[str, ...] = ()  # where the gate fires, per class of measured sites (evidence.coverage)
    together: tuple[SetChange, ...] = ()  # the latest A/B variants that held it among other fusions

    @property
    def label(self) -> str:
        """The verdict as shown: ``fires only in gpt2 train/default`` spells its contexts; a fusion never
        measured alone but measured among others is ``not measured alone``."""
        if self.verdict == ONLY:
            return f"{ONLY} {', '.join(self.fires_in or self.won)}"
        if self.verdict == UNMEASURED and self.together and not self.steps:
            return f"{UNMEASURED} alone"
        return self.verdict

    @property
    def where(self) -> str:
        """Where it fires on CUDA, in words."""
        if self.promoted:
            return ", ".join(self.fires_in) or "nowhere"
        return "not promoted" + (f" (won in {', '.join(self.won)})" if self.won else "")

    def to_json(self) -> dict:
        d = asdict(self)
        d.update(label=self.label, where=self.where)
        return d


@dataclass(frozen=True)
class Decisions:
    """Every decision, best first, and where the evidence came from."""

    rows: tuple[Decision, ...]
    ab_source: str | None  # the VerifyAB verify.json files used, relative to the workspace, comma-separated
    ab_date: str | None  # the newest of their dates
    together: tuple[str, ...] = ()  # the latest plain `miner verify` run (all fusions at once), one line per model
    together_source: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    models: tuple["ModelStep", ...] = ()  # per (model, mode, compile): the step with the promoted fusions
    setup: str = ""  # the setup most rows were measured in (each row names its own where it differs)
    not_compared: tuple[str, ...] = ()  # A/B files of CPU-interpreter runs: never beside GPU rows
    configs: tuple = ()  # miner.check.configs.Recommendation per A/B result that measured knobs: what to run

    @property
    def adopt(self) -> list[Decision]:
        return [d for d in self.rows if d.verdict == ADOPT]

    def to_json(self) -> dict:
        return {"ab_source": self.ab_source, "ab_date": self.ab_date, "setup": self.setup,
                "not_compared": list(self.not_compared), "models": [asdict(m) for m in self.models],
                "together": list(self.together),
                "together_source": self.together_source, "notes": list(self.notes),
                "rule": RULE, "decisions": [d.to_json() for d in self.rows],
                "configs": [c.to_json() for c in self.configs]}


@dataclass(frozen=True)
class ModelStep:
    """One model step of the latest in-model A/B: the default compile against the fusions as they fire.

    ``variant`` is ``gated`` (the promoted fusions with their gate on: what a user gets) when the A/B
    timed it, else ``all`` (every fusion or candidate of that run, gate open)."""

    model: str
    mode: str
    compile: str
    default_ms: float
    default_p20: float
    default_p80: float
    fused_ms: float
    fused_p20: float
    fused_p80: float
    speedup: float
    speedup_p20: float | None
    speedup_p80: float | None
    verdict: str | None
    band: float | None
    default_peak_gib: float
    fused_peak_gib: float
    fired: dict
    parity: bool | None
    variant: str
    source: str
    date: str
    setup: str = ""
    parity_judged: str = ""  # how parity was judged (``Parity.judged``); "... (not judged)": it could not be


def model_steps(results: Sequence[tuple[str, object]], names: dict[str, str] | None = None) -> list[ModelStep]:
    """The :class:`ModelStep` of each A/B result (source file, ``ABResult``) that timed its default;
    ``names``: candidate id -> the fusion promoted from it (fired candidates are named so)."""
    names = names or {}
    out = []
    for source, r in results:
        d = r.variant("default")
        if r.error or d is None or d.step is None:
            continue
        g = r.variant("gated")
        v = g if g is not None and g.step is not None else r.variant("all")
        if v is None or v.step is None:
            continue
        v = same_graph(r, v)
        fired = {names.get(k, k): n for k, n in (v.matches or {}).items() if n}
        out.append(ModelStep(r.model, r.mode, r.compile, d.step.median_ms, d.step.p20_ms, d.step.p80_ms,
                             v.step.median_ms, v.step.p20_ms, v.step.p80_ms, v.speedup or 1.0, v.speedup_p20,
                             v.speedup_p80, v.verdict, r.noise_band, d.step.peak_mem_bytes / 2**30,
                             v.step.peak_mem_bytes / 2**30, fired, _parity_ok(v.parity),
                             v.name, source, str(r.env.get("date") or ""), setup_of(r),
                             str(getattr(v.parity, "judged", "") or "")))
    order = {"default": 0, "dynamic": 1, "reduce-overhead": 2}
    return sorted(out, key=lambda m: (m.mode != "train", order.get(m.compile, 3), m.compile, m.model, m.setup))


def same_graph(r, v):
    """The phase-A variant of ``r`` that compiled the graph ``v`` (the gated variant) runs: the one whose
    fusions fired the same number of times (``alone:<f>`` or ``all``), else ``v``. One graph gets one
    measurement, and so one verdict, in every table (the gated variant timed again in a second phase
    with its own noise could say noise where the same graph alone said win)."""
    if v.name != "gated":
        return v
    fired = {k: n for k, n in (v.matches or {}).items() if n}
    for other in r.variants:
        if other.name in ("all",) or other.name.startswith("alone:"):
            if other.step is not None and fired and {k: n for k, n in (other.matches or {}).items() if n} == fired:
                return other
    return v


def setup_diff(setup: str, headline: str) -> str:
    """The parts of ``setup`` that differ from ``headline`` (both :func:`setup_of` texts), e.g.
    ``tiny B2 S64``; "" when they are the same."""
    if not setup or not headline or setup == headline:
        return ""
    theirs = set(headline.split(", "))
    return ", ".join(p for p in setup.split(", ") if p not in theirs)


def model_step_cells(m: ModelStep, headline: str = "") -> list[str]:
    """The cells of :data:`MODEL_STEP_HEADER` for ``m`` (text; the terminal and HTML tables share them);
    the first names the setup where it differs from ``headline``."""
    rng = (f" [{m.speedup_p20:.3f}-{m.speedup_p80:.3f}]" if m.speedup_p20 is not None and m.speedup_p80 is not None
           else "")
    verdict = step_label(m.verdict, m.speedup_p20) + (f" ±{100 * m.band:.1f}%" if m.band is not None else "")
    fired = ", ".join(f"{k} x{n}" for k, n in sorted(m.fired.items())) or (
        "none (the gate keeps all off)" if m.variant == "gated" else "none")
    peak = f"{m.default_peak_gib:.2f} / {m.fused_peak_gib:.2f}" if m.default_peak_gib > 0 else "-"
    diff = setup_diff(m.setup, headline)
    return [f"{m.model} {m.mode}/{m.compile}" + (f" [{diff}]" if diff else ""), f"{m.default_ms:.2f}", f"{m.fused_ms:.2f}",
            f"{m.speedup:.3f}x{rng}", verdict, peak, fired + ("" if m.variant == "gated" else " (gate open)"),
            "ok" if m.parity else ("-" if m.parity is None else
                                   "not judged" if "not judged" in m.parity_judged else "FAIL")]


MODEL_STEP_HEADER = ("model", "default ms", "fused ms", "speedup [p20-p80]", "verdict ±band", "peak GiB",
                     "fusions fired", "parity")


RULE = ("adopt only where an in-model A/B (`miner verify --ab`) measured the step faster beyond its noise band and "
        "nowhere slower (a fusion slower in one compile mode only is adopted for the others: `fires only in`); "
        "predicted numbers never decide")


# --------------------------------------------------------------------------- the rule

def verdict_of(steps: Sequence[StepChange], *, failed: str | None = None, kernel: KernelRange | None = None
               ) -> tuple[str, str, tuple[str, ...]]:
    """(verdict, reason, the contexts it won in) from measurements only (see the module docstring).

    Parameters
    ----------
    steps : sequence of StepChange
        The in-model A/B measurements of the fusion.
    failed : str, optional
        Why it is unsafe (a failed validation), if it is.
    kernel : KernelRange, optional
        The isolated kernel's speedups in its latest bench run.
    """
    broke = [s for s in steps if s.parity_ok is False or s.verdict == "parity-fail"]
    if failed or broke:
        return UNSAFE, failed or "parity failed in " + ", ".join(s.where for s in broke), ()
    wins = [s for s in steps if s.verdict == "win"]
    losses = [s for s in steps if s.verdict == "loss"]
    won = tuple(dict.fromkeys(s.where for s in wins))
    if wins and not losses:
        return ADOPT, "step faster beyond noise in " + _list(wins), won
    if wins:
        return ONLY, f"faster in {_list(wins)}; slower in {_list(losses)}", won
    if steps:
        noise = [s for s in steps if s.verdict != "loss"]
        parts = (["slower in " + _list(losses)] if losses else []) + (["within noise in " + _list(noise)] if noise else [])
        return NOT_WORTH, "; ".join(parts), ()
    if kernel is not None and kernel.hi < 1.0:
        return NOT_WORTH, (f"no in-model A/B; the kernel alone is slower than Inductor at all {kernel.shapes} "
                           f"shapes of run {kernel.run} ({kernel.lo:.2f}-{kernel.hi:.2f}x)"), ()
    return UNMEASURED, "no in-model A/B yet (`miner verify --ab`)", ()


def _list(steps: Iterable[StepChange]) -> str:
    return ", ".join(f"{s.where} {s.speedup:.3f}x (band ±{100 * s.band:.1f}%"
                     + ("; marginal: p20 below 1.0" if s.shown == MARGINAL else "") + ")" for s in steps)


# --------------------------------------------------------------------------- evidence

def latest_ab(ws: Workspace, files: list | None = None) -> tuple[list[Path], list] | None:
    """The latest in-model A/B of each (model, mode, compile mode, preset) over every ``verify.json`` of kind
    VerifyAB under ``reports/`` (a run is often saved in several folders, one per model; a re-run replaces
    the older result), and the files those results come from; None if there is none. GPU results only
    (``is_gpu_run``); a result at another batch or sequence length is another row.

    Files are taken oldest first by their environment date (then path), so a newer file's result for
    the same (model, mode, compile, preset) wins, as ``miner verify --ab --record`` merges the gate's evidence.
    """
    from miner.runtime.evidence import shape_of

    latest: dict[tuple, tuple[Path, object]] = {}
    for _, _, path, results in sorted(ab_files(ws) if files is None else files, key=lambda f: f[:2]):
        for r in results:
            if is_gpu_run(r):  # a CPU-interpreter run is never compared with GPU runs
                latest[(r.model, r.mode, r.compile, r.preset) + shape_of(r)] = (path, r)
    if not latest:
        return None
    paths = sorted({p for p, _ in latest.values()})
    return paths, [(p, r) for p, r in latest.values()]


def ab_files(ws: Workspace) -> list[tuple[str, str, Path, list]]:
    """(date, path, path, results) of every ``verify.json`` of kind VerifyAB under ``reports/``."""
    from miner.check import abrun

    found = []
    for path in sorted(ws.reports.rglob("verify.json")):
        try:
            results, _ = abrun.load(path)  # UsageError (a MinerError) for a verify.json of another kind
        except (MinerError, OSError, ValueError, KeyError, TypeError):
            continue
        date = next((r.env.get("date") for r in results if r.env.get("date")), "") or ""
        found.append((str(date), str(path), path, results))
    return found


def ab_results(ws: Workspace, files: list | None = None) -> list[tuple[str, object]]:
    """(source file relative to ``ws``, ``ABResult``) of every A/B file (``files``: :func:`ab_files`, read
    here if None), oldest first (by the files' environment dates, then path)."""
    found = sorted(((date, str(path.relative_to(ws.root)) if path.is_relative_to(ws.root) else str(path), results)
                    for date, _, path, results in (ab_files(ws) if files is None else files)), key=lambda f: f[:2])
    return [(src, r) for _, src, results in found for r in results]


def recommendations(ws: Workspace, files: list | None = None) -> list:
    """What to run per model and mode (``miner.check.configs.recommendations``) over every A/B file of ``ws``
    (``files``: :func:`ab_files`, read here if None), oldest first."""
    from miner.check import configs

    found = ab_results(ws, files)
    return configs.with_how(configs.recommendations([r for _, r in found], [src for src, _ in found]), ws)


def cpu_runs(ws: Workspace, files: list | None = None) -> tuple[str, ...]:
    """The A/B files (relative to the workspace) holding CPU-interpreter results: listed apart, never compared."""
    return tuple(str(p.relative_to(ws.root)) for _, _, p, results in (ab_files(ws) if files is None else files)
                 if any(not is_gpu_run(r) for r in results))


def ab_steps(results: Sequence[tuple[str, object]]) -> dict[str, list[StepChange]]:
    """fusion (or candidate id) -> its fusion-alone measurements in A/B ``results``: (source file, ``ABResult``).

    The p20-p80 range is the A/B's own (quantiles of the per-round paired ratios) where the file has
    it, else the default's median over the variant's p80 and p20 step times.
    """
    from miner.check.ab import alone_records, alone_variant, knob_record, over_knobs

    out: dict[str, list[StepChange]] = {}
    for source, r in results:
        if r.error:
            continue
        d = r.variant("default")
        for f, rec in alone_records(r).items():
            v = alone_variant(r, f)
            s, base = v.step, d.step if d else None
            lo, hi, mem = v.speedup_p20, v.speedup_p80, None
            if s is not None and base is not None:
                if lo is None or hi is None:
                    lo = base.median_ms / s.p80_ms if s.p80_ms > 0 else None
                    hi = base.median_ms / s.p20_ms if s.p20_ms > 0 else None
                mem = (s.peak_mem_bytes - base.peak_mem_bytes) / 2**20
            out.setdefault(f, []).append(StepChange(
                r.model, r.mode, r.compile, rec.speedup, rec.band, rec.verdict, lo, hi, mem,
                _parity_ok(v.parity), rec.matches, source, str(r.env.get("date") or ""),
                setup_of(r)))
        for o in over_knobs(r):  # alone on top of a knob: the knob's step over the knob's with the fusion
            rec = knob_record(r, o)  # its compile: the mode the gate reads under that knob (reduce-overhead for
            if rec is not None:      # a CUDA-graph knob), as its record in wins.json says: one row for both
                out.setdefault(o.fusion, []).append(StepChange(
                    r.model, r.mode, rec.compile, o.speedup, rec.band, rec.verdict, o.p20, o.p80, None,
                    _parity_ok(o.variant.parity), rec.matches, source, str(r.env.get("date") or ""), setup_of(r),
                    knob=rec.knob))
    return out


def _parity_ok(parity) -> bool | None:
    """A variant's parity as a measurement: None where none was measured or it could not be judged."""
    return None if parity is None or parity.unjudged else bool(parity.ok)


def set_steps(results: Sequence[tuple[str, object]]) -> dict[str, list[SetChange]]:
    """fusion (or candidate id) -> the A/B variants of ``results`` ((source file, ``ABResult``), oldest
    first) that held it among other fusions: ``all`` / ``gated`` with more than one fusion firing, and
    every ``knob:<k>+fusions``; the latest per (model step, setup, configuration)."""
    latest: dict[tuple, SetChange] = {}
    for source, r in results:
        if r.error:
            continue
        d = r.variant("default")
        for v in r.variants:
            fired = sorted(f for f, n in (v.matches or {}).items() if n)
            if v.step is None or v.error or v.speedup is None or not fired:
                continue
            if v.knob and v.name.endswith("+fusions"):
                config, knob = f"{v.knob}+fusions", r.variant(f"knob:{v.knob}")
            elif v.name in ("all", "gated") and len(fired) > 1:
                config, knob = "fusions", None
            else:
                continue
            over = (v.speedup / knob.speedup if knob is not None and knob.speedup and not knob.error else None)
            mem = ((v.step.peak_mem_bytes - d.step.peak_mem_bytes) / 2**20
                   if d is not None and d.step is not None and not v.cudagraphs else None)
            verdict = "parity not judged" if v.parity is not None and v.parity.unjudged else v.verdict or "-"
            for f in fired:
                step = StepChange(r.model, r.mode, r.compile, v.speedup, r.noise_band or 0.0, verdict,
                                  v.speedup_p20, v.speedup_p80, mem, _parity_ok(v.parity),
                                  int(v.matches[f]), source, str(r.env.get("date") or ""), setup_of(r))
                latest[(f, r.model, r.mode, r.compile, step.setup, config)] = SetChange(step, config, len(fired) - 1,
                                                                                       over)
    out: dict[str, list[SetChange]] = {}
    for (f, *_), sc in latest.items():
        out.setdefault(f, []).append(sc)
    return out


def silent_in(results: Sequence[tuple[str, object]]) -> dict[str, list[str]]:
    """fusion -> "model mode/compile" of the A/B ``results`` where it matched nothing with the gate open."""
    out: dict[str, list[str]] = {}
    for _, r in results:
        if not r.error:
            for f, n in r.fires.items():
                if not n:
                    out.setdefault(f, []).append(f"{r.model} {r.mode}/{r.compile}")
    return out


def record_steps(records: Iterable, source: str) -> list[StepChange]:
    """The gate's evidence records (``miner.runtime.evidence.InModelRecord``) as measurements (no p20-p80, no memory)."""
    return [StepChange(r.model, r.mode, r.compile, r.speedup, r.band, r.verdict, matches=int(r.matches or 0),
                       source=source, date=str(r.date or ""), knob=r.knob) for r in records]


def gate_fires(records: Sequence) -> tuple[str, ...]:
    """Where the gate fires with these in-model records: "model mode/compile" of each record whose
    measured contexts the gate decides to fire in (``miner.runtime.evidence.fires_in``)."""
    from miner.runtime.evidence import fires_in

    return fires_in(records)


def kernel_range(c: CandidateInfo | None, runs: Sequence[BenchRun] = ()) -> KernelRange | None:
    """Speedups over Inductor across the shapes of the candidate's latest bench run (``c.bench`` is oldest first)."""
    if c is None or not c.bench:
        return None
    latest = c.bench[-1].run
    sp = [b.speedup for b in c.bench if b.run == latest and b.speedup is not None]
    if not sp:
        return None
    return KernelRange(min(sp), max(sp), len(sp), run_name(latest, runs))


def run_name(key: str, runs: Sequence[BenchRun]) -> str:
    """A bench run's name: the ``reports/gpu/<run>/`` folder it was saved in, else its GPU and date."""
    run = next((r for r in runs if r.key == key), None)
    if run is not None:
        for s in run.sources:
            p = Path(s)
            if p.parent.parent.name == "gpu":
                return p.parent.name
        return f"{run.gpu} {run.date}"
    return key


def _together(ws: Workspace, after: str | None = None) -> tuple[tuple[str, ...], str | None]:
    """The latest plain ``miner verify`` run (every fusion at once), one line per result; nothing when
    it is not newer than ``after`` (the latest in-model A/B's date)."""
    from miner.check import verify

    found = []
    for path in sorted(ws.reports.rglob("verify.json")):
        try:
            if read_json(path).get("kind") != "VerifyRun":
                continue
            results = verify.load(path)
        except (MinerError, OSError, ValueError, KeyError, TypeError):
            continue
        found.append((next((r.env.get("date") for r in results if r.env.get("date")), "") or "", str(path), results))
    if not found:
        return (), None
    date, path, results = max(found)
    if after and str(date) <= after:
        return (), None  # the in-model A/B's gated rows are newer: they are "all promoted fusions at once"
    lines = []
    for r in results:
        fired = sorted(k for k, v in r.matches.items() if v and not k.startswith("inductor."))
        if r.speedup is not None:
            lines.append(f"{r.model} {r.mode}: {r.speedup:.3f}x with {', '.join(fired) or 'none firing'}")
    return tuple(lines), str(Path(path).relative_to(ws.root))


# --------------------------------------------------------------------------- all of it

def decide(review: Review, ws: Workspace) -> Decisions:
    """The decision on every candidate of ``review`` and every promoted fusion of ``ws``.

    Parameters
    ----------
    review : Review
        What ``miner.rank.rank.review`` read (candidates, their bench points and runs).
    ws : Workspace
        Where ``reports/``, ``fusions/`` and ``candidates/`` are.

    Returns
    -------
    Decisions
        In ``ORDER`` (adopt, fires only in, not measured, not worth it, unsafe), then by the best
        measured step speedup, then by the best isolated kernel speedup.
    """
    files = ab_files(ws)  # every verify.json read once, for each view below
    found = latest_ab(ws, files)
    ab_source = ab_date = None
    measured: dict[str, list[StepChange]] = {}
    silent: dict[str, list[str]] = {}
    if found:
        paths, results = found
        ab_source = ", ".join(str(p.relative_to(ws.root)) for p in paths)
        ab_date = max((str(r.env.get("date")) for _, r in results if r.env.get("date")), default=None)
        measured = ab_steps([(str(p.relative_to(ws.root)), r) for p, r in results])
        silent = silent_in([(str(p), r) for p, r in results])
    rows: list[Decision] = []
    seen_fusions = set()
    for r in review.rows:
        c = r.candidate
        if c is None:
            continue
        fusion = c.fusion
        seen_fusions.add(fusion)
        rec_path = evidence_file(ws.root, fusion or c.id, fusion=bool(fusion))
        failed = ("validation failed: " + str((c.validation or {}).get("failure") or "see validation.json")
                  if c.status == "failed" else None)
        rows.append(_decision(c.id, fusion or c.label, r.pattern.ops, bool(fusion), rec_path, ws,
                              _evidence(measured, silent, (fusion or "", c.id), failed=failed,
                                        kernel=kernel_range(c, review.runs))))
    ranked = {r.candidate.id for r in review.rows if r.candidate is not None}
    for row in unranked_rows(ws, ranked, review.only_model, measured, silent):  # no mined pattern
        seen_fusions.add(row.name if row.promoted else None)
        rows.append(row)
    extra = sorted(ws.fusions.glob("*/fusion.json")) if ws.fusions.is_dir() and not review.only_model else ()
    for d in extra:  # a promoted fusion whose candidate is not in this workspace (with --model: not in that model)
        name = d.parent.name
        if name not in seen_fusions:
            rows.append(_decision(name, name, "", True, evidence_file(ws.root, name, fusion=True), ws,
                                  _evidence(measured, silent, (name,))))
    sets = set_steps([(src, r) for src, r in ab_results(ws, files) if is_gpu_run(r)])
    rows = [replace(d, together=tuple(sc for k in dict.fromkeys((d.id, d.name) if d.promoted else (d.id,))
                                      for sc in sets.get(k, ())))
            for d in rows]
    order = {v: i for i, v in enumerate(ORDER)}
    rows.sort(key=lambda d: (order[d.verdict], -max((s.speedup for s in d.steps), default=0.0),
                             -(d.kernel.hi if d.kernel else 0.0), d.id))
    together, tsource = _together(ws, ab_date)
    from miner.core import candidate as candidates

    steps = tuple(model_steps([(str(p.relative_to(ws.root)), r) for p, r in found[1]],
                              candidates.fusions_by_candidate(ws))) if found else ()
    recs = tuple(recommendations(ws, files)) if found else ()
    setups = [m.setup for m in steps] + [x.setup for d in rows for x in d.steps if x.setup]
    setup = max(set(setups), key=setups.count) if setups else ""
    return Decisions(tuple(rows), ab_source, ab_date, together, tsource, models=steps, setup=setup,
                     not_compared=cpu_runs(ws, files), configs=recs)


def unranked_rows(ws: Workspace, ranked: set[str], only_model: str | None, measured: dict[str, list[StepChange]],
                  silent: dict[str, list[str]]) -> list[Decision]:
    """The decision on every candidate of ``ws`` the ranking has no row for (``ranked``: the ids it has).

    Upcast-matmul candidates (``miner.rules.upcast``) and whole-region candidates (``miner generate
    --regions``) come from no mined pattern, so the ranking has no row for them; their evidence is
    the same as any candidate's: in-model A/B files (``measured``, by candidate id or by the fusion's
    name), the gate's records (``candidates/<id>/in_model.json`` or, once promoted,
    ``fusions/<name>/wins.json``), a failed validation. ``only_model``: only those observed in that model.
    """
    from miner.core import candidate as candidates

    promoted = candidates.fusions_by_candidate(ws)
    rows = []
    for folder in candidates.folders(ws):
        try:
            cand = candidates.at(folder)
            validation = candidates.validation(folder)
        except MinerError:
            continue  # the ranking's reader reports a corrupt candidate
        if cand.id in ranked or (only_model and only_model not in cand.meta.get("occurrences", {})):
            continue
        fusion = promoted.get(cand.id)
        failed = (f"validation failed: {validation.get('failure') or 'see validation.json'}"
                  if validation is not None and not validation.get("ok") else None)
        rec_path = evidence_file(ws.root, fusion or cand.id, fusion=bool(fusion))
        d = _decision(cand.id, fusion or cand.label, str(cand.meta.get("ops", "")), bool(fusion), rec_path, ws,
                      _evidence(measured, silent, (fusion or "", cand.id), failed=failed))
        rows.append(replace(d, status=candidates.status_of(validation, fusion, candidates.timed(folder))))
    return rows


@dataclass(frozen=True)
class _Evidence:
    """What a decision reads besides the gate's records: the in-model A/B step changes, why its
    validation failed, its isolated kernel range, and the A/B models it matched nothing in."""

    ab: list[StepChange]
    failed: str | None = None
    kernel: KernelRange | None = None
    silent: Sequence[str] = ()


def _evidence(measured: dict[str, list[StepChange]], silent: dict[str, list[str]], keys: Sequence[str], *,
              failed: str | None = None, kernel: KernelRange | None = None) -> _Evidence:
    """The :class:`_Evidence` filed under any of ``keys`` (a candidate id, a fusion's name)."""
    return _Evidence([s for k in keys for s in measured.get(k, [])], failed, kernel,
                     [m for k in keys for m in silent.get(k, [])])


def _decision(ident: str, name: str, ops: str, promoted: bool, rec_path: Path, ws: Workspace,
              found: _Evidence) -> Decision:
    from miner.runtime import evidence

    ab, failed, kernel, silent = found.ab, found.failed, found.kernel, found.silent
    records = evidence.read(rec_path)
    covered = {(s.model, s.mode, s.compile, s.knob) for s in ab}
    rel = str(rec_path.relative_to(ws.root)) if rec_path.is_relative_to(ws.root) else str(rec_path)
    steps = ab + [s for s in record_steps(records, rel) if (s.model, s.mode, s.compile, s.knob) not in covered]
    verdict, reason, won = verdict_of(steps, failed=failed, kernel=kernel)
    if silent and not steps and verdict == UNMEASURED:
        reason = f"matches nothing in the models the in-model A/B ran ({', '.join(silent)}): no step change to measure"
    fires = gate_fires(records) if promoted else ()
    cover = tuple(gate_coverage(rec_path, records)) if promoted else ()
    return Decision(ident, name, ops, promoted, verdict, reason, fires, won, tuple(steps), kernel, coverage=cover)


def gate_coverage(path: Path, records: Sequence) -> list[str]:
    """Where the gate of the fusion whose ``wins.json`` is ``path`` (its in-model ``records``) fires, per
    class of measured sites (``miner.runtime.evidence.coverage``: exact sites and the sizes their wins
    bracket; the file's isolated rows may keep a bracket off)."""
    from miner.runtime import evidence

    try:
        wins = read_json(path) if path.exists() else {}
    except MinerError:
        return []
    return evidence.coverage(records, evidence.isolated_rows(wins))


__all__ = ["ADOPT", "MARGINAL", "MODEL_STEP_HEADER", "ab_files", "cpu_runs", "is_gpu_run", "same_graph", "setup_diff", "setup_of",
           "step_label", "NOT_WORTH", "ONLY", "ORDER", "UNMEASURED", "UNSAFE", "VERDICTS", "Decision",
           "Decisions", "KernelRange", "ModelStep", "SetChange", "StepChange", "ab_results", "ab_steps", "model_step_cells", "model_steps", "decide", "gate_fires", "kernel_range", "latest_ab", "record_steps",
           "run_name", "set_steps", "silent_in", "unranked_rows", "verdict_of"]
