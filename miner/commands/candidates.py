"""``miner candidates``: the ranked review list in the terminal, and one candidate in full."""

from __future__ import annotations

import argparse

from miner.rank import rank
from miner.report.report import render_show, render_table

HELP = "rank candidates by expected time saved across the zoo (or `show <id>`: everything known about one)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=("show",), help="`show <id>`: one candidate in full")
    parser.add_argument("id", nargs="?", help="candidate id (a unique prefix will do), pattern id or fusion name")
    parser.add_argument("--top", type=int, default=20, metavar="N", help="show the N best families (default 20; 0: all)")
    parser.add_argument("--model", metavar="NAME", help="only occurrences in this zoo model (e.g. bert)")
    parser.add_argument("--members", action="store_true", help="list every member of a family, not only its leader")
    parser.add_argument("--patterns", action="store_true",
                        help="rank the mined patterns that have no candidate, with the reason generate gave")
    parser.add_argument("--scale", choices=rank.SCALES, default="published",
                        help="score at each model's published size (default) or at the captured shapes")
    parser.add_argument("--json", action="store_true", help="print the ranking as JSON")


def run(args: argparse.Namespace) -> int:
    from miner.core.errors import UsageError, unreadable

    if args.top is not None and args.top < 0:
        raise UsageError("--top must be 0 (all) or positive")
    if args.action is None and args.id is not None:
        raise UsageError(f"unexpected argument {args.id!r}; did you mean `miner candidates show {args.id}`?")
    if args.action == "show" and not args.id:
        raise UsageError("`miner candidates show` needs a candidate id")
    review = rank.review(args.workspace, only_model=args.model, scale=args.scale)
    if review.problems:  # a corrupt file is never ranked around
        raise unreadable(review.problems)
    if args.action == "show":
        print(render_show(review, review.find(args.id)))
    elif args.json:
        print(rank.dumps(review))
    else:
        print(render_table(review, top=args.top or None, members=args.members, patterns=args.patterns))
    return 0
