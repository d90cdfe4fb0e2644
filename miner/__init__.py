"""miner: mine fusion opportunities from torch.compile's post-grad graphs.

The model zoo, the promoted fusions and the fusions' test harness live in the folders ``models/``,
``fusions/`` and ``tests/harness/`` and install as ``miner_models``, ``miner_fusions`` and
``miner_testing`` (see pyproject.toml). When this package is imported from a checkout (those folders
beside it), the three names resolve to that checkout's folders, so a second checkout or worktree never
runs the zoo of whichever copy is installed.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

__version__ = "0.1.0"

_ROOT = Path(__file__).resolve().parent.parent
CHECKOUT_PACKAGES = {"miner_models": _ROOT / "models", "miner_fusions": _ROOT / "fusions",
                     "miner_testing": _ROOT / "tests" / "harness"}


class _CheckoutFolders(importlib.abc.MetaPathFinder):
    """Finds ``miner_models`` / ``miner_fusions`` / ``miner_testing`` in the checkout this package was imported from."""

    def find_spec(self, name, path=None, target=None):
        folder = CHECKOUT_PACKAGES.get(name)
        if folder is None or not (folder / "__init__.py").is_file() or not (_ROOT / "pyproject.toml").is_file():
            return None
        return importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])


if not any(isinstance(f, _CheckoutFolders) for f in sys.meta_path):
    sys.meta_path.insert(0, _CheckoutFolders())
