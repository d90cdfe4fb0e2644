"""Hand-written patterns (as ``miner mine`` writes them) for the generator's tests.

Each builder returns a ``miner.core.pattern.Pattern`` with one or more safe occurrences carrying
input metas, the way the mined patterns do. Ops and args follow what Inductor's post-grad graphs
contain (TORCH-NOTES.md, "How common blocks look in post-grad graphs").
"""

from __future__ import annotations

from miner.core.pattern import Occurrence, Pattern, PatternNode, Verdict, canonical_form, ops_summary, pattern_id
from miner.core.records import GraphKey
from miner.core.tensors import TensorSpec


def _contig(shape):
    st, acc = [], 1
    for s in reversed(shape):
        st.append(acc)
        acc *= s
    return tuple(reversed(st))


def make(nodes, n_inputs, outputs, input_shapes, dtype="float32", n_consts=0, scalars=(), model="bert",
         phase="forward", input_dtypes=None, extra_outputs=()):
    nodes = tuple(PatternNode(t, c, tuple(a), dict(kw or {})) for t, c, a, kw in nodes)
    dts = input_dtypes or [dtype] * n_inputs
    occ = Occurrence(
        graph=GraphKey(model, "tiny", "train" if phase != "inference" else "infer", phase),
        nodes=tuple(f"n{j}" for j in range(len(nodes))), inputs=tuple(f"i{k}" for k in range(n_inputs)),
        scalars=tuple(scalars), outputs=tuple(outputs),
        input_meta=tuple(TensorSpec(tuple(s), d, _contig(s)) for s, d in zip(input_shapes, dts)),
        phase=phase, verdict=Verdict(ok=True))
    pid = pattern_id(canonical_form(nodes, n_inputs, n_consts))
    return Pattern(id=pid, nodes=nodes, n_inputs=n_inputs, n_consts=n_consts, outputs=tuple(outputs),
                   extra_outputs=tuple(extra_outputs), ops=ops_summary(nodes), occurrences=(occ,))


P, R = "pointwise", "reduction"


def softmax(shape=(2, 4, 8, 8), dtype="float32"):
    """amax/sub/exp/sum/div (what Inductor's post-grad graph holds for a softmax)."""
    return make([
        ("aten.amax.default", R, [{"input": 0}, [-1], True], None),
        ("aten.sub.Tensor", P, [{"input": 0}, {"node": 0}], None),
        ("aten.exp.default", P, [{"node": 1}], None),
        ("aten.sum.dim_IntList", R, [{"node": 2}, [-1], True], None),
        ("aten.div.Tensor", P, [{"node": 2}, {"node": 3}], None),
    ], 1, [4], [shape], dtype)


def exp_softmax(shape=(6, 20)):
    """exp(x) / sum(exp(x)): the issue's chain, without the max."""
    return make([
        ("aten.exp.default", P, [{"input": 0}], None),
        ("aten.sum.dim_IntList", R, [{"node": 0}, [-1], True], None),
        ("aten.div.Tensor", P, [{"node": 0}, {"node": 1}], None),
    ], 1, [2], [shape])


def scaled_masked_softmax(shape=(2, 2, 4, 8), mask_shape=(2, 1, 1, 8)):
    """(x * c0 + mask) then softmax: bert's attention scores, a broadcast input and a scalar."""
    return make([
        ("aten.mul.Tensor", P, [{"input": 0}, {"const": 0}], None),
        ("aten.add.Tensor", P, [{"node": 0}, {"input": 1}], None),
        ("aten.amax.default", R, [{"node": 1}, [-1], True], None),
        ("aten.sub.Tensor", P, [{"node": 1}, {"node": 2}], None),
        ("aten.exp.default", P, [{"node": 3}], None),
        ("aten.sum.dim_IntList", R, [{"node": 4}, [-1], True], None),
        ("aten.div.Tensor", P, [{"node": 4}, {"node": 5}], None),
    ], 2, [6], [shape, mask_shape], n_consts=1, scalars=(0.125,))


def log_softmax(shape=(8, 24)):
    return make([
        ("aten.amax.default", R, [{"input": 0}, [1], True], None),
        ("aten.sub.Tensor", P, [{"input": 0}, {"node": 0}], None),
        ("aten.exp.default", P, [{"node": 1}], None),
        ("aten.sum.dim_IntList", R, [{"node": 2}, [1], True], None),
        ("aten.log.default", P, [{"node": 3}], None),
        ("aten.sub.Tensor", P, [{"node": 1}, {"node": 4}], None),
    ], 1, [5], [shape], extra_outputs=(0, 4))  # the row max and log-sum, as mining found them (see gelu_erf)


def layer_norm(shape=(2, 8, 32), dtype="float32"):
    """var_mean, getitem x2, sub, add(eps), rsqrt, mul, mul(weight), add(bias); mean/rstd also out."""
    h = shape[-1]
    return make([
        ("aten.var_mean.correction", R, [{"input": 0}, [2]], {"correction": 0, "keepdim": True}),
        ("operator.getitem", "view", [{"node": 0}, 0], None),
        ("operator.getitem", "view", [{"node": 0}, 1], None),
        ("aten.add.Tensor", P, [{"node": 1}, {"const": 0}], None),
        ("aten.rsqrt.default", P, [{"node": 3}], None),
        ("aten.sub.Tensor", P, [{"input": 0}, {"node": 2}], None),
        ("aten.mul.Tensor", P, [{"node": 5}, {"node": 4}], None),
        ("aten.mul.Tensor", P, [{"node": 6}, {"input": 1}], None),
        ("aten.add.Tensor", P, [{"node": 7}, {"input": 2}], None),
    ], 3, [8], [shape, (h,), (h,)], dtype, n_consts=1, scalars=(1e-12,), extra_outputs=(2, 4))


def rms_norm(shape=(2, 8, 32)):
    h = shape[-1]
    return make([
        ("aten.pow.Tensor_Scalar", P, [{"input": 0}, 2], None),
        ("aten.mean.dim", R, [{"node": 0}, [-1], True], None),
        ("aten.add.Tensor", P, [{"node": 1}, {"const": 0}], None),
        ("aten.rsqrt.default", P, [{"node": 2}], None),
        ("aten.mul.Tensor", P, [{"input": 0}, {"node": 3}], None),
        ("aten.mul.Tensor", P, [{"input": 1}, {"node": 4}], None),
    ], 2, [5], [shape, (h,)], n_consts=1, scalars=(1e-6,), model="llama")


def gelu_erf(shape=(4, 48)):
    """x * 0.5 * (1 + erf(x * 0.7071...))."""
    return make([
        ("aten.mul.Tensor", P, [{"input": 0}, {"const": 0}], None),
        ("aten.mul.Tensor", P, [{"input": 0}, {"const": 1}], None),
        ("aten.erf.default", P, [{"node": 1}], None),
        ("aten.add.Tensor", P, [{"node": 2}, {"const": 2}], None),
        ("aten.mul.Tensor", P, [{"node": 0}, {"node": 3}], None),
    ], 1, [4], [shape], n_consts=3, scalars=(0.5, 0.7071067811865476, 1.0), extra_outputs=(3,))
    # extra output 3 (the add, saved for backward) as mining found it in the zoo: the same pattern id as
    # the committed candidate must mean the same op signature (rewrite.define_op refuses two in a process)


def gelu_tanh(shape=(4, 48)):
    """0.5 * x * (1 + tanh(0.79788 * (x + 0.044715 * x^3)))."""
    return make([
        ("aten.mul.Tensor", P, [{"input": 0}, {"const": 0}], None),
        ("aten.pow.Tensor_Scalar", P, [{"input": 0}, {"const": 1}], None),
        ("aten.mul.Tensor", P, [{"node": 1}, {"const": 2}], None),
        ("aten.add.Tensor", P, [{"input": 0}, {"node": 2}], None),
        ("aten.mul.Tensor", P, [{"node": 3}, {"const": 3}], None),
        ("aten.tanh.default", P, [{"node": 4}], None),
        ("aten.add.Tensor", P, [{"node": 5}, {"const": 4}], None),
        ("aten.mul.Tensor", P, [{"node": 0}, {"node": 6}], None),
    ], 1, [7], [shape], n_consts=5, scalars=(0.5, 3.0, 0.044715, 0.7978845608028654, 1.0), model="gpt2")


def silu_mul(shape=(2, 8, 40)):
    """neg, exp, add(1), div, mul(up): llama's SiLU(gate) * up."""
    return make([
        ("aten.neg.default", P, [{"input": 0}], None),
        ("aten.exp.default", P, [{"node": 0}], None),
        ("aten.add.Tensor", P, [{"node": 1}, {"const": 0}], None),
        ("aten.div.Tensor", P, [{"input": 0}, {"node": 2}], None),
        ("aten.mul.Tensor", P, [{"node": 3}, {"input": 1}], None),
    ], 2, [4], [shape, shape], n_consts=1, scalars=(1.0,), model="llama")


def unsupported_cat(shape=(4, 8)):
    return make([
        ("aten.neg.default", P, [{"input": 0}], None),
        ("aten.cat.default", "other", [[{"node": 0}, {"input": 0}], -1], None),
    ], 1, [1], [shape])


def not_last_dim(shape=(4, 8)):
    return make([
        ("aten.exp.default", P, [{"input": 0}], None),
        ("aten.sum.dim_IntList", R, [{"node": 0}, [0], True], None),
    ], 1, [1], [shape])


ALL = {"softmax": softmax, "exp_softmax": exp_softmax, "scaled_masked_softmax": scaled_masked_softmax,
       "log_softmax": log_softmax, "layer_norm": layer_norm, "rms_norm": rms_norm, "gelu_erf": gelu_erf,
       "gelu_tanh": gelu_tanh, "silu_mul": silu_mul}


def where_mul_sum(rows=16, cols=40):
    """bert's backward ``where(mask[N, 1], a, b) * x`` summed per row, the ``where`` also read outside:
    a per-element value of a per-row shape, which the row kernel cannot store."""
    return make([
        ("aten.where.self", P, [{"input": 1}, {"input": 2}, {"input": 3}], None),
        ("aten.mul.Tensor", P, [{"input": 0}, {"node": 0}], None),
        ("aten.sum.dim_IntList", R, [{"node": 1}, [-1], True], None),
    ], 4, [0, 1, 2], [(rows, cols), (rows, 1), (), ()], input_dtypes=["float32", "bool", "float32", "float32"],
        phase="backward")


def test_fixtures_have_distinct_ids():
    ids = [f().id for f in ALL.values()]
    assert len(set(ids)) == len(ids)
