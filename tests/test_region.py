"""Whole-region candidates with dropout (miner.generate.region, random ops in lower/emit, the randomness rule).

The region is t5's relu + dropout forward kernel from the H200 profile (``pf4693d7449`` of
reports/gpu/2026-12-03-h200-profile/mined/regions.json), generated as the committed candidate is.
The kernel draws Inductor's numbers (``tl.rand(seed, element offset)``): its mask equals the
reference's element for element; keep rate and scaling are checked statistically.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
import torch._inductor.config
import torch._inductor.inductor_prims  # noqa: F401 - prims.inductor_random & co.
from hypothesis import given, settings, strategies as st

from miner.core import candidate as candidates
from miner.core.workspace import Workspace
from miner.generate import generate as gen, lower, region
from miner.mine import regions

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "reports/gpu/2026-12-03-h200-profile"
RELU_DROPOUT, RMS_DROPOUT = "pf4693d7449", "p010eaa2cbb"

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter tests")


@pytest.fixture(scope="module")
def rps():
    return {rp.id: rp for rp in regions.load(PROFILE)}


@pytest.fixture(scope="module")
def cand(tmp_path_factory, rps):
    ws = Workspace(tmp_path_factory.mktemp("region"))
    r = gen.generate_one(rps[RELU_DROPOUT].pattern, ws, "test", {"regions": "x"})
    assert isinstance(r, gen.Generated), r
    return candidates.load(ws, RELU_DROPOUT)


def test_prepare_takes_the_input_view_out_and_ties_the_random_shape(rps):
    p = region.prepare(rps[RELU_DROPOUT].pattern)
    targets = [n.target for n in p.nodes]
    assert "aten.reshape.default" not in targets
    rand = p.nodes[targets.index("prims.inductor_random.default")]
    assert rand.args[0] == {"shape_of": 1}
    assert p.occurrences[0].input_meta[1].shape == (16, 512, 3072)  # the view's shape, not mm's [8192, 3072]
    seed = p.nodes[targets.index("prims.inductor_lookup_seed.default")]
    assert seed.args[1] == {"int_const": 0}
    assert [p.nodes[j].target for j in sorted(p.all_outputs)] == ["aten.gt.Scalar", "aten.mul.Tensor"]  # mask + result


def test_lower_marks_seed_inputs_and_runtime_seed_index(rps):
    prog = lower.lower(gen.spec_from_pattern(region.prepare(rps[RELU_DROPOUT].pattern)))
    assert prog.seed_inputs == (0,) and prog.seed_consts == (0,) and prog.random
    assert prog.output_kinds == ("vec", "vec")


def test_a_random_op_whose_shape_no_input_has_is_unsupported(rps):
    from dataclasses import replace

    p = rps[RELU_DROPOUT].pattern
    nodes = list(p.nodes)
    j = [n.target for n in nodes].index("prims.inductor_random.default")
    nodes[j] = replace(nodes[j], args=([3, 5, 7],) + tuple(nodes[j].args[1:]))
    with pytest.raises(lower.Unsupported, match="no input has that shape"):
        region.prepare(replace(p, nodes=tuple(nodes)))


def _inputs(shape, seed_index=3, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(1)
    seeds = torch.randint(0, 2 ** 31, (8,), generator=g, dtype=torch.int64)
    x = torch.randn(shape, generator=g).to(dtype)
    return seeds, x, seed_index


@pytest.mark.parametrize("shape,variant", [((2, 3, 64), None), ((2, 37), None), ((2, 37), "looped"),
                                           ((1, 3, 50), "looped")])
def test_kernel_equals_reference_mask_included(cand, shape, variant):
    seeds, x, i = _inputs(shape)
    mask, out = cand.kernel_module.launch(seeds, x, i, 0.1, 1 / 0.9, variant=variant)
    rmask, rout = cand.kernel_module.reference(seeds, x.double(), i, 0.1, 1 / 0.9)
    assert torch.equal(mask, rmask)
    torch.testing.assert_close(out.double(), rout.double(), rtol=1e-2, atol=1e-2)
    assert mask.dtype == torch.bool and out.dtype == torch.bfloat16


def test_one_pass_and_looped_draw_the_same_numbers(cand):
    seeds, x, i = _inputs((3, 45))
    a = cand.kernel_module.launch(seeds, x, i, 0.1, 1 / 0.9, variant="one_pass")
    b = cand.kernel_module.launch(seeds, x, i, 0.1, 1 / 0.9, variant="looped")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_keep_rate_and_scaling(cand):
    """Keep rate 1 - p within 5 sigma, kept values scaled by 1 / (1 - p), dropped ones zero; each layer's seed differs."""
    p, n = 0.1, 64 * 512
    seeds, _, _ = _inputs((1,))
    x = torch.full((64, 512), 2.0, dtype=torch.bfloat16)
    mask, out = cand.kernel_module.launch(seeds, x, 5, p, 1 / (1 - p))
    keep = mask.double().mean().item()
    assert abs(keep - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n), keep
    assert torch.all(out[mask] == torch.tensor(2.0 / (1 - p), dtype=torch.bfloat16))
    assert torch.all(out[~mask] == 0)
    other, _ = cand.kernel_module.launch(seeds, x, 6, p, 1 / (1 - p))
    agree = (other == mask).double().mean().item()  # independent masks agree on p^2 + (1-p)^2 of the elements
    assert abs(agree - (p * p + (1 - p) ** 2)) < 0.02
    # no structure along rows or columns: the keep rate of every 8th column is the same
    cols = mask[:, ::8].double().mean().item()
    assert abs(cols - (1 - p)) < 5 * math.sqrt(p * (1 - p) / mask[:, ::8].numel())


@settings(max_examples=8, deadline=None)
@given(rows=st.integers(1, 5), cols=st.integers(1, 70), p=st.sampled_from([0.1, 0.5]))
def test_mask_matches_reference_for_any_shape(cand, rows, cols, p):
    seeds, x, i = _inputs((rows, cols))
    mask, out = cand.kernel_module.launch(seeds, x, i, p, 1 / (1 - p))
    rmask, rout = cand.kernel_module.reference(seeds, x.double(), i, p, 1 / (1 - p))
    assert torch.equal(mask, rmask)
    torch.testing.assert_close(out.double(), rout.double(), rtol=1e-2, atol=1e-2)


def test_launch_contract_refuses_a_random_shape_other_than_the_rows(cand):
    from miner.rules.contract import shape_contract
    from miner.runtime.launch import ContractError

    assert shape_contract([((8,), "int64"), ((2, 4), "float32")], seeds=[0], randoms=[("r", (2, 4))]) == []
    why = shape_contract([((8,), "int64"), ((2, 4), "float32")], seeds=[0], randoms=[("r", (3, 4))])
    assert why and "random" in why[0]
    assert "seed input" in shape_contract([((8,), "float32"), ((2, 4), "float32")], seeds=[0])[0]
    seeds, x, i = _inputs((2, 4))
    with pytest.raises(ContractError, match="several devices|cannot compute"):
        cand.kernel_module.launch(seeds.to("meta"), x, i, 0.1, 1.1)


class DropoutResidualRMSNorm(torch.nn.Module):
    """t5's LayerFF tail as autocast leaves it: bf16 matmul, dropout, fp32 residual, RMS norm, bf16 out."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 32, bias=False).to(torch.bfloat16)
        self.weight = torch.nn.Parameter(torch.rand(32) + 0.5)

    def forward(self, x, res, mask=None):
        d = torch.nn.functional.dropout(self.lin(x), p=0.1, training=True) if mask is None \
            else self.lin(x) * mask * (1 / 0.9)
        s = res + d
        h = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (self.weight * h).to(torch.bfloat16), s


def _compiled(cand_, model, *xs):
    from miner.runtime import rewrite

    graph_pass = rewrite.FusionPass([rewrite.entry_for(cand_.path / "pattern.py", cand_.id, cand_.pattern_module)])
    torch._dynamo.reset()
    try:
        with torch._inductor.config.patch(force_disable_caches=True, fallback_random=False):
            out = torch.compile(model, options=rewrite.inductor_options(graph_pass), dynamic=False)(*xs)
            out[0].float().sum().backward()
    finally:
        torch._dynamo.reset()
    return graph_pass, out


@pytest.fixture(scope="module")
def rms_cand(tmp_path_factory, rps):
    ws = Workspace(tmp_path_factory.mktemp("region_rms"))
    assert isinstance(gen.generate_one(rps[RMS_DROPOUT].pattern, ws, "test", {"regions": "x"}), gen.Generated)
    return candidates.load(ws, RMS_DROPOUT)


def test_rewrite_fires_and_the_backward_uses_the_forward_mask(rms_cand):
    """Compiled with the dropout+residual+RMS-norm region fusion: it fires, and the gradients are
    autograd's through the mask the fused forward drew (read back from s = res + mask * a / 0.9)."""
    torch.manual_seed(0)
    model = DropoutResidualRMSNorm()
    x = torch.randn(2, 8, 16, dtype=torch.bfloat16)
    res = torch.randn(2, 8, 32, requires_grad=True)
    graph_pass, (y, s) = _compiled(rms_cand, model, x, res)
    assert graph_pass.total() == 1, (graph_pass.counts, graph_pass.declined)
    a = model.lin(x).detach().float()
    mask = ((s.detach() - res.detach()).abs() > 1e-6) | (a == 0)
    assert 0.8 < mask.double().mean().item() < 0.97
    got_res, got_w = res.grad.clone(), model.lin.weight.grad.clone()
    res.grad, model.lin.weight.grad = None, None
    y2, s2 = model(x, res, mask.to(torch.bfloat16))
    torch.testing.assert_close(s2.detach(), s.detach(), rtol=1e-2, atol=1e-2)
    y2.float().sum().backward()
    torch.testing.assert_close(got_res, res.grad, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got_w.float(), model.lin.weight.grad.float(), rtol=5e-2, atol=5e-2)


def _dropout_graph(again: bool):
    """An FX graph (fake-traced, ``meta['val']`` set) of a dropout whose seed is looked up ``again`` elsewhere."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(seeds, x):
        seed = torch.ops.prims.inductor_lookup_seed.default(seeds, 0)
        r = torch.ops.prims.inductor_random.default(list(x.shape), seed, "rand")
        keep = torch.ops.aten.gt.Scalar(r, 0.1)
        y = torch.ops.aten.mul.Tensor(keep, x)
        if not again:
            return keep, y
        seed2 = torch.ops.prims.inductor_lookup_seed.default(seeds, 0)
        return keep, y, torch.ops.prims.inductor_random.default(list(x.shape), seed2, "rand")

    return make_fx(f, tracing_mode="fake")(torch.zeros(4, dtype=torch.int64), torch.randn(2, 8)).graph


@pytest.mark.parametrize("again", [False, True])
def test_randomness_rule_for_kernels_that_draw_their_own_numbers(again):
    from miner.rules import safety

    g = _dropout_graph(again)
    names = [n.name for n in g.nodes if n.op == "call_function"][:4]
    ins = tuple(n.name for n in g.nodes if n.op == "placeholder")
    occ = safety.Occurrence(graph=safety.MATCH_KEY, nodes=tuple(names), inputs=ins, outputs=(2, 3))
    fx = safety.FxGraph(g)
    plain = safety.check_randomness(occ, fx).reasons
    assert len(plain) == 2 and all("is a random op" in r for r in plain)  # mined patterns: never
    drawn = safety.check_randomness(occ, fx, random=True).reasons
    if again:  # the same seed drawn again outside (a backward regenerating the mask): declined, with the reason
        assert len(drawn) == 1 and "looked up again" in drawn[0], drawn
    else:
        assert drawn == ()
    kernel = safety.check_kernel(occ, fx).reasons
    assert kernel == (), kernel  # seeds outside the rows, the random shape is the rows'


def test_the_random_numbers_cast_is_elided_as_inductor_computes_it(rps):
    """The region casts its random number to bf16 before dropout's comparison; Inductor computes that
    intermediate in float32 and elides the cast (``emulate_precision_casts`` off), so the kernel and its
    reference compare the unrounded number (rounding it flipped the mask near the threshold on the H200)."""
    from miner.generate import emit

    prog = lower.lower(gen.spec_from_pattern(region.prepare(rps[RELU_DROPOUT].pattern)))
    casts = [v for v in prog.values.values() if v.op == "prims.convert_element_type"]
    assert casts and all(v.expr == v.deps[0] and prog.values[v.deps[0]].random for v in casts)  # the number itself
    text = emit.render_kernel_py(prog, "# test\n")
    assert "round_bf16" not in text and "_launch.elided_cast(" in text


def test_randomness_rule_declines_when_inductor_emulates_precision_casts():
    from miner.rules import safety

    g = _dropout_graph(False)
    names = [n.name for n in g.nodes if n.op == "call_function"][:4]
    ins = tuple(n.name for n in g.nodes if n.op == "placeholder")
    occ = safety.Occurrence(graph=safety.MATCH_KEY, nodes=tuple(names), inputs=ins, outputs=(2, 3))
    with torch._inductor.config.patch(emulate_precision_casts=True):
        drawn = safety.check_randomness(occ, safety.FxGraph(g), random=True).reasons
    assert len(drawn) == 1 and "emulate_precision_casts" in drawn[0], drawn


def test_committed_region_candidates_record_their_source():
    import json

    for cid in (RELU_DROPOUT, RMS_DROPOUT):
        meta = json.loads((REPO / "candidates" / cid / "candidate.json").read_text())
        assert meta["source"] == {"regions": "reports/gpu/2026-12-03-h200-profile/mined/regions.json"}
        assert meta["label"].startswith("dropout_")


def test_bench_checks_a_random_candidate_against_its_own_numbers(rms_cand):
    """``miner bench``'s numerics gate: the kernel against kernel.py's reference (Inductor's random
    numbers); eager draws torch's own numbers, so its masks differ and it is reported as such."""
    from miner.bench.cases import BenchCase
    from miner.bench.run import bench_case
    from miner.bench.timing import Env
    from miner.core.tensors import TensorSpec

    case = BenchCase(inputs=(TensorSpec((32,), "float32"), TensorSpec((2, 4, 32), "float32"),
                             TensorSpec((8,), "int64"), TensorSpec((2, 4, 32), "bfloat16")),
                     scalars=(3.0, 0.1, 1 / 0.9, 2.0, 1e-6))
    env = Env("cpu", "cpu", torch.__version__, "-", "-", 1.0, 1 << 20, interpret=True)
    row = bench_case(rms_cand, case, env, variants=("candidate", "eager"), replays=1)
    by = {v.name: v for v in row.variants}
    assert by["candidate"].numerics_ok and by["candidate"].timing is not None, by["candidate"]
    assert by["eager"].numerics_ok is False  # torch's CPU generator: other masks (named, not silently timed)


@pytest.mark.parametrize("weight_shape", [(32,), (1, 1, 32), (3, 5, 32)])
@pytest.mark.parametrize("variant", ["one_pass", "looped"])
def test_a_weight_broadcast_over_rows_is_read_once_per_program(rms_cand, weight_shape, variant):
    """A norm's weight ([N], per column) takes the one-pass kernel's [1, BLOCK] evict_last load
    (X0_COL, decided from its strides at launch); a full-size one the per-row load; both equal the reference."""
    assert rms_cand.kernel_module.COLUMNS == (0,)
    assert 'eviction_policy="evict_last"' in (rms_cand.path / "kernel.py").read_text()
    g = torch.Generator().manual_seed(3)
    w = torch.rand(weight_shape, generator=g) + 0.5
    res, a = torch.randn(3, 5, 32, generator=g), torch.randn(3, 5, 32, generator=g).to(torch.bfloat16)
    seeds = torch.randint(0, 2 ** 31, (8,), generator=g)
    args = (w, res, seeds, a, 2, 0.1, 1 / 0.9, 2.0, 1e-6)
    outs = rms_cand.kernel_module.launch(*args, variant=variant)
    refs = rms_cand.kernel_module.reference(w.double(), res.double(), seeds, a.double(), *args[4:])
    assert torch.equal(outs[0], refs[0])  # the mask
    for o, r in zip(outs[1:], refs[1:]):
        torch.testing.assert_close(o.double(), r.double(), rtol=2e-2, atol=2e-2)


@pytest.mark.slow
def test_fires_in_t5_training_under_bf16_autocast():
    """The zoo's tiny t5, trained one step under CPU bf16 autocast (the H200 run's precision) with
    both region candidates: dropout+residual+RMS norm fires at every such site (8 in the tiny t5),
    relu+dropout at every feed-forward (4), although its relu is also read by the backward's ``le``
    mask (a shared output: the candidate's replacement recomputes relu for it, issue 29)."""
    import miner_models as models
    from miner.runtime import rewrite

    built = models.resolve("t5").build("tiny", "train", "cpu")
    ws = Workspace(REPO)
    ents = [rewrite.entry_for(candidates.load(ws, c).path / "pattern.py", c, candidates.load(ws, c).pattern_module)
            for c in (RMS_DROPOUT, RELU_DROPOUT)]
    gp = rewrite.FusionPass(ents)
    torch._dynamo.reset()
    try:
        with torch._inductor.config.patch(force_disable_caches=True, fallback_random=False), \
                torch.autocast("cpu", dtype=torch.bfloat16):
            out = torch.compile(built.model, options=rewrite.inductor_options(gp), dynamic=False)(**built.inputs)
            loss = built.loss(out)
            loss.backward()
    finally:
        torch._dynamo.reset()
    assert gp.counts[RMS_DROPOUT] == 8 and gp.counts[RELU_DROPOUT] == 4, (gp.counts, gp.declined)
    assert torch.isfinite(loss.detach())


def test_plain_generate_keeps_region_candidates(tmp_path, rps):
    """``miner generate`` (from patterns.json) removes stale candidates, but not those generated from a regions.json."""
    ws = Workspace(tmp_path)
    assert isinstance(gen.generate_one(rps[RMS_DROPOUT].pattern, ws, "test", {"regions": "x"}), gen.Generated)
    (ws.candidates / "pdeadbeef00").mkdir(parents=True)
    (ws.candidates / "pdeadbeef00" / "candidate.json").write_text("{}")
    assert gen.remove_stale(ws, keep=[]) == ["pdeadbeef00"]
    assert (ws.candidates / RMS_DROPOUT / "kernel.py").exists()


def test_cli_generate_regions(tmp_path):
    import subprocess
    import sys

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "miner.cli", "--workspace", str(tmp_path), "generate", *args],
                              capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})

    regions_json = str(PROFILE / "mined" / "regions.json")
    r = cli("--regions", regions_json)
    assert r.returncode == 2 and "needs --only" in r.stderr
    r = cli("--regions", regions_json, "--only", "pzzzz")
    assert r.returncode == 2 and "no region pattern" in r.stderr
    r = cli("--regions", regions_json, "--only", RMS_DROPOUT[:6])  # default: the four-per-call stream, <id>_x4
    assert r.returncode == 0, r.stderr
    assert "dropout_rms_norm" in r.stdout and (tmp_path / "candidates" / (RMS_DROPOUT + "_x4") / "kernel.py").exists()
    assert "--rng philox4" in (tmp_path / "candidates" / (RMS_DROPOUT + "_x4") / "kernel.py").read_text()
    assert not (tmp_path / "candidates" / "index.json").exists()  # the index of patterns.json's candidates stays as it was
    r = cli("--regions", regions_json, "--only", RMS_DROPOUT[:6], "--rng", "inductor")  # Inductor's own numbers
    assert r.returncode == 0, r.stderr
    assert "uniform(v0, lin)" in (tmp_path / "candidates" / RMS_DROPOUT / "kernel.py").read_text()
    r = cli("--regions", regions_json, "--only", RMS_DROPOUT[:6], "--rng", "bogus")
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_meta_rule_notes_dtype_mixes_inside_a_whole_region():
    """An add of float32 and bfloat16 operands: declined for a mined pattern (eager rounds in between),
    a note for a region (the Inductor kernel it replaces computes in float32 too)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from miner.rules import safety

    def f(a, b):
        return (torch.ops.aten.add.Tensor(a, torch.ops.aten.mul.Tensor(b, 2.0)),)

    g = make_fx(f, tracing_mode="fake")(torch.randn(2, 8), torch.randn(2, 8).to(torch.bfloat16)).graph
    names = [n.name for n in g.nodes if n.op == "call_function"]
    ins = tuple(n.name for n in g.nodes if n.op == "placeholder")
    occ = safety.Occurrence(graph=safety.MATCH_KEY, nodes=tuple(names), inputs=ins, outputs=(1,))
    fx = safety.FxGraph(g)
    plain = safety.check_meta(occ, fx)
    assert any("mixes dtypes" in r for r in plain.reasons)
    region_ = safety.check_meta(occ, fx, region=True)
    assert region_.reasons == () and any("mixes dtypes" in n for n in region_.notes)


T5_SOFTMAX = {"p4a7fd15d60": 1, "p9836c8c870": 1, "pbb9b9d613b": 0}  # region -> embeddings (bias gathers)


@pytest.mark.parametrize("rid", sorted(T5_SOFTMAX))
def test_t5_attention_softmax_regions_lower(rps, rid):
    """The decoder (causal mask), encoder layer 0 (bias gather + padding masks) and encoder layers 1-11
    (realized bias) softmax + dropout regions: full/expand shapes tied to inputs, the gather lowered."""
    p = region.prepare(rps[rid].pattern)
    for node in p.nodes:
        if node.target in region.SHAPED:
            shape = node.args[region.SHAPED[node.target]]
            assert not isinstance(shape, list) or all(not isinstance(s, int) or s <= 1 for s in shape), node
            assert set(node.kwargs.get("device", {"device_of": 0})) == {"device_of"}
    prog = lower.lower(gen.spec_from_pattern(p))
    assert len(prog.gathers) == T5_SOFTMAX[rid] and prog.levels == 1 and prog.online_softmax


def test_a_region_kernel_reads_a_heads_last_input_in_place():
    """t5's encoder attention region (``pbb9b9d613b_x4``) with its shared position bias laid out heads last
    (strides ``[.., 1, S * H, H]``, as the H100 run of 2026-12-06 saw it): the kernel's outputs equal its
    reference's on the same strided tensor, and that reference equals the one on a contiguous copy."""
    from miner.core.modules import load_module

    kernel = load_module(Path(__file__).resolve().parents[1] / "candidates" / "pbb9b9d613b_x4" / "kernel.py",
                         "miner_test_pbb9b9d613b_x4_kernel")
    g = torch.Generator().manual_seed(0)
    B, H, S = 2, 3, 40
    seeds = torch.randint(0, 2 ** 31, (4,), dtype=torch.int64, generator=g)
    scores = torch.randn(B, H, S, S, generator=g)
    bias = torch.randn(B, S, S, H, generator=g).permute(0, 3, 1, 2)
    assert not bias.is_contiguous()
    scalars = (1, 0.1, float("-inf"), 0.0, 1 / 0.9)
    out = kernel.launch(seeds, scores, bias, *scalars)
    ref = kernel.reference(seeds, scores, bias, *scalars)
    dense = kernel.reference(seeds, scores, bias.contiguous(), *scalars)
    for o, r, d in zip(out, ref, dense):
        assert torch.equal(r, d)
        assert o.dtype == r.dtype and torch.allclose(o.float(), r.float(), rtol=1e-6, atol=1e-6)


DEBERTA = Path(__file__).parent / "fixtures" / "h100_deberta_attention_region.json"  # region p297db06345 of
# the DebertaV2 tune run (reports/gpu/2026-12-06-h100-deberta-tune/: its mined/regions.json, two occurrences kept)


def test_a_region_that_reshapes_its_result_is_generated_and_computes_its_reference(tmp_path):
    """DebertaV2's attention softmax + mask + dropout (7.1 ms/step above floor on the H100) views its
    result [16, 24, 512, 512] -> [-1, 512, 512] before the cast: refused as 'unsupported op
    aten.reshape.default' until a reshape of a computed value was lowered as the identity on the rows."""
    ws = Workspace(tmp_path)
    (tmp_path / "mined").mkdir()
    (tmp_path / "mined" / "regions.json").write_text(DEBERTA.read_text())
    [rp] = regions.load(ws)
    p = region.prepare(rp.pattern)
    [view] = [n for n in p.nodes if n.target == "aten.reshape.default"]
    # tied to the trailing dims of an input (the mask [B, 1, S, S] or the scores [B, H, S, S]), -1 kept
    assert [a if not isinstance(a, dict) else tuple(a["dim_of"])[1] for a in view.args[1]] == [-1, 2, 3]
    r = gen.generate_one(rp.pattern, ws, "test", {"regions": "mined/regions.json", "rng": "philox4"})
    assert isinstance(r, gen.Generated), r
    cand = candidates.load(ws, r.id)
    g = torch.Generator().manual_seed(0)
    B, H, S = 2, 3, 40
    seeds = torch.randint(0, 2 ** 31, (4,), dtype=torch.int64, generator=g)
    mask = torch.rand(B, 1, S, S, generator=g) > 0.8
    scores = torch.randn(B, H, S, S, generator=g).to(torch.bfloat16)
    scalars = (1, 0.1, -3.3895313892515355e+38, 1 / 0.9)
    out = cand.kernel_module.launch(seeds, mask, scores, *scalars)
    ref = cand.kernel_module.reference(seeds, mask, scores, *scalars)
    assert tuple(out[-1].shape) == (B * H, S, S) and all(tuple(o.shape) == (B, H, S, S) for o in out[:-1])
    for o, want in zip(out, ref):
        assert o.dtype == want.dtype and torch.allclose(o.float(), want.float(), rtol=1e-2, atol=1e-2)


def test_the_contract_takes_an_output_that_merges_leading_dims_only():
    from miner.rules.contract import shape_contract

    ins = [((2, 3, 40, 40), "bfloat16")]
    assert shape_contract(ins, outputs=[("out0", (6, 40, 40), "vec")]) == []
    assert shape_contract(ins, outputs=[("out0", (2, 3, 1600), "vec")])  # the rows changed: refused
    assert shape_contract(ins, outputs=[("out0", (6, 40, 1), "row")]) == []
    assert shape_contract([((2, "s0", 40), "float32")], outputs=[("o", (2 * 3, 40), "vec")])  # symbolic: equal only


DEBERTA_MORE = Path(__file__).parent / "fixtures" / "h100_deberta_more_regions.json"  # three more regions of
# the same run: residual adds with a per-column weight, a cast viewed [8192, 1536], the embedding gradient


@pytest.mark.parametrize("rid", ["p6d8937f2d2", "p0e40b14aa7"])
def test_debertas_regions_generate_and_validate_at_other_sizes(tmp_path, rid):
    """Two of DeBERTa's regions failed their numerics at the test sizes: a region without random numbers
    reading a norm's weight once per program (its launcher never passed the ``X<k>_COL`` flag), and an
    index_put table whose 512 rows were tied to the sequence length (now literal). A third, a cast viewed
    [8192, 1536] (``pc2bb3cd809``), is no longer generated: nothing to fuse
    (test_a_region_of_only_casts_is_not_generated)."""
    from miner.check.validate import validate

    ws = Workspace(tmp_path)
    (tmp_path / "mined").mkdir()
    (tmp_path / "mined" / "regions.json").write_text(DEBERTA_MORE.read_text())
    rp = {r.id: r for r in regions.load(ws)}[rid]
    r = gen.generate_one(rp.pattern, ws, "test", {"regions": "mined/regions.json", "rng": "philox4"})
    assert isinstance(r, gen.Generated), r
    v = validate(ws, r.id, device="cpu", model=False)
    assert v.ok, v.failure


def test_a_reshape_inside_a_region_must_keep_one_row_space():
    # gpt2's GELU gradient (H200 profile) views its [8192, 3072] operand [16, 512, 3072] beside a
    # [16, 512, 3072] input: no one row space for the kernel, so no candidate (it used to fail validation)
    from miner.core.pattern import PatternNode
    from miner.core.tensors import TensorSpec

    view = PatternNode("aten.reshape.default", "view", ({"node": 0}, [16, 512, 3072]), {})
    metas = [TensorSpec((8192, 3072), "bfloat16", (3072, 1), "cuda"), TensorSpec((16, 512, 3072), "bfloat16",
                                                                           (512 * 3072, 3072, 1), "cuda")]
    with pytest.raises(lower.Unsupported, match="no one row space"):
        region._check_rows(view, metas)
    rows = [TensorSpec((16, 24, 512, 512), "bfloat16", None, "cuda")]  # the seed vector left out by prepare
    region._check_rows(PatternNode("aten.reshape.default", "view", ({"node": 0}, [-1, 512, 512]), {}), rows)
    ids = [TensorSpec((333,), "int64", (1,), "cuda")] + rows  # an int64 vector that is no seed counts
    with pytest.raises(lower.Unsupported, match="no one row space"):
        region._check_rows(PatternNode("aten.reshape.default", "view", ({"node": 0}, [-1, 512, 512]), {}), ids)
    with pytest.raises(lower.Unsupported, match="changes the rows"):  # the last dim split: other rows
        region._check_rows(PatternNode("aten.reshape.default", "view", ({"node": 0}, [16, 24, 512, 256, 2]), {}), rows)


def _deberta_attention_graph(save_stats: bool):
    """Two layers of DeBERTa's attention forward as Inductor's post-grad graph has them on the GPU (the
    tiny step's, 2026-12-06): one shared fill constant and mask, and, where ``save_stats``, the softmax's
    row max and sum read by the graph output (saved for the backward), as both the tiny step and B16 S512
    save them."""
    from torch.fx.experimental.proxy_tensor import make_fx

    aten, prims = torch.ops.aten, torch.ops.prims
    B, H, S = 2, 4, 64

    def layer(scores, keep, fill, seeds, index):
        where = aten.where.self(keep, fill, aten.reshape.default(scores, [-1, H, S, S]))
        x = prims.convert_element_type.default(where, torch.float32)
        rowmax, rowsum = prims.prepare_softmax_online.default(x, -1)
        probs = aten.div.Tensor(aten.exp.default(aten.sub.Tensor(x, rowmax)), rowsum)
        drawn = prims.inductor_random.default([B, H, S, S], prims.inductor_lookup_seed.default(seeds, index), "rand")
        keep_mask = aten.gt.Scalar(drawn, 0.1)
        out = aten.mul.Tensor(aten.mul.Tensor(keep_mask, probs), 1.1111111111111112)
        return where, keep_mask, prims.convert_element_type.default(aten.reshape.default(out, [-1, S, S]),
                                                                    torch.bfloat16), rowmax, rowsum

    def fn(scores, mask, seeds):
        keep = aten.bitwise_not.default(mask)
        fill = aten.full.default([], -3.3895313892515355e+38, dtype=torch.bfloat16, layout=torch.strided,
                                 device=scores.device, pin_memory=False)
        w1, k1, o1, m1, s1 = layer(scores, keep, fill, seeds, 1)
        w2, k2, o2, m2, s2 = layer(aten.bmm.default(o1, o1), keep, fill, seeds, 4)
        return (k1, o1, w2, k2, o2) + ((m1, s1, m2, s2) if save_stats else ())

    from torch._inductor.fx_passes.post_grad import view_to_reshape

    gm = make_fx(fn, tracing_mode="fake")(torch.randn(B * H, S, S).to(torch.bfloat16),
                                          torch.rand(B, 1, S, S) > 0.5, torch.randint(0, 100, (5,)))
    view_to_reshape(gm)  # as compile_fx does before the post-grad passes: the graphs hold reshape, not view
    return gm


def test_the_attention_region_matches_a_graph_that_saves_the_softmax_stats(tmp_path):
    """The region's row max and sum (getitems, mapped to no kernel) are outputs now that the miner counts
    a connector read outside as leaving (test_regions). Without them the pattern cannot match a graph that
    saves them for the backward (DeBERTa's tiny step and B16 S512 do); with them it matches each layer
    whether the graph saves them or not. (A second cause of the 0 of 24 on the H100, a pattern traced with
    ``view`` where the graphs hold ``reshape``, is tests/test_captured.py's; this graph holds ``reshape`` as
    Inductor's do. Matched in a process of its own: the region without the stats, generated above,
    defines the same custom op.)"""
    import json
    import subprocess
    import sys

    data = json.loads(DEBERTA.read_text())
    rp = data["region_patterns"][0]
    stat = {"shape": [16, 24, 512, 1], "dtype": "float32", "stride": [12288, 512, 1, 1], "device": "cuda"}
    # what `miner mine` now writes for this region: nodes 8 and 11 are the getitems
    assert [rp["nodes"][j]["target"] for j in (8, 11)] == ["operator.getitem"] * 2
    rp["extra_outputs"] = sorted(set(rp["extra_outputs"]) | {8, 11})
    for o in rp["occurrences"]:
        meta = dict(zip(o["occurrence"]["outputs"], o["occurrence"]["output_meta"]))
        meta[8] = meta[11] = stat
        o["occurrence"]["outputs"], o["occurrence"]["output_meta"] = sorted(meta), [meta[k] for k in sorted(meta)]
    (tmp_path / "mined").mkdir()
    (tmp_path / "mined" / "regions.json").write_text(json.dumps(data))
    ws = Workspace(tmp_path)
    [loaded] = regions.load(ws)
    r = gen.generate_one(loaded.pattern, ws, "test", {"regions": "mined/regions.json", "rng": "philox4"})
    assert isinstance(r, gen.Generated), r
    script = f"""
from pathlib import Path
from miner.core import candidate as candidates
from miner.core.workspace import Workspace
from miner.runtime import rewrite
from tests.test_region import _deberta_attention_graph
cand = candidates.load(Workspace(Path({str(tmp_path)!r})), {r.id!r})
for save_stats in (True, False):
    graph_pass = rewrite.FusionPass([rewrite.entry_for(cand.path / "pattern.py", cand.id, cand.pattern_module)])
    gm = _deberta_attention_graph(save_stats)
    graph_pass(gm.graph)
    print(save_stats, graph_pass.total())
"""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TRITON_INTERPRET": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "2", "False", "2"], done.stdout


@pytest.mark.parametrize("rid", ["pae82366874", "pc6d2789354", "pc2bb3cd809"])
def test_a_region_of_only_casts_is_not_generated(tmp_path, rps, rid):
    """A region whose kernel only converts dtypes (here and there viewed) is the copy Inductor runs already:
    refused, with why. (MegatronBert, H100 2026-12-06: such a region fired at 536 sites, 0.769x with parity
    failed, and took the attention region's final cast before that region could match.)"""
    if rid not in rps:  # DeBERTa's cast viewed [8192, 1536]
        rps = {r.id: r for r in regions.load(_fixture_ws(tmp_path / "more", DEBERTA_MORE))}
    r = gen.generate_one(rps[rid].pattern, Workspace(tmp_path), "test", {"regions": "x"})
    assert isinstance(r, gen.Skipped), r
    assert "nothing to fuse" in r.reason and "convert_element_type" in r.reason
    assert not (tmp_path / "candidates" / rid).exists()


def _fixture_ws(root: Path, regions_json: Path) -> Workspace:
    (root / "mined").mkdir(parents=True)
    (root / "mined" / "regions.json").write_text(regions_json.read_text())
    return Workspace(root)
