"""The tests every promoted fusion runs, installed as ``miner_testing`` (pyproject ``package-dir``).

A fusion's test module (``tests/fusions/test_<name>.py``, written by ``miner promote``) has one shape
for every kind of candidate: ``FUSION`` (its name; ``fusions/<FUSION>/`` two folders above the module),
``CASES`` (rows ``(test, case id, arguments)``: each row one run of the test it names) and one line
binding the named tests of its kind's harness module here (``miner.kinds``: a kind's ``harness``)::

    globals().update(bind("row_kernel", CASES))

:func:`bind` returns those test functions, the harness's fixtures and :func:`pytest_generate_tests`,
which gives each test its rows as the ``case`` argument (plus ``dtype`` and ``device`` where a test
takes them). The harness lives outside the product package ``miner`` (it imports pytest); from a
checkout ``import miner`` resolves ``miner_testing`` to this folder (``miner.CHECKOUT_PACKAGES``).
Without CUDA, ``TRITON_INTERPRET=1`` is set here before triton is imported (kernels run on CPU
tensors); CUDA cases are marked ``gpu`` and skip cleanly without a CUDA device.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest
import torch  # does not import triton, so the switch below still takes effect

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run on CPU tensors

DTYPES = ("float32", "bfloat16", "float16")
CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                         reason="needs a CUDA device")])
DEVICES = ("cpu", CUDA)


def bind(harness: str, cases) -> dict:
    """The tests ``cases`` names, from ``miner_testing.<harness>``, its fixtures and the parametrizing hook.

    Parameters
    ----------
    harness : str
        The harness module (a kind's ``harness`` in ``miner.kinds``).
    cases : sequence of tuple
        The test module's ``CASES``: ``(test, case id, arguments)``.

    Returns
    -------
    dict
        What the test module puts into its globals, so that pytest collects it there.

    Raises
    ------
    LookupError
        When a row names a test the harness does not have (listing the ones it has).
    """
    module = importlib.import_module(f"{__name__}.{harness}")
    have = sorted(n for n in vars(module) if n.startswith("test_"))
    names = list(dict.fromkeys(row[0] for row in cases))
    unknown = [n for n in names if n not in have]
    if unknown:
        raise LookupError(f"miner_testing.{harness} has no test {', '.join(unknown)}; its tests: {', '.join(have)}")
    return {**{n: getattr(module, n) for n in names}, **{f: getattr(module, f) for f in module.FIXTURES},
            "pytest_generate_tests": pytest_generate_tests}


def pytest_generate_tests(metafunc):
    """Each test's rows of the module's ``CASES`` as ``case``; ``dtype`` and ``device`` where asked for."""
    if "case" in metafunc.fixturenames:
        rows = [r for r in metafunc.module.CASES if r[0] == metafunc.function.__name__]
        metafunc.parametrize("case", [pytest.param(args, id=cid) for _, cid, args in rows])
    if "dtype" in metafunc.fixturenames:
        metafunc.parametrize("dtype", DTYPES)
    if "device" in metafunc.fixturenames:
        metafunc.parametrize("device", DEVICES)


def workspace_of(module) -> Path:
    """The workspace whose ``fusions/`` a test module tests (``tests/fusions/test_<name>.py`` two folders down)."""
    return Path(module.__file__).resolve().parents[2]


@pytest.fixture(scope="module", name="fusion")
def named_pattern(request):
    """The ``fusion`` fixture of a kind whose fusion is its ``pattern.py`` alone (compute_once, gemm_epilogue):
    ``(name, pattern module)`` of the fusion the requesting test module names."""
    from miner.runtime import fusions

    name = request.module.FUSION
    return name, fusions.load(workspace_of(request.module), name)


def fusion_folder_as_candidate(module):
    """The fusion a test module names, as ``miner validate``'s checks take a candidate
    (``miner.core.candidate.Candidate``: its name, its folder and its ``fusion.json``)."""
    from miner.core.candidate import Candidate
    from miner.core.workspace import read_json

    folder = workspace_of(module) / "fusions" / module.FUSION
    return Candidate(module.FUSION, folder, read_json(folder / "fusion.json"))


def registry_is_loud(fusion, unknown: str) -> None:
    """``fusion`` (a :func:`fusion_folder_as_candidate`) is registered, and loading ``unknown`` fails naming it."""
    from miner.core.errors import UsageError
    from miner.runtime import fusions

    where = fusion.path.parent
    assert fusion.id in fusions.names(where)
    with pytest.raises(UsageError, match=fusion.id):
        fusions.load(where, unknown)


__all__ = ["bind", "fusion_folder_as_candidate", "named_pattern", "pytest_generate_tests", "registry_is_loud", "workspace_of"]
