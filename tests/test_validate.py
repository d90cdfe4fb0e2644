"""validate: numeric cases, pass/fail bookkeeping, and the rewrite firing inside torch.compile."""

import json

import pytest
import torch

import test_codegen_fixtures as F
from miner.runtime import rewrite
from miner.core import candidate as candidates
from miner.generate.generate import generate_one
from miner.check.cases import numeric_cases
from miner.check.validate import check_rewrite, validate
from miner.core.workspace import Workspace


@pytest.fixture()
def ws(tmp_path):
    return Workspace(tmp_path)


def test_numeric_cases_cover_observed_and_odd_shapes(ws):
    meta = json.loads((generate_one(F.layer_norm(), ws, "x").path / "candidate.json").read_text())
    cases = {label: (entry, variant) for label, entry, variant in numeric_cases(meta, on_cpu=True)}
    labels = " | ".join(cases)
    for want in ("observed bert/forward", "looped", "odd row length 37", "one row", "long row 8229", "bfloat16"):
        assert want in labels
    entry, variant = cases["odd row length 37"]
    assert [i["shape"] for i in entry["inputs"]] == [[2, 8, 37], [37], [37]]  # weight/bias follow the row
    entry, _ = cases["one row"]
    assert entry["inputs"][0]["shape"] == [1, 1, 32]


def test_validate_numerics_only_marks_validated(ws):
    r = generate_one(F.rms_norm(), ws, "x")
    written = (r.path / "candidate.json").read_bytes()
    v = validate(ws, r.id, device="cpu", model=False)
    assert v.ok, v.failure
    assert (r.path / "candidate.json").read_bytes() == written  # generate's file: validate writes its own
    saved = json.loads((r.path / "validation.json").read_text())
    assert candidates.status(ws, candidates.load(ws, r.id)) == "validated"
    assert saved["ok"] and saved["model"] is False and len(saved["checks"]) >= 8
    assert all(c["kind"] == "numerics" and c["ok"] for c in saved["checks"])


def test_a_wrong_kernel_fails_with_the_reason(ws):
    r = generate_one(F.exp_softmax(), ws, "x")
    kernel = r.path / "kernel.py"
    kernel.write_text(kernel.read_text().replace("v2 = (v0 / v1)", "v2 = (v0 / v1) * 1.001"))
    v = validate(ws, r.id, device="cpu", model=False)
    assert not v.ok and "elements outside rtol=1e-05" in v.failure
    cand = candidates.load(ws, r.id)
    assert candidates.status(ws, cand) == "failed" and candidates.failure(cand) == v.failure
    generate_one(F.exp_softmax(), ws, "x")  # regenerated: that validation checked other sources
    assert candidates.status(ws, cand) == "generated" and candidates.failure(cand) is None


def test_rewrite_fires_in_torch_compile_and_matches_eager(ws):
    cand = candidates.load(ws, generate_one(F.softmax(), ws, "x").id)
    graph_pass = rewrite.FusionPass([rewrite.entry_for(cand.path / "pattern.py", cand.id, cand.pattern_module)])
    x = torch.randn(2, 4, 8, 8)
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True):
        f = torch.compile(lambda t: torch.softmax(t, -1), options=rewrite.inductor_options(graph_pass), dynamic=False)
        out = f(x)
    torch._dynamo.reset()
    assert graph_pass.counts[cand.id] == 1
    torch.testing.assert_close(out, torch.softmax(x, -1))


def test_pass_uuid_hashes_the_sources(ws):
    cand = candidates.load(ws, generate_one(F.silu_mul(), ws, "x").id)
    entry = rewrite.entry_for(cand.path / "pattern.py", cand.id, cand.pattern_module)
    before = rewrite.FusionPass([entry]).uuid()
    (cand.path / "kernel.py").write_text((cand.path / "kernel.py").read_text() + "\n# edited\n")
    assert rewrite.FusionPass([entry]).uuid() != before


def test_extra_check_declines_cpu_without_the_interpreter(monkeypatch):
    t = torch.empty(2, 8)
    assert rewrite.device_reasons([t]) == []
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert rewrite.device_reasons([t]) == ["device: CPU tensors need the Triton interpreter (TRITON_INTERPRET=1)"]
    assert rewrite.device_reasons([t, torch.empty(2, 8, device="meta")])[0].startswith("device: inputs on several")


@pytest.mark.slow
def test_rewrite_proven_on_a_zoo_model(ws):
    cand = candidates.load(ws, generate_one(F.layer_norm(shape=(2, 64, 128)), ws, "x").id)
    check = check_rewrite(cand, "bert", "train")
    assert check.ok, check.detail
    assert check.matches > 0


def test_a_long_float32_sum_is_judged_by_its_rounding_not_a_fixed_tolerance():
    # DebertaV2's mul -> sum over its 128,100-word vocabulary (2026-12-06, H100): 68 of 8192 row sums
    # cancel to near 0 and miss rtol=atol=1e-5 by rounding alone (5.2e-4); a kernel wrong by a scale
    # of 1e-4 must still fail
    import torch

    from miner.check.reduce import float64_reference
    from miner.check.validate import within_rounding

    def pattern(x0, x1):
        v0 = torch.ops.aten.mul.Tensor(x0, x1)
        return v0, torch.ops.aten.sum.dim_IntList(v0, [-1], True)

    g = torch.Generator().manual_seed(0)
    x0, x1 = torch.randn(64, 128100, generator=g), torch.randn(64, 1, generator=g)
    x0[:, -1] = -(x0[:, :-1].double().sum(-1)).float()  # every row sums to ~0: cancellation
    refs = float64_reference(pattern, [x0, x1], [])
    mul = x0 * x1
    blocked = mul.view(64, -1, 25).sum(-1, dtype=torch.float32).cumsum(-1)[:, -1:]  # a float32 order of its own
    ok, _, _, detail = within_rounding(blocked, refs[1], torch.float32)
    from miner.check.checks import compare
    assert not compare(blocked, refs[1].value, torch.float32)[0]  # the fixed tolerance fails it
    assert ok and "all within float32 rounding" in detail, detail
    wrong = blocked + 1e-4 * refs[1].e2.sqrt().float()  # planted: beyond rounding, by the same measure
    ok, _, worst, detail = within_rounding(wrong, refs[1], torch.float32)
    assert not ok and "beyond" in detail and worst > 1, detail
    short = mul[:, 1:].sum(-1, keepdim=True)  # planted: a kernel that misses each row's first element
    assert not within_rounding(short, refs[1], torch.float32)[0]
    assert within_rounding(mul, refs[0], torch.float32)[0]  # the elementwise product: exact enough either way
    import types

    from miner.check.validate import sums
    assert sums(types.SimpleNamespace(meta={"ops": "mul -> sum"}))  # only a pattern that sums is judged so
    assert not sums(types.SimpleNamespace(meta={"ops": "exp -> div -> summary_stat"}))


def test_the_float64_bound_is_computed_a_chunk_of_rows_at_a_time_where_rows_are_independent():
    # the bound of a [8192, 128100] float32 sum held ~10 float64 [8192, 128100] temporaries at once on the
    # H100 (2026-12-06): it ran out of memory and the fixed element tolerance failed DebertaV2's mul -> sum
    import torch

    from miner.check import reduce as R

    def row_sum(x0, x1, w):
        v0 = torch.ops.aten.mul.Tensor(torch.ops.aten.mul.Tensor(x0, x1), w)
        return v0, torch.ops.aten.sum.dim_IntList(v0, [-1], True)

    def col_sum(x0, x1, w):  # sums over the rows: no chunk may be judged alone
        return (torch.ops.aten.sum.dim_IntList(torch.ops.aten.mul.Tensor(x0, w), [0], True),)

    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(37, 300, generator=g), torch.randn(37, 1, generator=g), torch.randn(1, 300, generator=g)]
    for fn in (row_sum, col_sum):
        whole = R.float64_reference(fn, xs, [])
        seen = []
        real = R.float64_reference
        R.float64_reference = lambda f, x, s: seen.append(x[0].shape[0]) or real(f, x, s)
        try:
            chunked = R.float64_reference_by_rows(fn, xs, [], chunk_elements=8 * 300)
        finally:
            R.float64_reference = real
        assert seen == ([8, 8, 8, 8, 5] if fn is row_sum else [37]), seen  # col_sum: the whole at once
        for a, b in zip(chunked, whole):
            assert torch.equal(a.value, b.value) and torch.equal(a.e2, b.e2)


def test_a_pattern_seen_only_under_autocast_is_proven_under_autocast(monkeypatch, tmp_path):
    # DebertaV2's GELU-gradient chain (2026-12-06, H100) ends in a cast to bf16 that only an autocast step
    # has: the float32 tiny model could never fire it ("did not fire (0 matches)")
    import types

    import torch

    from miner.check import validate as V

    steps = []

    def model_step(built, mode, device, graph_pass=None, *, compiled=True, autocast=False, fallback_random=True):
        steps.append((device, autocast, graph_pass is not None))
        if graph_pass is not None and autocast:
            graph_pass.counts = {"pgelu": 2}
        g = torch.ones(4)
        return 1.0, torch.ones(3), {"w": g * (1.2 if graph_pass is not None and autocast and scale[0] else 1.0)}

    scale = [False]

    class Pass:
        def __init__(self, entries):
            self.counts = {}

        def total(self):
            return sum(self.counts.values())

    monkeypatch.setattr(V, "models_build", lambda *a: types.SimpleNamespace())
    monkeypatch.setattr(V, "model_step", model_step)
    import miner.runtime.rewrite as rewrite
    monkeypatch.setattr(rewrite, "FusionPass", Pass)
    monkeypatch.setattr(rewrite, "entry_for", lambda *a: None)
    cand = types.SimpleNamespace(id="pgelu", path=tmp_path, pattern_module=None, meta={"observed": [
        {"inputs": [{"shape": [2, 8], "dtype": "float32"}], "outputs": [{"shape": [2, 8], "dtype": "bfloat16"}]}]})
    c = V.check_rewrite(cand, "bert", "train", device="cpu", autocast_device="cuda")
    assert c.ok and c.matches == 2 and c.device == "cuda" and "bf16 autocast" in c.case, c
    assert ("cuda", True, True) in steps and ("cuda", True, False) in steps
    assert ("cpu", False, True) in steps  # no cast in its ops: float32 was tried first
    cand.meta["ops"] = "erf -> add -> mul -> convert_element_type"
    steps.clear()
    assert V.check_rewrite(cand, "bert", "train", device="cpu", autocast_device="cuda").ok
    assert all(a for _, a, _ in steps)  # a cast in its ops: straight to autocast, no float32 compile
    del cand.meta["ops"]
    scale[0] = True  # planted: the rewrite's gradients 20% off
    c = V.check_rewrite(cand, "bert", "train", device="cpu", autocast_device="cuda")
    assert not c.ok and "grads differ (relative norm 0.2" in c.detail, c.detail
    steps.clear()
    c = V.check_rewrite(cand, "bert", "train", device="cpu")  # no device to run autocast on: float32's verdict
    assert not c.ok and "did not fire" in c.detail and all(not a for _, a, _ in steps)
    cand.meta["observed"][0]["outputs"][0]["dtype"] = "float32"  # a float32 pattern: never retried
    steps.clear()
    assert not V.check_rewrite(cand, "bert", "train", device="cpu", autocast_device="cuda").ok
    assert all(not a for _, a, _ in steps)


def test_no_float16_case_for_a_pattern_holding_a_constant_beyond_float16():
    # DebertaV2's attention region fills masked scores with bf16's lowest (-3.39e38): as float16 it is -inf
    from miner.check.cases import low_dtypes

    assert low_dtypes([1, 0.1, -3.3895313892515355e+38, 1.1111]) == ("bfloat16",)
    assert low_dtypes([1, 0.1, float("-inf"), -65504.0]) == ("bfloat16", "float16")
    # a pattern that casts to bf16 itself is an autocast-bf16 graph's: no fp16 case (and the converse)
    from miner.check.cases import literal_dtypes
    cast = {"nodes": [{"target": "prims.convert_element_type.default", "args": [{"input": 2}, {"dtype": "bfloat16"}]}]}
    assert literal_dtypes(cast) == {"bfloat16"} and low_dtypes([0.5], literal_dtypes(cast)) == ("bfloat16",)
    assert low_dtypes([0.5], frozenset({"float16"})) == ("float16",)


def test_compare_in_chunks_gives_what_it_gives_whole(monkeypatch):
    import torch

    from miner.check import checks

    g = torch.Generator().manual_seed(1)
    ref = torch.randn(37, 53, generator=g, dtype=torch.float64)
    ref[3, 4] = float("nan")
    out = (ref * (1 + 1e-4 * torch.randn(37, 53, generator=g, dtype=torch.float64))).float()
    whole = checks.compare(out, ref, torch.float32)
    monkeypatch.setattr(checks, "COMPARE_CHUNK", 100)  # 20 chunks, the last one short
    assert checks.compare(out, ref, torch.float32) == whole and not whole[0] and "elements outside" in whole[3]
    out[0, 0] = float("nan")  # a NaN the reference does not have, in the first chunk
    assert checks.compare(out, ref, torch.float32)[3] == "NaN positions differ from the reference"
