"""Promoted fusions in ``torch.compile``: a fusions folder, loaded by path, as one Inductor pass.

A fusions folder is what ``miner promote`` writes: ``<workspace>/fusions/<name>/`` with
``pattern.py``, ``kernel.py``, ``fusion.json`` and, once timed on a GPU, ``wins.json``. Any such
folder loads the same way, the repository's own ``fusions/`` (installed as ``miner_fusions``)
and a user's workspace alike; nothing is imported by a package name that exists only in one
checkout. The one line::

    import miner.runtime.fusions
    miner.runtime.fusions.install("path/to/workspace")   # then torch.compile(model, mode=...) as usual

``install`` puts the fusions' pass into Inductor's global config (both post-grad slots), so it
holds for every later ``torch.compile`` whatever its ``mode`` ("default", "reduce-overhead",
"max-autotune"): torch refuses ``mode`` together with ``options``. Without a global setting, pass
the options yourself: ``torch.compile(model, options=inductor_options("path/to/workspace"))``.
Either way ``graph_pass.counts[name]`` (the returned pass) says how often each fusion matched in
the compiles the pass ran in: a compile served from Inductor's cache runs no pass and counts
nothing (``graph_pass.cache_hits()`` says how many were; see ``FusionPass``).

On the CPU the kernels would run in the Triton interpreter (~100x slower than Inductor's C++):
they fire there only when asked, ``install(..., interpret=True)`` or ``MINER_INTERPRET=1`` (with
``TRITON_INTERPRET=1`` set before triton is imported); otherwise each CPU match declines with that
reason (``graph_pass.declined``; every decision of the pass: ``graph_pass.log``) and one warning is logged.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterable

from miner.core.errors import UsageError
from miner.runtime import rewrite

SLOTS = ("post_grad_custom_pre_pass", "post_grad_custom_post_pass")
PLACEHOLDER = "path/to/workspace"  # what the README and docstrings write

log = logging.getLogger(__name__)


def fusions_dir(where: str | Path) -> Path:
    """The fusions folder of ``where``: a workspace (holding ``fusions/``) or a fusions folder itself.

    Parameters
    ----------
    where : str or Path
        A workspace root, or the fusions folder (the one holding ``<name>/pattern.py``).

    Returns
    -------
    Path
        The folder whose subfolders are the fusions. A workspace without ``fusions/`` gives its
        (absent) ``fusions`` path, which holds no fusions.
    """
    path = Path(where).expanduser().resolve()
    if (path / "fusions").is_dir() and not any(path.glob("*/pattern.py")):
        return path / "fusions"
    return path


def names(where: str | Path) -> list[str]:
    """The fusions in ``where`` (see :func:`fusions_dir`), sorted."""
    return sorted(p.parent.name for p in fusions_dir(where).glob("*/pattern.py"))


def promoted_from(where: str | Path, pattern_id: str) -> list[str]:
    """The fusions in ``where`` (see :func:`fusions_dir`) that ``miner promote`` made from candidate ``pattern_id``
    (their ``fusion.json`` names it), sorted.

    Raises
    ------
    WorkspaceError
        For a ``fusion.json`` that does not parse (naming it and the command that rebuilds it).
    """
    from miner.core.workspace import read_json

    return [path.parent.name for path in sorted(fusions_dir(where).glob("*/fusion.json"))
            if read_json(path).get("pattern_id") == pattern_id]


def load(where: str | Path, name: str):
    """The pattern module of fusion ``name`` in ``where``, imported by path once per process.

    Raises
    ------
    UsageError
        When there is no such fusion; the message lists the fusions there.
    """
    folder = fusions_dir(where)
    path = folder / name / "pattern.py"
    if not path.is_file():
        raise UsageError(f"unknown fusion {name!r} in {folder}; fusions: {', '.join(names(folder)) or '(none)'}")
    return rewrite.load_module(path, rewrite.module_name(path, "pattern"))


def checked_dir(where: str | Path) -> Path:
    """The fusions folder of ``where`` (:func:`fusions_dir`), refusing a path that holds none.

    Raises
    ------
    UsageError
        For the README's placeholder, a missing path, or a folder with neither ``fusions/`` nor
        fusions of its own. A ``fusions/`` without any fusion is allowed, with a logged warning.
    """
    if str(where).rstrip("/") == PLACEHOLDER:
        raise UsageError(f"install({PLACEHOLDER!r}): replace the placeholder with your workspace, the "
                         "folder `miner promote` wrote fusions/ into (e.g. install('.'))")
    path = Path(where).expanduser().resolve()
    if not path.is_dir():
        raise UsageError(f"{path}: no such directory (give the workspace `miner promote` wrote fusions/ into)")
    folder = fusions_dir(path)
    if folder == path and path.name != "fusions" and not names(path):
        raise UsageError(f"{path}: no fusions/ here and no fusion folders (<name>/pattern.py); "
                         "`miner promote <id> --name <name>` writes one")
    if not names(folder):
        log.warning("miner fusions: %s holds no fusion yet (`miner promote` adds one); the pass does nothing", folder)
    return folder


def _pass(folder: str | Path, selected: Iterable[str] | None, interpret: bool | None, gate: str = "on",
          records: dict | None = None) -> rewrite.FusionPass:
    chosen = names(folder) if selected is None else list(selected)
    modules = {n: load(folder, n) for n in chosen}
    return rewrite.FusionPass([rewrite.entry_for(m.__file__, n, m) for n, m in modules.items()],
                              interpret=rewrite.interpret_requested(interpret), gate=gate, records=records)


def graph_pass(where: str | Path, selected: Iterable[str] | None = None, *,
               interpret: bool | None = None) -> rewrite.FusionPass:
    """One :class:`miner.runtime.rewrite.FusionPass` running the selected fusions of ``where`` (default: all).

    Its ``counts[name]`` counts the matches of each fusion (compiles served from Inductor's cache
    excepted: ``cache_hits()``); its ``uuid()`` hashes every fusion's pattern.py, kernel.py and
    wins.json and the state a decision reads (``rewrite.decision_state``), so Inductor's caches
    see an edited or re-measured fusion and never serve a graph compiled under other conditions.
    ``interpret``: let CPU matches run in the Triton interpreter (None: ``MINER_INTERPRET=1``).
    Raises :class:`UsageError` for a path without fusions (:func:`checked_dir`).
    """
    return _pass(checked_dir(where), selected, interpret)


def inductor_options(where: str | Path, selected: Iterable[str] | None = None, *,
                     graph_pass_: rewrite.FusionPass | None = None, interpret: bool | None = None) -> dict[str, Any]:
    """``torch.compile(model, options=...)`` installing the fusions of ``where`` for that compile only.

    ``graph_pass_`` reuses a pass (e.g. one whose counts you read). Not usable with ``mode=``
    (torch takes one or the other): use :func:`install` there.
    """
    return rewrite.inductor_options(graph_pass_ if graph_pass_ is not None
                                    else graph_pass(where, selected, interpret=interpret))


def install(where: str | Path, selected: Iterable[str] | None = None, *,
            interpret: bool | None = None) -> rewrite.FusionPass:
    """Install the fusions of ``where`` into Inductor's global config; returns the pass (its ``counts``).

    Every later ``torch.compile`` uses them, with any ``mode``. A slot already holding a miner
    pass is replaced; a slot holding someone else's pass raises (chain them yourself).
    :func:`uninstall` empties the slots again.

    Parameters
    ----------
    where : str or Path
        The workspace ``miner promote`` wrote ``fusions/`` into, or that fusions folder. A missing
        path or one without fusions raises :class:`UsageError`.
    selected : iterable of str, optional
        Fusion names (default: all).
    interpret : bool, optional
        Let matches on CPU tensors run in the Triton interpreter (for tests; needs
        ``TRITON_INTERPRET=1`` before triton is imported). None: ``MINER_INTERPRET=1`` decides.
        Otherwise CPU matches decline with that reason and one logged warning.
    """
    import torch._inductor.config as config

    for slot in SLOTS:
        current = getattr(config, slot)
        if current is not None and not isinstance(current, rewrite.FusionPass):
            raise UsageError(f"torch._inductor.config.{slot} already holds {current!r}; not replacing it")
    p = graph_pass(where, selected, interpret=interpret)
    for slot in SLOTS:
        setattr(config, slot, p)
    return p


def uninstall() -> None:
    """Remove an installed miner pass from Inductor's global config (a foreign pass stays)."""
    import torch._inductor.config as config

    for slot in SLOTS:
        if isinstance(getattr(config, slot), rewrite.FusionPass):
            setattr(config, slot, None)


class Fusions:
    """The functions above bound to one fusions folder (what ``fusions/__init__.py`` exports)."""

    def __init__(self, where: str | Path, interpret: bool | None = None):
        self.root = fusions_dir(where)
        self.interpret = interpret  # CPU matches in the Triton interpreter (None: MINER_INTERPRET=1)

    def names(self) -> list[str]:
        return names(self.root)

    def load(self, name: str):
        return load(self.root, name)

    def graph_pass(self, selected: Iterable[str] | None = None, *, gate: str = "on",
                   records: dict | None = None) -> rewrite.FusionPass:
        """A pass of the selected fusions; ``gate`` and ``records``: see :class:`~miner.runtime.rewrite.FusionPass`."""
        return _pass(self.root, selected, self.interpret, gate, records)

    def inductor_options(self, selected: Iterable[str] | None = None, graph_pass_=None) -> dict[str, Any]:
        return rewrite.inductor_options(graph_pass_ if graph_pass_ is not None else self.graph_pass(selected))

    def install(self, selected: Iterable[str] | None = None) -> rewrite.FusionPass:
        return install(self.root, selected, interpret=self.interpret)
