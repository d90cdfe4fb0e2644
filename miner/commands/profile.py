"""``miner profile``: where the compiled step's time goes, kernel by kernel, and which regions hold it.

Runs ``miner scan`` with profiling (one model at a time, each in its own worker process: the
capture and the profile share one compile, so the profiled kernel names are the captured ones),
saves ``profiles/<model>/<preset>/<mode>.profile.json``, groups every captured kernel's FX-node set
into region patterns carrying the measured times (``mined/regions.json``), and prints the step
composition and the top regions. ``--show`` only prints what is saved.
"""

from __future__ import annotations

import sys
import time

from miner.core import executor
from miner.core.errors import UsageError

HELP = "profile the compiled step on the GPU: step composition, each kernel's time vs its memory floor, regions"


def add_arguments(p) -> None:
    p.add_argument("--models", default=None, help="comma-separated zoo names (required unless --show)")
    p.add_argument("--preset", default=None, help="tiny or base (default: base on cuda, tiny on cpu)")
    p.add_argument("--mode", default="train", help="train, infer, or train,infer (default: train)")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (CPU op times; for testing)")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="autocast dtype; auto = float32 on CPU, bfloat16 on CUDA")
    p.add_argument("--batch", type=int, default=None, help="override the preset's batch size")
    p.add_argument("--seq", type=int, default=None, help="override the preset's sequence length")
    p.add_argument("--force", action="store_true", help="re-profile even if a saved profile exists")
    p.add_argument("--timeout", type=float, default=None, help="seconds per model before it is killed (default 1800)")
    p.add_argument("--top", type=int, default=15, metavar="N", help="regions to print (default 15)")
    p.add_argument("--show", action="store_true", help="only print the saved profiles of the workspace")
    p.add_argument("--also-infer", default=None, metavar="A,B",
                   help="after --mode's runs, also profile these models' inference step (e.g. bert,gpt2)")
    executor.add_arguments(p)


def composition_table(profiles) -> str:
    """One row per profile: step (p20-p80) and its composition in ms (``StepProfile.composition``)."""
    head = ["model", "mode", "step ms (p20-p80)", "gemm", "attn", "tri@floor", "tri>floor", "tri?", "other",
            "idle", "triton/floor", ">floor %"]
    rows = []
    for p in profiles:
        c, t = p.composition(), p.totals()
        other = c["copy"] + c["other_aten"]
        rows.append([p.model, p.mode, f"{p.step_ms:.2f} ({p.step_p20_ms:.2f}-{p.step_p80_ms:.2f})",
                     *(f"{c[k]:.2f}" for k in ("gemm", "attention", "triton_floor", "triton_above_floor",
                                               "triton_no_bytes")),
                     f"{other:.2f}", f"{c['idle']:.2f}", f"{t['triton_ms']:.2f}/{t['triton_floor_ms']:.2f}",
                     f"{100 * c['triton_above_floor'] / p.step_ms:.1f}" if p.step_ms else "-"])
    return _table(head, rows) + ("\n(ms per step; tri@floor / tri>floor: Triton time up to / above its floor at the "
                                 "copy bandwidth; tri?: Triton without a byte count; idle: step time no kernel covers)")


def totals_table(profiles) -> str:
    """The issue's reference table (as ``../shared/probes/step_profile.py`` prints it): ms per step."""
    head = ["model", "mode", "step", "gemm", "attention", "Triton", "Triton floor", "above floor", "% of step"]
    rows = []
    for p in profiles:
        t = p.totals()
        net = t["triton_with_bytes_ms"] - t["triton_floor_ms"]
        rows.append([p.model, p.mode, *(f"{t[k]:.2f}" for k in ("step_ms", "gemm_ms", "attention_ms", "triton_ms",
                                                                  "triton_floor_ms")),
                     f"{net:.2f}", f"{100 * net / p.step_ms:.1f}" if p.step_ms else "-"])
    return _table(head, rows) + "\n(above floor: Triton time with a byte count minus its floor, net, as the probe)"


def regions_table(region_patterns, top: int) -> str:
    head = ["above us", "us/step", "floor us", "roofline", "occ", "models", "region", "ops"]
    rows = []
    for rp in [rp for rp in region_patterns if rp.measured][:top]:
        roof = rp.roofline
        rows.append([f"{rp.above_floor_us:.0f}", f"{rp.us_per_step:.0f}", f"{rp.floor_us_per_step:.0f}",
                     "-" if roof is None else f"{100 * roof:.0f}%", str(len(rp.occurrences)),
                     ",".join(rp.pattern.support.models), rp.id, _short(rp.ops, 70)])
    return _table(head, rows) + "\n(per step, summed over the region's measured kernel call sites)"


def mined_links(ws, rps) -> dict[str, list[str]]:
    """Region pattern id -> ids of the mined patterns (``mined/patterns.json``) with an occurrence inside it."""
    from miner.core.pattern import load_mining, patterns_path
    from miner.rank import measured

    if not patterns_path(ws).exists():
        return {}
    index = measured.SiteIndex(rps, {})
    out: dict[str, list[str]] = {}
    for p in load_mining(ws).patterns:
        for o in p.occurrences:
            for rid in measured.credit_occurrence(o, index)[1]:
                if p.id not in out.setdefault(rid, []):
                    out[rid].append(p.id)
    return out


def unmapped(profiles, min_us: float = 200.0) -> list[str]:
    """Triton kernels of at least ``min_us`` per step that no capture kernel map holds."""
    return [f"{p.model}/{p.mode}: {k.name} {k.us_per_step:.0f} us" for p in profiles for k in p.kernels
            if k.kind.startswith("triton") and k.us_per_step >= min_us and not k.sites]


def _short(s: str, n: int) -> str:
    return s if len(s) <= n else s[:n - 3] + "..."


def _table(head, rows) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * w for w in widths]), *(fmt(r) for r in rows)])


def run(args) -> int:
    from miner.commands.scan import default_jobs, expand_models, require_device, scan_options
    from miner.core.workspace import Workspace
    from miner.mine import regions
    from miner.scan import profile as prof

    ws = Workspace(args.workspace)
    modes = tuple(m.strip() for m in args.mode.split(",") if m.strip())
    bad = [m for m in modes if m not in ("train", "infer")]
    if bad or not modes:
        raise UsageError(f"unknown mode {','.join(bad) or '(none)'}; modes: train, infer")
    preset = args.preset or ("base" if args.device.startswith("cuda") else "tiny")
    names = expand_models(args.models) if args.models else None
    failed = []
    if not args.show:
        if names is None:
            raise UsageError("--models is required (or --show to print the saved profiles)")
        require_device(args)
        from miner.scan.scan import scan
        t0 = time.perf_counter()
        # the local pool profiles one model at a time (one GPU); Ray gives each model's task a GPU of its own
        jobs = 1 if args.executor == "local" else default_jobs(len(names))
        ex = executor.make(args.executor, address=args.address, jobs=jobs)
        print(f"miner profile: {len(names)} model(s) " + ("one at a time" if jobs == 1 else f"on {ex.describe()}")
              + f", preset {preset}, mode {','.join(modes)}, device {args.device}, workspace {args.workspace}",
              flush=True)
        runs = [(names, modes)]
        if args.also_infer:
            extra = expand_models(args.also_infer)
            runs.append((extra, ("infer",)))
            names = list(dict.fromkeys(names + extra))
            modes = tuple(dict.fromkeys(modes + ("infer",)))
        results = []
        try:
            for run_names, run_modes in runs:
                options = scan_options(args, preset=preset, modes=run_modes, jobs=jobs, profile=True)
                results += scan(run_names, options, workspace=ws, echo=lambda s: print(s, flush=True), executor=ex)
        finally:
            ex.close()
        failed = [f"{r.model}/{r.mode}: {r.error}" for r in results if not r.ok]
        print(f"profiled {len(results) - len(failed)}/{len(results)} in {time.perf_counter() - t0:.1f}s", flush=True)
    profiles = [p for p in prof.load_all(ws, names) if p.preset == preset and p.mode in modes]
    if not profiles:
        raise UsageError(f"no saved profiles under {ws.root / 'profiles'} for preset {preset}, mode {','.join(modes)}"
                         + ("" if args.show else "; see the errors above"))
    everything = prof.load_all(ws)
    graphs = ws.load_graphs()
    rps = regions.group(graphs, everything)
    path = regions.save(ws, rps)
    print()
    print(composition_table(profiles))
    print()
    print(totals_table(profiles))
    bw = sorted({round(p.copy_bw / 1e12, 2) for p in profiles})
    print(f"copy bandwidth (floor): {', '.join(f'{b:.2f}' for b in bw)} TB/s; bytes: {profiles[0].bytes_source}")
    recompiled = [f"{p.model}/{p.mode}" for p in profiles if p.recompiled]
    if recompiled:
        print(f"warning: recompiled after the capture ({', '.join(recompiled)}): kernel names may not match the "
              f"capture", file=sys.stderr)
    print(f"\ntop regions by measured time above floor ({sum(rp.measured > 0 for rp in rps)} measured region "
          f"patterns of {len(rps)}; all in {path}):")
    print(regions_table(rps, args.top))
    links = mined_links(ws, rps)
    top = [rp for rp in rps if rp.measured][:args.top]
    if links:
        print("mined patterns inside them (`miner candidates` ranks them by measured recoverable time):")
        for rp in top:
            if links.get(rp.id):
                ids = links[rp.id]
                print(f"  {rp.id}: {', '.join(ids[:6])}{f' (+{len(ids) - 6})' if len(ids) > 6 else ''}")
    missing = unmapped(profiles)
    if missing:
        print(f"\n{len(missing)} Triton kernel(s) of >= 200 us/step in no kernel map: " + "; ".join(missing[:10]))
        print("(a Triton kernel in no kernel map is most likely a mix-order reduction, e.g. layer-norm or RMS-norm "
              "backward: Inductor records no provenance for those; captures made with "
              "miner.scan.capture.track_mix_order_reductions record them, older ones need a new `miner profile`)")
    if failed:
        print(f"miner profile: {len(failed)} failed: " + "; ".join(failed), file=sys.stderr)
        return 1
    return 0
