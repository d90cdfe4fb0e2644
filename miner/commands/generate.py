"""``miner generate``: write ``candidates/<id>/`` for the mined patterns the generator supports."""

from __future__ import annotations

import argparse
import sys

HELP = "write fusion candidates (pattern, replacement, Triton kernel) for supported mined patterns"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--top", type=int, default=0, metavar="N",
                        help="only the first N patterns of mined/patterns.json (default 0: all)")
    parser.add_argument("--only", metavar="ID,...", help="only these pattern ids (unique prefixes will do)")
    parser.add_argument("--quiet", action="store_true", help="do not list skipped patterns")


def run(args: argparse.Namespace) -> int:
    from miner.errors import UsageError
    from miner.generate import describe, generate, remove_stale
    from miner.pattern import load_patterns
    from miner.workspace import Workspace

    ws = Workspace(args.workspace)
    patterns = load_patterns(ws)
    command = "miner generate"
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        unknown = [w for w in wanted if not any(p.id.startswith(w) for p in patterns)]
        if unknown:
            raise UsageError(f"unknown pattern id(s) {', '.join(unknown)}; see `miner patterns`")
        patterns = [p for p in patterns if any(p.id.startswith(w) for w in wanted)]
        command += f" --only {args.only}"
    if args.top < 0:
        raise UsageError("--top must be 0 (all) or positive")
    if args.top:
        patterns = patterns[:args.top]
        command += f" --top {args.top}"
    done, skipped = generate(ws, patterns, command=command)
    if not args.only and not args.top:
        for gone in remove_stale(ws, [g.id for g in done]):
            print(f"removed stale candidate {gone}")
    for g in done:
        print(describe(g))
    if not args.quiet:
        for s in skipped:
            print(describe(s))
    print(f"{len(done)} candidate(s) written to {ws.candidates}, {len(skipped)} pattern(s) skipped "
          f"(reasons in {ws.candidates / 'index.json'})", file=sys.stderr)
    return 0
