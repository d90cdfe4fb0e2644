"""``miner models``: list the zoo (hand-written specs, the hf-suite list, every model_type), or
write the zoo table from a workspace's scan results."""

from __future__ import annotations

HELP = "list the model zoo (hand-written, hf-suite, generic model_types) or write the zoo table"

SOURCES = ("hand", "suite", "generic")


def add_arguments(p) -> None:
    p.add_argument("--source", choices=SOURCES, action="append",
                   help="only this source (repeatable): hand-written specs, hf-suite entries, generic model_types")
    p.add_argument("--unsupported", action="store_true",
                   help="also list the hf-suite names and model_types that cannot be built, with the reason")
    p.add_argument("--table", metavar="FILE",
                   help="write the zoo table (markdown) from the scan results under --workspace to FILE")
    p.add_argument("--preset", default="tiny", help="table: which preset's scans (default tiny)")
    p.add_argument("--mode", default="train", help="table: which mode's scans (default train)")
    p.add_argument("--more-scans", metavar="DIR", action="append", default=[],
                   help="table: also read CPU scan results from workspace DIR (repeatable; --workspace wins)")
    p.add_argument("--gpu-scans", metavar="DIR",
                   help="table: also show the results of a CUDA scan saved in workspace DIR")
    p.add_argument("--eager", action="store_true",
                   help="table: also build every model and run one eager step (minutes)")
    from miner.report.terminal import add_output_options
    add_output_options(p)


def _listing(sources: tuple[str, ...]) -> list[tuple[str, str, str, str]]:
    import miner_models as models
    from miner_models.generic import generic_registry
    from miner_models.suite import suite_registry
    rows = []
    if "hand" in sources:
        rows += [(n, "hand", ",".join(s.presets), s.note) for n, s in models.REGISTRY.items()]
    if "suite" in sources:
        rows += [(n, "suite", ",".join(s.presets), s.note) for n, s in suite_registry().items()]
    if "generic" in sources:
        rows += [(n, "generic" if n not in models.REGISTRY else "generic (hand-written overrides)",
                  ",".join(s.presets), s.note) for n, s in generic_registry().items()]
    return rows


def _write_table(args) -> int:
    from miner.core.workspace import Workspace, write_text
    from miner_models.table import eager_check, render
    import miner_models as models

    scans = [r for d in [*args.more_scans[::-1], args.workspace] for r in Workspace(d).scans()]  # later wins
    gpu_scans = Workspace(args.gpu_scans).scans() if args.gpu_scans else None
    checks = {}
    if args.eager:
        names = models.expand(["hf-suite", "all"])
        for i, n in enumerate(names, 1):
            checks[n] = eager_check(n, args.preset, args.mode)
            print(f"[{i}/{len(names)}] {n}: {'ok' if checks[n].ran else checks[n].error}", flush=True)
    command = (f"miner --workspace {args.workspace} models --table {args.table}" + (" --eager" if args.eager else "")
               + "".join(f" --more-scans {d}" for d in args.more_scans)
               + (f" --gpu-scans {args.gpu_scans}" if args.gpu_scans else ""))
    write_text(args.table, render(scans, args.preset, args.mode, checks, command, gpu_scans))
    print(f"wrote {args.table} from {len(scans)} scan result(s) under {args.workspace}")
    return 0


def run(args) -> int:
    import transformers
    transformers.logging.set_verbosity_error()
    if args.table:
        return _write_table(args)
    from miner.report.terminal import Column, Listing, emit

    sources = tuple(args.source or SOURCES)
    rows = [{"name": n, "source": src, "presets": pre, "note": note} for n, src, pre, note in _listing(sources)]
    if args.unsupported:
        from miner_models.generic import UNSUPPORTED
        from miner_models.suite import unsupported
        rows += [{"name": n, "source": "unsupported", "presets": "", "note": why}
                 for n, why in {**unsupported(), **UNSUPPORTED}.items()]
    counts = ", ".join(f"{sum(r['source'].startswith(s) for r in rows)} {s}" for s in sources)
    cols = [Column("name", "name", max_width=32), Column("source", "source", max_width=12),
            Column("presets", "presets", wrap=False), Column("note", "note", ratio=1)]
    total = sum(r["source"] != "unsupported" for r in rows)
    lst = Listing("", cols, rows, after=[f"{total} entries ({counts}); groups: hf-suite, all"])
    return emit(args, [lst], rows, rows, "`miner scan --models NAME[,NAME...]` (compile and capture; "
                "`--models hf-suite` for the whole list)")
