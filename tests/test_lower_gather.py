"""lower/emit: t5's attention-softmax families, one at a time (issue 29).

An ``aten.embedding`` gather of a small table by an int64 index, read through the views its result
takes (permute/unsqueeze: the table's column lands on the heads dim); views of computed values;
``full`` scalars; ``any`` over the row; ``prims.prepare_softmax_online``; intermediate bf16 casts
left out as Inductor computes them. Kernels run in the Triton interpreter (conftest), small shapes.
"""

from __future__ import annotations

import pytest
import torch

import test_codegen_fixtures as F
from miner.check import cases
from miner.core import candidate as candidates
from miner.core.workspace import Workspace
from miner.generate import emit, lower
from miner.generate.generate import Generated, generate_one, spec_from_pattern

P, R, O, V = "pointwise", "reduction", "other", "view"
FULL_KW = {"dtype": {"dtype": "float32"}, "device": {"device_of": 0}, "layout": {"enum": "torch.strided"},
           "pin_memory": False}


def _bias_nodes(scores: int = 0, table: int = 1, index: int = 2):
    """scores + table[index].permute(2, 0, 1)[None]: t5's position bias (nodes 0-3, result node 3)."""
    return [("aten.embedding.default", O, [{"input": table}, {"input": index}], None),
            ("aten.permute.default", V, [{"node": 0}, [2, 0, 1]], None),
            ("aten.unsqueeze.default", V, [{"node": 1}, 0], None),
            ("aten.add.Tensor", P, [{"input": scores}, {"node": 2}], None)]


def _online_softmax_nodes(x: int):
    """prepare_softmax_online(v_x) -> exp(v_x - max) / sum (nodes x+1 .. x+6, result x+6)."""
    return [("prims.prepare_softmax_online.default", O, [{"node": x}, -1], None),
            ("operator.getitem", O, [{"node": x + 1}, 0], None),
            ("aten.sub.Tensor", P, [{"node": x}, {"node": x + 2}], None),
            ("aten.exp.default", P, [{"node": x + 3}], None),
            ("operator.getitem", O, [{"node": x + 1}, 1], None),
            ("aten.div.Tensor", P, [{"node": x + 4}, {"node": x + 5}], None)]


def biased_softmax(b=2, h=3, s=8, t=32):
    """softmax(scores + bias[bucket]) over the last dim: the gather, its views, prepare_softmax_online."""
    nodes = _bias_nodes() + _online_softmax_nodes(3)
    return F.make(nodes, 3, [9], [(b, h, s, s), (t, h), (s, s)], input_dtypes=["float32", "float32", "int64"])


def _generate(tmp_path, pattern):
    ws = Workspace(tmp_path)
    r = generate_one(pattern, ws, "test")
    assert isinstance(r, Generated), r
    return candidates.load(ws, r.id)


def _bias_inputs(b, h, s, t, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, s, s, generator=g), torch.randn(t, h, generator=g),
            torch.randint(0, t, (s, s), generator=g))


# --------------------------------------------------------------------------- (a) int64 inputs as indices

def test_an_int64_index_lowers_as_an_index_load_and_the_table_is_never_loaded():
    prog = lower.lower(spec_from_pattern(biased_softmax()))
    assert prog.values["a2"].index and prog.values["a2"].kind == "vec"
    assert prog.values["a1"].kind == "table"
    assert prog.gathers == (lower.Gather(1, 2, prog.gathers[0].views),)
    code = emit.kernel_source(prog)
    assert "a2 = tl.load(x2_row + cols * x2_sc, mask=mask, other=0)\n" in code  # no float cast of an index
    assert "a1 = " not in code


@pytest.mark.parametrize("nodes, reason", [
    ([("aten.add.Tensor", P, [{"input": 0}, {"input": 1}], None)], "int64"),  # an index read as a value
    (_bias_nodes() + [("aten.mul.Tensor", P, [{"node": 3}, {"input": 2}], None)], "also read per element"),
    ([("aten.embedding.default", O, [{"input": 1}, {"input": 1}], None)], "both an embedding's table and its index"),
])
def test_int64_inputs_other_than_indices_are_refused(nodes, reason):
    p = F.make(nodes, 3, [len(nodes) - 1], [(2, 3, 8, 8), (8, 8), (8, 8)],
               input_dtypes=["float32", "int64", "int64"])
    with pytest.raises(lower.Unsupported, match=reason):
        lower.lower(spec_from_pattern(p))


# --------------------------------------------------------------------------- (b) + (c) the gather through its views

@pytest.mark.parametrize("shape, variant", [((2, 3, 8, 32), None), ((2, 3, 7, 7), None), ((1, 3, 5, 5), "looped")])
def test_gather_through_permute_and_unsqueeze_equals_torch(tmp_path, shape, variant):
    b, h, s, t = shape
    cand = _generate(tmp_path, biased_softmax(b, h, s, t))
    x, w, idx = _bias_inputs(b, h, s, t)
    (out,) = cand.kernel_module.launch(x, w, idx, variant=variant)
    bias = w.double()[idx].permute(2, 0, 1)[None]  # [1, H, S, S]: element (b, h, i, j) reads w[idx[i, j], h]
    ref = torch.softmax(x.double() + bias, dim=-1)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6)


def test_the_gather_views_put_the_table_column_on_the_heads_dim(tmp_path):
    cand = _generate(tmp_path, biased_softmax(2, 3, 8, 32))
    x, w, idx = _bias_inputs(2, 3, 8, 32)
    xs, strides = cand.kernel_module._gather_views([x, w, idx])
    assert tuple(xs[1].shape) == (1, 3, 8, 8) and xs[1].stride()[1:] == (1, 0, 0)  # w[0, h] at every (i, j)
    assert tuple(xs[2].shape) == (1, 3, 8, 8) and xs[2].stride()[1:] == (0, 8, 1)  # idx[i, j] for every head
    assert strides == (3,) and xs[0] is x
    meta = candidates.load(Workspace(tmp_path), cand.id).meta
    assert meta["observed"][0]["gathers"] == [{"table": 1, "index": 2, "index_dims": [-2, -1], "column_dim": -3}]


def test_a_view_of_a_computed_value_is_refused():
    nodes = [("aten.exp.default", P, [{"input": 0}], None), ("aten.permute.default", V, [{"node": 0}, [1, 0]], None)]
    with pytest.raises(lower.Unsupported, match="of a computed value"):
        lower.lower(spec_from_pattern(F.make(nodes, 1, [1], [(4, 4)])))


def test_an_embedding_result_read_by_two_ops_is_refused():
    nodes = _bias_nodes() + [("aten.permute.default", V, [{"node": 0}, [2, 1, 0]], None)]
    p = F.make(nodes, 3, [3, 4], [(2, 3, 8, 8), (32, 3), (8, 8)], input_dtypes=["float32", "float32", "int64"])
    with pytest.raises(lower.Unsupported, match="one view chain"):
        lower.lower(spec_from_pattern(p))


def test_an_expand_of_a_computed_value_is_the_value():
    nodes = [("aten.exp.default", P, [{"input": 0}], None),
             ("aten.expand.default", V, [{"node": 0}, [3, -1, -1]], None),
             ("aten.add.Tensor", P, [{"node": 1}, {"input": 1}], None)]
    prog = lower.lower(spec_from_pattern(F.make(nodes, 2, [2], [(1, 4, 8), (3, 4, 8)])))
    assert prog.values["v2"].expr == "(v0 + a1)"


# --------------------------------------------------------------------------- (d) + (e) + (f): t5's safe softmax

def safe_softmax(b=2, h=3, s=8, t=32):
    """where(mask, bias, min) + scores, then _safe_softmax: rows that are all -inf give 0 (any over the row)."""
    nodes = [("aten.embedding.default", O, [{"input": 2}, {"input": 3}], None),        # 0
             ("aten.permute.default", V, [{"node": 0}, [2, 0, 1]], None),               # 1
             ("aten.unsqueeze.default", V, [{"node": 1}, 0], None),                     # 2
             ("aten.full.default", O, [[], {"const": 0}], FULL_KW),                     # 3
             ("aten.where.self", P, [{"input": 1}, {"node": 2}, {"node": 3}], None),    # 4
             ("aten.add.Tensor", P, [{"input": 0}, {"node": 4}], None),                 # 5
             ("aten.eq.Scalar", P, [{"node": 5}, {"float": "-inf"}], None),             # 6
             ("aten.logical_not.default", P, [{"node": 6}], None),                      # 7
             ("aten.any.dim", R, [{"node": 7}, -1, True], None),                        # 8
             ("aten.logical_not.default", P, [{"node": 8}], None),                      # 9
             ("aten.full.default", O, [{"shape_of": 0}, 0.0], FULL_KW)]                  # 10
    nodes += [(t_, c, [_shift(a, 5, 11) for a in args], kw) for t_, c, args, kw in _online_softmax_nodes(5)]
    nodes += [("aten.where.self", P, [{"node": 9}, {"node": 10}, {"node": 16}], None)]  # 17
    return F.make(nodes, 4, [17], [(b, h, s, s), (1, 1, s, s), (t, h), (s, s)], n_consts=1, scalars=(float("-inf"),),
                  input_dtypes=["float32", "bool", "float32", "int64"])


def _shift(a, x, to):
    """Node refs past ``x`` in ``_online_softmax_nodes(x)`` moved to start at ``to``."""
    if isinstance(a, dict) and "node" in a and a["node"] > x:
        return {"node": a["node"] - x - 1 + to}
    return a


@pytest.mark.parametrize("variant", [None, "looped"])
def test_safe_softmax_with_gathered_bias_and_fully_masked_rows(tmp_path, variant):
    b, h, s, t = 2, 3, 6, 16
    cand = _generate(tmp_path, safe_softmax(b, h, s, t))
    x, w, idx = _bias_inputs(b, h, s, t, seed=1)
    mask = torch.rand(1, 1, s, s, generator=torch.Generator().manual_seed(2)) < 0.6
    mask[..., 0, :] = False  # row 0 of every head: all -inf, the safe softmax gives 0 there
    (out,) = cand.kernel_module.launch(x, mask, w, idx, float("-inf"), variant=variant)
    z = x.double() + torch.where(mask, w.double()[idx].permute(2, 0, 1)[None], float("-inf"))
    ref = torch.nan_to_num(torch.softmax(z, dim=-1), nan=0.0)
    assert (out[..., 0, :] == 0).all()
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6)


def test_full_is_a_scalar_and_prepare_softmax_online_is_one_pass():
    prog = lower.lower(spec_from_pattern(safe_softmax()))
    assert prog.values["v3"].kind == "const" and prog.values["v4"].expr == "tl.where(a1, v0, c0)"  # v0: the viewed gather
    assert prog.values["v17"].expr == "tl.where(v9, 0.0, v16)"
    assert prog.levels == 1 and prog.online_softmax  # any, max and the online sum: one pass over the row
    assert prog.values["v11_sum"].online_max == "v11_max"


# --------------------------------------------------------------------------- the reference and the cases

def test_intermediate_low_precision_casts_are_elided_outputs_kept():
    nodes = [("prims.convert_element_type.default", P, [{"input": 0}, {"dtype": "bfloat16"}], None),
             ("aten.add.Tensor", P, [{"node": 0}, {"input": 1}], None),
             ("prims.convert_element_type.default", P, [{"node": 1}, {"dtype": "bfloat16"}], None)]
    prog = lower.lower(spec_from_pattern(F.make(nodes, 2, [1, 2], [(4, 8), (4, 8)])))
    assert emit.elided_casts(prog) == ["v0"]


def test_shrunk_cases_keep_the_gather_consistent(tmp_path):
    cand = _generate(tmp_path, safe_softmax(4, 6, 64, 32))
    entry = candidates.load(Workspace(tmp_path), cand.id).meta["observed"][0]
    small = cases.shrink(entry, 16)
    shapes = [tuple(i["shape"]) for i in small["inputs"]]
    assert shapes[2][0] == 32  # the table keeps its rows ...
    assert shapes[2][1] == shapes[0][1] and shapes[3] == shapes[0][2:]  # ... its columns follow the heads
    xs = [torch.empty(s, dtype=getattr(torch, i["dtype"]), device="meta") for s, i in zip(shapes, small["inputs"])]
    assert cand.pattern_module.pattern(*xs, float("-inf"))[0].shape == shapes[0]


@pytest.mark.parametrize("n_cols", [5, 7, 9])
def test_looped_rows_shorter_than_the_alignment(tmp_path, n_cols):
    """Rows start at 16-aligned offsets minus a lead up to 15: a chunk narrower than 16 let the tail
    chunk read the previous row's last columns (found here: softmax of 5-wide rows was 0.3 off)."""
    cand = _generate(tmp_path, F.softmax((6, n_cols)))
    x = torch.randn(6, n_cols, generator=torch.Generator().manual_seed(3))
    (out,) = cand.kernel_module.launch(x, variant="looped")
    torch.testing.assert_close(out.double(), torch.softmax(x.double(), -1), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="looped BLOCK 8 < 16"):
        cand.kernel_module.launch(x + 1, variant="looped", config=(1, 8, 4))


@pytest.mark.parametrize("cid", ["p4a7fd15d60_x4", "p9836c8c870_x4"])
def test_committed_gather_candidates_register_their_pattern(cid):
    """The initial trace runs the pattern on EXAMPLE_INPUTS: the table and index must fit the views
    (the table's columns on the heads dim) and the index must be a valid row (zeros, not garbage)."""
    from pathlib import Path

    from torch._inductor.pattern_matcher import PatternMatcherPass

    cand = candidates.at(Path(__file__).resolve().parents[1] / "candidates" / cid)
    cand.pattern_module.register(PatternMatcherPass())
    shapes = dict(enumerate(cand.pattern_module.EXAMPLE_INPUTS))
    assert shapes[len(shapes) - 2][0][1] == 2 and shapes[len(shapes) - 1][0] == [2, 8]
