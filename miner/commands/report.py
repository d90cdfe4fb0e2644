"""``miner report``: the ranked review as one self-contained HTML page."""

from __future__ import annotations

import argparse

from miner.rank import rank
from miner.report.report import default_run_name, write_report
from miner.core.workspace import Workspace

HELP = "write reports/<run>/index.html (ranking, cost model, per-candidate drawings and benchmarks) and print its path"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", dest="run_name", default=default_run_name(), metavar="NAME",
                        help="report folder under reports/ (default: %(default)s)")
    parser.add_argument("--model", metavar="NAME", help="only occurrences in this zoo model")
    parser.add_argument("--scale", choices=rank.SCALES, default="published",
                        help="score at each model's published size (default) or at the captured shapes")
    parser.add_argument("--detail-top", type=int, default=10, metavar="N",
                        help="detail sections for every candidate plus the N best patterns without one (default 10)")


def run(args: argparse.Namespace) -> int:
    from miner.core.errors import UsageError, unreadable
    from miner.rank.decision import latest_ab

    if "/" in args.run_name or args.run_name in ("", ".", "..", "gpu"):
        raise UsageError(f"--run {args.run_name!r}: give a plain folder name (not 'gpu', which holds bench runs)")
    ws = Workspace(args.workspace)
    ws.scans()  # a corrupt scan result fails the command here, not as a banner inside the HTML
    review = rank.review(ws, only_model=args.model, scale=args.scale)
    if review.problems:  # a corrupt file is never ranked around
        raise unreadable(review.problems)
    if not review.rows and not latest_ab(ws):  # an in-model A/B alone (knobs, say) is worth a report
        raise UsageError(f"nothing to report in {ws.root}: no mined patterns, candidates or in-model A/B; run "
                         "`miner scan --models ...`, then `miner mine`")
    from miner.report.terminal import next_step

    print(write_report(review, ws, args.run_name, detail_top=args.detail_top), flush=True)  # whole, for scripts
    next_step("open it in a browser; `miner promote <id> --name <name>` adopts a validated candidate")
    return 0
