"""``miner candidates``: the measured-only decision table, then the predicted ranking; ``show <id>``: one in full."""

from __future__ import annotations

import argparse

from miner.rank import rank
from miner.report.terminal import add_output_options

HELP = ("what to adopt (measured only), then candidates ranked by expected time saved (or `show <id>`: everything "
        "known about one)")


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
    add_output_options(parser)


def run(args: argparse.Namespace) -> int:
    from miner.core.errors import UsageError, unreadable
    from miner.core.workspace import Workspace
    from miner.rank.decision import decide
    from miner.report import listings as L
    from miner.report.terminal import emit

    if args.top is not None and args.top < 0:
        raise UsageError("--top must be 0 (all) or positive")
    if args.action is None and args.id is not None:
        raise UsageError(f"unexpected argument {args.id!r}; did you mean `miner candidates show {args.id}`?")
    if args.action == "show" and not args.id:
        raise UsageError("`miner candidates show` needs a candidate id")
    ws = Workspace(args.workspace)
    review = rank.review(ws, only_model=args.model, scale=args.scale)
    if review.problems:  # a corrupt file is never ranked around
        raise unreadable(review.problems)
    dec = decide(review, ws)
    if args.action == "show":
        u = next((x for x in dec.rows if x.status and (x.id.startswith(args.id) or x.name == args.id)), None)
        if u is not None:  # no ranked row: an upcast or region candidate (miner.rank.decision.unranked_rows)
            from miner.core import candidate as candidates

            return emit(args, L.unranked_show_listings(u, candidates.load(ws, u.id)),
                        {"decision": u.to_json(), "ab_source": dec.ab_source}, [u.to_json()],
                        f"`miner verify --ab --candidates {u.id}` (in model steps, GPU); `miner report`")
        r = review.find(args.id)
        d = next((x for x in dec.rows if x.id == r.id), None)
        return emit(args, L.show_listings(review, r, d), {**L.row_json(review, r, d), "ab_source": dec.ab_source},
                    L.show_csv(r), f"`miner verify --ab --candidates {r.id}` (in model steps, GPU); `miner report`")
    top = args.top or None
    kw = dict(top=top, members=args.members, patterns=args.patterns)
    ranking = L.ranking_listing(review, **kw)
    listings = [ranking] if args.patterns else [L.decision_listing(dec), ranking]
    if args.patterns:
        first = review.pattern_families[0].id if review.pattern_families else None
    else:
        first = dec.rows[0].id if dec.rows else None
    hint = (f"`miner candidates show {first}` (one in full); " if first else "") + "`miner report` (the HTML page)"
    csv_rows = L.ranking_csv(review, dec, **kw) if args.patterns else L.decision_csv(dec, review)
    return emit(args, listings, L.candidates_json(review, None if args.patterns else dec, **kw), csv_rows, hint)
