"""Op categories over every op found in the committed zoo captures, and the rules behind them."""

from pathlib import Path

import pytest
import torch

from miner.core.ops import CATEGORIES, categorize, categorize_name, resolve_target, target_name
from miner.core.workspace import Workspace

REPO = Path(__file__).resolve().parents[1]


def zoo_targets() -> dict[str, str]:
    """Every call_function target in the committed captures, with the category stored at capture time."""
    graphs = Workspace(REPO).load_graphs()
    return {n.target: n.category for g in graphs for n in g.nodes if n.op == "call_function"}


def test_every_zoo_op_has_a_category_that_agrees_with_torch():
    targets = zoo_targets()
    assert len(targets) > 40, "the committed captures should cover the tiny zoo"
    for name, stored in sorted(targets.items()):
        cat = categorize_name(name)
        assert cat == stored, f"{name}: {cat} from its name, {stored} from the live op at capture"
        op = resolve_target(name)
        if name.startswith("operator."):
            assert cat == "other", name
            continue
        assert isinstance(op, torch._ops.OpOverload), f"{name} no longer resolves to an op"
        assert target_name(op) == name  # the string round-trips to the same op
        if op._schema.is_mutable:
            assert cat in ("mutation", "random"), name
        elif cat == "pointwise":
            assert torch.Tag.pointwise in op.tags and not op.is_view, name
        elif cat == "reduction":
            assert torch.Tag.reduction in op.tags, name
        elif cat == "view":
            assert op.is_view, name


def test_the_blocks_we_mine_are_categorized():
    expected = {
        "aten.exp.default": "pointwise", "aten.div.Tensor": "pointwise", "aten.rsqrt.default": "pointwise",
        "prims.convert_element_type.default": "pointwise", "aten.amax.default": "reduction",
        "aten.sum.dim_IntList": "reduction", "aten.var_mean.correction": "reduction",
        "aten.mean.dim": "reduction", "aten.view.default": "view", "aten.permute.default": "view",
        "aten.mm.default": "matmul", "aten.addmm.default": "matmul", "aten.bmm.default": "matmul",
        "prims.inductor_random.default": "random", "aten.native_dropout.default": "random",
        "aten.copy_.default": "mutation", "aten.add_.Tensor": "mutation", "aten.embedding.default": "other",
        "operator.getitem": "other",
    }
    for name, cat in expected.items():
        assert categorize_name(name) == cat, name


@pytest.mark.parametrize("name", ["aten.nosuchop.default", "nonsense", "operator.nosuch"])
def test_unknown_targets_are_other(name):
    assert categorize_name(name) == "other"
    assert categorize(None) == "other"
