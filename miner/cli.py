"""``miner`` command line: parses arguments and hands them to one stage.

``VERBS`` maps each verb to the module that implements it (``miner/commands/<verb>.py``,
defining ``add_arguments(parser)`` and ``run(args) -> int``). Only the chosen verb's module
is imported, so ``miner --help`` is instant and one stage's heavy imports never slow another.
A verb whose module is missing fails loudly (``tests/test_cli.py`` imports every one).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import threading
from pathlib import Path

from miner import __version__
from miner.core.errors import MinerError

VERBS: dict[str, tuple[str, str]] = {
    "scan": ("miner.commands.scan", "build models from configs, compile with Inductor, capture post-grad graphs"),
    "models": ("miner.commands.models", "list the model zoo: hand-written specs, model types, groups"),
    "mine": ("miner.commands.mine", "mine frequent pointwise/reduction subgraphs across captured graphs"),
    "patterns": ("miner.commands.patterns", "list mined patterns, or show one (`patterns show <id>`)"),
    "generate": ("miner.commands.generate", "write fusion candidates (pattern, replacement, Triton kernel)"),
    "validate": ("miner.commands.validate", "check candidates' numerics and that the rewrite fires in torch.compile"),
    "promote": ("miner.commands.promote", "promote a validated candidate into fusions/"),
    "bench": ("miner.commands.bench", "benchmark candidates on GPU against eager and Inductor"),
    "verify": ("miner.commands.verify", "model step time with and without the promoted fusions (GPU)"),
    "candidates": ("miner.commands.candidates", "ranked candidate list, or one candidate (`candidates show <id>`)"),
    "report": ("miner.commands.report", "write the HTML report under reports/ and print its path"),
    "profile": ("miner.commands.profile", "profile the compiled step on GPU: step composition, kernels vs memory floor, regions"),
    "tune": ("miner.commands.tune", "one command from a model to a measured recommendation: profile, mine, generate, "
                                    "validate, A/B with knobs, report (GPU)"),
}


# Verbs that may start a workspace; every other verb reads one, and a missing one is an error (never created).
MAKES_WORKSPACE = frozenset({"scan", "models", "profile", "tune"})  # profile captures, as scan does (not with --show)

WORKSPACE_HELP = ("where captures/, mined/, candidates/, reports/ and fusions/ live, relative to the current "
                  "directory (default: .); before or after the verb")


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``verb``'s module is imported to define its arguments."""
    parser = argparse.ArgumentParser(prog="miner", description="Mine fusion opportunities from torch.compile's "
                                     "post-grad graphs, generate Triton kernels for them, prove and promote them.")
    parser.add_argument("--version", action="version", version=f"miner {__version__}")
    parser.add_argument("--workspace", default=".", metavar="DIR", help=WORKSPACE_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in VERBS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        # also after the verb (`miner scan --workspace DIR`); SUPPRESS keeps a value given before it
        p.add_argument("--workspace", default=argparse.SUPPRESS, metavar="DIR", help=WORKSPACE_HELP)
        if name == verb:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(run=module.run)
    return parser


def _verb(argv: list[str]) -> str | None:
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--workspace":
            skip = True
        elif not a.startswith("-"):
            return a if a in VERBS else None
    return None


def main(argv: list[str] | None = None) -> int:
    """Run one verb; returns the exit code.

    ``--workspace`` is resolved against the current directory here, once, so no stage (and no
    worker process it starts in another directory) ever sees a relative workspace. A closed
    stdout (``miner candidates --json | head``) ends the command quietly with code 141.
    """
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(_verb(argv))
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    args.workspace = str(Path(args.workspace).expanduser().resolve())
    makes = args.command in MAKES_WORKSPACE and not getattr(args, "show", False)
    if not makes and not Path(args.workspace).is_dir():
        print(f"miner {args.command}: error: no workspace {args.workspace} (`miner scan --workspace DIR` makes "
              "one)", file=sys.stderr)
        return 2
    terminated: list[int] = []
    try:
        with terminate_as_interrupt(terminated):
            code = int(args.run(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        return code
    except MinerError as e:
        print(f"miner {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"miner {args.command}: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return 128 + (terminated[0] if terminated else signal.SIGINT)
    except BrokenPipeError:
        return _closed_stdout()


@contextlib.contextmanager
def terminate_as_interrupt(seen: list[int]):
    """SIGTERM (``timeout``, a batch scheduler, ``kill``) raises ``KeyboardInterrupt`` as Ctrl-C does, so a
    command saves what it measured and says where before it stops (Python's default for SIGTERM ends the
    process on the spot: ``miner verify --ab`` under ``timeout`` lost a measured win that way). The signal
    is appended to ``seen``; the previous handler comes back after. Main thread only (where signals land)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        seen.append(signum)
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _closed_stdout() -> int:
    """The reader of our stdout went away: stop without a traceback (and without one at exit)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's final flush of stdout would fail again
    except (OSError, ValueError):
        pass
    return 141  # 128 + SIGPIPE, what a shell reports for a command killed by a closed pipe


if __name__ == "__main__":
    sys.exit(main())
