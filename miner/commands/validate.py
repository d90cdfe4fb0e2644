"""``miner validate``: numerics against float64 and proof that the rewrite fires in torch.compile."""

from __future__ import annotations

import argparse

HELP = "check candidates' numerics and that the rewrite fires in torch.compile"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ids", nargs="*", metavar="ID", help="candidate ids (unique prefixes will do)")
    parser.add_argument("--all", action="store_true", help="every candidate under candidates/")
    parser.add_argument("--no-model", action="store_true",
                        help="numerics only: skip compiling a zoo model to prove the rewrite fires")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="where kernels run (default: cuda if present)")


def run(args: argparse.Namespace) -> int:
    import os

    on_cpu = args.device == "cpu" or args.device is None and not _has_cuda()
    os.environ.setdefault("TRITON_INTERPRET", "1" if on_cpu else "0")  # before triton is imported
    if on_cpu:
        os.environ.setdefault("MINER_INTERPRET", "1")  # validation runs the kernels interpreted: asked
    import warnings

    # validation compiles with Inductor's caches off on purpose; torch says so in a 170-column warning
    warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")
    from miner.core.errors import UsageError
    from miner.check.validate import validate
    from miner.core.workspace import Workspace
    from miner.report.terminal import next_step, say

    ws = Workspace(args.workspace)
    if args.all == bool(args.ids):
        raise UsageError("give candidate ids or --all (not both)")
    ids = sorted(p.parent.name for p in ws.candidates.glob("*/candidate.json")) if args.all else args.ids
    if not ids:
        raise UsageError(f"no candidates under {ws.candidates}; run `miner generate` first")
    failed = 0
    for cid in ids:
        say(f"{cid}:")
        v = validate(ws, cid, device=args.device, model=not args.no_model, log=say)
        not_run = sum(c.ok is None for c in v.checks)
        say(f"{v.id}: {'validated' if v.ok else 'FAILED: ' + str(v.failure)}"
            + (f" ({not_run} check(s) not run on {v.device}: marked skip above)" if not_run else ""))
        failed += not v.ok
    next_step("`miner bench --all` on a CUDA machine, then `miner candidates`" if on_cpu
              else "`miner bench --all`, then `miner candidates`")
    return 1 if failed else 0


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()

