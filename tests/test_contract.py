"""The generated kernel's shape contract (miner.rules.contract.shape_contract), on its own.

What a row kernel can compute is checked before every launch (``ContractError``); mining's
``kernel`` rule and the compile-time match check apply the same function to metas.
"""

from __future__ import annotations

import pytest
import torch

from miner.rules import contract
from miner.runtime import fusions, launch
from tests.safety_harness import FUSIONS


def test_row_shape_broadcasts_and_gives_scalars_one_row():
    assert contract.row_shape([(2, 1, 8), (5, 8), (8,)]) == (2, 5, 8)
    assert contract.row_shape([(), ()]) == (1,)
    assert contract.row_shape([(2, 3), (4, 3)]) is None


def test_contract_accepts_full_per_row_per_column_and_scalar_inputs():
    ins = [((2, 5, 8), "float32"), ((2, 5, 1), "bfloat16"), ((8,), "float16"), ((), "float32"), ((2, 5, 8), "bool")]
    assert contract.shape_contract(ins, [("sum", (2, 5, 8), [-1])],
                                 [("o", (2, 5, 8), "vec"), ("r", (2, 5, 1), "row"), ("r2", (2, 5), "row")]) == []


@pytest.mark.parametrize("inputs, reductions, outputs, clause", [
    ([((4, 8), "float64")], [], [], "in0 is float64"),
    ([((4, 8), "int64")], [], [], "in0 is int64"),
    ([((4, 8), "float32"), ((3, 8), "float32")], [], [], "do not broadcast"),
    ([(("s0", 8), "float32"), (("s1", 8), "float32")], [], [], "do not broadcast"),  # unproven equal
    ([(("s0", 8), "float32"), ((1, 8), "float32")], [("sum", (1, 8), [-1])], [("o", ("s0",), "vec")],
     "does not fill the rows"),
    ([((4, 8), "float32")], [("sum", (4, 8), [0])], [], "reduces the last dim only"),
    ([((4, 8), "float32")], [("sum", (4, 8), None)], [], "reduces the last dim only"),
    # a size-1 last dim reduced, then broadcast to wider rows: the kernel would reduce 16 copies
    ([((4, 1), "float32"), ((4, 16), "bool")], [("sum", (4, 1), [-1])], [], "16 broadcast copies"),
    ([((4, 1), "float32"), ((16,), "float32")], [], [("o", (4, 1), "vec")], "does not fill the rows"),
    # rows of one element (found on CUDA: a layer norm over one element, its gradient ill-conditioned)
    ([((4, 1), "float32"), ((1,), "float32")], [("mean", (4, 1), [-1])], [("o", (4, 1), "vec")], "one element per row"),
    ([((4, 8), "float32")], [], [("r", (1, 1), "row")], "per row"),
    ([((4, 8), "float32")], [], [("r", (8,), "row")], "per row"),
])
def test_contract_names_each_violation(inputs, reductions, outputs, clause):
    reasons = contract.shape_contract(inputs, reductions, outputs)
    assert any(clause in r for r in reasons), reasons


def test_contract_holds_for_symbolic_sizes():
    """Sizes as ``miner scan`` writes SymInts: equal symbols are equal, a symbol is never 1."""
    assert contract.shape_contract([(("s0", "s1"), "float32"), (("s1",), "float32")],
                                 [("amax", ("s0", "s1"), [-1])], [("o", ("s0", "s1"), "vec"), ("r", ("s0", 1), "row")]) == []
    assert contract.shape_contract([(("s0", 1), "float32"), (("s0", "s1"), "bool")], [("sum", ("s0", 1), [-1])], [])


def test_reduction_over_size1_dims_besides_the_last_is_the_last_dim():
    assert contract.shape_contract([((4, 1, 8), "float32")], [("sum", (4, 1, 8), [1, 2])], []) == []


def _kernel(name):
    return fusions.load(FUSIONS, name)._kernel()


def test_launch_raises_a_clear_error_on_a_size1_reduction_broadcast_wider():
    k = _kernel("softmax_like")
    x0, x1, x2 = torch.zeros(2, 4, 16, dtype=torch.bool), torch.zeros(2, 4, 16), torch.randn(2, 4, 1)
    with pytest.raises(launch.ContractError, match="broadcast copies"):
        k.launch(x0, x1, x2)


def test_launch_raises_on_outputs_that_do_not_fill_the_rows():
    k = _kernel("add_rms_norm")
    with pytest.raises(launch.ContractError, match="does not fill the rows"):
        k.launch(torch.randn(24), torch.randn(2, 5, 1), torch.randn(2, 5, 1), 2.0, 1e-6)


def test_launch_raises_on_dtypes_the_kernel_does_not_load():
    with pytest.raises(launch.ContractError, match="float64"):
        _kernel("log_softmax").launch(torch.randn(3, 8, dtype=torch.float64))


def test_launch_accepts_strided_expanded_and_offset_inputs():
    """Strides are no precondition: layout reads any of them in place."""
    k, m = _kernel("log_softmax"), fusions.load(FUSIONS, "log_softmax")
    base = torch.randn(6, 20)
    for x in (base.t()[:, :6], base[:, 3:11], torch.randn(1, 8).expand(5, 8)):
        torch.testing.assert_close(k.launch(x)[0], m.pattern(x)[0], rtol=1e-5, atol=1e-5)


def test_traced_contract_agrees_with_mining_kernel_rule_on_the_same_shapes():
    """One function behind both: the traced pattern and the record-based rule give the same verdict."""
    from tests.test_safety import _verdict  # mining's path: make_fx graph -> records -> safety.check

    m = fusions.load(FUSIONS, "rms_norm")
    k = m._kernel()
    for w, x in (((24,), (2, 5, 1)), ((8,), (2, 5, 8))):
        traced = launch.traced_contract(k.reference, (w, x), ("float32", "float32"), (2.0, 1e-6), k.OUTPUT_KINDS)
        v, _ = _verdict(lambda w_, x_: m.pattern(w_, x_, 2.0, 1e-6), torch.randn(w), torch.randn(x))
        kernel_reasons = [r for r in v.reasons if r.startswith("kernel:")]
        assert bool(traced) == bool(kernel_reasons), (traced, v.reasons)


def test_no_tuning_inside_a_cuda_graph_capture(monkeypatch):
    calls = []
    monkeypatch.setattr(launch, "interpreting", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    key = ("contract-test", "one_pass", 4, 8)
    cfg = launch.pick(key, [(1, 8, 4), (2, 8, 4)], lambda c: calls.append(c), "cuda")
    assert cfg == (1, 8, 4) and calls == [] and key not in launch.TUNED  # tuned later, outside the capture


def test_one_op_name_never_serves_two_signatures():
    """Two pattern modules of one pattern id with other outputs must not share a custom op silently."""
    from miner.core.errors import MinerError
    from miner.runtime import rewrite

    def fake(x):
        return (x,)

    rewrite.define_op("miner::test_two_signatures", 1, 0, 1, impl=fake, fake=fake)
    assert rewrite.define_op("miner::test_two_signatures", 1, 0, 1, impl=fake, fake=fake) is not None
    with pytest.raises(MinerError, match="already defined with 1 output"):
        rewrite.define_op("miner::test_two_signatures", 1, 0, 2, impl=fake, fake=fake)
