"""generate: lowering patterns into row-kernel programs (lower), emitting them (emit), and the kernels' numerics.

Kernels run in the Triton interpreter (tests/conftest.py sets TRITON_INTERPRET=1), on small shapes.
"""

import pytest
import torch

import test_codegen_fixtures as F
from miner.generate import emit
from miner.generate import lower as codegen
from miner.core import candidate as candidates
from miner.core.tensors import make_inputs
from miner.generate.generate import Generated, generate_one, spec_from_pattern
from miner.core.workspace import Workspace


def lower(pattern):
    return codegen.lower(spec_from_pattern(pattern))


def test_softmax_lowers_to_one_level_with_an_online_sum():
    prog = lower(F.softmax())
    assert prog.online_softmax
    assert prog.levels == 1  # max and sum(exp(x - max)) in one pass over the row
    assert prog.output_kinds == ("vec",)


def test_layer_norm_needs_two_levels_and_returns_row_values():
    prog = lower(F.layer_norm())
    assert not prog.online_softmax
    assert prog.levels == 2  # mean, then the centred sum of squares
    assert prog.output_kinds == ("row", "row", "vec")  # mean, rstd (for backward), normalized output


def test_pointwise_chain_has_no_reduction_level():
    assert lower(F.gelu_erf()).levels == 0


@pytest.mark.parametrize("builder, reason", [
    (F.unsupported_cat, "unsupported op aten.cat.default"),
    (F.not_last_dim, "only the last dim is supported"),
])
def test_patterns_outside_the_class_say_why(builder, reason):
    with pytest.raises(codegen.Unsupported, match=reason):
        lower(builder())


def test_int_inputs_are_refused_with_their_dtype():
    p = F.make([("aten.neg.default", "pointwise", [{"input": 0}], None)], 1, [0], [(4, 8)], dtype="int64")
    with pytest.raises(codegen.Unsupported, match="int64"):
        lower(p)


def test_keepdim_false_reduction_feeding_pointwise_is_refused():
    p = F.make([
        ("aten.sum.dim_IntList", "reduction", [{"input": 0}, [-1]], None),
        ("aten.neg.default", "pointwise", [{"node": 0}], None),
    ], 1, [1], [(4, 8)])
    with pytest.raises(codegen.Unsupported, match="keepdim=False"):
        lower(p)


def test_reference_source_is_plain_aten():
    src = emit.reference_source(spec_from_pattern(F.softmax()))
    assert "torch.ops.aten.amax.default(x0, [-1], True)" in src
    assert src.rstrip().endswith("return (v4,)")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return Workspace(tmp_path_factory.mktemp("ws"))


@pytest.mark.parametrize("name", sorted(F.ALL))
@pytest.mark.parametrize("variant", ["one_pass", "looped"])
def test_generated_kernel_matches_float64_reference(workspace, name, variant):
    result = generate_one(F.ALL[name](), workspace, "test")
    assert isinstance(result, Generated)
    cand = candidates.load(workspace, result.id)
    observed = cand.meta["observed"][0]
    xs, cs = make_inputs(observed["inputs"]), [float(s) for s in observed["scalars"]]
    outs = cand.kernel_module.launch(*xs, *cs, variant=variant)
    ref = cand.pattern_module.pattern(*[x.double() if x.is_floating_point() else x for x in xs], *cs)
    expect = cand.pattern_module.pattern(*xs, *cs)
    assert len(outs) == len(ref)
    for o, r, e in zip(outs, ref, expect):
        assert o.shape == e.shape and o.dtype == e.dtype
        torch.testing.assert_close(o.double(), r, rtol=1e-5, atol=1e-5)


def test_online_softmax_survives_fully_masked_rows(workspace):
    # Rows of -inf: eager softmax gives NaN; the online rescaling must not turn that into 0 or inf
    # elsewhere, and finite rows next to them stay exact.
    cand = candidates.load(workspace, generate_one(F.softmax(), workspace, "test").id)
    x = torch.randn(4, 9000)
    x[1] = float("-inf")
    x[2, :8990] = float("-inf")
    (out,) = cand.kernel_module.launch(x)  # 9000 > ONE_PASS_MAX: looped kernel
    torch.testing.assert_close(out, torch.softmax(x, -1), equal_nan=True, rtol=1e-5, atol=1e-6)


def test_broadcast_and_strided_inputs(workspace):
    cand = candidates.load(workspace, generate_one(F.scaled_masked_softmax(), workspace, "test").id)
    x = torch.randn(3, 2, 5, 8).transpose(-1, -2)  # (3, 2, 8, 5), non-contiguous rows (col stride 8)
    mask = torch.randn(3, 1, 1, 5)
    (out,) = cand.kernel_module.launch(x, mask, 0.125)
    torch.testing.assert_close(out, torch.softmax(x * 0.125 + mask, -1), rtol=1e-5, atol=1e-6)


def test_pow_and_tanh_helpers_match_torch(workspace):
    cand = candidates.load(workspace, generate_one(F.gelu_tanh(), workspace, "test").id)
    x = torch.cat([torch.linspace(-6, 6, 101), torch.tensor([0.0, 1e-4, -1e-4, 0.05, -0.07])]).reshape(1, -1)
    cs = (0.5, 3.0, 0.044715, 0.7978845608028654, 1.0)
    (out,) = cand.kernel_module.launch(x, *cs)
    ref = cand.pattern_module.pattern(x.double(), *cs)[0]
    torch.testing.assert_close(out.double(), ref, rtol=2e-6, atol=5e-7)  # fp32 cancellation in 1 + tanh near -1


@pytest.mark.parametrize("name", ["log_softmax", "layer_norm", "rms_norm", "scaled_masked_softmax"])
def test_looped_kernel_on_rows_that_start_off_the_16_element_grid(workspace, name):
    # n_cols = 4101: row r starts at element 4101 * r, so every row has a different lead before
    # its 16-aligned start (head chunk, full chunks, tail chunk); inputs laid out like the rows
    # take the aligned loads, broadcast ones (weights, masks) their logical columns.
    cand = candidates.load(workspace, generate_one(F.ALL[name](), workspace, "test").id)
    observed = cand.meta["observed"][0]
    rank = len(max((i["shape"] for i in observed["inputs"]), key=len))
    torch.manual_seed(0)
    xs = []
    for spec in observed["inputs"]:
        shape = list(spec["shape"])
        if len(shape) == rank:  # 5 rows of 4101 (leading dims 5, 1, ...); a broadcast last dim stays 1
            shape = [5] + [1] * (rank - 2) + [4101 if shape[-1] != 1 else 1]
        else:  # a weight: one row
            shape = shape[:-1] + [4101]
        xs.append(torch.randn(shape) if spec["dtype"] != "bool" else torch.rand(shape) > 0.5)
    cs = list(observed.get("scalars", []))
    outs = cand.kernel_module.launch(*xs, *cs, variant="looped")
    ref = cand.pattern_module.pattern(*[x.double() if x.is_floating_point() else x for x in xs], *cs)
    for o, r in zip(outs, ref):
        torch.testing.assert_close(o.double(), r, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- emission (miner.generate.emit)

def _kernel_text(pattern):
    from miner.generate.emit import render_kernel_py

    return render_kernel_py(lower(pattern), "# head\n")


@pytest.mark.parametrize("builder, helpers", [
    (F.gelu_tanh, "from miner.runtime.jit import load_full, load_masked, pow_c, tanh"),  # x ** c1: a constexpr power
    (F.softmax, "from miner.runtime.jit import load_full, load_masked"),
])
def test_kernel_imports_only_the_jit_helpers_it_calls(builder, helpers):
    text = _kernel_text(builder())
    assert [ln for ln in text.splitlines() if ln.startswith("from miner.runtime.jit")] == [helpers]
    assert "def _tanh" not in text and "def _pow" not in text  # helpers are imported, never pasted


def test_looped_loads_are_one_helper_call_each_with_the_layout_flag():
    text = _kernel_text(F.softmax())
    assert "if X0_ALIGNED:" not in text
    assert "a0 = load_masked(x0_ptr, x0_row, x0_sc, abase, lead, cols, mask, X0_ALIGNED).to(tl.float32)" in text
    assert "a0 = load_full(x0_ptr, x0_row, x0_sc, abase, lead, cols, X0_ALIGNED).to(tl.float32)" in text


def test_each_line_computing_a_pattern_node_names_its_op():
    prog = lower(F.layer_norm())
    text = _kernel_text(F.layer_norm())
    for v in prog.values.values():
        if v.op and v.kind != "tuple":
            assert any(ln.strip().startswith(f"{v.name} = ") and ln.endswith(f"  # {v.op}")
                       for ln in text.splitlines()), v.name
    assert "  # aten.var_mean" in text and "  # aten.rsqrt" in text
