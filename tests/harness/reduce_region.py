"""The tests of a reduction-region fusion (a region reducing over outer dims, t5's position-bias gradient).

``miner validate``'s checks of the kind (``miner.check.reduce``) on the promoted fusion's own files
(``fusions/<FUSION>/``, its ``fusion.json`` holding the observed entries and the kernel's plan):

- numerics: ``kernel.launch`` against the float64 reference within its float32 rounding bound
  (``compare_bounded``), per observed entry (``entry``: its index) at the CPU's stand-in sizes or at odd
  sizes (``primes``: ``SMALL`` / ``ODD``), float inputs as observed or in ``dtype``;
- the rewrite: the pattern compiled as a module with only this fusion's pass (CPU, Triton interpreted)
  fires and equals eager.
"""

from __future__ import annotations

import pytest

from miner.check import reduce
from miner.core.candidate import Candidate
from miner_testing import fusion_folder_as_candidate, registry_is_loud

FIXTURES = ("fusion",)


@pytest.fixture(scope="module")
def fusion(request) -> Candidate:
    """The fusion the requesting test module names, as the checks take a candidate: its folder and fusion.json."""
    return fusion_folder_as_candidate(request.module)


def test_kernel_matches_float64_reference(fusion, case, device):
    entry = fusion.meta["observed"][case["entry"]]
    primes = {"SMALL": reduce.SMALL, "ODD": reduce.ODD}[case["primes"]]
    xs = reduce.inputs_for(entry, primes, reduce.table_rows(fusion.meta), device, float_dtype=case["dtype"])
    check = reduce.check_case(fusion, "case", xs, [float(s) for s in entry["scalars"]])
    assert check.ok, check.detail


def test_rewrite_fires_and_equals_eager_in_the_region_module(fusion, case):
    check = reduce.rewrite_check(fusion)
    assert check.ok, check.detail


def test_registry_is_loud_about_unknown_names(fusion, case):
    registry_is_loud(fusion, case["unknown"])
