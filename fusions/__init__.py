# Written by miner 0.1.0 (`miner promote`); the same in every workspace.
"""Promoted fusions: Inductor pattern rewrites whose replacement is a generated Triton kernel.

Load them into torch.compile by path, with any ``mode``::

    import miner.runtime.fusions
    miner.runtime.fusions.install("path/to/workspace")      # every later torch.compile uses them
    model = torch.compile(model, mode="max-autotune")

or, for one compile, ``torch.compile(model, options=miner.runtime.fusions.inductor_options("path/to/workspace"))``.
This folder imported as a package (the repository's own is installed as ``miner_fusions``) offers
the same functions bound to it: ``names()``, ``load(name)``, ``graph_pass(names)``,
``inductor_options(names)``, ``install(names)``. ``graph_pass().counts`` says how often each
fusion matched. Each fusion ``<name>/`` has ``pattern.py`` (search pattern in aten ops,
replacement by the custom op ``miner::<name>``, extra check), ``kernel.py`` (the Triton kernel and
its launcher) and ``wins.json``: its in-model A/B records (on CUDA the extra check fires only
where they measured the model's step faster; an isolated benchmark never enables it alone) and its
isolated GPU timings. Kernels run on CUDA, or on CPU tensors under
``TRITON_INTERPRET=1`` (elsewhere the extra check declines and the graph is left as it was).
"""

from pathlib import Path as _Path

from miner.runtime.fusions import Fusions as _Fusions

_FUSIONS = _Fusions(_Path(__file__).resolve().parent)
names, load, graph_pass = _FUSIONS.names, _FUSIONS.load, _FUSIONS.graph_pass
inductor_options, install = _FUSIONS.inductor_options, _FUSIONS.install
