"""Which configuration to run a model with: knobs, fusions, both or neither, from one in-model A/B.

``miner verify --ab --knobs ...`` times, per model, step mode and compile mode, in one alternating
harness: the default compile, the fusions as a user gets them (``gated``; candidates: ``all``), each
knob alone (``knob:<k>``) and each knob with the fusions (``knob:<k>+fusions``). ``configurations``
turns one such ``ABResult`` into :class:`Config` rows; ``recommend`` is the rule, a pure function:

1. **unusable**: a configuration that failed to compile or run, or broke parity against the default
   compile (``miner.check.verify.make_parity``, the rule the fusions are held to), is never recommended;
2. **faster beyond noise**: only a configuration whose step is faster than the default by more than
   the run's noise band (verdict ``win``) can be recommended; none: the default, with that reason;
3. **the fastest**, except that a configuration with fewer changes (a knob alone rather than the knob
   with the fusions; the fusions rather than a knob that changes numerics) within the noise band of
   it is preferred: the extra change buys nothing measurable. Among equals in changes, one that keeps
   the default's numerics goes first;
4. **the fusions' share**: speedup(best knob + fusions) / speedup(best knob), the best knob being the
   fastest usable knob alone; with the knob's own band where the run timed its control (its step timed
   twice per round: ``Config.knob_band``), else the run's noise band (the two are paired against the same
   default in the same rounds), a share above 1 + band is a measured gain of the fusions on top of the knob
   (rule 3 tells the two apart by the same band);
5. **numerics**: each knob that says it changes numerics, with its measured relative difference to the
   default compile (the largest of loss, logits and gradients);
6. **memory**: where a usable configuration faster than the default peaks at least :data:`LEANER` below the
   recommended one (peaks measured alike: both a timed step's, or both the warm-up's of CUDA graphs), the
   fastest such one is named beside it with what it costs in speed: the choice when memory binds
   (``recompute_dropout_masks``: no dropout mask saved for the backward).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping, Sequence

DEFAULT, FUSIONS = "default", "fusions"
LEANER = 0.05  # rule 6: a peak this much (relative) below the recommended configuration's is worth naming


@dataclass(frozen=True)
class Config:
    """One measured configuration of a model step."""

    name: str  # default, fusions, <knob>, <knob>+fusions
    knob: str | None = None
    fusions: bool = False
    speedup: float | None = None  # paired median of default / this
    p20: float | None = None
    p80: float | None = None
    verdict: str | None = None  # win / loss / noise
    parity_ok: bool | None = None
    error_rel: float | None = None  # the largest relative difference to the default (loss, logits, grads)
    numerics: str = ""  # how the knob changes numerics, as it declares
    ms: float | None = None
    peak_gib: float | None = None  # None: not measured (CUDA graphs)
    compile_s: float | None = None
    error: str | None = None
    band: float | None = None  # the noise band of the run that measured it
    source: str = ""  # that run's verify.json
    # judged with the step's own masks injected: ``error_rel`` is the largest error to that reference and
    # ``floor_rel`` the default's own to its reference (None: judged against the default compile)
    floor_rel: float | None = None
    # why parity could not be judged (the judge's reason): such a configuration is never recommended,
    # and it is not a measured failure either
    unjudged: str = ""
    peak_warmup: bool = False  # ``peak_gib`` is the warm-up's (CUDA graphs: their pool), not a timed step's
    fired: tuple[str, ...] = ()  # the fusions (or candidate ids) that matched in it
    # the noise band of steps on top of its knob: the knob's own step timed twice per round
    # (``ABResult.knob_bands``); None where the run timed no such control (the run's ``band`` then)
    knob_band: float | None = None

    @property
    def changes(self) -> int:
        """How many changes to the default compile: each knob part, and the fusions."""
        return (len(self.knob.split("+")) if self.knob else 0) + int(self.fusions)

    @property
    def usable(self) -> bool:
        return self.error is None and self.speedup is not None and self.parity_ok is not False


@dataclass(frozen=True)
class Recommendation:
    """The configuration to run one model step with, and what stands behind it."""

    model: str
    mode: str
    compile: str
    best: Config
    reason: str
    band: float | None
    configs: tuple[Config, ...] = ()  # usable ones fastest first, then the unusable ones
    best_knob: Config | None = None
    best_knob_fused: Config | None = None
    share: float | None = None  # speedup(best knob + fusions) / speedup(best knob)
    share_verdict: str | None = None  # win / loss / noise against ``share_band``
    numerics: tuple[str, ...] = ()
    source: str = ""
    date: str = ""
    setup: str = ""  # where it was measured (``miner.check.ab.setup_of``): GPU, preset, batch, seq, dtype
    how: str = ""  # the code that runs ``best`` (:func:`how`), where the caller knows the workspace
    share_band: float | None = None  # the best knob's own band where measured (``Config.knob_band``), else ``band``
    leaner: Config | None = None  # rule 6: the fastest usable win peaking at least LEANER below ``best``

    @property
    def where(self) -> str:
        return f"{self.model} {self.mode}/{self.compile}"

    def to_json(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------- the rule

def _band_verdict(x: float | None, band: float | None) -> str | None:
    if x is None or band is None:
        return None
    return "win" if x > 1.0 + band else "loss" if x < 1.0 - band else "noise"


def _why_unusable(c: Config) -> str:
    if c.error:
        return c.error
    if c.unjudged:
        return f"parity not judged ({c.unjudged})"
    if c.parity_ok is False:
        return "parity failed" + (f" (max rel diff {c.error_rel:.1e})" if c.error_rel is not None else "")
    return "not timed"


def recommend(configs: Sequence[Config], band: float | None, *, model: str = "", mode: str = "",
              compile: str = "default") -> Recommendation:
    """The configuration to recommend among ``configs`` of one model step (rules in the module docstring).

    Parameters
    ----------
    configs : sequence of Config
        Every measured configuration, ``default`` included (speedup 1 by definition if absent).
    band : float, optional
        The run's noise band (relative), from the default-vs-control rounds.

    Returns
    -------
    Recommendation
    """
    default = next((c for c in configs if c.name == DEFAULT), Config(DEFAULT, speedup=1.0))
    usable = sorted((c for c in configs if c.usable and c.name != DEFAULT), key=lambda c: -c.speedup)
    unusable = [c for c in configs if not c.usable and c.name != DEFAULT]
    knobs = [c for c in usable if c.knob and not c.fusions]
    best_knob = knobs[0] if knobs else None
    fused = next((c for c in usable if best_knob is not None and c.knob == best_knob.knob and c.fusions), None)
    share = fused.speedup / best_knob.speedup if fused is not None and best_knob.speedup else None
    said: dict[str, list[str]] = {}  # knobs saying the same (t5: the SDPA flag alone and in two combinations)
    for c in configs:
        if c.knob and not c.fusions and c.numerics:
            said.setdefault(f"{c.numerics}" + (f"; measured max rel diff to the default {c.error_rel:.1e}"
                                               if c.error_rel is not None else "")
                            + ("" if c.parity_ok is not False else " (parity FAILED)"), []).append(c.name)
    numerics = tuple(f"{', '.join(names)}: {text}" for text, names in said.items())
    wins = [c for c in usable if c.verdict == "win"]
    bad = "; ".join(f"{c.name}: {_why_unusable(c)}" for c in unusable)
    if not wins:
        best = default
        reason = (f"nothing measured faster than the default beyond the noise band ±{100 * (band or 0):.1f}%"
                  + (f" (left out: {bad})" if bad else ""))
    else:
        fastest = wins[0]
        near = [c for c in wins if c.speedup >= fastest.speedup * (1.0 - (_apart(c, fastest, band) or 0.0))]
        best = min(near, key=lambda c: (c.changes, bool(c.numerics), -c.speedup))
        reason = f"{best.speedup:.3f}x, faster than the default beyond the noise band ±{100 * (band or 0):.1f}%"
        if best is not fastest:
            reason += (f"; {fastest.name} ({fastest.speedup:.3f}x) is within the band of it with more changes "
                       f"({fastest.changes} vs {best.changes})")
        if bad:
            reason += f"; never recommended: {bad}"
    share_band = _apart(fused, best_knob, band) if fused is not None and best_knob is not None else band
    return Recommendation(model, mode, compile, best, reason, band, tuple(usable + unusable), best_knob, fused, share,
                          _band_verdict(share, share_band), numerics, share_band=share_band,
                          leaner=_leaner(best, wins))


def _leaner(best: Config, wins: Sequence[Config]) -> Config | None:
    """Rule 6: the fastest of ``wins`` whose peak is at least :data:`LEANER` below ``best``'s, measured alike."""
    if best.peak_gib is None:
        return None
    return next((c for c in wins if c.peak_gib is not None and c.peak_warmup == best.peak_warmup
                 and c.peak_gib <= best.peak_gib * (1.0 - LEANER)), None)


def _apart(a: Config, b: Config, band: float | None) -> float | None:
    """The band two configurations are told apart by: the knob's own (``Config.knob_band``) between two on
    top of the same knob (its step and the same with the fusions, timed in the same rounds), else the run's."""
    if a.knob and a.knob == b.knob:
        own = b.knob_band if b.knob_band is not None else a.knob_band
        if own is not None:
            return own
    return band


# --------------------------------------------------------------------------- from A/B results

def _error_rel(parity: Any) -> float | None:
    """The largest relative difference behind a parity verdict: to the default compile, or, where the
    variant draws other random numbers and was judged with its own masks injected (``error``), to
    that reference (the direct difference then compares two random streams: it says nothing)."""
    if parity is None:
        return None
    if _masked(parity):
        return _largest(parity.error)
    return _largest({"loss": parity.loss_rel, "logits": parity.logits_rel, "grads": parity.grads_rel})


def _masked(parity: Any) -> bool:
    from miner.check.masks import METHOD

    return str(getattr(parity, "judged", "")).startswith(METHOD) and bool(getattr(parity, "error", None))


def _largest(d: dict | None) -> float | None:
    vals = [v for v in (d or {}).values() if v is not None]
    return max(vals) if vals else None


def _config(name: str, v: Any, *, knob: str | None, fusions: bool, r: Any, source: str) -> Config:
    s = v.step
    return Config(name, knob, fusions, 1.0 if name == DEFAULT else v.speedup, v.speedup_p20, v.speedup_p80,
                  v.verdict, None if v.parity is None else bool(v.parity.ok), _error_rel(v.parity), v.numerics,
                  None if s is None else s.median_ms,
                  _peak_gib(v), v.compile_s, v.error,
                  r.noise_band, source,
                  _largest(v.parity.floor) if v.parity is not None and _masked(v.parity) else None,
                  _unjudged(v.parity), bool(v.cudagraphs and getattr(v, "warmup_peak_bytes", None) is not None),
                  tuple(f for f, n in sorted((getattr(v, "matches", None) or {}).items()) if n) if fusions else (),
                  (getattr(r, "knob_bands", None) or {}).get(knob) if knob else None)


def _peak_gib(v: Any) -> float | None:
    """The step's peak GiB; under CUDA graphs (the step allocates nothing: its tensors live in the
    graphs' pool, allocated when they were recorded) the peak over the warm-up steps that recorded them,
    None where not measured (``Config.peak_warmup`` says which)."""
    if v.cudagraphs:
        w = getattr(v, "warmup_peak_bytes", None)
        return None if w is None else w / 2**30
    return None if v.step is None else v.step.peak_mem_bytes / 2**30


def _unjudged(parity: Any) -> str:
    """The judge's reason where parity could not be judged (``Parity.judged`` ends "(not judged)")."""
    if parity is None or not parity.unjudged:
        return ""
    return str(getattr(parity, "reason", "") or "no reason recorded")


def configurations(r: Any, source: str = "") -> list[Config]:
    """The configurations an ``ABResult`` measured: default, the fusions as a user gets them (``gated``;
    for candidates, which have no gate, ``all``), and each knob variant."""
    out = []
    for v in r.variants:
        if v.name == DEFAULT:
            out.append(_config(DEFAULT, v, knob=None, fusions=False, r=r, source=source))
        elif v.name == "gated" or (v.name == "all" and r.variant("gated") is None):
            out.append(_config(FUSIONS, v, knob=None, fusions=True, r=r, source=source))
        elif v.knob and "+alone:" not in v.name:  # a fusion alone on a knob is evidence, not a configuration
            fused = v.name.endswith("+fusions")
            out.append(_config(v.knob + ("+fusions" if fused else ""), v, knob=v.knob, fusions=fused, r=r,
                               source=source))
    return out


def recommendations(results: Sequence[Any], sources: Sequence[str] = ()) -> list[Recommendation]:
    """One :class:`Recommendation` per (model, mode, compile mode, preset) whose A/B results measured a knob.

    ``results`` oldest first (``sources``: each one's file, by position): the configurations of several
    runs of the same model step in the same setup (GPU, preset, batch, sequence, dtype: runs on two GPUs
    never pool) are pooled, a later measurement of a configuration replacing an earlier one (a GPU
    session split over calls: the fusions in one, a knob in the next). Each configuration's verdict is
    against its own run's noise band; the recommendation's band is the widest of them.
    """
    from miner.check.ab import setup_of

    pooled: dict[tuple, dict[tuple, Config]] = {}
    latest: dict[tuple, Any] = {}
    for i, r in enumerate(results):
        if r.error:
            continue
        key = (r.model, r.mode, r.compile, setup_of(r))
        confs = pooled.setdefault(key, {})
        for c in configurations(r, sources[i] if i < len(sources) else ""):
            confs[(c.name, c.fired if c.fusions else ())] = c
        latest[key] = r
    out = []
    for key, held in pooled.items():
        confs = _named_apart(held)
        if not any(c.knob for c in confs.values()):
            continue
        bands = [c.band for c in confs.values() if c.band is not None and c.name != DEFAULT]
        rec = recommend(list(confs.values()), max(bands) if bands else None, model=key[0], mode=key[1],
                        compile=key[2])
        srcs = sorted({c.source for c in confs.values() if c.source})
        out.append(replace(rec, source=", ".join(srcs), date=str(latest[key].env.get("date") or ""), setup=key[3]))
    return out


def _named_apart(held: Mapping[tuple, Config]) -> dict[str, Config]:
    """Pooled configurations by name; where runs measured one name with different fusions firing (t5's
    five candidates on top of a knob in one call, one compute-once candidate in another), each keeps its
    measurement, named with what fired: a later run replaces an earlier one only where the same fusions fired."""
    from collections import Counter

    count = Counter(name for name, _ in held)
    out = {}
    for (name, fired), c in held.items():
        if count[name] > 1:
            c = replace(c, name=f"{name} [{', '.join(fired) or 'none fired'}]")
        out[c.name] = c
    return out


# --------------------------------------------------------------------------- how to run it

def how(best: Config, fusion_of: Mapping[str, str], workspace: str = ".") -> str:
    """The code that runs ``best`` in a user's own script: each knob's line (``miner.check.knobs.code``),
    ``miner.runtime.fusions.install(workspace)`` where it holds fusions, and the ``torch.compile`` call.

    ``fusion_of``: the workspace's promoted fusions by name and by the candidate id each was promoted from
    (``miner.core.candidate.fusions_by_candidate``). A measured fusion that is a candidate not promoted yet
    is named with the command that promotes it: until then a user's compile does not hold it."""
    from miner.check import knobs

    lines, calls = [], []
    for part in (best.knob.split("+") if best.knob else []):
        try:
            code = knobs.code(knobs.get(part))
        except Exception:  # noqa: BLE001 - a knob of your own that no longer imports: named, not written out
            code = [f"the knob {part}"]
        for line in code:
            (calls if line.startswith("torch.compile(") else lines).append(line)
    compile_call = " with ".join(calls) or "torch.compile(model)"  # two modes: both said, neither merged by guess
    todo = []
    if best.fusions:
        lines.append(f"miner.runtime.fusions.install({json.dumps(workspace)})")
        todo = [f for f in best.fired if f not in fusion_of]
    text = "; ".join(lines + [f"model = {compile_call}"])
    if todo:
        text += (f" (first promote {', '.join(todo)}: `miner promote <id> --name <name>`, each needs its "
                 "own in-model win)")
    return text


def with_how(recs: Sequence[Recommendation], ws: Any) -> list[Recommendation]:
    """``recs`` with :attr:`Recommendation.how` written for the workspace ``ws`` (its promoted fusions, its
    path as a user would pass it from the current directory)."""
    import os

    from miner.core import candidate as candidates
    from miner.runtime import fusions

    fusion_of = {name: name for name in fusions.names(ws.fusions)}
    fusion_of.update(candidates.fusions_by_candidate(ws))
    try:
        where = os.path.relpath(ws.root)
    except ValueError:  # another drive (Windows)
        where = str(ws.root)
    return [replace(r, how=how(r.best, fusion_of, where)) for r in recs]


# --------------------------------------------------------------------------- text

def _sp(c: Config | None) -> str:
    if c is None or c.speedup is None:
        return "-"
    rng = f" [{c.p20:.3f}-{c.p80:.3f}]" if c.p20 is not None and c.p80 is not None and c.name != DEFAULT else ""
    return f"{c.speedup:.3f}x{rng}"


def _own_knob_share(rec: Recommendation) -> list[str]:
    """Where the recommended configuration is a knob with the fusions and that knob is not the best knob
    alone (t5: the SDPA flag with CUDA graphs and the fusions, while the same with the masks drawn into bits
    is the fastest knob), what the fusions add on top of its own knob: that is what they buy the user."""
    best = rec.best
    if not (best.fusions and best.knob and rec.best_knob is not None and best.knob != rec.best_knob.knob):
        return []
    alone = next((c for c in rec.configs if c.knob == best.knob and not c.fusions and c.usable), None)
    if alone is None or not alone.speedup or best.speedup is None:
        return []
    share, band = best.speedup / alone.speedup, _apart(best, alone, rec.band)
    across = "" if best.source == alone.source else "; the two from different runs, each against its own default"
    return [f"  fusions on top of its own knob ({alone.name}): {share:.3f}x ({_band_verdict(share, band)} against "
            f"±{100 * (band or 0):.1f}%{across})"]


def _unmeasured(rec: Recommendation) -> str:
    """Says the fusions on top of the best knob were not measured, and the command that measures them."""
    name = rec.best_knob.knob or rec.best_knob.name
    return (f"not measured (`miner verify --ab --models {rec.model} --mode {rec.mode} --knobs {name} "
            f"--fusion-variants none` measures it)")


def lines(rec: Recommendation, width: int = 100, *, setup: str = "") -> list[str]:
    """The recommendation in a few lines of at most ``width`` columns (terminal, ``miner tune``'s end);
    ``setup``: where it was measured, named in brackets (where it differs from the page's setup)."""
    band = "-" if rec.band is None else f"±{100 * rec.band:.1f}%"
    out = [f"{rec.where}" + (f" [{setup}]" if setup else "") + f": run {rec.best.name} ({_sp(rec.best)}; "
           f"noise band {band})", f"  why: {rec.reason}"]
    if rec.best_knob is not None:
        if rec.share is not None:
            own = rec.share_band is not None and rec.share_band != rec.band
            out.append(f"  fusions on top of the best knob ({rec.best_knob.name}): {rec.share:.3f}x "
                       f"({rec.share_verdict} against ±{100 * (rec.share_band or 0):.1f}%"
                       + (", the knob's own band: its step timed twice per round)" if own else ")"))
        else:
            unusable = next((c for c in rec.configs if c.knob == rec.best_knob.knob and c.fusions), None)
            out.append(f"  fusions on top of the best knob ({rec.best_knob.name}): "
                       + (f"not usable: {_why_unusable(unusable)}" if unusable is not None else _unmeasured(rec)))
    out += _own_knob_share(rec)
    out += [f"  numerics: {n}" for n in rec.numerics]
    if (lean := rec.leaner) is not None and rec.best.peak_gib:
        kind = "warm-up peak (CUDA graphs' pool)" if lean.peak_warmup else "peak"
        out.append(f"  where memory binds: {lean.name}, {kind} {lean.peak_gib:.2f} GiB "
                   f"({100 * (lean.peak_gib / rec.best.peak_gib - 1):+.1f}% of {rec.best.peak_gib:.2f}) at "
                   f"{_sp(lean)} ({100 * (rec.best.speedup / lean.speedup - 1):.1f}% slower)")
    if rec.how and rec.best.name != DEFAULT:
        out.append(f"  how: {rec.how}")
    import textwrap

    return [w for line in out for w in textwrap.wrap(line, width, subsequent_indent="    ")]


HEADER = ("configuration", "ms", "speedup [p20-p80]", "verdict", "peak GiB", "compile s", "parity (max rel diff)")


def cells(c: Config) -> list[str]:
    """The cells of :data:`HEADER` for one configuration."""
    from miner.check.ab import step_label

    par = f"not judged ({c.unjudged})" if c.unjudged else (
        "-" if c.parity_ok is None else "ok" if c.parity_ok else "FAIL") + (
        f" (masks injected: {c.error_rel:.1e}, the default's floor {c.floor_rel:.1e})" if c.floor_rel is not None
        else f" ({c.error_rel:.1e})" if c.error_rel is not None else "")
    return [c.name + (" *" if c.numerics else ""), "-" if c.ms is None else f"{c.ms:.2f}",
            c.error or _sp(c), "unjudged" if c.unjudged else step_label(c.verdict, c.p20),
            "-" if c.peak_gib is None else f"{c.peak_gib:.2f}" + (" (warm-up)" if c.peak_warmup else ""),
            "-" if c.compile_s is None else f"{c.compile_s:.1f}", par]


def markdown(results: Sequence[Any]) -> str:
    """Per A/B result with knobs: the recommendation, then every configuration (a markdown table)."""
    md = []
    for rec in recommendations(results):
        md += [f"**{rec.where}**: run `{rec.best.name}`.", ""] + [f"- {x.strip()}" for x in lines(rec, 10**6)[1:]]
        md += ["", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
        default = Config(DEFAULT)
        rows = [next((c for c in configurations(_by(results, rec)) if c.name == DEFAULT), default)] + list(rec.configs)
        md += ["| " + " | ".join(cells(c)) + " |" for c in rows] + [""]
    md.append("`*`: the knob changes numerics (its parity column is measured against the default compile). "
              "Speedup: paired median of default/configuration over the rounds; verdict against the run's noise band.")
    return "\n".join(md) + "\n"


def _by(results: Sequence[Any], rec: Recommendation) -> Any:
    from miner.check.ab import setup_of

    return next(r for r in results if (r.model, r.mode, r.compile, setup_of(r)) == (rec.model, rec.mode, rec.compile,
                                                                                    rec.setup))


__all__ = ["Config", "HEADER", "Recommendation", "cells", "configurations", "lines", "markdown", "recommend",
           "recommendations"]
