"""The tests of a region-kernel fusion (everything Inductor fused into one kernel, dropout drawn in the kernel).

The checks ``miner validate`` ran on the candidate (``miner.check.validate``), run again on the promoted
fusion's own files (``fusions/<FUSION>/``, its ``fusion.json`` holding the pattern and lowering):

- numerics: ``kernel.launch`` against a float64 reference on every case ``miner promote`` listed
  (``entry``: the inputs' shapes, dtypes and strides, and the scalars; ``variant``: the looped kernel or
  the default). A kernel that draws its own random numbers is compared with its ``kernel.reference``,
  which draws the same ones (``miner.runtime.philox``) in float64 torch.
- the four-per-call stream: the same mask, bit for bit, under every tiling (``entry``).
- the zoo model's tiny step compiled with the fusion (gate held open), compared with an eager step into
  which the masks the kernel drew are injected (``model``, ``mode``; ``slow``). Where the tiny step's
  graph is cut so that the region does not match, the test skips with that reason: the in-model A/B at
  the measured shape judged it (``fusions/<FUSION>/wins.json``).
"""

from __future__ import annotations

import pytest

from miner.check import masks, validate
from miner.core.candidate import Candidate
from miner_testing import fusion_folder_as_candidate, registry_is_loud

FIXTURES = ("fusion",)


@pytest.fixture(scope="module")
def fusion(request) -> Candidate:
    """The fusion the requesting test module names, as the checks take a candidate: its folder and fusion.json."""
    return fusion_folder_as_candidate(request.module)


def test_kernel_matches_float64_reference(fusion, case, device):
    check = validate.check_numerics(fusion, "case", case["entry"], case["variant"], device)
    assert check.ok, check.detail


def test_same_mask_in_every_tiling(fusion, case, device):
    check = validate.check_tiling(fusion, "case", case["entry"], device)
    assert check.ok, check.detail


@pytest.mark.slow
def test_step_with_its_masks_injected_matches_eager(fusion, case, device):
    check = masks.check_model(fusion, case["model"], case["mode"], device)
    if check.ok is None:
        pytest.skip(check.detail)
    assert check.ok, check.detail


def test_registry_is_loud_about_unknown_names(fusion, case):
    registry_is_loud(fusion, case["unknown"])
