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
