"""Shared test setup: without CUDA, Triton runs on the CPU through its interpreter and GPU tests skip."""

import os

import pytest
import torch  # torch does not import triton: the interpreter switch below still takes effect

import miner  # noqa: F401  first: miner_models / miner_fusions then resolve to this checkout's folders

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must be set before triton is imported
    os.environ.setdefault("MINER_INTERPRET", "1")  # the fusions may fire on CPU tensors (interpreted)


def pytest_collection_modifyitems(config, items):
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _train_matches_once_per_fusion_body():
    """``miner promote`` measures a fusion's training-step matches in a fresh process (~18 s on CI's CPU); the
    suite promotes the same candidate under several names. The count depends on the fusion's files, not its
    name: within one test session it is measured once per body (``pattern.py`` + ``kernel.py`` with the name
    blanked) and input case, then reused."""
    import hashlib

    from miner.check import fusion_chain

    real, seen = fusion_chain.train_matches, {}

    def once(fusions_dir, name, shapes, scalars):
        folder = fusions_dir / name
        body = "".join((folder / f).read_text().replace(name, "<name>") for f in ("pattern.py", "kernel.py")
                       if (folder / f).exists())
        key = (hashlib.sha256(body.encode()).hexdigest(), repr(shapes), repr(scalars))
        if key not in seen:
            seen[key] = real(fusions_dir, name, shapes, scalars)
        return seen[key]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fusion_chain, "train_matches", once)
        yield
