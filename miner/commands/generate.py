"""``miner generate``: write ``candidates/<id>/`` for the mined patterns the generator supports."""

from __future__ import annotations

import argparse
import sys

HELP = "write fusion candidates (pattern, replacement, Triton kernel) for supported mined patterns"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--top", type=int, default=20, metavar="N",
                        help="the N best patterns it takes, in the ranking every listing uses (estimated time "
                             "saved per step; default 20, 0: all)")
    parser.add_argument("--only", metavar="ID,...", help="exactly these pattern ids (unique prefixes will do)")
    parser.add_argument("--keep", action="store_true", help="keep candidate folders of patterns not generated now")
    parser.add_argument("--quiet", action="store_true", help="do not count skipped patterns by reason")
    parser.add_argument("--verbose", action="store_true", help="list every skipped pattern with its reason")
    parser.add_argument("--regions", metavar="REGIONS_JSON",
                        help="generate whole-Inductor-kernel region patterns from this regions.json (`miner profile` "
                             "writes mined/regions.json) instead of mined/patterns.json; needs --only; keeps the "
                             "other candidates and candidates/index.json")
    parser.add_argument("--rng", choices=("philox4", "inductor"), default="philox4",
                        help="with --regions: the random stream of dropout regions: philox4 (default; four numbers per "
                             "Philox call, candidate <id>_x4, its own mask) or inductor (Inductor's exact numbers)")
    parser.add_argument("--recomputed", metavar="RECOMPUTED_JSON",
                        help="write the compute-once candidates, one per family (small, expensive values Inductor "
                             "recomputes per element of the larger kernels that read them: llama's RoPE cos/sin, t5's "
                             "relative-position bias lookup) from this mined/recomputed.json (`miner mine` writes it)")
    parser.add_argument("--epilogues", metavar="EPILOGUES_JSON",
                        help="write the GEMM-epilogue candidate (an addmm read only by a tanh GELU or ReLU as one "
                             "cuBLASLt GEMM applying it, aten._addmm_activation) from this mined/epilogues.json "
                             "(`miner mine` writes it)")
    parser.add_argument("--upcasts", metavar="UPCASTS_JSON",
                        help="write the upcast-matmul candidate (float32 bmm/mm of exact bf16/fp16 upcasts as a "
                             "bf16/fp16 GEMM with float32 output) from this mined/upcasts.json (`miner mine` writes it)")


def run(args: argparse.Namespace) -> int:
    from miner.report.terminal import next_step, say
    from miner.core.errors import UsageError
    from miner.generate.generate import Skipped, describe, generate, remove_stale, select, supported
    from miner.core.pattern import load_patterns
    from miner.core.workspace import Workspace

    ws = Workspace(args.workspace)
    if args.top < 0:
        raise UsageError("--top must be 0 (all) or positive")
    if args.regions:
        return _run_regions(args, ws)
    if args.upcasts:
        return _run_upcasts(args, ws)
    if args.recomputed:
        return _run_recomputed(args, ws)
    if args.epilogues:
        return _run_epilogues(args, ws)
    patterns = load_patterns(ws)
    if args.only:
        from miner.commands.patterns import find

        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        picked = {find(patterns, w).id for w in wanted}  # an unknown or ambiguous prefix is an error
        chosen = [p for p in patterns if p.id in picked]
        pre = [Skipped(p.id, p.ops, supported(p) or "not selected (--only)") for p in patterns if p not in chosen]
        command = f"miner generate --only {','.join(wanted)}"
    else:
        chosen, pre = select(patterns, args.top or None)
        command = f"miner generate --top {args.top}"
    done, skipped = generate(ws, chosen, command=command, pre_skipped=pre)
    if not args.keep:
        for gone in remove_stale(ws, [g.id for g in done]):
            say(f"removed stale candidate {gone}")
    for g in done:
        say(describe(g, ws.root))
    if args.verbose:
        for s in skipped:
            say(describe(s, ws.root))
    elif not args.quiet:
        for line in skip_counts(skipped):
            say(line)
    say(f"{len(done)} candidate(s) written to candidates/, {len(skipped)} pattern(s) not generated (each with "
        f"its reason in candidates/index.json; --verbose lists them)", file=sys.stderr)
    next_step("`miner validate --all`" if done else "`miner patterns` (what the generator takes)")
    return 0


def skip_counts(skipped) -> list[str]:
    """One line per reason a pattern was not generated, with how many (most frequent first)."""
    from collections import Counter

    from miner.report.text import cut

    def reason(s) -> str:
        r = s.reason.removeprefix("not generated: ")
        return "below --top" if r.startswith("below --top") else r.split(" (")[0]
    counts = Counter(reason(s) for s in skipped)
    return [f"skipped {n:4d}  {cut(r, 80)}" for r, n in counts.most_common()]


def _run_regions(args: argparse.Namespace, ws) -> int:
    """``--regions FILE --only ID,...``: candidates from region patterns (each a whole Inductor kernel)."""
    from miner.report.terminal import next_step, say

    from pathlib import Path

    from miner.core.errors import UsageError
    from miner.generate.generate import describe, generate
    from miner.mine import regions

    if not args.only:
        raise UsageError("--regions needs --only ID,... (the region patterns to generate)")
    path = Path(args.regions)
    if not path.is_file():
        raise UsageError(f"--regions {args.regions}: no such file")
    rps = regions.load(path.parent.parent) if (path.parent.name, path.name) == ("mined", regions.REGIONS_FILE) else None
    if rps is None:
        raise UsageError(f"--regions {args.regions}: expected a mined/{regions.REGIONS_FILE}")
    by_id = {rp.id: rp for rp in rps}
    chosen = []
    for w in (w.strip() for w in args.only.split(",") if w.strip()):
        hits = [i for i in by_id if i.startswith(w)]
        if len(hits) != 1:
            raise UsageError(f"--only {w}: {'ambiguous' if hits else 'no'} region pattern in {args.regions}"
                             + (f" ({', '.join(sorted(hits)[:5])})" if hits else ""))
        chosen.append(by_id[hits[0]].pattern)
    try:
        rel = path.resolve().relative_to(Path(ws.root).resolve())
    except ValueError:
        rel = path.resolve()
    command, source = region_command(rel, [p.id for p in chosen], args.rng)
    done, skipped = generate(ws, chosen, command=command, source=source)
    for r in done + skipped:
        say(describe(r, ws.root))
    say(f"{len(done)} region candidate(s) written to candidates/, {len(skipped)} not generated", file=sys.stderr)
    next_step("`miner validate --all`" if done else "`miner candidates` (what is measured)")
    return 0 if done else 1


def region_command(rel, ids: list[str], rng: str) -> tuple[str, dict]:
    """(the command a region candidate records, its ``source``) for region patterns ``ids`` of the
    regions file ``rel``, drawn with ``rng`` (``philox4``: ``<id>_x4``, four numbers per Philox call;
    ``inductor``: Inductor's exact numbers). ``miner generate --regions`` and ``miner tune`` share it."""
    command = f"miner generate --regions {rel} --only {','.join(ids)} --rng {rng}"
    return command, ({"regions": str(rel), "rng": rng} if rng != "inductor" else {"regions": str(rel)})


def _mined_input(ws, flag: str, value: str, written: str):
    """The file given to ``flag``, relative to the workspace when inside it (as candidate.json records it);
    ``UsageError`` when there is no such file (``written``: what `miner mine` writes)."""
    from pathlib import Path

    from miner.core.errors import UsageError

    path = Path(value)
    if not path.is_file():
        raise UsageError(f"{flag} {value}: no such file (`miner mine` writes {written})")
    try:
        return path.resolve().relative_to(Path(ws.root).resolve())
    except ValueError:
        return path.resolve()


def _run_upcasts(args: argparse.Namespace, ws) -> int:
    """``--upcasts FILE``: the upcast-matmul candidates, exact (``u...``) and demoting (``d...``)
    (``miner.generate.upcast``); keeps the other candidates."""
    from miner.report.terminal import next_step, say

    from miner.generate import upcast
    from miner.generate.generate import describe

    rel = _mined_input(ws, "--upcasts", args.upcasts, "mined/upcasts.json")
    done = [g for demote in (False, True) if (g := upcast.generate(ws, rel, f"miner generate --upcasts {rel}",
                                                                   demote=demote)) is not None]
    if not done:
        say(f"{args.upcasts}: no float32 bmm/mm there is a bf16/fp16 upcast (exact, or with one operand rounded "
              f"where the output is rounded anyway); nothing written", file=sys.stderr)
        return 1
    for g in done:
        say(describe(g, ws.root))
    next_step("`miner validate --all`")
    return 0


def _run_recomputed(args: argparse.Namespace, ws) -> int:
    """``--recomputed FILE``: the compute-once candidates, one per family (``miner.generate.realize``); keeps
    the other candidates."""
    from miner.report.terminal import next_step, say

    from miner.generate import realize
    from miner.generate.generate import describe

    rel = _mined_input(ws, "--recomputed", args.recomputed, "mined/recomputed.json")
    done = realize.generate(ws, rel, f"miner generate --recomputed {rel}")
    if not done:
        say(f"{args.recomputed}: no small, expensive value there is recomputed per element of a broadcast; "
            f"nothing written", file=sys.stderr)
        return 1
    for g in done:
        say(describe(g, ws.root))
    next_step("`miner validate --all`")
    return 0


def _run_epilogues(args: argparse.Namespace, ws) -> int:
    """``--epilogues FILE``: the GEMM-epilogue candidate (``miner.generate.epilogue``); keeps the other candidates."""
    from miner.report.terminal import next_step, say

    from miner.generate import epilogue
    from miner.generate.generate import describe

    rel = _mined_input(ws, "--epilogues", args.epilogues, "mined/epilogues.json")
    g = epilogue.generate(ws, rel, f"miner generate --epilogues {rel}")
    if g is None:
        say(f"{args.epilogues}: the rule takes no addmm + activation there (`miner mine` printed why it declined "
            f"them); nothing written", file=sys.stderr)
        return 1
    say(describe(g, ws.root))
    next_step("`miner validate --all`")
    return 0
