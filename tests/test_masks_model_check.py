"""``miner.check.masks.check_model``: a region candidate's rewrite in the tiny model (masks injected)."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from miner.check import masks


@pytest.fixture
def stand_ins(monkeypatch):
    """The tiny model, the compile and the judge replaced: ``state['matches']`` is what the pass reports,
    ``state['ok']`` the judge's verdict."""
    import miner.check.checks as checks
    import miner.runtime.rewrite as rewrite

    state = {"matches": 0, "ok": True}

    class Pass:
        def __init__(self, entries, gate="on"):
            assert gate == "open"  # the rewrite is what is checked: a promoted fusion's gate would decline tiny shapes
            self.counts = {}

        def total(self):
            return state["matches"]

    monkeypatch.setattr(checks, "models_build", lambda *a: types.SimpleNamespace())
    monkeypatch.setattr(rewrite, "FusionPass", Pass)
    monkeypatch.setattr(rewrite, "entry_for", lambda *a: None)
    monkeypatch.setattr(masks, "observe_compiled", lambda *a, **k: None)
    monkeypatch.setattr(masks, "slots_of", lambda cands: {})
    monkeypatch.setattr(masks, "masked_parity", lambda *a, **k: masks.MaskedParity(
        state["ok"], "loss 1e-05 <= 2 x 1e-05", {"loss": 1e-5}, {"loss": 1e-5}, recorded=2, dropouts=3))
    cand = types.SimpleNamespace(id="p297db06345_x4", path=Path("candidates/p297db06345_x4"), pattern_module=None)
    return state, cand


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_no_match_in_the_tiny_step_is_not_judged_and_says_where_it_is(stand_ins, device):
    """DeBERTa's attention region (7.3 ms/step above floor, H100 2026-12-06) matched nothing in the tiny step
    on the GPU: there the partitioner saves the softmax's row max and sum for the backward, interior values
    of the region at B16 S512. That failed validation and kept the region out of the A/B that would show it
    firing where it was found; now it is not judged, and says the A/B decides."""
    state, cand = stand_ins
    c = masks.check_model(cand, "DebertaV2ForMaskedLM", "train", device)
    assert c.ok is None and c.matches == 0 and c.detail.startswith("not judged")
    assert "miner verify --ab" in c.detail and ("--device cuda" in c.detail) == (device == "cpu")


def test_a_match_is_judged_by_the_masked_parity(stand_ins):
    state, cand = stand_ins
    state["matches"] = 12
    assert masks.check_model(cand, "DebertaV2ForMaskedLM", "train", "cuda").ok is True
    state["ok"] = False  # planted: the judge finds the rewrite's step off
    c = masks.check_model(cand, "DebertaV2ForMaskedLM", "train", "cuda")
    assert c.ok is False and c.detail.startswith("12 match(es), 2 of 3 dropouts")
