"""Benchmark rows, their JSON, and what is made of them: the run table, the targets, the chart, wins per shape.

``save_results`` writes ``candidates/<id>/bench.json`` (one run per GPU, this stage's file in a
candidate folder) and the run's ``reports/gpu/<date>-<gpu>/`` table; ``wins_table`` is the isolated
part of a promoted fusion's ``wins.json`` (``miner promote`` writes that). Isolated rows never enable
a firing alone: in-model A/B records decide (``miner.runtime.evidence.RULE``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from miner.bench import roofline as rl
from miner.bench.cases import BenchCase
from miner.bench.timing import Env, Timing
from miner.core.errors import MinerError
from miner.core.tensors import TensorSpec

BASELINE = "inductor"
COPY = "copy"  # a plain copy of the same number of bytes, same harness: the size-matched ceiling
VARIANTS = ("eager", "inductor", "max-autotune", "candidate")
BENCH_SCHEMA = 1


@dataclass(frozen=True)
class VariantResult:
    name: str
    timing: Timing | None = None
    rel_err: float | None = None  # ||out - ref64|| / ||ref64|| over all outputs
    max_abs_err: float | None = None
    numerics_ok: bool | None = None
    error: str | None = None
    compile_s: float | None = None



@dataclass(frozen=True)
class BenchRow:
    candidate: str
    name: str
    case: BenchCase
    outputs: tuple[TensorSpec, ...]
    bytes_moved: int
    roofline_ms: float
    rotation: int
    variants: tuple[VariantResult, ...]
    env: Env

    @property
    def l2_resident(self) -> bool:
        """True when even the rotation's whole working set fits in twice the L2 (tiny shapes)."""
        return self.rotation * self.bytes_moved < 2 * self.env.l2_bytes

    def variant(self, name: str) -> VariantResult | None:
        return next((v for v in self.variants if v.name == name), None)

    def ms(self, name: str) -> float | None:
        v = self.variant(name)
        return v.timing.median_ms if v is not None and v.timing is not None else None

    def roofline_pct(self, name: str = "candidate") -> float | None:
        ms = self.ms(name)
        return None if ms is None else 100.0 * rl.roofline_share(self.bytes_moved, ms, self.env.copy_gbps)

    def speedup(self, name: str = "candidate", over: str = BASELINE) -> float | None:
        a, b = self.ms(name), self.ms(over)
        return None if a is None or b is None or a <= 0 else b / a

    def wins(self) -> bool | None:
        """Candidate at least as fast as Inductor (median), beyond the two 20/80 spreads' overlap."""
        s = self.speedup()
        return None if s is None else s >= 1.0


# ---- JSON (every record round-trips)

def row_to_json(row: BenchRow) -> dict:
    d = asdict(row)
    d["outputs"] = [s.to_json() for s in row.outputs]
    d["case"]["inputs"] = [s.to_json() for s in row.case.inputs]
    d["case"]["derived_from"] = [s.to_json() for s in row.case.derived_from]
    d["speedup_vs_inductor"] = row.speedup()
    d["speedup_vs_max_autotune"] = row.speedup(over="max-autotune")
    d["roofline_pct"] = {v.name: row.roofline_pct(v.name) for v in row.variants}
    return d


def row_from_json(d: dict) -> BenchRow:
    c = d["case"]
    case = BenchCase(inputs=tuple(TensorSpec.from_json(s) for s in c["inputs"]), scalars=tuple(c.get("scalars", [])),
                     models=tuple(c.get("models", ())), source=c.get("source", "captured"),
                     preset=c.get("preset", "tiny"), roles=tuple(c.get("roles", ())),
                     derived_from=tuple(TensorSpec.from_json(s) for s in c.get("derived_from", ())),
                     phases=tuple(c.get("phases", ())), count=c.get("count", 0), cast=c.get("cast"))
    variants = tuple(VariantResult(**{**v, "timing": Timing(**v["timing"]) if v.get("timing") else None})
                     for v in d["variants"])
    return BenchRow(candidate=d["candidate"], name=d.get("name", d["candidate"]), case=case,
                    outputs=tuple(TensorSpec.from_json(s) for s in d["outputs"]), bytes_moved=d["bytes_moved"],
                    roofline_ms=d["roofline_ms"], rotation=d["rotation"], variants=variants, env=Env(**d["env"]))



# --------------------------------------------------------------------------- results

def wins_table(rows: Sequence[BenchRow]) -> dict:
    """Per candidate: the shapes where it is at least as fast as Inductor, and where it loses.

    Stored in a fusion's ``wins.json`` for the record and for the gate's bracket rule, where a
    ``loses`` row inside a bracket of in-model wins keeps the fusion off; a ``wins`` row never
    enables a firing (``miner.runtime.evidence.RULE``).
    """
    out: dict[str, dict] = {}
    for r in rows:
        s = r.speedup()
        if s is None:
            continue
        entry = out.setdefault(r.candidate, {"name": r.name, "wins": [], "loses": [], "gpu": r.env.gpu})
        item = {"inputs": [i.to_json() for i in r.case.inputs], "row_length": r.case.row_length,
                "speedup_vs_inductor": round(s, 4), "source": r.case.source, "models": list(r.case.models)}
        (entry["wins"] if s >= 1.0 else entry["loses"]).append(item)
    for entry in out.values():
        win_rows = [w["row_length"] for w in entry["wins"] if w["row_length"]]
        lose_rows = [w["row_length"] for w in entry["loses"] if w["row_length"]]
        entry["max_winning_row"] = max(win_rows) if win_rows else None
        entry["min_losing_row"] = min(lose_rows) if lose_rows else None
    return out


def _fmt_us(ms: float | None) -> str:
    return "-" if ms is None else f"{ms * 1e3:.1f}"


def _fmt_pct(p: float | None) -> str:
    return "-" if p is None or not math.isfinite(p) else f"{p:.0f}%"


def markdown_table(rows: Sequence[BenchRow]) -> str:
    lines = ["| candidate | models | shape (inputs) | source | eager us | inductor us | max-autotune us | candidate us | "
             "roofline us | same-size copy us | cand. % roofline | ind. % roofline | vs inductor | vs max-autotune | notes |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        notes = "; ".join(f"{v.name}: {v.error}" for v in r.variants if v.error)
        if r.l2_resident and r.env.device.startswith("cuda"):
            notes = f"working set {r.rotation} x {r.bytes_moved / 1e3:.0f} kB stays in L2" + (f"; {notes}" if notes else "")
        if r.case.source == "derived":
            notes = (f"derived from {' '.join(map(str, r.case.derived_from))} as {' '.join(r.case.roles)}"
                     + (f"; {notes}" if notes else ""))
        sp, spm = r.speedup(), r.speedup(over="max-autotune")
        lines.append(
            f"| {r.name} | {','.join(r.case.models)} | {r.case.label} | {r.case.source} | {_fmt_us(r.ms('eager'))} | "
            f"{_fmt_us(r.ms('inductor'))} | {_fmt_us(r.ms('max-autotune'))} | {_fmt_us(r.ms('candidate'))} | "
            f"{_fmt_us(r.roofline_ms)} | {_fmt_us(r.ms(COPY))} | {_fmt_pct(r.roofline_pct('candidate'))} | {_fmt_pct(r.roofline_pct('inductor'))} | "
            f"{'-' if sp is None else f'{sp:.2f}x'} | {'-' if spm is None else f'{spm:.2f}x'} | {notes} |")
    return "\n".join(lines) + "\n"


ROOFLINE_TARGET = 0.90  # share of the memory roofline, for rows up to ROOFLINE_ROWS elements
ROOFLINE_ROWS = 8192


def targets(rows: Sequence[BenchRow]) -> list[str]:
    """The issue's targets checked on measured rows, one line per miss (and a summary line).

    * the candidate at least as fast as Inductor on every shape (median);
    * at least 90% of the memory roofline for rows up to 8192 elements (rows whose working set
      stays in L2 are left out). A miss names the size-matched copy's share too: when a plain copy
      of the same bytes also falls short, the size, not the kernel, sets the limit.
    """
    lines, n_speed, n_roof, n_roof_ok, n_speed_ok = [], 0, 0, 0, 0
    for r in rows:
        s = r.speedup()
        where = f"{r.name} [{','.join(r.case.models)}] {r.case.label} ({r.case.source})"
        if s is not None:
            n_speed += 1
            if s >= 1.0:
                n_speed_ok += 1
            else:
                lines.append(f"- slower than Inductor: {where}: {s:.2f}x ({_fmt_us(r.ms('candidate'))} us vs "
                             f"{_fmt_us(r.ms('inductor'))} us, {100 * (1 / s - 1):.0f}% more time)")
        pct = r.roofline_pct("candidate")
        if pct is None or r.case.row_length is None or r.case.row_length > ROOFLINE_ROWS or r.l2_resident:
            continue
        n_roof += 1
        if pct >= 100 * ROOFLINE_TARGET:
            n_roof_ok += 1
            continue
        copy_ms = r.ms(COPY)
        copy_pct = None if copy_ms is None else 100 * r.roofline_ms / copy_ms
        lines.append(f"- under {100 * ROOFLINE_TARGET:.0f}% of the roofline: {where}: {pct:.0f}% "
                     f"({100 * ROOFLINE_TARGET - pct:.0f} points short); a copy of the same bytes reaches "
                     f"{_fmt_pct(copy_pct)}, Inductor {_fmt_pct(r.roofline_pct('inductor'))}")
    head = [f"- at least 1.0x Inductor: {n_speed_ok} of {n_speed} timed shapes",
            f"- at least {100 * ROOFLINE_TARGET:.0f}% of the memory roofline (rows <= {ROOFLINE_ROWS}, working set "
            f"beyond L2): {n_roof_ok} of {n_roof}"]
    return head + lines


def env_header(env: Env) -> str:
    return (f"GPU {env.gpu} ({env.sm_count} SMs, L2 {env.l2_bytes / 2**20:.0f} MiB), torch {env.torch}, "
            f"triton {env.triton}, CUDA {env.cuda}, date {env.date}; measured device-to-device copy "
            f"{env.copy_gbps:.0f} GB/s (read + write), the roofline's bandwidth; miner {env.miner}"
            + ("; TRITON_INTERPRET=1 (CPU smoke run: times mean nothing)" if env.interpret else ""))


def plot(rows: Sequence[BenchRow], path: Path) -> Path | None:
    """Per shape, bars of each variant's median time and the roofline (log scale, us)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    if not rows:
        return None
    names = list(VARIANTS) + ["roofline"]
    colors = {"eager": "#999999", "inductor": "#1f77b4", "max-autotune": "#17becf", "candidate": "#d62728",
              "roofline": "#2ca02c"}
    fig_h = max(3.0, 0.45 * len(rows) + 1.5)
    fig, ax = plt.subplots(figsize=(12, fig_h))
    width = 0.8 / len(names)
    labels = []
    for i, r in enumerate(rows):
        labels.append(f"{r.name} {','.join(r.case.models)} {r.case.label}"[:90])
        for j, n in enumerate(names):
            ms = r.roofline_ms if n == "roofline" else r.ms(n)
            if ms is not None:
                ax.barh(i + j * width - 0.4 + width / 2, ms * 1e3, height=width, color=colors[n],
                        label=n if i == 0 or n not in ax.get_legend_handles_labels()[1] else None)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels, fontsize=6)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("median time per call, us (log)")
    env = rows[0].env
    ax.set_title(f"miner bench: {env.gpu}, torch {env.torch}, triton {env.triton}, {env.date[:10]}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def gpu_slug(env: Env) -> str:
    name = env.gpu.lower().replace("nvidia", "").strip()
    return "".join(c if c.isalnum() else "-" for c in name).strip("-") or "cpu"


def save_results(rows: Sequence[BenchRow], env: Env, *, candidate_dirs: dict[str, Path] | None,
                 report_dir: Path | None, json_only: bool = False) -> list[Path]:
    """``candidates/<id>/bench.json`` per candidate (its rows replace that GPU's earlier ones) and the run table.

    ``candidate_dirs`` maps a candidate id to its folder.
    """
    from miner.core.workspace import read_json, write_json, write_text

    written = []
    by_cand: dict[str, list[BenchRow]] = {}
    for r in rows:
        by_cand.setdefault(r.candidate, []).append(r)
    if candidate_dirs:
        for cid, rs in by_cand.items():
            if cid not in candidate_dirs:
                continue
            path = Path(candidate_dirs[cid]) / "bench.json"
            old = read_json(path) if path.exists() else {}
            runs = [x for x in old.get("runs", []) if x.get("env", {}).get("gpu") != env.gpu]
            runs.append({"env": asdict(env), "rows": [row_to_json(r) for r in rs],
                         "where_it_wins": wins_table(rs).get(cid)})
            written.append(write_json(path, {"schema": BENCH_SCHEMA, "kind": "BenchResults", "candidate": cid,
                                             "runs": runs}))
    if report_dir is not None:
        report_dir = Path(report_dir)
        data = {"schema": BENCH_SCHEMA, "kind": "BenchRun", "env": asdict(env),
                "rows": [row_to_json(r) for r in rows], "where_it_wins": wins_table(rows)}
        written.append(write_json(report_dir / "bench.json", data))
        if json_only:
            return written
        written.append(write_json(report_dir / "wins.json", wins_table(rows)))
        md = (f"# miner bench\n\n{env_header(env)}\n\n"
              "Times are medians per call from CUDA-graph replays over rotating input sets (20/80% quantiles "
              "in bench.json). `derived` shapes were scaled from a tiny-preset capture to the published "
              "model size (the roles are named); `captured` shapes were observed by a scan.\n\n"
              + markdown_table(rows) + "\n## Targets\n\n" + "\n".join(targets(rows)) + "\n")
        written.append(write_text(report_dir / "bench.md", md))
        png = plot(rows, report_dir / "bench.png")
        if png:
            written.append(png)
    return written


def load_rows(path: Path) -> list[BenchRow]:
    from miner.core.workspace import read_json
    data = read_json(path)
    if data.get("kind") == "BenchRun":
        return [row_from_json(r) for r in data["rows"]]
    if data.get("kind") == "BenchResults":
        return [row_from_json(r) for run in data["runs"] for r in run["rows"]]
    raise MinerError(f"{path}: not a miner bench file")



def today_dir(env: Env, reports_root: Path) -> Path:
    return Path(reports_root) / "gpu" / f"{env.date[:10]}-{gpu_slug(env)}"
