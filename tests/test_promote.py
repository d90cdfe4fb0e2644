"""promote: refuses what is not validated, writes the fusion folder, its test, the registry and wins.json."""

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch
from torch._subclasses import FakeTensorMode

import test_codegen_fixtures as F
from miner import bench
from miner.bench import BenchCase, BenchRow, Env, TensorSpec, Timing, VariantResult
from miner.core import candidate as candidates
from miner.core.errors import UsageError
from miner.generate.generate import generate_one
from miner.promote import check_promotable, promote
from miner.check import promotion
from miner.check.validate import validate
from miner.core.workspace import Workspace


@pytest.fixture()
def ws(tmp_path):
    return Workspace(tmp_path)


def test_refuses_a_generated_candidate(ws):
    r = generate_one(F.exp_softmax(), ws, "x")
    with pytest.raises(UsageError, match=f"candidate {r.id} is not validated \\(status generated\\)"):
        promote(ws, r.id, "softmax_like")


def test_refuses_a_failed_candidate_with_its_reason(ws):
    r = generate_one(F.exp_softmax(), ws, "x")
    kernel = r.path / "kernel.py"
    kernel.write_text(kernel.read_text().replace("v2 = (v0 / v1)", "v2 = (v0 / v1) * 2.0"))
    validate(ws, r.id, device="cpu", model=False)
    with pytest.raises(UsageError, match="status failed: numerics"):
        promote(ws, r.id, "softmax_like")


def test_refuses_numerics_only_validation(ws):
    r = generate_one(F.exp_softmax(), ws, "x")
    validate(ws, r.id, device="cpu", model=False)
    with pytest.raises(UsageError, match="without proving the rewrite"):
        promote(ws, r.id, "softmax_like")
    # an in-model GPU A/B where it matched proves the rewrite instead; one where it matched nothing does not
    promotion.write_evidence(ws, r.id, [{**IN_MODEL_WIN, "matches": 0, "contexts": {}}])
    with pytest.raises(UsageError, match="without proving the rewrite"):
        promote(ws, r.id, "softmax_like")
    promotion.write_evidence(ws, r.id, [IN_MODEL_WIN])
    assert check_promotable(ws, r.id)  # the proof (promote's first step; the rest is tested below)


def test_refuses_bad_names_and_unknown_ids(ws):
    with pytest.raises(UsageError, match="lower_snake_case"):
        promote(ws, "p0", "Softmax")
    with pytest.raises(UsageError, match="unknown candidate"):
        promote(ws, "p0", "softmax_like")


def validated(ws):
    """A promotable candidate (exp / sum / div over (6, 20) float32 rows)."""
    r = generate_one(F.exp_softmax(), ws, "x")
    assert validate(ws, r.id, device="cpu", model=False).ok
    # The model check is slow (tests/test_validate.py covers it); record one as validate would.
    saved = json.loads((r.path / "validation.json").read_text())
    saved["checks"].append({"kind": "rewrite", "case": "bert/tiny/train", "ok": True, "detail": "1 match(es)"})
    (r.path / "validation.json").write_text(json.dumps(saved))
    promotion.write_evidence(ws, r.id, [IN_MODEL_WIN])  # as `miner verify --ab --record` would (tests/test_ab.py)
    return r


# an in-model A/B record: the fusion alone made bert's step faster beyond noise, at this context
SITE = "float32[64,1024] | producer:none consumer:none"
def _stored(record: dict) -> dict:
    """A record as the evidence store writes it (every field, the unset ones null)."""
    from miner.runtime.evidence import InModelRecord

    return InModelRecord.from_json(record).to_json()


IN_MODEL_WIN = {"model": "bert", "mode": "train", "compile": "default", "preset": "base", "speedup": 1.02,
                "band": 0.004, "verdict": "win", "matches": 1, "contexts": {SITE: 1}}


def test_promote_writes_fusion_test_and_registry(ws):
    r = validated(ws)
    out = promote(ws, r.id, "softmax_like")
    folder = ws.fusions / "softmax_like"
    pattern = (folder / "pattern.py").read_text()
    assert 'OP_NAME = "miner::softmax_like"' in pattern
    assert 'rewrite.load_module(Path(__file__).with_name("kernel.py")' in pattern  # a sibling, by path
    assert "import fusions" not in pattern and "miner_fusions" not in pattern
    assert pattern.splitlines()[1] == f"# Do not edit; regenerate with: miner promote {r.id} --name softmax_like"
    assert "def launch(x0, *, variant=None, config=None, bits=())" in (folder / "kernel.py").read_text()
    registry = (ws.fusions / "__init__.py").read_text()
    assert "_Fusions(_Path(__file__).resolve().parent)" in registry  # the folder's fusions, whatever it holds
    test = (ws.root / "tests" / "fusions" / "test_softmax_like.py").read_text()
    # the test module is its cases table; the tests are its kind's harness's (miner_testing.row_kernel)
    assert 'FUSION = "softmax_like"' in test and 'globals().update(bind("row_kernel", CASES))' in test
    table = {}
    exec(compile(test, "test_softmax_like.py", "exec"), table)
    assert table["CASES"][0][:2] == ("test_kernel_matches_float64_reference", "bert/forward")
    assert table["CASES"][0][2]["shapes"] == [[6, 20]]
    train = [args for name, _, args in table["CASES"] if name == "test_training_step_matches_eager_with_the_expected_matches"]
    assert train[0]["matches"] == 0  # measured: backward keeps exp and sum, so the matcher leaves the chain
    assert callable(table["test_training_step_matches_eager_with_the_expected_matches"])  # bound by the table
    assert "def test_" not in test
    assert candidates.status(ws, candidates.load(ws, r.id)) == "promoted"
    assert "promoted_as" not in json.loads((r.path / "candidate.json").read_text())  # promote writes fusions/ only
    assert len(out.files) == 7  # never timed in isolation: wins.json holds only the in-model evidence
    assert json.loads((folder / "wins.json").read_text())["in_model"]["records"] == [_stored(IN_MODEL_WIN)]
    conftest = ws.root / "tests" / "fusions" / "conftest.py"  # a workspace of its own: GPU cases skip on a CPU
    assert conftest in out.files and "needs a CUDA device" in conftest.read_text()
    compile(conftest.read_text(), "conftest.py", "exec")
    assert "and rewrite.wins_gate(match, WINS, N_INPUTS)" in pattern


def test_one_candidate_is_never_promoted_under_two_names(ws):
    r = validated(ws)
    promote(ws, r.id, "softmax_like")
    with pytest.raises(UsageError, match=f"candidate {r.id} is already promoted as fusions/softmax_like/"):
        promote(ws, r.id, "softmax_again")
    assert not (ws.fusions / "softmax_again").exists()
    promote(ws, r.id, "softmax_like")  # the same name again refreshes it


# --------------------------------------------------------------------------- the measured-wins gate

ENV = Env(device="cuda", gpu="NVIDIA H200", torch="2.11.0", triton="3.6.0", date="2026-12-02T12:00:00Z",
          copy_gbps=4000.0, l2_bytes=60 * 2**20, sm_count=132, cuda="13.0")


def bench_row(cid, shape, speedup, env=ENV):
    """A timed float32 row of the candidate: Inductor 10 us, the candidate 10 / speedup us."""
    variants = (VariantResult("inductor", Timing(0.010, 0.010, 0.010, 25, 100)),
                VariantResult("candidate", Timing(0.010 / speedup, 0.010 / speedup, 0.010 / speedup, 25, 100)))
    spec = TensorSpec(tuple(shape), "float32")
    return BenchRow(candidate=cid, name="exp_softmax", case=BenchCase(inputs=(spec,), models=("bert",)),
                    outputs=(spec,), bytes_moved=8 * spec.nbytes, roofline_ms=0.001, rotation=4,
                    variants=variants, env=env)


def fake_match(shape, dtype, device):
    """A match of ``exp(x0)`` in a one-op FX graph (the safety rules read the graph too)."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        val = torch.empty(shape, dtype=dtype, device=device)
    g = torch.fx.Graph()
    x0 = g.placeholder("x0")
    y = g.call_function(torch.ops.aten.exp.default, (x0,))
    g.output(y)
    x0.meta["val"], y.meta["val"] = val, val
    return SimpleNamespace(kwargs={"x0": x0}, graph=g, nodes=[y], output_nodes=lambda: [y])


@pytest.fixture()
def workspace_fusions(ws):
    """The tmp workspace's fusions, loaded by path as a user's would be."""
    from miner.runtime.fusions import Fusions

    return lambda: Fusions(ws.root)


def test_promote_writes_wins_json_and_the_fusion_fires_only_where_it_wins(ws, workspace_fusions):
    r = validated(ws)
    rows = [bench_row(r.id, (64, 1024), 1.25), bench_row(r.id, (6, 20), 0.5)]
    older = [bench_row(r.id, (6, 20), 2.0, env=dataclasses.replace(ENV, gpu="NVIDIA H100", date="2026-11-01"))]
    bench.save_results(older, older[0].env, candidate_dirs={r.id: r.path}, report_dir=None)
    bench.save_results(rows, ENV, candidate_dirs={r.id: r.path}, report_dir=None)
    out = promote(ws, r.id, "gated_exp")
    wins = json.loads((ws.fusions / "gated_exp" / "wins.json").read_text())
    assert ws.fusions / "gated_exp" / "wins.json" in out.files
    assert (wins["gpu"], wins["torch"], wins["triton"], wins["date"]) == ("NVIDIA H200", "2.11.0", "3.6.0", ENV.date)
    assert wins["source"] == f"candidates/{r.id}/bench.json" and wins["candidate"] == r.id
    assert [w["inputs"][0]["shape"] for w in wins["wins"]] == [[64, 1024]]  # the latest run (H200) only
    assert [w["inputs"][0]["shape"] for w in wins["loses"]] == [[6, 20]]

    fusions = workspace_fusions()
    module = fusions.load("gated_exp")
    assert module.WINS == wins
    assert wins["in_model"]["records"] == [_stored(IN_MODEL_WIN)]  # the promotion's evidence, for the gate
    assert not module.extra_check(fake_match((6, 20), torch.float32, "cuda"))  # no in-model record here
    assert module.extra_check(fake_match((64, 1024), torch.float32, "cuda"))  # in-model win at this context
    assert not module.extra_check(fake_match((128, 1024), torch.float32, "cuda"))  # unmeasured in a model
    assert not module.extra_check(fake_match((64, 1024), torch.bfloat16, "cuda"))  # another dtype
    assert module.extra_check(fake_match((6, 20), torch.float32, "cpu"))  # GPU timings: not on CPU

    # the pass's uuid follows wins.json: a new measurement invalidates Inductor's caches
    graph_pass = fusions.graph_pass(["gated_exp"])
    before = graph_pass.uuid()
    bench.save_results([bench_row(r.id, (6, 20), 1.1)], ENV, candidate_dirs={r.id: r.path}, report_dir=None)
    assert graph_pass.uuid() == before  # bench wrote its own file only
    assert ws.fusions / "gated_exp" / "wins.json" in promote(ws, r.id, "gated_exp").files  # promote refreshes it
    after = graph_pass.uuid()
    assert after != before
    (ws.fusions / "gated_exp" / "wins.json").unlink()
    assert graph_pass.uuid() not in (before, after)


def test_bench_import_writes_bench_json_only_and_names_the_fusions_to_refresh(ws, capsys):
    from miner import cli

    r = validated(ws)
    promote(ws, r.id, "gated_exp")
    target = ws.fusions / "gated_exp" / "wins.json"
    assert json.loads(target.read_text())["wins"] == []  # in-model evidence only
    fusion_files = {p: p.read_bytes() for p in (ws.fusions / "gated_exp").iterdir()}
    run = ws.root / "reports" / "gpu" / "run"
    bench.save_results([bench_row(r.id, (6, 20), 0.5), bench_row("pother", (6, 20), 2.0)], ENV,
                       candidate_dirs=None, report_dir=run, json_only=True)
    assert cli.main(["--workspace", str(ws.root), "bench", "--import", str(run / "bench.json")]) == 0
    assert f"miner promote {r.id} --name gated_exp" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in (ws.fusions / "gated_exp").iterdir()} == fusion_files
    assert (r.path / "bench.json").exists()
    promote(ws, r.id, "gated_exp")
    wins = json.loads(target.read_text())
    assert wins["wins"] == [] and wins["loses"][0]["speedup_vs_inductor"] == 0.5


REPO = __import__("pathlib").Path(__file__).resolve().parents[1]
REGION = "p37352563d9_x4"  # MegatronBert's attention region (four-per-call dropout), validated and measured on the GPU


def _body(path) -> list[str]:
    return [ln for ln in path.read_text().splitlines() if not ln.startswith("# ")]


@pytest.fixture()
def region_ws(tmp_path):
    import shutil

    ws = Workspace(tmp_path)
    shutil.copytree(REPO / "candidates" / REGION, ws.candidates / REGION)
    return ws


def test_a_region_candidate_promotes_with_its_validated_kernel(region_ws):
    r = promote(region_ws, REGION, "attention_softmax_dropout")
    folder = region_ws.fusions / "attention_softmax_dropout"
    assert _body(folder / "kernel.py") == _body(region_ws.candidates / REGION / "kernel.py")  # the validated kernel
    pattern = (folder / "pattern.py").read_text()
    assert 'OP_NAME = "miner::attention_softmax_dropout"' in pattern and "rewrite.wins_gate(" in pattern
    meta = json.loads((folder / "fusion.json").read_text())
    assert meta["lowering"]["rng"] == "philox4" and meta["pattern"]["id"] == "p37352563d9"  # the masks judge's nodes
    test = (region_ws.root / "tests" / "fusions" / "test_attention_softmax_dropout.py").read_text()
    assert 'bind("region_kernel", CASES)' in test and "test_same_mask_in_every_tiling" in test
    assert "test_step_with_its_masks_injected_matches_eager" in test
    assert any(p.name == "wins.json" for p in r.files)


def test_a_region_candidate_without_its_recorded_lowering_is_refused_with_the_command_to_regenerate(region_ws):
    path = region_ws.candidates / REGION / "candidate.json"
    meta = json.loads(path.read_text())
    del meta["lowering"]
    path.write_text(json.dumps(meta))
    with pytest.raises(UsageError, match="records no lowering.*miner generate --regions"):
        promote(region_ws, REGION, "attention_softmax_dropout")
    assert not (region_ws.fusions / "attention_softmax_dropout").exists()


@pytest.mark.parametrize("cid", sorted(p.parent.name for p in (REPO / "candidates").glob("*/candidate.json")
                                       if json.loads(p.read_text()).get("lowering")))
def test_a_region_candidates_json_renders_its_own_files_again(cid):
    """What ``miner promote`` renders from candidate.json alone (its prepared pattern and lowering) is the
    committed, validated kernel and pattern, names aside: here rendered with the candidate's own names."""
    from miner.generate import generate as gen, lower

    folder = REPO / "candidates" / cid
    meta = json.loads((folder / "candidate.json").read_text())
    prog = lower.lower(gen.spec_from_meta(meta))
    kernel = gen.render_kernel_py(prog, "# head\n")
    pattern = gen.render_pattern_py(prog, "# head\n", meta["op"], gen.KERNEL_IMPORT,
                                    gen.example_shapes(meta["observed"], prog.spec.n_inputs, prog.seed_inputs),
                                    f"Fusion candidate {cid} ({meta['label']}): {meta['ops']}.")
    assert [ln for ln in kernel.splitlines() if not ln.startswith("# ")] == _body(folder / "kernel.py")
    assert [ln for ln in pattern.splitlines() if not ln.startswith("# ")] == _body(folder / "pattern.py")


def test_a_reduction_region_promotes_and_its_fusion_passes_its_own_checks(tmp_path):
    """t5's position-bias-gradient reduction (kind ``reduce_region``): the fusion's kernel is the validated one,
    its pattern asks the gate, and the harness's checks pass on the fusion's own files."""
    import shutil

    from miner.core.candidate import Candidate
    from miner_testing import reduce_region as harness

    ws = Workspace(tmp_path)
    cid = "p86f4808f37"
    shutil.copytree(REPO / "candidates" / cid, ws.candidates / cid)
    (ws.candidates / cid / "in_model.json").unlink(missing_ok=True)
    promotion.write_evidence(ws, cid, [IN_MODEL_WIN])  # as `miner verify --ab --record` would
    promote(ws, cid, "bias_gradient")
    folder = ws.fusions / "bias_gradient"
    assert _body(folder / "kernel.py") == _body(ws.candidates / cid / "kernel.py")
    assert "rewrite.wins_gate(match, WINS, N_INPUTS)" in (folder / "pattern.py").read_text()
    test = (ws.root / "tests" / "fusions" / "test_bias_gradient.py").read_text()
    assert 'bind("reduce_region", CASES)' in test and "test_rewrite_fires_and_equals_eager_in_the_region_module" in test
    fusion = Candidate("bias_gradient", folder, json.loads((folder / "fusion.json").read_text()))
    harness.test_kernel_matches_float64_reference(fusion, {"entry": 0, "primes": "ODD", "dtype": None}, "cpu")
    harness.test_rewrite_fires_and_equals_eager_in_the_region_module(fusion, {})


def test_a_fusions_cases_table_reads_back_infinities():
    """t5's masked attention softmax fills with ``-inf``: its cases table once held a bare ``-inf``."""
    import math

    from miner.generate.fusion_test import literal

    row = {"scalars": [5, 0.1, -math.inf, math.inf], "shape": (2,), "nested": {"x": [math.nan]}}
    back = eval(literal(row))  # noqa: S307 - the generated module is Python read back the same way
    assert back["scalars"][:2] == [5, 0.1] and back["scalars"][2:] == [-math.inf, math.inf]
    assert back["shape"] == (2,) and math.isnan(back["nested"]["x"][0])
    assert literal(row).count('float("') == 3
