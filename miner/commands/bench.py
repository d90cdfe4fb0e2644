"""miner bench: time candidates against eager and Inductor on a CUDA GPU."""

from __future__ import annotations

import sys
from pathlib import Path

from miner import kinds
from miner.core import candidate as candidates
from miner.core import executor
from miner.core.dtypes import CAST_FLOATS
from miner.core.errors import UsageError

HELP = ("time each candidate on its observed and base-model shapes: eager, Inductor, Inductor "
        "max-autotune and the generated kernel (CUDA graphs, medians, % of the measured memory roofline)")


def add_arguments(p) -> None:
    sel = p.add_mutually_exclusive_group()
    sel.add_argument("--candidates", metavar="ID,...", help="candidate ids (or unique prefixes) to time")
    sel.add_argument("--all", action="store_true", help="every candidate under candidates/ (the default)")
    p.add_argument("--models", metavar="M,...", help="only the shapes these models produce")
    p.add_argument("--shapes", choices=("captured", "base", "all"), default="all",
                   help="captured: as the scan observed them; base: scaled to the published model sizes "
                        "(or base-preset captures); all: both (default)")
    p.add_argument("--dtypes", default="captured", metavar="D,...",
                   help="time each case once per entry: captured (as observed) or a floating dtype its "
                        "float inputs are cast to, e.g. captured,bfloat16 (default: captured)")
    p.add_argument("--variants", default="eager,inductor,max-autotune,candidate",
                   help="comma list of eager, inductor, max-autotune, candidate, candidate-looped "
                        "(default: the first four)")
    p.add_argument("--replays", type=int, default=25, help="timed CUDA-graph replays per variant (default 25)")
    p.add_argument("--time-budget", type=float, default=None, metavar="S",
                   help="start no new case after S seconds (base-size cases run first); results so far are saved")
    p.add_argument("--include-failed", action="store_true",
                   help="also time candidates whose validation failed (skipped by default)")
    p.add_argument("--out", metavar="DIR", help="run table folder (default reports/gpu/<date>-<gpu>/)")
    p.add_argument("--no-save", action="store_true", help="print the table, write nothing")
    p.add_argument("--json-only", action="store_true", help="write only the run's bench.json (render later with --import)")
    p.add_argument("--import", dest="import_run", metavar="BENCH_JSON",
                   help="no timing: file the rows of a run table (e.g. one made on another machine) into "
                        "candidates/<id>/bench.json and re-render that run's bench.md, wins.json and plot")
    p.add_argument("--allow-cpu", action="store_true",
                   help="smoke-run the harness on the CPU (Triton interpreter); its times mean nothing")
    executor.add_arguments(p)


def _prepare_cpu_smoke() -> None:
    from miner.commands import interpret_on_cpu

    interpret_on_cpu("bench")


def run(args) -> int:
    from miner import bench
    from miner.core.workspace import Workspace

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    known = bench.VARIANTS + bench.EXTRA_VARIANTS
    unknown = [v for v in variants if v not in known]
    if unknown:
        raise UsageError(f"unknown variant(s) {', '.join(unknown)}; variants: {', '.join(known)}")
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad = [d for d in dtypes if d != "captured" and d not in CAST_FLOATS]
    if bad or not dtypes:
        raise UsageError(f"unknown dtype(s) {', '.join(bad) or '(none)'}; --dtypes takes captured, "
                         f"{', '.join(CAST_FLOATS)}")
    if args.import_run:
        return _import_run(args, bench, Workspace(args.workspace))
    if args.allow_cpu:
        import torch
        if not torch.cuda.is_available():
            _prepare_cpu_smoke()
    # a cluster at --address has the GPUs, not necessarily this machine
    device = "cuda" if executor.elsewhere(args) and not args.allow_cpu else \
        bench.require_cuda("miner bench", allow_cpu=args.allow_cpu)
    ws = Workspace(args.workspace)
    ids = [c.strip() for c in args.candidates.split(",")] if args.candidates else None
    cands = candidates.load_all(ws, ids)
    untimed = {c.id: kinds.kind_of(c.meta) for c in cands if kinds.kind_of(c.meta).bench}
    for cid, kind in untimed.items():  # e.g. an aten rewrite: no kernel of its own to time
        print(f"skipping {cid} ({kind.name}): {kind.bench}")
    cands = [c for c in cands if c.id not in untimed]
    if not cands:
        raise UsageError(f"no candidates in {ws.candidates} (run `miner generate` first)")
    if not args.include_failed:
        failed = {c.id: candidates.failure(c) for c in cands}
        for c in cands:
            if failed[c.id]:
                print(f"skipping {c.id} ({c.label}): its validation failed ({failed[c.id]})")
        cands = [c for c in cands if not failed[c.id]]
    models = [m.strip() for m in args.models.split(",")] if args.models else None
    dirs_by_id = {c.id: c.path for c in cands}
    done: list = []

    def save(rows, env):
        if args.no_save or not rows:
            return []
        out = Path(args.out) if args.out else bench.today_dir(env, ws.reports)
        return bench.save_results(rows, env, candidate_dirs=dirs_by_id, report_dir=out, json_only=args.json_only)

    def on_row(row):  # keep what is measured even if the run is cut short
        done.append(row)
        save(done, row.env)

    failures = []
    options = bench.BenchOptions(device=device, variants=tuple(variants), shapes=args.shapes,
                                 models=None if models is None else tuple(models), replays=args.replays,
                                 casts=tuple(dtypes))
    ex = executor.make(args.executor, address=args.address)
    if not ex.remote:
        env, rows = bench.run_bench(cands, options, time_budget_s=args.time_budget, on_row=on_row)
    else:  # one task per candidate and case (miner.bench.remote)
        from miner.bench.remote import run_bench_on
        try:
            env, rows, failures = run_bench_on(ex, cands, options, time_budget_s=args.time_budget, on_row=on_row)
        finally:
            ex.close()
    print()
    print(bench.env_header(env))
    print(bench.markdown_table(rows))
    print("\n".join(bench.targets(rows)))
    for p in save(rows, env):
        print(f"wrote {p}")
    for f in failures:
        print(f"not timed: {f}", file=sys.stderr)
    failed = [r for r in rows for v in r.variants if v.name == "candidate" and v.numerics_ok is False]
    return 1 if failed or failures else 0


def _import_run(args, bench, ws) -> int:
    """Copy a run table's rows into each candidate's bench.json (this stage's file, nothing else)."""
    path = Path(args.import_run)
    rows = bench.load_rows(path)
    if not rows:
        raise UsageError(f"{path}: no rows")
    dirs = {p.name: p for p in candidates.folders(ws)}
    missing = sorted({r.candidate for r in rows} - set(dirs))
    for cid in missing:
        print(f"no folder for candidate {cid} under {ws.candidates}: its rows stay in the run table only")
    out = Path(args.out) if args.out else path.parent
    for p in bench.save_results(rows, rows[0].env, candidate_dirs=dirs, report_dir=out):
        print(f"wrote {p}")
    # A promoted fusion gates on the measurements promote copied into its wins.json: say which to refresh.
    fusions = candidates.fusions_by_candidate(ws)
    for cid in sorted({r.candidate for r in rows} & set(fusions)):
        print(f"fusions/{fusions[cid]}/wins.json predates these rows: refresh its gate with "
              f"`miner promote {cid} --name {fusions[cid]}`")
    print("\n".join(bench.targets(rows)))
    return 0
