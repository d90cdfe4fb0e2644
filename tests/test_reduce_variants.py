"""The reduce_region kernel variants (loop, tile, split), their float64 check and the GPU timing entry.

Run under the Triton interpreter (conftest sets TRITON_INTERPRET=1) at small sizes: the kernels'
structure (unrolling, one-row scalar loads, the split's partials and epilogue) is exercised, the
speed is measured on a GPU by ``python3 -m miner.check.reduce``.
"""

import pytest
import torch

from miner.check import reduce as check
from miner.core import candidate
from miner.core.workspace import Workspace
from miner.runtime import reduce as R

CID = "p86f4808f37"


@pytest.fixture(scope="module")
def t5():
    """The encoder's bias-gradient region at sizes 12 -> 2, 16 -> 3, 512 -> 16 (a power of two: XB
    divides the row, so the one-row scalar loads run), its inputs and float64 references."""
    cand = candidate.load(Workspace("."), CID)
    entry = cand.meta["observed"][0]
    xs = check.inputs_for(entry, (2, 3, 16), 32, "cpu", seed=5)
    cs = [float(s) for s in entry["scalars"]]
    return cand, xs, cs, check.float64_reference(cand.pattern_module.pattern, xs, cs)


# (variant, (RB, XB, num_warps)): RB=2 does not divide the 3 reduced elements (masked tail); XB=8 and 16
# divide the 16-wide rows (ONE_ROW: scalar loads of the row sums), XB=32 and 64 do not.
CASES = [("loop", (1, 16, 1)), ("loop", (2, 32, 1)), ("tile", (4, 8, 1)), ("tile", (2, 32, 1)),
         ("split", (2, 16, 1)), ("split", (1, 64, 1))]


@pytest.mark.parametrize("variant,config", CASES)
def test_variant_matches_float64(t5, variant, config):
    cand, xs, cs, refs = t5
    c = check.check_case(cand, variant, xs, cs, variant=variant, config=config, refs=refs)
    assert c.ok, c.detail
    assert c.max_rel < 1


def test_default_variant_is_split_and_unknown_variant_is_refused(t5):
    cand, xs, cs, _ = t5
    assert cand.kernel_module.VARIANT == "split" and set(cand.kernel_module.KERNELS) >= set(R.CONFIGS)
    with pytest.raises(ValueError, match="variant 'nope'"):
        cand.kernel_module.launch(*xs, *cs, variant="nope")


def test_float64_reference_sums_in_float64():
    # the pattern sums with dtype=float32: 1e8 + 1 - 1e8 is 0 in float32 and 1 in float64
    def fn(x):
        return (torch.ops.aten.sum.dim_IntList(x, [0], False, dtype=torch.float32),)

    x = torch.tensor([[1e8], [1.0], [-1e8]])
    ref, = check.float64_reference(fn, [x], [])
    assert ref.value.dtype == torch.float64 and float(ref.value[0]) == 1.0
    assert float(fn(x.double())[0][0]) == 0.0  # what the previous reference computed
    assert float(ref.bound()[0]) > 0


def test_bound_passes_the_kernel_and_fails_real_bugs(t5):
    cand, xs, cs, refs = t5
    expect = cand.pattern_module.pattern(*[x.to("meta") for x in xs], *cs)[0].dtype
    out = cand.kernel_module.launch(*xs, *cs)[0]
    ok, _, ratio, _ = check.compare_bounded(out, refs[0], expect)
    assert ok and ratio < 1
    assert not check.compare_bounded(out * (1 + 1e-5), refs[0], expect)[0]  # a wrong scale
    dropped = list(xs)
    dropped[2] = torch.zeros_like(xs[2])  # layer 0's probabilities: its term is 0, as if the layer were dropped
    assert not check.compare_bounded(cand.kernel_module.launch(*dropped, *cs)[0], refs[0], expect)[0]
    assert not check.compare_bounded(out[:-1], refs[0], expect)[0]  # a wrong shape


def test_split_branches_read_only_their_reductions_inputs():
    text = (Workspace(".").candidates / CID / "kernel.py").read_text()
    split = text[text.index("def reduce_split_kernel"):text.index("def reduce_epilogue_kernel")]
    def loaded(i):
        branch = split[split.index(f"if i == {i}:"):split.index(f"if i == {i + 1}:")]
        return {int(t.split("_ptr")[0][1:]) for t in branch.split("tl.load(")[1:]}

    # t5's bias gradient under sdpa_reduced_math: each layer's branch reads the mask and its own score gradient
    assert loaded(0) == {1, 2} and loaded(1) == {1, 3}


def test_tuning_key_is_per_shape_and_variant(t5, monkeypatch):
    from miner.runtime import launch as _launch

    cand, xs, cs, _ = t5
    keys = []
    monkeypatch.setattr(_launch, "pick", lambda key, cands, go, dev: keys.append(key) or cands[0])
    cand.kernel_module.launch(*xs, *cs)
    cand.kernel_module.launch(*xs, *cs)
    cand.kernel_module.launch(*xs, *cs, variant="loop")
    cand.kernel_module.launch(*xs, *cs, config=R.CONFIGS["split"][0])  # a forced tile is not tuned
    entry = cand.meta["observed"][0]
    other = check.inputs_for(entry, (2, 5, 16), 32, "cpu", seed=5)
    cand.kernel_module.launch(*other, *cs)
    assert len(keys) == 4 and keys[0] == keys[1] and keys[2] != keys[0] and keys[3] != keys[0]


def test_timing_entry_runs_every_variant(capsys):
    configs = {"loop": [(1, 128, 1)], "tile": [(4, 128, 1)], "split": [(2, 128, 1)]}
    best = check.time_candidate(candidate.load(Workspace("."), CID), sorted(R.CONFIGS), configs, print,
                                device="cpu", primes=(2, 3, 16), inductor=False)
    out = capsys.readouterr().out
    assert set(best) == set(R.CONFIGS), out
    assert out.count("check ok") >= 4 and "scatter alone" in out and "default split" in out


def test_timing_entry_refuses_unknown_variant(capsys):
    assert check.main(["--variants", "loop,nope", CID]) == 2
    assert "unknown variant" in capsys.readouterr().out
