"""``miner`` command line: parses arguments and hands them to one stage.

Each verb lives in ``miner/commands/<verb>.py`` and defines ``HELP``, ``add_arguments(parser)``
and ``run(args) -> int`` (the exit code). Verbs are discovered from that package; a verb
module that fails to import fails ``miner`` loudly rather than vanishing from ``--help``.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import miner.commands
from miner import __version__
from miner.errors import MinerError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="miner", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"miner {__version__}")
    parser.add_argument("--workspace", default=".", metavar="DIR",
                        help="where captures/, mined/, candidates/, reports/ and fusions/ live (default: .)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(miner.commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"miner.commands.{info.name}")
        p = sub.add_parser(info.name.replace("_", "-"), help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except MinerError as e:
        print(f"miner {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"miner {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
