"""The four-per-call dropout stream: the pure-torch Philox against Triton's, the kernel helpers'
two draws against each other, and the generated dropout kernels' checks failing on broken kernels.

Each test names the bug it would catch.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from miner.runtime import philox
from miner.runtime.jit import fill_uniform4

REPO = Path(__file__).resolve().parents[1]
# the compiled kernels on a CUDA machine (their tl.join/tl.reshape element order as the GPU runs it), the
# interpreter on CPU tensors otherwise (conftest sets TRITON_INTERPRET=1 when there is no CUDA device)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SEEDS = (0, 12345, -5, 2**62 + 17, -(2**63))


@triton.jit
def _randint4x_kernel(seed_ptr, out_ptr, n, BLOCK: tl.constexpr):
    seed = tl.load(seed_ptr)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    a, b, c, d = tl.randint4x(seed, offs.to(tl.uint32))
    m = offs < n
    tl.store(out_ptr + offs * 4 + 0, a.to(tl.int64) & 0xFFFFFFFF, mask=m)
    tl.store(out_ptr + offs * 4 + 1, b.to(tl.int64) & 0xFFFFFFFF, mask=m)
    tl.store(out_ptr + offs * 4 + 2, c.to(tl.int64) & 0xFFFFFFFF, mask=m)
    tl.store(out_ptr + offs * 4 + 3, d.to(tl.int64) & 0xFFFFFFFF, mask=m)


def _triton_words(seed: int, n: int) -> torch.Tensor:
    out = torch.empty(n * 4, dtype=torch.int64, device=DEVICE)
    _randint4x_kernel[(triton.cdiv(n, 256),)](torch.tensor([seed], device=DEVICE), out, n, BLOCK=256)
    return out.view(n, 4).cpu()


def _fill(seed: int, n: int, per_group: bool, start: int = 0, block: int = 64) -> torch.Tensor:
    out = torch.empty(n, dtype=torch.float32, device=DEVICE)
    fill_uniform4[(triton.cdiv(n, block),)](torch.tensor([seed], device=DEVICE), out, n, start,
                                            PER_GROUP=per_group, BLOCK=block)
    return out.cpu()


@pytest.mark.parametrize("seed", SEEDS)
def test_torch_philox_words_are_tritons_randint4x(seed):
    # catches a wrong round constant, key schedule, mulhi or word order in miner.runtime.philox
    words = torch.stack(philox.philox4x32(seed, torch.arange(2000)), dim=-1)
    assert torch.equal(words, _triton_words(seed, 2000))


def test_torch_uniform_is_tritons_conversion():
    # catches a conversion that is not tl.uint_to_uniform_float's (e.g. word * 2**-32): the reference's mask would differ
    @triton.jit
    def k(seed_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.rand(tl.load(seed_ptr), offs.to(tl.uint32)), mask=offs < n)
    out = torch.empty(3000, device=DEVICE)
    k[(triton.cdiv(3000, 256),)](torch.tensor([7], device=DEVICE), out, 3000, BLOCK=256)
    assert torch.equal(out.cpu(), philox.to_uniform(philox.philox4x32(7, torch.arange(3000))[0]))


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_grouped_and_per_element_draws_agree_with_the_reference(seed):
    # catches a wrong interleave (join/reshape order), a wrong word select in uniform_at, an unaligned group start
    ref = philox.uniform(seed, torch.arange(1000))
    assert torch.equal(_fill(seed, 1000, per_group=True), ref)
    assert torch.equal(_fill(seed, 1000, per_group=False), ref)
    assert torch.equal(_fill(seed, 1000, per_group=True, block=16), ref)  # another tile: the same numbers


def test_counters_beyond_32_bits():
    # catches a counter truncated to 32 bits (groups 2**32 apart would repeat)
    start = 4 * 2**32 + 4 * 10
    got = _fill(3, 256, per_group=True, start=start)
    assert torch.equal(got, philox.uniform(3, torch.arange(start, start + 256)))
    assert not torch.equal(got, philox.uniform(3, torch.arange(40, 40 + 256)))


def test_rand_is_the_stream_in_row_major_order():
    # catches rand() drawing in another order than the row-major index L (the kernels' ``lin``)
    r = philox.rand([3, 5, 7], torch.tensor(11))
    assert r.dtype == torch.float32 and r.shape == (3, 5, 7)
    assert torch.equal(r.reshape(-1), philox.uniform(11, torch.arange(105)))
    assert philox.rand([2, 3], torch.empty((), dtype=torch.int64, device="meta")).device.type == "meta"
    with pytest.raises(ValueError, match="rand"):
        philox.rand([2], torch.tensor(1), "randn")


# --------------------------------------------------------------------------- the generated candidates

@pytest.fixture(scope="module")
def x4(tmp_path_factory):
    """candidates/pf4693d7449_x4 (relu + dropout, no reduction) and p010eaa2cbb_x4 (dropout + residual + RMS norm),
    generated afresh from the committed H200 regions into a scratch workspace."""
    from miner.core.workspace import Workspace
    from miner.generate.generate import generate
    from miner.mine import regions

    ws = Workspace(tmp_path_factory.mktemp("x4"))
    rps = {rp.id: rp for rp in regions.load(REPO / "reports/gpu/2026-12-03-h200-profile")}
    src = {"regions": "reports/gpu/2026-12-03-h200-profile/mined/regions.json", "rng": "philox4"}
    done, skipped = generate(ws, [rps["pf4693d7449"].pattern, rps["p010eaa2cbb"].pattern], "test", source=src)
    assert [g.id for g in done] == ["pf4693d7449_x4", "p010eaa2cbb_x4"], skipped
    return ws


def _broken(ws, cid: str, old: str, new: str):
    """A copy of candidate ``cid`` whose kernel.py has ``old`` replaced (a planted bug)."""
    from miner.core import candidate as candidates

    bad = ws.candidates / (cid + "bad" + str(abs(hash(new)) % 1000))
    shutil.copytree(ws.candidates / cid, bad)
    k = bad / "kernel.py"
    text = k.read_text()
    assert old in text
    k.write_text(text.replace(old, new))
    return candidates.at(bad)


def test_generated_kernel_draws_the_stream_and_one_mask_per_tiling(x4):
    # catches a kernel whose mask is not the reference's or depends on the tile (validate's stream checks pass)
    from miner.check.validate import stream_checks
    from miner.core import candidate as candidates

    for cid in ("pf4693d7449_x4", "p010eaa2cbb_x4"):
        cand = candidates.load(x4, cid)
        assert cand.kernel_module.RNG == "philox4"
        checks = stream_checks(cand, DEVICE)
        assert len(checks) == 3 and all(c.ok for c in checks), [c.detail for c in checks]


def test_tiling_check_fails_when_the_looped_kernel_ignores_its_chunk(x4):
    # planted bug: every chunk of a looped row draws the first chunk's groups (the numbers depend on BLOCK)
    from miner.check.validate import check_tiling

    cand = _broken(x4, "pf4693d7449_x4", "(abase + chunk) // 4", "abase // 4")
    entry = {"inputs": [{"shape": [112], "dtype": "int64", "stride": None},
                        {"shape": [2, 3, 1000], "dtype": "bfloat16", "stride": None}], "scalars": [3, 0.5, 2.0]}
    c = check_tiling(cand, "planted", entry, DEVICE)
    assert c.ok is False and "differ under looped" in c.detail


def test_numerics_fail_when_the_grouped_draw_is_off_by_one_group(x4):
    # planted bug: the one-pass kernel's groups start one group late: the mask is no longer the reference's
    from miner.check.validate import check_numerics

    cand = _broken(x4, "p010eaa2cbb_x4", "rows * (n_cols // 4) + tl.arange", "rows * (n_cols // 4) + 1 + tl.arange")
    entry = {"inputs": [{"shape": [64], "dtype": "float32", "stride": None},
                        {"shape": [2, 4, 64], "dtype": "float32", "stride": None},
                        {"shape": [112], "dtype": "int64", "stride": None},
                        {"shape": [2, 4, 64], "dtype": "bfloat16", "stride": None}],
             "scalars": [4, 0.5, 2.0, 2, 1e-6]}
    c = check_numerics(cand, "planted", entry, None, DEVICE)
    assert c.ok is False and "output 0" in c.detail  # the mask


def test_inductor_stream_is_still_available():
    # catches --rng inductor no longer drawing Inductor's numbers (the committed p010eaa2cbb is that candidate)
    text = (REPO / "candidates/p010eaa2cbb/kernel.py").read_text()
    assert "uniform(v0, lin)" in text and "RAND4" not in text and "_philox" not in text


def test_tiling_check_fails_when_the_kernel_stores_its_mask_bits_out_of_order(x4):
    # planted bug: the kernel's bits path stores element 8 i + k in bit 7 - k (its bool mask is right): only the
    # bits half of the check sees it, in every tiling
    from miner.check.validate import check_tiling
    from miner.core import candidate as candidates

    helper = (REPO / "miner/runtime/jit.py").read_text()
    body = helper[helper.index("@triton.jit\ndef store_mask("):]
    assert "k = tl.arange(0, 8)[None, None, :]" in body
    planted = body.replace("k = tl.arange(0, 8)[None, None, :]", "k = 7 - tl.arange(0, 8)[None, None, :]")
    cand = _broken(x4, "pf4693d7449_x4", "store_mask, ", "")
    k = cand.path / "kernel.py"
    text = k.read_text()
    k.write_text(text.replace("\n\ndef reference(", "\n\n" + planted + "\n\ndef reference(", 1))
    entry = {"inputs": [{"shape": [112], "dtype": "int64", "stride": None},
                        {"shape": [2, 3, 1024], "dtype": "bfloat16", "stride": None}], "scalars": [3, 0.5, 2.0]}
    c = check_tiling(cand, "planted", entry, DEVICE)
    assert c.ok is False and "stored as bits" in c.detail, c.detail
    good = check_tiling(candidates.at(x4.candidates / "pf4693d7449_x4"), "unbroken", entry, DEVICE)
    assert good.ok and "stored as bits alike (output 0)" in good.detail, good.detail
