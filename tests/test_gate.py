"""The measured-wins gate: a promoted fusion fires on CUDA only where its GPU run says it wins."""

from types import SimpleNamespace

import pytest
import torch
from torch._subclasses import FakeTensorMode

from miner.runtime.rewrite import decide, match_inputs_ok, signature_of, wins_gate

MASK, F32, BF16 = "bool", "float32", "bfloat16"


def measured(*rows):
    """A wins.json payload: rows of (shapes, dtypes, speedup over Inductor)."""
    wins = {"wins": [], "loses": []}
    for shapes, dtypes, speedup in rows:
        item = {"inputs": [{"shape": list(s), "dtype": d, "stride": None} for s, d in zip(shapes, dtypes)],
                "speedup_vs_inductor": speedup}
        wins["wins" if speedup >= 1.0 else "loses"].append(item)
    return wins


def sig(shape, dtypes):
    return tuple((tuple(shape), d) for d in dtypes)


BIG, SMALL = (16, 12, 512, 512), (2, 4, 64, 64)
WINS = measured(([BIG] * 3, (MASK, BF16, BF16), 1.01),
                ([SMALL] * 3, (MASK, BF16, BF16), 0.80),
                ([BIG] * 3, (MASK, F32, F32), 0.95))


def test_exact_measured_win_fires():
    fire, reason = decide(sig(BIG, (MASK, BF16, BF16)), WINS)
    assert fire and "measured on these shapes: 1.01x" in reason


def test_exact_measured_loss_declines():
    assert decide(sig(SMALL, (MASK, BF16, BF16)), WINS) == (False, "measured on these shapes: 0.80x Inductor")
    assert not decide(sig(BIG, (MASK, F32, F32)), WINS)[0]


def test_unmeasured_shapes_follow_the_nearest_row_with_the_same_dtypes():
    near_big = sig((16, 12, 384, 512), (MASK, BF16, BF16))
    fire, reason = decide(near_big, WINS)
    assert fire and reason.startswith("nearest measured bool[16,12,512,512]")
    near_small = sig((4, 4, 64, 64), (MASK, BF16, BF16))
    fire, reason = decide(near_small, WINS)
    assert not fire and "bool[2,4,64,64]" in reason and "0.80x" in reason


def test_row_length_counts_not_just_size():
    rows = measured(([(64, 512)], (F32,), 1.1), ([(512, 64)], (F32,), 0.9))  # same element count
    assert decide(sig((32, 1024), (F32,)), rows)[0]
    assert not decide(sig((1024, 32), (F32,)), rows)[0]


def test_a_tie_goes_to_the_slower_row():
    tie = measured(([(4, 64)], (F32,), 1.2), ([(16, 64)], (F32,), 0.9))
    assert decide(sig((8, 64), (F32,)), tie) == (False, "nearest measured float32[16,64]: 0.90x Inductor")


def test_other_dtypes_do_not_fire():
    assert decide(sig(BIG, (MASK, "float16", "float16")), WINS) == (False, "no measurement for these dtypes")


def test_unmeasured_fires():
    for wins in (None, {"wins": [], "loses": []}):
        assert decide(sig(BIG, (MASK, F32, F32)), wins) == (True, "unmeasured: fires wherever the extra check allows")


def test_exact_rows_with_other_strides_vote_by_median():
    rows = measured(([(8, 64)], (F32,), 1.3), ([(8, 64)], (F32,), 0.9), ([(8, 64)], (F32,), 1.1))
    assert decide(sig((8, 64), (F32,)), rows)[0]


def match_of(*vals):
    """What ``extra_check`` receives: ``match.kwargs["x<k>"]`` are FX nodes with ``meta["val"]``."""
    return SimpleNamespace(kwargs={f"x{k}": SimpleNamespace(meta={"val": v}) for k, v in enumerate(vals)})


def fake(shape, dtype, device):
    with FakeTensorMode(allow_non_fake_inputs=True):
        return torch.empty(shape, dtype=dtype, device=device)


def test_gate_reads_the_match_and_applies_on_cuda():
    small = match_of(*(fake(SMALL, d, "cuda") for d in (torch.bool, torch.bfloat16, torch.bfloat16)))
    big = match_of(*(fake(BIG, d, "cuda") for d in (torch.bool, torch.bfloat16, torch.bfloat16)))
    assert signature_of(v.meta["val"] for v in small.kwargs.values()) == sig(SMALL, (MASK, BF16, BF16))
    assert not wins_gate(small, WINS, 3)
    assert wins_gate(big, WINS, 3)
    assert wins_gate(small, None, 3)  # unmeasured


def test_gate_passes_on_cpu_where_the_timings_do_not_apply():
    cpu = match_of(*(fake(SMALL, d, "cpu") for d in (torch.bool, torch.bfloat16, torch.bfloat16)))
    assert wins_gate(cpu, WINS, 3)
    assert wins_gate(cpu, measured(([SMALL] * 3, (MASK, F32, F32), 0.5)), 3)


def test_gate_declines_a_match_without_tensor_metas():
    assert not wins_gate(SimpleNamespace(kwargs={"x0": SimpleNamespace(meta={})}), None, 1)
    assert not match_inputs_ok(SimpleNamespace(kwargs={}), 1, ("float",), None)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_kinds_check_still_sees_fake_inputs(device):
    m = match_of(fake((4, 8), torch.float32, device))
    assert match_inputs_ok(m, 1, ("float",), 2)


def test_gate_decisions_are_counted_with_their_reason():
    from miner.runtime import rewrite

    small = match_of(*(fake(SMALL, d, "cuda") for d in (torch.bool, torch.bfloat16, torch.bfloat16)))
    before = dict(rewrite.GATE_DECISIONS)
    wins_gate(small, {**WINS, "name": "softmax_like"}, 3)
    new = {k: n - before.get(k, 0) for k, n in rewrite.GATE_DECISIONS.items() if n != before.get(k, 0)}
    (key,) = new
    assert key.startswith("softmax_like decline ") and new[key] == 1 and ": " in key
