"""Terminal listings: one ``Listing`` printed as a table that fits the terminal, as JSON, or as CSV.

Every listing verb (``miner candidates``, ``candidates show``, ``patterns``, ``patterns show``,
``models``) builds ``Listing`` values and hands them to ``emit``, so the three forms show the same
rows: the text table (``rich``; width from ``COLUMNS``, else the terminal's, else 100 when stdout is
not a terminal; colour only on a terminal), ``--json`` (``Listing.data``: everything the text
shows, and more) and ``--csv`` (one header row, one row per item, as PyTorch's dynamo benchmark
CSVs: ``Listing.csv_rows``). The text ends with a ``next:`` line saying what to run next.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Sequence, TextIO

DEFAULT_WIDTH = 100  # when stdout is not a terminal and COLUMNS is not set


@dataclass(frozen=True)
class Column:
    """One table column: the row key it shows, its header, alignment, wrapping and colour."""

    key: str
    header: str
    justify: str = "left"  # left / right
    wrap: bool = True  # False: never wrapped (ids, numbers)
    style: str | None = None
    ratio: int | None = None  # share of the spare width (rich), for the long text columns
    max_width: int | None = None


@dataclass
class Listing:
    """A table and what surrounds it: its rows as text cells, and its data for ``--json`` / ``--csv``."""

    title: str
    columns: Sequence[Column]
    rows: list[dict[str, Any]]  # column key -> cell text (a str, or (str, style))
    before: list[str] = field(default_factory=list)  # paragraphs above the table
    after: list[str] = field(default_factory=list)  # paragraphs below it
    styles: list[str | None] | None = None  # per row
    empty: str = "(nothing)"


def width(stream: TextIO | None = None) -> int:
    """The output width: ``COLUMNS`` if set, else the terminal's (stdout a terminal), else ``DEFAULT_WIDTH``."""
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 20:
        return int(env)
    stream = stream or sys.stdout
    if _tty(stream):
        return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
    return DEFAULT_WIDTH


def wrap(text: str, indent: str = "  ", stream: TextIO | None = None) -> str:
    """``text`` fitted to the output :func:`width`: each of its lines wrapped at spaces, continuation
    lines indented by ``indent`` beyond the line's own. A word longer than a line (a long path) is
    kept whole, so it can still be copied."""
    import textwrap

    w = width(stream)
    out = []
    for line in text.split("\n"):
        lead = line[:len(line) - len(line.lstrip(" "))]
        out += textwrap.wrap(line, w, initial_indent="", subsequent_indent=lead + indent, break_on_hyphens=False,
                             break_long_words=False) or [""]
    return "\n".join(out)


def say(text: str = "", *, file: TextIO | None = None) -> None:
    """Print ``text`` fitted to the output width (:func:`wrap`), flushed (progress lines of workers
    stay whole lines)."""
    stream = file or sys.stdout
    with _SAY_LOCK:  # one write per call: lines of two workers' threads never share a line
        stream.write(wrap(text, stream=stream) + "\n")
        stream.flush()


_SAY_LOCK = threading.Lock()


def next_step(hint: str, file: TextIO | None = None) -> None:
    """The last line of every verb: ``next: <the command to run next>``."""
    say(f"next: {hint}", file=file)


def _tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def console(stream: TextIO | None = None):
    """A ``rich`` console on ``stream``: fitted width, colour only on a terminal (and not under ``NO_COLOR``)."""
    stream = stream or sys.stdout
    tty = _tty(stream) and not os.environ.get("NO_COLOR")
    return _console_class()(file=stream, width=width(stream), color_system="auto" if tty else None, force_terminal=tty,
                   highlight=False, markup=False, emoji=False, soft_wrap=False, no_color=not tty)


def _console_class():
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:  # rich would exit(1); the CLI ends a closed pipe quietly (code 141)
            raise BrokenPipeError

    return _Console


def table(listing: Listing):
    """The listing's ``rich`` table (rows already in display order)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0), header_style="bold",
              expand=False)
    for c in listing.columns:
        t.add_column(c.header, justify=c.justify, no_wrap=not c.wrap, overflow="fold" if c.wrap else "ellipsis",
                     style=c.style, ratio=c.ratio, max_width=c.max_width)
    for i, row in enumerate(listing.rows):
        cells = []
        for c in listing.columns:
            v = row.get(c.key, "")
            cells.append(Text(v[0], style=v[1] or "") if isinstance(v, tuple) else Text(str(v)))
        t.add_row(*cells, style=(listing.styles[i] if listing.styles else None))
    return t


def print_listings(listings: Sequence[Listing], hint: str, stream: TextIO | None = None) -> None:
    """The listings as text, then the ``next:`` line."""
    con = console(stream)
    for n, lst in enumerate(listings):
        if n:
            con.print()
        if lst.title:
            con.print(lst.title, style="bold")
        for p in lst.before:
            con.print(p)
        if lst.rows:
            con.print(table(lst))
        elif lst.empty:
            con.print(lst.empty)
        for p in lst.after:
            con.print(p)
    con.print(f"next: {hint}", style="cyan")


def print_json(data: Any, stream: TextIO | None = None) -> None:
    """``data`` as indented JSON (non-JSON values as their ``str``)."""
    (stream or sys.stdout).write(json.dumps(data, indent=1, default=str) + "\n")


def print_csv(rows: Sequence[dict[str, Any]], stream: TextIO | None = None) -> None:
    """One header row (the union of the rows' keys, in first-seen order), one row per item."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    w = csv.DictWriter(stream or sys.stdout, fieldnames=keys, lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: _flat(v) for k, v in r.items()})


def _flat(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, tuple)):
        return ";".join(str(x) for x in v)
    if isinstance(v, dict):
        return json.dumps(v, default=str)
    return v


def add_output_options(parser) -> None:
    """``--json`` and ``--csv`` (mutually exclusive) on a listing verb."""
    g = parser.add_mutually_exclusive_group()
    g.add_argument("--json", action="store_true", help="print everything the listing shows (and more) as JSON")
    g.add_argument("--csv", action="store_true",
                   help="print one CSV row per item (one header row, as PyTorch's dynamo benchmark CSVs)")


def emit(args, listings: Sequence[Listing], data: Any, csv_rows: Sequence[dict], hint: str) -> int:
    """Print the listings as ``--json``, ``--csv`` or text (the default) per ``args``; returns 0."""
    if getattr(args, "json", False):
        print_json(data)
    elif getattr(args, "csv", False):
        print_csv(csv_rows)
    else:
        print_listings(listings, hint)
    return 0


def cell(text: str, style: str | None) -> tuple[str, str | None]:
    """A styled cell (the style applies on a terminal only)."""
    return (text, style)
