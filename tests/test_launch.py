"""miner.runtime.launch: row layout, the reduction-free re-cut, tile configs and per-shape tuning."""

from __future__ import annotations

import pytest
import torch

from miner.runtime import launch


def test_flat_rows_only_for_contiguous_full_size_inputs():
    x = torch.randn(2, 5, 3072)
    # 30720 = 15 * 2**11: 2048 is the largest power of two up to 4096 that divides it
    assert launch.flat_rows(x.shape, [x, torch.randn(2, 5, 3072)], x.numel()) == (15, 2048)
    assert launch.flat_rows((4, 4096), [torch.randn(4, 4096)], 4 * 4096) == (4, 4096)  # never more than 4096
    rows, b = launch.flat_rows(x.shape, [x], x.numel())
    assert rows * b == x.numel() and b & (b - 1) == 0 and x.numel() % b == 0
    assert launch.flat_rows(x.shape, [x, torch.randn(3072)], x.numel()) is None  # a broadcast input
    assert launch.flat_rows(x.shape, [x.transpose(0, 1).contiguous().transpose(0, 1)], x.numel()) is None
    assert launch.flat_rows((3, 7), [torch.randn(3, 7)], 21) is None  # no power of two >= 256 divides


def test_layout_coalesces_leading_dims_and_zero_strides_broadcasts():
    x, w = torch.randn(2, 3, 4, 8), torch.randn(8)
    (d1, d2), strides, ex = launch.layout(x.shape, [x, w])
    assert (d1, d2) == (1, 24)  # 2*3*4 rows coalesced into one dim
    assert strides[:4] == [0, 0, 8, 1] and strides[4:] == [0, 0, 0, 1]


@pytest.mark.parametrize("n_rows, n_cols", [(8192, 768), (8192, 2048), (1, 37), (24576, 512)])
def test_one_pass_configs_hold_whole_rows_heuristic_first(n_rows, n_cols):
    cfgs = launch.configs(n_rows, n_cols, "one_pass")
    rows0, block0, warps0 = cfgs[0]
    assert block0 >= n_cols  # whole rows, always
    assert rows0 * block0 <= 4096 or rows0 == 1  # the heuristic tile; one row may be longer
    assert all(b == block0 for _, b, _ in cfgs) and len(set(cfgs)) == len(cfgs)
    assert all(r * b <= 16384 for r, b, _ in cfgs[1:])


def test_looped_configs_are_one_row_per_program():
    cfgs = launch.configs(8192, 50257, "looped")
    assert cfgs[0] == (1, launch.LOOP_BLOCK, 8) and all(r == 1 for r, _, _ in cfgs) and len(cfgs) > 1


def test_pick_times_each_config_once_per_key(monkeypatch):
    import triton.testing

    launched = []
    times = {(1, 1024, 4): 3.0, (2, 1024, 8): 1.0, (4, 1024, 8): 2.0}
    monkeypatch.setattr(launch, "interpreting", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, warmup, rep: (fn(), times[launched[-1]])[1])
    launch.TUNED.pop(("k",), None)
    best = launch.pick(("k",), list(times), launched.append, "cuda")
    assert best == (2, 1024, 8) and launch.TUNED[("k",)] == best
    n = len(launched)
    assert launch.pick(("k",), list(times), launched.append, "cuda") == best and len(launched) == n  # cached
    assert launch.pick(("other",), list(times), launched.append, "cpu") == (1, 1024, 4)  # no timing off GPU
    launch.TUNED.pop(("k",), None)


def test_a_config_the_compiler_refuses_is_skipped(monkeypatch):
    import triton.testing

    monkeypatch.setattr(launch, "interpreting", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, warmup, rep: (fn(), 1.0)[1])

    def run(cfg):
        if cfg[2] == 16:
            raise RuntimeError("out of resources: shared memory")

    assert launch.pick(("refused",), [(1, 8192, 16), (1, 4096, 8)], run, "cuda") == (1, 4096, 8)
    launch.TUNED.pop(("refused",), None)


def _layer_norm_kernel():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "fusions" / "layer_norm" / "kernel.py"
    spec = importlib.util.spec_from_file_location("_plan_test_layer_norm_kernel", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("case", ["contiguous", "strided-copied"])
def test_a_repeated_call_reuses_its_plan_and_computes_the_same(case, monkeypatch):
    """The first call of a (shapes, strides, dtypes) checks the contract, lays out and picks the
    tile; later calls only allocate and launch, and give what a first call gives."""
    k = _layer_norm_kernel()
    if case == "contiguous":
        xs = (torch.randn(3, 5, 40), torch.randn(40), torch.randn(40))
    else:  # four leading dims that do not coalesce: the rows are copied contiguous, on every call
        xs = (torch.randn(5, 4, 3, 2, 40).permute(3, 2, 1, 0, 4), torch.randn(40), torch.randn(40))
    monkeypatch.setattr(launch, "PLANS", {})
    first = k.launch(*xs, 1e-5)
    [plan] = launch.PLANS.values()
    assert (plan.copy_shape is not None) == (case != "contiguous")
    calls = []
    monkeypatch.setattr(launch, "check_contract", lambda *a, **kw: calls.append(a))  # not called again
    again = k.launch(*xs, 1e-5)
    assert not calls and len(launch.PLANS) == 1
    for a, b in zip(first, again):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    ref = k.reference(*(x.double() for x in xs), 1e-5)
    torch.testing.assert_close(again[3].double(), ref[3], rtol=1e-4, atol=1e-4)
    k.launch(xs[0].contiguous(), xs[1], xs[2], 1e-5)  # other strides: a plan of its own
    assert len(launch.PLANS) == 2 or case == "contiguous"
