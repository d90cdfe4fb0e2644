"""``miner promote``: copy a validated candidate into ``fusions/<name>/`` with its test."""

from __future__ import annotations

import argparse

HELP = "promote a validated candidate into fusions/<name>/ (+ tests/fusions/test_<name>.py)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id", metavar="ID", help="candidate id (a unique prefix will do)")
    parser.add_argument("--name", required=True, help="fusion name, after what it computes (e.g. softmax_like)")


def run(args: argparse.Namespace) -> int:
    from miner.promote import promote
    from miner.core.workspace import Workspace

    result = promote(Workspace(args.workspace), args.id, args.name)
    print(f"promoted {result.id} as fusions/{result.name}/")
    for f in result.files:
        print(f"  wrote {f}")
    return 0
