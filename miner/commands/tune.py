"""``miner tune``: from a model to a measured recommendation, in one command (GPU).

Stages, in order, each through the code of the verb that owns it:

1. ``profile``  ``miner profile``: the compiled step's kernels, captures, ``mined/regions.json``;
2. ``mine``     ``miner mine --models ...``: ``mined/patterns.json``, ``upcasts.json``, ``recomputed.json``,
   ``epilogues.json``;
3. ``generate`` every kind that applies (``miner.generate``): the best row patterns (``--top``), the
                regions with the most measured time above floor (``--regions``), upcast matmuls,
                compute-once values, GEMM epilogues;
4. ``validate`` ``miner.check.validate`` on each new candidate (numerics, the rewrite fires in a model);
5. ``ab``       ``miner verify --ab``: the validated candidates and the knobs (``--knobs``) in the
                model step, alternating; ``--record`` on CUDA (the candidates' in-model evidence);
then, always (cheap, no GPU): ``miner report`` and the decision (``miner.check.configs``) printed.

Resume: ``<out>/tune.json`` records each finished stage; a stage recorded there whose outputs still
read back is skipped (said so), so a run cut short (Ctrl-C, a lost machine) goes on where it stopped
when the same command runs again (``--fresh``: start over). ``--time-budget S``: no stage starts after
S seconds (those skipped are named), and the A/B gets what is left as its own budget.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from miner.core import executor
from miner.core.errors import MinerError, UsageError

HELP = ("one command from a model to a measured recommendation (GPU): profile, mine, generate, validate, "
        "A/B of the candidates and the knobs, report, the decision")
DEFAULT_KNOBS = "sdpa_reduced_math,reduce_overhead"
STATE = "tune.json"


def add_arguments(p) -> None:
    p.add_argument("--models", required=True, metavar="M,...", help="zoo models (`miner models`)")
    p.add_argument("--mode", default="train", metavar="train,infer", help="step modes (default train)")
    p.add_argument("--preset", default=None, help="zoo preset (default base on CUDA, tiny with --allow-cpu)")
    p.add_argument("--knobs", default=DEFAULT_KNOBS, metavar="K,...",
                   help=f"knobs for the A/B (`miner verify --knobs`; default {DEFAULT_KNOBS}; '' for none)")
    p.add_argument("--top", type=int, default=3, metavar="N", help="row-pattern candidates to generate (default 3)")
    p.add_argument("--regions", type=int, default=2, metavar="N",
                   help="region candidates: the N regions with the most measured time above floor (default 2)")
    p.add_argument("--rounds", type=int, default=15, help="A/B alternating rounds (default 15)")
    p.add_argument("--fusion-variants", default="all,gated", metavar="V,...",
                   help="A/B fusion variants (`miner verify --fusion-variants`; default all,gated: the default, "
                        "the candidates together (all), each knob alone and with the candidates; gated leaves "
                        "out all (one compile less: the fusions are then measured only on top of a knob, and not "
                        "at all where no knob fits the GPU's memory); all,alone,gated also measures each "
                        "candidate alone, one compile each)")
    p.add_argument("--warmup", type=int, default=3, help="A/B warm-up steps, the first compiles (default 3)")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="A/B steps per variant under torch.profiler for the kernel diff (default 0: none)")
    p.add_argument("--model-budget", type=float, default=None, metavar="S",
                   help="A/B: compile no further variant after S seconds of one model and mode")
    p.add_argument("--time-budget", type=float, default=None, metavar="S",
                   help="start no stage after S seconds (the A/B gets what is left); skipped stages are named")
    p.add_argument("--out", metavar="DIR", help="where the A/B and tune.json go (default reports/tune/<models>)")
    p.add_argument("--fresh", action="store_true", help="ignore the saved stages of an earlier run; start over")
    p.add_argument("--allow-cpu", action="store_true",
                   help="smoke-run on the CPU (tiny preset, Triton interpreter); its times mean nothing")
    executor.add_arguments(p)


@dataclass
class Run:
    """What every stage reads: the settings, the workspace, the saved state, the clock."""

    args: Any
    ws: Any
    device: str
    preset: str
    models: list[str]
    modes: list[str]
    out: Path
    state: dict = field(default_factory=dict)
    start: float = field(default_factory=time.perf_counter)
    stage: str = ""  # the stage running now

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def remaining(self) -> float | None:
        b = self.args.time_budget
        return None if b is None else b - self.elapsed()

    def log(self, line: str) -> None:
        print(f"[tune {self.elapsed():5.0f} s] {line}", flush=True)

    def verb(self, argv: list[str]) -> int:
        """Run another verb in this process, through its own parser (its defaults, its checks)."""
        from miner.cli import build_parser

        args = build_parser(argv[0]).parse_args(argv)
        args.workspace = str(self.ws.root)
        return int(args.run(args) or 0)

    def ex_args(self) -> list[str]:
        return ["--executor", self.args.executor] + (["--address", self.args.address] if self.args.address else [])


@dataclass(frozen=True)
class Stage:
    """``run(run) -> outputs`` (JSON-able, kept in tune.json); ``done(run, outputs)``: they still read back."""

    name: str
    run: Callable[[Run], dict]
    done: Callable[[Run, dict], bool]
    what: str


# --------------------------------------------------------------------------- the stages

def _profile(run: Run) -> dict:
    code = run.verb(["profile", "--models", ",".join(run.models), "--mode", ",".join(run.modes), "--preset",
                     run.preset, "--device", run.device, *run.ex_args()])
    if code and not _profiled(run, {}):
        raise UsageError("miner profile failed for every model (see above)")
    return {"profiles": sorted(f"{p.model}/{p.mode}" for p in _profiles(run))}


def _profiles(run: Run) -> list:
    from miner.scan import profile as prof

    return [p for p in prof.load_all(run.ws, run.models) if p.preset == run.preset and p.mode in run.modes]


def _profiled(run: Run, out: dict) -> bool:
    try:
        return {(p.model, p.mode) for p in _profiles(run)} >= {(m, x) for m in run.models for x in run.modes}
    except Exception:  # a profile that does not read back: profile again
        return False


def _mine(run: Run) -> dict:
    run.verb(["mine", "--models", ",".join(run.models), "--top", "5"])
    return {"patterns": "mined/patterns.json"}


def _mined(run: Run, out: dict) -> bool:
    from miner.core.pattern import load_mining

    try:
        return set(run.models) <= set(load_mining(run.ws).params.get("models", ()))
    except Exception:
        return False


def _generate(run: Run) -> dict:
    """Every kind that applies; one kind failing does not stop the others (its error is printed). The
    kinds go in the order validation and the A/B take them: regions (their time above floor was
    measured in the step) first, then upcasts, recomputed values and GEMM epilogues, then row patterns (estimated)."""
    from miner.core.pattern import load_patterns
    from miner.generate import generate as gen
    from miner.generate import epilogue, realize, upcast

    ids: list[str] = []

    def kind(name: str, make: Callable[[], list]) -> None:
        try:
            got = [g for g in make() if g is not None]
        except Exception as e:  # noqa: BLE001  a kind that cannot be generated here is reported, not fatal
            run.log(f"  generate {name}: {executor.one_line(e)}")
            return
        run.log(f"  generate {name}: {len(got)} candidate(s) {' '.join(g.id for g in got)}".rstrip())
        ids.extend(g.id for g in got if g.id not in ids)

    def rows() -> list:
        chosen, pre = gen.select(load_patterns(run.ws), run.args.top or None)
        return gen.generate(run.ws, chosen, command=f"miner generate --top {run.args.top} --keep", pre_skipped=pre)[0]

    mined = Path(run.ws.root) / "mined"
    if run.args.regions:
        kind("regions", lambda: _regions(run))
    if (mined / "upcasts.json").is_file():
        kind("upcasts", lambda: [upcast.generate(run.ws, "mined/upcasts.json", "miner generate --upcasts "
                                                 "mined/upcasts.json", demote=d) for d in (False, True)])
    if (mined / "recomputed.json").is_file():
        kind("recomputed", lambda: realize.generate(run.ws, "mined/recomputed.json",
                                                    "miner generate --recomputed mined/recomputed.json"))
    if (mined / "epilogues.json").is_file():
        kind("epilogues", lambda: [epilogue.generate(run.ws, "mined/epilogues.json",
                                                     "miner generate --epilogues mined/epilogues.json")])
    if run.args.top:
        kind("row patterns", rows)
    return {"candidates": ids}


def _regions(run: Run) -> list:
    """The ``--regions`` measured regions with the most time above floor that generate, going down the
    list past those the generator refuses (each refusal printed with its reason), as ``miner generate
    --regions`` writes them (dropout regions draw four numbers per Philox call: ``<id>_x4``)."""
    from miner.commands.generate import region_command
    from miner.generate import generate as gen
    from miner.mine import regions

    rel = f"mined/{regions.REGIONS_FILE}"
    done: list = []
    for rp in sorted(regions.load(run.ws), key=lambda rp: -rp.above_floor_us):
        if len(done) >= run.args.regions:
            break
        if not rp.measured or not set(rp.pattern.support.models) & set(run.models):
            continue
        command, source = region_command(rel, [rp.pattern.id], "philox4")
        got, skipped = gen.generate(run.ws, [rp.pattern], command=command, source=source)
        done += got
        for r in skipped:
            run.log(f"    region {rp.id} ({rp.above_floor_us / 1000:.1f} ms/step above floor): {r.reason[:160]}")
    return done


def _generated(run: Run, out: dict) -> bool:
    return all((Path(run.ws.candidates) / c / "candidate.json").is_file() for c in out.get("candidates", ()))


def _validate(run: Run) -> dict:
    """Each candidate generated above; one validated earlier (its validation.json reads back) is not redone.
    None starts once the time left would not cover it (as long as the longest so far) and the A/B's
    compiles with it (:func:`_ab_estimate`)."""
    from miner.check.validate import validate

    ok, failed, took = [], [], []
    ids = run.state["stages"]["generate"]["outputs"]["candidates"]
    knobs = _knob_count(run)  # the captures, read once
    for i, cid in enumerate(ids):
        folder = Path(run.ws.candidates) / cid
        saved = _read_validation(folder)
        if saved is not None:
            run.log(f"  {cid}: validated earlier ({'ok' if saved.get('ok') else 'FAILED'}), kept")
            (ok if saved.get("ok") else failed).append(cid)
            continue
        left, need = run.remaining(), _ab_estimate(run, len(ok) + 1, knobs)
        if left is not None and left <= (need or 0) + max(took, default=0.0):
            run.log(f"  {cid}: not validated (--time-budget: {max(left, 0):.0f} s left" +
                    (f"; the A/B with it needs ~{need:.0f} s, a validation took up to {max(took, default=0):.0f} s)"
                     if need else ")"))
            continue
        run.log(f"  validate {cid} ({i + 1}/{len(ids)})")
        t0 = run.elapsed()
        v = validate(run.ws, cid, device=run.device, model=True, log=lambda s: None)
        took.append(run.elapsed() - t0)
        run.log(f"  {cid}: {'validated' if v.ok else 'FAILED: ' + str(v.failure)[:70]}")
        (ok if v.ok else failed).append(cid)
    return {"validated": ok, "failed": failed}


A_B_COMPILE_SHARE = 0.65  # an A/B variant's compile against the profile's of the same step (DeBERTa-v2 base
# train on the H100, 2026-12-06: 48.0 and 47.8 s in the A/B, 74.6 s in the profile, which also benchmarks kernels)


def _ab_estimate(run: Run, candidates: int, knobs: int | None = None) -> float | None:
    """Seconds the A/B would take with ``candidates`` validated: one compile per variant it builds (the
    float32 parity reference, the default, ``all``, ``alone`` once per candidate over the default (with
    ``all``) and over each knob, each knob alone and with the fusions; the control reads the default's cache;
    ``gated`` compiles only for promoted fusions, which have a gate), each ``A_B_COMPILE_SHARE`` of the
    profile's compile of the same step (its scan's seconds, summed over the models and modes). ``knobs``: how
    many apply (read from the captures here if None). None without such a scan here."""
    scans = [run.ws.load_scan(m, run.preset, mode) for m in run.models for mode in run.modes]
    seconds = sum(float(getattr(sc, "seconds", 0) or 0) for sc in scans if sc is not None)
    if not seconds:
        return None
    if knobs is None:
        knobs = _knob_count(run)
    variants = {v.strip() for v in (run.args.fusion_variants or "").split(",") if v.strip()}
    alone = ("alone" in variants) * candidates * (("all" in variants) + knobs)  # over the default, over each knob
    compiles = 2 + 2 * knobs + ("all" in variants) + alone + ("gated" in variants and not candidates)
    return float(seconds) * A_B_COMPILE_SHARE * compiles


def _read_validation(folder: Path) -> dict | None:
    from miner.core import candidate as candidates

    try:
        return candidates.validation(folder)
    except Exception:
        return None


def _validated(run: Run, out: dict) -> bool:
    return all(_read_validation(Path(run.ws.candidates) / c) is not None for c in out.get("validated", ()))


def _ab(run: Run) -> dict:
    ids = run.state["stages"].get("validate", {}).get("outputs", {}).get("validated", [])
    knobs = _knobs_that_apply(run)
    variants = run.args.fusion_variants
    if not knobs and ids and variants == "gated":  # no knob+fusions variant to measure them in: gate open
        variants = "all"
        run.log("  no knob applies: the candidates are measured together with the gate open (--fusion-variants all)")
    argv = ["verify", "--ab", "--models", ",".join(run.models), "--mode", ",".join(run.modes), "--preset", run.preset,
            "--rounds", str(run.args.rounds), "--warmup", str(run.args.warmup), "--profile-steps",
            str(run.args.profile_steps), "--out", str(run.out / "ab"), "--fusion-variants", variants,
            *run.ex_args()]
    argv += ["--candidates", ",".join(ids)] if ids else []
    argv += ["--knobs", knobs] if knobs else []
    argv += ["--model-budget", str(run.args.model_budget)] if run.args.model_budget else []
    argv += ["--time-budget", f"{max(1.0, run.remaining()):.0f}"] if run.remaining() is not None else []
    argv += ["--record"] if run.device == "cuda" else ["--allow-cpu"]
    if not ids and not knobs and not _has_fusions(run):
        raise UsageError("nothing to A/B: no candidate validated, no promoted fusion and --knobs ''")
    run.log(f"  miner {' '.join(argv)}")
    (run.out / "ab" / "verify.json").unlink(missing_ok=True)  # an earlier, unfinished A/B's: not this one's
    code = run.verb(argv)
    if not _ab_saved(run, {}):
        raise UsageError(f"miner verify --ab wrote no {run.out / 'ab' / 'verify.json'} (exit {code})")
    return {"verify": str(run.out / "ab" / "verify.json"), "exit": code}


def _knobs_that_apply(run: Run, quiet: bool = False) -> str:
    """``--knobs`` without the knobs that cannot change these models' steps (``Knob.applies`` over
    their captured graphs and profiles), each one left out named with why."""
    from miner.check import knobs as knob_registry

    roots = (run.ws.captures, Path(run.ws.root) / "profiles")
    text = "".join(f.read_text(errors="replace") for m in run.models for root in roots
                   for f in sorted((root / m / run.preset).glob("*.json")))
    kept = []
    for item in (k.strip() for k in (run.args.knobs or "").split(",") if k.strip()):
        knob = knob_registry.parse(item)[0]
        if text and not knob.applies(text):
            if not quiet:
                run.log(f"  knob {item} left out: no {' or '.join(knob.needs)} in the step's graphs or kernels")
        else:
            kept.append(item)
    mined = _mined_knobs(run)
    for item, why in mined.items():
        if item not in kept and run.args.knobs != "":  # --knobs '' asks for none
            kept.append(item)
            if not quiet:
                run.log(f"  knob {item} added: {why}")
    return ",".join(kept)


def _mined_knobs(run: Run) -> dict[str, str]:
    """Knobs mining found sites for in these models' graphs, with why: ``gemm_epilogues`` where
    ``mined/epilogues.json`` holds an addmm + activation its rule takes (``miner.mine.epilogue``), unless the
    ``gemm_epilogue`` candidate made from those sites is in the workspace: it measures the same rewrite, gated and
    promotable, so the knob's two compiles would measure it twice."""
    from miner.generate.epilogue import candidate_id
    from miner.mine import epilogue

    if (run.ws.candidates / candidate_id() / "candidate.json").is_file():
        return {}

    path = Path(run.ws.mined) / epilogue.EPILOGUES_FILE
    try:
        found = epilogue.load(path)["found"] if path.is_file() else []
    except Exception:  # noqa: BLE001 - an unreadable file adds nothing; `miner mine` rewrites it
        return {}
    taken = [f for f in found if f.get("ok") and f.get("model") in run.models]
    if not taken:
        return {}
    return {"gemm_epilogues": f"mining found {len(taken)} addmm + activation its rule takes "
                              f"({', '.join(sorted({f['model'] + ' ' + f['mode'] for f in taken}))}; "
                              f"mined/{epilogue.EPILOGUES_FILE})"}


def _knob_count(run: Run) -> int:
    """How many of ``--knobs`` can change these models' steps (:func:`_knobs_that_apply`, quietly)."""
    return len([k for k in _knobs_that_apply(run, quiet=True).split(",") if k])


def _has_fusions(run: Run) -> bool:
    from miner.runtime.fusions import Fusions

    return bool(Fusions(run.ws.root).names())


def _ab_saved(run: Run, out: dict) -> bool:
    from miner.check import abrun

    try:
        return bool(abrun.load(run.out / "ab" / "verify.json")[0])
    except Exception:
        return False


STAGES = (
    Stage("profile", _profile, _profiled, "the compiled step's kernels and regions (miner profile)"),
    Stage("mine", _mine, _mined, "mined patterns, upcasts, recomputed values (miner mine)"),
    Stage("generate", _generate, _generated, "candidates of every kind that applies (miner generate)"),
    Stage("validate", _validate, _validated, "numerics and the rewrite firing in a model (miner validate)"),
    Stage("ab", _ab, _ab_saved, "the candidates and the knobs in the model step (miner verify --ab)"),
)


# --------------------------------------------------------------------------- the command

def _state_path(run: Run) -> Path:
    return run.out / STATE


def _load_state(run: Run, fresh: bool) -> dict:
    from miner.core.workspace import read_json

    want = {"models": run.models, "modes": run.modes, "preset": run.preset, "device": run.device}
    path = _state_path(run)
    if path.is_file() and not fresh:
        try:
            old = read_json(path)
        except Exception:
            old = {}
        if {k: old.get(k) for k in want} == want:
            return old
        run.log(f"{path}: saved for other settings ({ {k: old.get(k) for k in want} }); starting over")
    return {**want, "stages": {}}


def _save_state(run: Run) -> None:
    from miner.core.workspace import write_json

    write_json(_state_path(run), run.state)


def run_stages(run: Run, stages: tuple[Stage, ...] | None = None) -> list[str]:
    """Run (or skip) each stage in order (default ``STAGES``); returns the names of the stages it ran now."""
    stages = STAGES if stages is None else stages
    ran: list[str] = []
    for i, stage in enumerate(stages):
        saved = run.state["stages"].get(stage.name)
        if saved and saved.get("done") and stage.done(run, saved.get("outputs", {})):
            run.log(f"stage {i + 1}/{len(stages)} {stage.name}: done earlier ({saved.get('seconds', 0):.0f} s), "
                    f"its outputs read back: skipped")
            continue
        left = run.remaining()
        if left is not None and left <= 0:
            rest = [s.name for s in stages[i:] if not (run.state["stages"].get(s.name) or {}).get("done")]
            run.log(f"--time-budget {run.args.time_budget:.0f} s spent: skipped {', '.join(rest)} "
                    f"(run the same command again to go on)")
            break
        run.log(f"stage {i + 1}/{len(stages)} {stage.name}: {stage.what}")
        run.stage = stage.name
        t0 = time.perf_counter()
        outputs = stage.run(run)
        run.state["stages"][stage.name] = {"done": True, "seconds": round(time.perf_counter() - t0, 1),
                                           "outputs": outputs}
        _save_state(run)  # a later interruption resumes after this stage
        ran.append(stage.name)
        run.log(f"stage {stage.name}: done in {time.perf_counter() - t0:.0f} s")
    return ran


def decision_lines(run: Run) -> list[str]:
    """The recommendation per model and mode (``miner.check.configs``) and each candidate's verdict alone."""
    from miner.check import abrun
    from miner.check.ab import run_records
    from miner.check import configs

    path = run.out / "ab" / "verify.json"
    if not path.is_file():
        return ["no A/B yet: no decision (run the same command again to go on)"]
    results, _ = abrun.load(path)
    out = [line for rec in configs.with_how(configs.recommendations(results), run.ws) for line in configs.lines(rec)]
    for r in results:
        if r.error:
            out.append(f"{r.model} {r.mode}/{r.compile}: {r.error}")
            continue
        if not any(v.knob for v in r.variants):
            out.append(f"{r.model} {r.mode}/{r.compile}: no knob measured")
        for f, recs in sorted(run_records(r).items()):
            for rec in recs:
                over = f" on top of {rec.knob}" if rec.knob else ""
                out.append(f"  candidate {f} alone{over}: {rec.speedup:.3f}x {rec.verdict} (±{100 * rec.band:.1f}%)")
        held = sorted({f for v in r.variants for f in v.fusions if v.step is not None})
        idle = [f for f in held if not any((v.matches or {}).get(f) for v in r.variants)]
        for f in idle:  # measured nowhere: say so, not only "nothing faster than the default"
            out.append(f"  {f}: matched nothing in this step (0 matches in every variant): not measured")
    return out


def run(args: argparse.Namespace) -> int:
    from miner import bench
    from miner.core.workspace import Workspace

    if args.allow_cpu:
        from miner.commands import interpret_on_cpu

        interpret_on_cpu("tune")
    device = "cuda" if executor.elsewhere(args) and not args.allow_cpu else \
        bench.require_cuda("miner tune", allow_cpu=args.allow_cpu)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    if not models:
        raise UsageError("--models is empty")
    if not modes or any(m not in ("train", "infer") for m in modes):
        raise UsageError(f"--mode {args.mode!r}: use train, infer or train,infer")
    if args.rounds < 1 or args.warmup < 1 or args.top < 0 or args.regions < 0:
        raise UsageError("--rounds and --warmup must be at least 1, --top and --regions at least 0")
    if args.knobs:
        from miner.check import knobs
        knobs.parse(args.knobs)  # an unknown knob fails now, not after the profile
    ws = Workspace(args.workspace)
    preset = args.preset or ("base" if device == "cuda" else "tiny")
    out = Path(args.out) if args.out else ws.reports / "tune" / "-".join(models)[:80]
    r = Run(args, ws, device, preset, models, modes, out)
    r.state = _load_state(r, args.fresh)
    r.log(f"miner tune: {', '.join(models)} ({','.join(modes)}, preset {preset}, {device}); state {_state_path(r)}"
          + (f"; --time-budget {args.time_budget:.0f} s" if args.time_budget is not None else ""))
    try:
        ran = run_stages(r)
    except KeyboardInterrupt:
        r.log(f"interrupted: the finished stages are saved in {_state_path(r)}; the same command goes on from there")
        if r.stage == "ab" and _ab_saved(r, {}):  # the A/B was cut: what it had measured
            print("\nDecision so far (the A/B was interrupted; from the variants it had measured):")
            for line in decision_lines(r):
                print(line)
        raise
    run_name = "tune-" + "-".join(models)[:60]
    if ran or not (ws.reports / run_name / "index.html").is_file():
        r.log(f"report: miner report --run {run_name}")
        try:
            r.verb(["report", "--run", run_name])
        except MinerError as e:  # e.g. nothing to report: every stage was skipped or found nothing
            r.log(f"report: not written ({e})")
    print()
    print("Decision (measured in the model step; `miner candidates` and the report lead with it):")
    for line in decision_lines(r):
        print(line)
    return 0
