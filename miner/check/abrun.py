"""``miner verify --ab`` over several models and modes: the run, its files, and the evidence it records.

Writes ``verify.json`` (``{"schema": 2, "kind": "VerifyAB", "env", "results": [ABResult], "peers":
[PeerRow]}``) and ``verify.md`` after every model, so an interrupted run keeps what it measured.
``record(workspace, results)`` puts each fusion-alone verdict into ``fusions/<name>/wins.json``
(``in_model``), which the gate (``miner.runtime.gate``) reads and ``FusionPass.uuid`` hashes.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from miner.check import explain
from miner.check.ab import (COMPILE_MODES, ABOptions, ABResult, VariantResult, ab_from_json, ab_to_json, run_records,
                            rounds_for, run_ab, size_text, step_label)
from miner.check.promotion import _root
from miner.check.verify import format_step, load_fusions, run_env
from miner.core.dtypes import AUTOCAST_MODEL_TOL, PARITY_ATOL, PARITY_K
from miner.core.errors import MinerError, UsageError

KIND, SCHEMA = "VerifyAB", 2


def plan(modes: Sequence[str], compile_modes: Sequence[str]) -> list[tuple[str, str]]:
    """(step mode, compile mode) pairs in run order: every default compile first, dynamic last.

    ``reduce-overhead`` (CUDA graphs) is planned for inference only.
    """
    bad = [c for c in compile_modes if c not in COMPILE_MODES]
    if bad:
        raise UsageError(f"unknown compile mode {bad[0]!r}; modes: {', '.join(COMPILE_MODES)}")
    pairs = [(m, c) for c in ("default", "reduce-overhead", "dynamic") if c in compile_modes for m in modes
             if not (c == "reduce-overhead" and m == "train")]
    if not pairs:
        raise UsageError("nothing to run: reduce-overhead is measured for inference only (--mode infer)")
    return pairs


class CandidateSet:
    """Candidates (``candidates/<id>/pattern.py``, ungated) standing in for a fusions folder; names are ids.

    A candidate's extra check has no gate; for the A/B it is wrapped to count each match's
    context in the applying pass's log (``miner.runtime.gate.observe``), so its in-model records say where it fired.
    """

    gated = False

    def __init__(self, workspace: Any, ids: Sequence[str]):
        from miner.core import candidate as candidates
        from miner.core.workspace import Workspace

        ws = workspace if isinstance(workspace, Workspace) else Workspace(_root(workspace))
        self._cands = {c.id: c for c in (candidates.load(ws, i) for i in ids)}
        if not self._cands:
            raise UsageError("--candidates is empty")

    def names(self) -> list[str]:
        return list(self._cands)

    def load(self, name: str):
        from miner.runtime import gate

        module = self._cands[name].pattern_module
        if not getattr(module.extra_check, "_miner_observed", False):
            check = module.extra_check

            def observed(match, _check=check):
                return _check(match) and gate.observe(match, name, module.N_INPUTS)
            observed._miner_observed = True
            module.extra_check = observed  # register() reads the module global when it runs
        return module

    def graph_pass(self, selected: Sequence[str] | None = None, *, gate: str = "on", records: dict | None = None):
        """A pass of the selected candidates (ungated: ``gate`` changes nothing but the cache key)."""
        from miner.runtime import rewrite

        chosen = self.names() if selected is None else list(selected)
        return rewrite.FusionPass([rewrite.entry_for(self.load(n).__file__, n, self.load(n)) for n in chosen],
                                  gate=gate, records=records)


class NoFusions:
    """No fusion to measure (a workspace without promoted fusions and no ``--candidates``, or ``--no-fusions``):
    knobs only."""

    gated = False

    def names(self) -> list[str]:
        return []


def _has_fusions(workspace: Any) -> bool:
    from miner.runtime.fusions import Fusions

    return bool(Fusions(_root(workspace)).names())


def fusions_of(run: "ABRun", workspace: Any, knobs: Sequence[Any]):
    """What ``run`` measures: ``--candidates`` (ungated), else the workspace's promoted fusions; none where
    ``--no-fusions`` says so or a knobs-only run finds none promoted."""
    if not run.fusions:
        return NoFusions()
    if run.candidates:
        return CandidateSet(workspace, run.candidates)
    return load_fusions(_root(workspace)) if not knobs or _has_fusions(workspace) else NoFusions()


def shape_grid(batch: int | Sequence[int] | None, seq: int | Sequence[int] | None) -> list[tuple]:
    """Every (batch, seq) of the given values (one value or a list each; None: the preset's), batch-major.

    Raises
    ------
    UsageError
        For a size below 1 or a repeated value.
    """
    def values(v, name):
        vs = [None] if v is None else [v] if isinstance(v, int) else list(v)
        if any(x is not None and x < 1 for x in vs) or len(set(vs)) < len(vs) or not vs:
            raise UsageError(f"--{name} {','.join(map(str, vs))}: give distinct sizes of at least 1")
        return vs
    return [(b, s) for b in values(batch, "batch") for s in values(seq, "seq")]


@dataclass(frozen=True)
class ABRun:
    """A ``miner verify --ab`` run over models: what it plans per model, and how each A/B runs (``ab``).

    Built once from the command line (``miner.commands.verify``); Ray tasks carry it as it is.
    """

    ab: ABOptions
    modes: tuple[str, ...] = ("train",)
    compile_modes: tuple[str, ...] = ("default",)
    # one size or a list each; every (batch, seq) of :func:`shape_grid` is its own A/B (own compiles,
    # ``dynamic=False`` unless the compile mode says otherwise), in that order per model
    batch: int | tuple[int, ...] | None = None
    seq: int | tuple[int, ...] | None = None
    model_budget_s: float | None = None  # no variant compiles after this many seconds of one model and mode
    knobs: str | None = None  # the ``--knobs`` spec (``miner.check.knobs.parse``; a string, so Ray tasks carry it)
    candidates: tuple[str, ...] = ()  # A/B these candidate ids (ungated) instead of the promoted fusions
    fusions: bool = True  # False: the knobs alone, no fusion loaded (``--no-fusions``)


def run_all(models: Sequence[str], run: ABRun, *, time_budget_s: float | None = None, workspace: Any = ".",
            on_result: Callable[[ABResult], None] | None = None, log: Callable[[str], None] = print) -> list[ABResult]:
    """The A/B of every model in every planned mode of ``run``; a model that fails or is out of time is recorded.

    ``time_budget_s``: no model starts, and no variant compiles, after this many seconds of the run.
    """
    import torch

    import miner_models as zoo

    from miner.check import ab, knobs as knob_registry

    modes, compile_modes, preset, device = run.modes, run.compile_modes, run.ab.preset, run.ab.device
    model_budget_s = run.model_budget_s
    chosen_knobs = knob_registry.parse(run.knobs)
    fusions = fusions_of(run, workspace, chosen_knobs)
    log(f"fusions: {', '.join(fusions.names()) or 'none'}"
        + (f"; knobs: {', '.join(k.name for k in chosen_knobs)}" if chosen_knobs else ""))
    ab.raise_compile_limits()
    env = run_env(device)
    specs = [zoo.resolve(m) for m in models]
    start = time.perf_counter()
    deadline = None if time_budget_s is None else start + time_budget_s
    results = []
    shapes = shape_grid(run.batch, run.seq)
    for (mode, compile_mode), spec, (batch, seq) in ((p, sp, sh) for p in plan(modes, compile_modes)
                                                      for sp in specs for sh in shapes):
        if deadline is not None and time.perf_counter() > deadline:
            r = ABResult(spec.name, mode, compile_mode, preset, batch, seq, env=env,
                         error=f"skipped: --time-budget {time_budget_s:.0f} s spent")
        else:
            size = "" if batch is None and seq is None else f", batch {batch or 'preset'}, seq {seq or 'preset'}"
            log(f"{spec.name} {mode}/{compile_mode} (preset {preset}{size}), {time.perf_counter() - start:.0f} s in")
            ends = [t for t in (deadline, None if model_budget_s is None else time.perf_counter() + model_budget_s)
                    if t is not None]
            try:
                case = ab.ABCase(spec.name, mode, compile_mode, batch, seq)
                r = run_ab(lambda: spec.build(preset, mode, device), case, fusions, run.ab, knobs=chosen_knobs,
                           deadline=min(ends) if ends else None, env=env, log=log)
            except ab.Interrupted as e:  # Ctrl-C or SIGTERM: what was measured is saved, then the run stops
                log(f"  {spec.name} {mode}/{compile_mode}: {e.result.error or 'interrupted: the variants measured so far are kept'}")
                results.append(e.result)
                if on_result is not None:
                    on_result(e.result)
                raise
            except MinerError:
                raise
            except Exception as e:  # one model failing must not lose the others
                msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:400]
                log(f"  {spec.name} {mode}/{compile_mode}: ERROR {msg}")
                r = ABResult(spec.name, mode, compile_mode, preset, batch, seq, env=env, error=msg)
            torch._dynamo.reset()
            gc.collect()
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
        results.append(r)
        if on_result is not None:
            on_result(r)
    log(f"A/B done in {time.perf_counter() - start:.0f} s")
    return results


# --------------------------------------------------------------------------- evidence

def record(workspace: Any, results: Sequence[ABResult], source: str = "") -> list[Path]:
    """Write each fusion-alone verdict of ``results`` (over the default, and over each knob it was measured
    alone on: ``ab.run_records``) into ``fusions/<name>/wins.json`` (``in_model``), or, for a candidate id
    (``--candidates``), into ``candidates/<id>/in_model.json`` and into the ``wins.json`` of every fusion
    promoted from it (the gate reads those: a candidate measured again, e.g. at another shape, needs no
    second ``miner promote``).

    Only results measured on CUDA count (interpreter timings mean nothing); a record for the same
    model, mode, compile mode, preset, batch, seq and knob replaces the older one.
    """
    from miner.runtime import evidence

    root = _root(workspace)
    per_fusion: dict[str, list[dict]] = {}
    for r in results:
        if r.error or r.env.get("device", "cuda") != "cuda":
            continue
        for f, recs in run_records(r).items():
            per_fusion.setdefault(f, []).extend(replace(rec, source=source) for rec in recs)
    targets = {f: _evidence_files(root, f) for f in per_fusion}  # every fusion.json read before anything is written
    return [evidence.write(path, path.parent.name, per_fusion[f]) for f in sorted(per_fusion) for path in targets[f]]


def _evidence_files(root: Path, name: str) -> list[Path]:
    """Where :func:`record` writes the records of ``name``: a promoted fusion's ``wins.json`` (the gate's evidence);
    for a candidate id, its ``in_model.json`` (what ``miner promote`` requires) and the ``wins.json`` of every
    fusion promoted from it. A corrupt ``fusion.json`` raises here (``WorkspaceError``), before any write."""
    from miner.runtime import evidence
    from miner.runtime.fusions import promoted_from

    fusion = evidence.evidence_file(root, name, fusion=True)
    if fusion.parent.is_dir():
        return [fusion]
    own = evidence.evidence_file(root, name, fusion=False)
    promoted = [evidence.evidence_file(root, f, fusion=True) for f in promoted_from(root, name)]
    return ([own] if own.parent.is_dir() else []) + promoted


def nothing_recorded(results: Sequence[ABResult]) -> str:
    """Why :func:`record` wrote nothing for ``results``: one line (``--record`` never ends silently)."""
    cuda = [r for r in results if not r.error and r.env.get("device", "cuda") == "cuda"]
    if not cuda:
        return "nothing recorded: no result timed on CUDA (interpreter timings are no evidence)"
    together = sorted({f for r in cuda for v in r.variants if v.name in ("all", "gated") or v.name.endswith("+fusions")
                       for f, n in v.matches.items() if n})
    if together:
        return (f"nothing recorded: no fusion was measured alone ({', '.join(together)} fired only together); "
                "`--fusion-variants all,alone` (or `alone,gated` with --knobs) measures each alone")
    return "nothing recorded: no fusion fired"


# --------------------------------------------------------------------------- output

def band_note(r: ABResult) -> str:
    """What sets a band wider than 1% and, where it is the rounds' spread, how many rounds would narrow it."""
    control = r.variant("control")
    if control is None or control.step is None or control.speedup is None or not r.noise_band or r.noise_band <= 0.01:
        return ""
    offset = abs(control.speedup - 1.0)
    more = rounds_for(r.noise_band, offset, control.step.steps)
    if more is None:
        return (f" It is the control's own offset ({pct(offset)[2:]}: two identical compiles timed apart), "
                f"which more rounds do not narrow.")
    need, reach = more
    return (f" It comes from the spread over {control.step.steps} rounds: about {need} rounds would narrow it to "
            f"{pct(reach)} (`--rounds {need}`).")


def pct(x: float | None) -> str:
    return "-" if x is None else f"+-{100 * x:.2f}%"


def _gib(v, compile_mode: str) -> str:
    """The step's peak memory beyond what was allocated before it; not measured under CUDA graphs,
    whose private pool is allocated when the graph is captured (the timed step allocates nothing)."""
    if v.step is None or compile_mode == "reduce-overhead" or v.cudagraphs:
        return "-"
    return f"{v.step.peak_mem_bytes / 2**30:.2f}"


def summary_table(results: Sequence[ABResult]) -> str:
    lines = ["| model | mode | compile | size | default ms (p20-p80) | noise band | all, gate open | gated | "
             "fires with the gate open (alone: speedup, verdict; the gate's decisions) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r.error:
            lines.append(f"| {r.model} | {r.mode} | {r.compile} | {size_text(r)} | {r.error} | - | - | - | - |")
            continue
        d, a, g = r.variant("default"), r.variant("all"), r.variant("gated")

        def sp(v):
            return ("-" if v is None or v.speedup is None else
                    f"{v.speedup:.3f}x {step_label(v.verdict, v.speedup_p20) if v.verdict else ''}".strip())
        fires = []
        for f, n in sorted(r.fires.items()):
            v = r.variant(f"alone:{f}") or (a if n and [k for k, m in r.fires.items() if m] == [f] else None)
            if n and v is not None and v.error is None and not v.matches.get(f):  # fires only beside the others
                fires.append(f"{f} x{n} (alone: 0 matches, not measured alone)")
                continue
            sites = r.gate.get(f, {})
            gate_says = (f"; gate fires in {sum(d.startswith('fire') for d in sites.values())}/{len(sites)} contexts"
                         if sites else "")
            fires.append(f"{f} x{n}" + (f" ({sp(v)}{gate_says})" if n and v is not None else
                                        f" ({gate_says[2:]})" if n and gate_says else "" if n else " (does not fire)"))
        lines.append(f"| {r.model} | {r.mode} | {r.compile} | {size_text(r)} | {format_step(d.step if d else None)} | "
                     f"{pct(r.noise_band)} | {sp(a)} | {sp(g)} | {'; '.join(fires) or '-'} |")
    return "\n".join(lines) + "\n"



def detail(r: ABResult) -> str:
    out = [f"### {r.model} {r.mode} / {r.compile} (preset {r.preset}, {size_text(r)}; {r.seconds:.0f} s)", ""]
    if r.error:
        return "\n".join(out + [r.error, ""])
    out += [f"Noise band (default vs control): {pct(r.noise_band)}.{band_note(r)}"]
    out += [f"Noise band on top of knob:{k} (its compiled step timed twice per round; a fusion over it is judged "
            f"against this): {pct(b)}." for k, b in sorted(getattr(r, "knob_bands", {}).items())]
    out += ["",
            "| variant | gate | ms (p20-p80) | speedup | verdict | step peak GiB | matches | parity | compile s | "
            "kernels vs default (us/step) | note |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for v in r.variants:
        if v.error:
            out.append(f"| {v.name} | {v.gate} | - | - | - | - | - | - | - | - | {v.error} |")
            continue
        m = ", ".join(f"{k}={n}" for k, n in sorted(v.matches.items()) if n) or ("none" if v.fusions else "-")
        par = parity_cell(v.parity)
        cs = "-" if v.compile_s is None else f"{v.compile_s:.1f}"
        if v.compile_s is not None and v.pass_s:
            cs += f" (miner's pass {sum(v.pass_s.values()):.1f})"
        out.append(f"| {v.name} | {v.gate} | {format_step(v.step)} | "
                   f"{_speedup(v)} | {step_label(v.verdict, v.speedup_p20)} | {_gib(v, r.compile)} | {m} | "
                   f"{par} | {cs} | {explain.describe(v.kernels)} | {v.note} |")
    if r.gate:
        cpu = "" if r.env.get("device", "cuda") == "cuda" else " (CPU run: the gate passes here; this is what it would decide on CUDA)"
        out += ["", f"The gate's decision per context (the evidence incl. this run's `alone` verdicts){cpu}:", ""]
        out += [f"- {f} `{site}`: {d}" for f, sites in sorted(r.gate.items()) for site, d in sorted(sites.items())]
    decisions = [(v.name, k, n) for v in r.variants for k, n in sorted(v.gate_decisions.items())]
    if decisions:
        out += ["", "Gate decisions while compiling (with the gate open: what it would have decided):", ""]
        out += [f"- {name}: x{n} {k}" for name, k, n in decisions]
    return "\n".join(out) + "\n"


def parity_cell(p) -> str:
    """``ok`` / ``FAIL`` with the rule that judged it and, against the float32 floor, the numbers."""
    if p is None:
        return "-"
    from miner.check.masks import METHOD

    judged = getattr(p, "judged", "fixed tolerance")
    if judged == "float32 floor" or judged.startswith(METHOD):
        return f"{'ok' if p.ok else 'FAIL'} ({judged}: {p.reason})"
    return ("ok" if p.ok else f"FAIL (loss {p.loss_rel}, grads {p.grads_rel})") + f" ({judged})"


def _speedup(v: VariantResult) -> str:
    if v.speedup is None:
        return "-"
    rng = "" if v.speedup_p20 is None else f" ({v.speedup_p20:.3f}-{v.speedup_p80:.3f})"
    return f"{v.speedup:.3f}x{rng}"


def _env(results: Sequence[ABResult]) -> dict:
    """The run's environment: the results', or this machine's for a peers-only run."""
    env = next((r.env for r in results if r.env), None)
    if env is None:
        import torch
        env = run_env("cuda" if torch.cuda.is_available() else "cpu")
    return env


def markdown(results: Sequence[ABResult], peers: Sequence[dict] = ()) -> str:
    env = _env(results)
    head = (f"GPU {env.get('gpu')}, torch {env.get('torch')}, triton {env.get('triton')}, CUDA {env.get('cuda')}, "
            f"date {env.get('date')}")
    md = [f"# miner verify --ab\n\n{head}\n",
          "Per model, step mode and compile mode: the default compile, a second default compile (control: "
          "its difference is the noise band: the larger of |median over rounds of default/control - 1| and "
          "twice the standard error of that median, from the p20-p80 spread of the per-round ratios), every fusion with the gate forced "
          "open (`all`), each fusion that fires alone (`alone:<f>`), and every fusion with the gate on "
          "(`gated`, deciding from in-model evidence incl. this run's `alone` verdicts). Timed steps alternate "
          "between the variants (round robin, Python's garbage collector paused within a round, ~1 ms of GPU "
          "work queued ahead of each step as in a loop that never synchronizes); median and p20-p80 per "
          "variant; speedup = median over rounds of default/variant (paired), with its p20-p80; verdict win / loss beyond the band, else noise. bf16 autocast; train = forward + "
          f"loss + backward. Parity of one seeded step: each variant's and the default's relative error to the "
          "same step compiled in float32 (same weights, inputs and dropout draws: the same seed before each "
          f"observed step); a variant passes when its error is at most {PARITY_K:g} x the default's + "
          f"{PARITY_ATOL} per quantity (without a usable float32 step: the direct difference within "
          f"{AUTOCAST_MODEL_TOL}); a variant that breaks parity is `parity-fail`, never a win. "
          "Step peak: the timed step's peak memory beyond what was allocated before it; under CUDA graphs "
          "(reduce-overhead) a timed step allocates nothing (its tensors live in the graphs' pool, allocated "
          "when they were recorded), so the configurations table gives the peak over the warm-up steps that "
          "recorded them, marked (warm-up); verify.json holds every variant's warm-up peak to compare. Kernels: torch.profiler kernel time "
          "per step against the default's, Inductor's kernel numbers stripped.\n", summary_table(results)]
    if peers:
        from miner.check.peers import peer_table
        md += ["\n## Peer: Liger-Kernel on llama (each variant in its own process)\n", peer_table(peers)]
    gated = [(r, r.variant("gated")) for r in results if not r.error and r.variant("gated")]
    gated = [(r, v) for r, v in gated if v.speedup is not None]
    if gated:
        r, v = min(gated, key=lambda rv: rv[1].speedup)
        md.insert(2, f"With the gate on, the slowest step is {r.model} {r.mode}/{r.compile} at {v.speedup:.3f}x "
                     f"({'within' if v.speedup >= 0.99 else 'BELOW'} the 0.99x target).\n")
    from miner.check import configs

    if any(v.knob for r in results for v in r.variants):
        md += ["\n## Configurations: knobs and fusions (the recommendation)\n", configs.markdown(results)]
    md += ["\n## Per model\n"] + [detail(r) for r in results]
    return "\n".join(md)


def save(results: Sequence[ABResult], out_dir: Path, peers: Sequence[dict] = ()) -> list[Path]:
    from miner.core.workspace import write_json, write_text

    env = _env(results)
    data = {"schema": SCHEMA, "kind": KIND, "env": env, "parity_tolerance": AUTOCAST_MODEL_TOL,
            "results": [ab_to_json(r) for r in results], "peers": list(peers)}
    out_dir = Path(out_dir)
    return [write_json(out_dir / "verify.json", data), write_text(out_dir / "verify.md", markdown(results, peers))]


def load(path: Path) -> tuple[list[ABResult], list[dict]]:
    from miner.core.workspace import read_json

    data = read_json(Path(path))
    if data.get("kind") != KIND:
        raise UsageError(f"{path}: not a `miner verify --ab` file (kind {data.get('kind')!r})")
    return [ab_from_json(r) for r in data["results"]], list(data.get("peers", []))

