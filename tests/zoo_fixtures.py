"""Factories for scan tests (``miner scan --models tests.zoo_fixtures:<name>``): one good, three bad."""

import os
import time

import torch


class TinyHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x, labels=None):
        probs = torch.softmax(self.proj(x), dim=-1)
        return {"loss": torch.nn.functional.mse_loss(probs, labels) if labels is not None else None, "probs": probs}


def good(preset, mode, device):
    from miner_models import Built
    inputs = {"x": torch.randn(4, 8), "labels": torch.rand(4, 8)} if mode == "train" else {"x": torch.randn(4, 8)}
    return Built(TinyHead().to(device), inputs, lambda out: out["loss"])


def raises(preset, mode, device):
    raise RuntimeError("this model is broken on purpose")


def crashes(preset, mode, device):
    os._exit(3)  # as a segfault or the OOM killer would: no Python cleanup, no result written


def hangs(preset, mode, device):
    time.sleep(3600)
