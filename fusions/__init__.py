# Written by miner 0.1.0 (`miner promote` rewrites it from the folders under fusions/).
"""Promoted fusions: Inductor pattern rewrites whose replacement is a generated Triton kernel.

Use::

    import fusions
    model = torch.compile(model, options=fusions.inductor_options())          # every fusion
    model = torch.compile(model, options=fusions.inductor_options(["softmax_like"]))

Each fusion ``fusions/<name>/`` has ``pattern.py`` (search pattern in aten ops, replacement by the
custom op ``miner::<name>``, extra check), ``kernel.py`` (the Triton kernel and its launcher) and,
once timed on a GPU, ``wins.json`` (where it beats Inductor: on CUDA the extra check fires only
there). The pass is one ``CustomGraphPass`` running every selected fusion; its ``uuid()`` hashes
their sources and wins.json, so editing a fusion or measuring it again invalidates Inductor's
caches. ``graph_pass().counts`` says how often each fusion matched. Kernels run on CUDA, or on
CPU tensors under ``TRITON_INTERPRET=1`` (elsewhere the extra check declines and the graph is left
as it was).
"""

from __future__ import annotations

import importlib
from pathlib import Path

REGISTRY: dict[str, str] = {
    "add_rms_norm": "fusions.add_rms_norm",
    "layer_norm": "fusions.layer_norm",
    "log_softmax": "fusions.log_softmax",
    "rms_norm": "fusions.rms_norm",
    "softmax_like": "fusions.softmax_like",
}


def names() -> list[str]:
    return sorted(REGISTRY)


def load(name: str):
    """The pattern module of fusion ``name``; an unknown name raises, listing the valid ones."""
    if name not in REGISTRY:
        from miner.errors import UsageError

        raise UsageError(f"unknown fusion {name!r}; fusions: {', '.join(names()) or '(none)'}")
    return importlib.import_module(f"{REGISTRY[name]}.pattern")


def graph_pass(selected: list[str] | None = None):
    """One ``miner.rewrite.FusionPass`` running the selected fusions (default: all)."""
    from miner.rewrite import Entry, FusionPass

    entries = []
    for name in (names() if selected is None else selected):
        module = load(name)
        folder = Path(module.__file__).parent
        files = (folder / "pattern.py", folder / "kernel.py", folder / "wins.json")  # wins.json may be absent
        entries.append(Entry(name, module, tuple(map(str, files))))
    return FusionPass(entries)


def inductor_options(selected: list[str] | None = None, graph_pass_=None) -> dict:
    """``torch.compile(options=...)`` installing the fusions' pass (``graph_pass_``: reuse one, e.g. to read counts)."""
    from miner.rewrite import inductor_options as _options

    return _options(graph_pass_ if graph_pass_ is not None else graph_pass(selected))
