"""Import a generated file (a candidate's or fusion's ``pattern.py`` / ``kernel.py``) by path, once per process.

``miner.core.candidate`` loads a candidate's modules with these; ``miner.runtime.rewrite`` re-exports
them, since every generated ``pattern.py`` loads its sibling ``kernel.py`` through
``rewrite.load_module`` and ``rewrite.module_name``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def module_name(path: str | Path, role: str) -> str:
    """A module name for a candidate file, unique per folder (the same pattern id may live in two workspaces)."""
    folder = Path(path).resolve().parent
    digest = hashlib.sha1(str(folder).encode()).hexdigest()[:8]
    return f"miner_candidates.{folder.name}_{digest}.{role}"


def load_module(path: str | Path, name: str) -> ModuleType:
    """Import ``path`` as module ``name`` once (later calls return the same module)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
