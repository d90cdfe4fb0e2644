"""``miner mine``: mine frequent pointwise/reduction subgraphs of the captured graphs into
``mined/patterns.json`` and print a short summary."""

from __future__ import annotations

HELP = "mine frequent pointwise/reduction subgraphs across captured graphs"


def add_arguments(p) -> None:
    p.add_argument("--min-support", type=int, default=2, metavar="N",
                   help="keep patterns with support at least N (default %(default)s): occurrences (a block repeated in the "
                        "layers of one graph counts each time) or graphs, see --support")
    p.add_argument("--support", choices=("occurrences", "graphs"), default="occurrences",
                   help="what --min-support counts: occurrences (minimum image count, default) or graphs")
    p.add_argument("--min-models", type=int, default=1, metavar="N",
                   help="... and in at least N distinct models (default %(default)s)")
    p.add_argument("--max-nodes", type=int, default=8, metavar="N",
                   help="at most N pointwise/reduction nodes per pattern (default %(default)s)")
    p.add_argument("--max-views", type=int, default=2, metavar="N",
                   help="at most N view/getitem nodes between them (default %(default)s)")
    p.add_argument("--models", metavar="A,B", help="only the captures of these models (default: all)")
    p.add_argument("--all", action="store_true", help="keep non-closed patterns too (default: closed only)")
    p.add_argument("--max-extra-outputs", type=int, default=2, metavar="N",
                   help="interior values used outside an occurrence it may also return (default %(default)s)")
    p.add_argument("--max-stored", type=int, default=2, metavar="N",
                   help="occurrences stored per pattern in patterns.json; counts cover all (default %(default)s)")
    p.add_argument("--limit", type=int, default=400, metavar="N",
                   help="save only the N best-ranked patterns, to keep patterns.json small "
                        "(default %(default)s; 0 = all)")
    p.add_argument("--max-fanout", type=int, default=4, metavar="N",
                   help="a node with more fusable users connects patterns only through its operands (default %(default)s)")
    p.add_argument("--top", type=int, default=10, metavar="N", help="patterns to print (default %(default)s)")
    p.add_argument("--upcasts-only", action="store_true",
                   help="only the upcast-matmul step (float32 bmm/mm of exact bf16/fp16 upcasts -> mined/upcasts.json), "
                        "which every mine run also does")


def run(args) -> int:
    from miner.core.errors import UsageError
    from miner.mine.mine import MineOptions, mine
    from miner.core.pattern import save_patterns
    from miner.core.workspace import Workspace
    from miner.report.terminal import next_step, say

    ws = Workspace(args.workspace)
    models = [m for m in args.models.split(",") if m] if args.models else None
    if args.max_nodes < 2:
        raise UsageError("--max-nodes must be at least 2")
    if args.min_support < 1 or args.min_models < 1:
        raise UsageError("--min-support and --min-models must be at least 1")
    graphs = ws.load_graphs(models)
    if not graphs:
        known = sorted({p.parts[-3] for p in ws.graph_files()})
        raise UsageError(f"no captured graphs under {ws.captures}"
                         + (f" for {','.join(models)}; captured models: {', '.join(known) or 'none'}" if models
                            else "; run `miner scan` first"))
    from miner.mine import upcast

    upcasts = upcast.mine(graphs)
    if args.upcasts_only:
        say(upcast.summary(upcasts))
        say(f"wrote {upcast.save(ws, upcasts)}")
        next_step("`miner generate --upcasts mined/upcasts.json`")
        return 0
    result = mine(graphs, MineOptions(min_support=args.min_support, min_models=args.min_models,
                                      max_nodes=args.max_nodes, max_views=args.max_views, max_fanout=args.max_fanout,
                                      closed_only=not args.all, max_extra_outputs=args.max_extra_outputs,
                                      max_stored=args.max_stored, support=args.support, limit=args.limit or None))
    saved = result.patterns[:args.limit] if args.limit else result.patterns
    stats = dict(result.stats, saved_patterns=len(saved))
    params = dict(result.params, limit=args.limit)
    path = save_patterns(ws, saved, params, stats)
    s = result.stats
    say(f"mined {s['graphs']} graphs ({s['nodes']} nodes, {s['fusable_nodes']} fusable) of "
          f"{len(result.params['models'])} models in {s['seconds']['total']:.1f} s: "
          f"{s['reported_patterns']} {'closed ' if not args.all else ''}patterns "
          f"({s['frequent_patterns']} frequent subgraphs), "
          f"{sum(p.inductor.missed_fusion for p in result.patterns)} of the {len(result.patterns)} kept with "
          f"missed fusions")
    from miner.commands.patterns import listing
    from miner.report.terminal import print_listings

    say(upcast.summary(upcasts) + f" ({upcast.save(ws, upcasts)})")
    from miner.mine import recompute

    recomputed = recompute.mine(graphs)
    say(recompute.summary(recomputed) + f" ({recompute.save(ws, recomputed)})")
    from miner.mine import epilogue

    epilogues = epilogue.mine(graphs)
    say(epilogue.summary(epilogues) + f" ({epilogue.save(ws, epilogues)})")
    say(f"wrote {path}" + (f" ({len(saved)} most frequent of {s['reported_patterns']} patterns)"
                           if len(saved) < s["reported_patterns"] else ""))
    say()
    print_listings([listing(saved, args.top)[0]], "`miner patterns` (all of them, ranked the same way), then "
                   "`miner generate --top 3`")
    return 0
