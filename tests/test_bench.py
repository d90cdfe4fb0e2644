"""miner bench: the harness logic on the CPU (CI), and a real run on CUDA (``-m gpu``).

The candidate used here is hand-written (a softmax-like row kernel that follows the Candidate
API of docs/architecture.md), so these tests do not depend on ``miner generate``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from miner import bench
from miner.bench import roofline as rl
from miner.bench import run as bench_run
from miner.core import candidate as candidates
from miner.bench import BenchCase, BenchRow, Env, TensorSpec, Timing, VariantResult
from miner.core import dtypes
from miner.core.tensors import storage_elements

REPO = Path(__file__).resolve().parents[1]

PATTERN_PY = '''\
# hand-written test candidate (tests/test_bench.py): softmax-like chain, bf16 in, float32 math
import torch
aten, prims = torch.ops.aten, torch.ops.prims
N_INPUTS, N_SCALARS, N_OUTPUTS = 1, 1, 1


def pattern(x0, c0):
    t = prims.convert_element_type.default(x0, torch.float32)
    t = aten.mul.Tensor(t, c0)
    e = aten.exp.default(t)
    s = aten.sum.dim_IntList(e, [-1], True)
    d = aten.div.Tensor(e, s)
    return (prims.convert_element_type.default(d, torch.bfloat16),)
'''

KERNEL_PY = '''\
# hand-written test candidate (tests/test_bench.py)
import torch
import triton
import triton.language as tl


@triton.jit
def _row(x_ptr, y_ptr, n_cols, c0, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=float("-inf")).to(tl.float32)
    e = tl.exp(x * c0)
    y = e / tl.sum(e, axis=0)
    tl.store(y_ptr + row * n_cols + cols, y.to(tl.bfloat16), mask=mask)


def launch(x0, c0):
    x = x0.contiguous()
    n = x.shape[-1]
    y = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    _row[(x.numel() // n,)](x, y, n, c0, BLOCK=triton.next_power_of_2(n))
    return (y,)
'''


def write_candidate(root: Path, cid: str = "softmaxlike0", shapes=((2, 4, 64, 64), (128, 1000))) -> Path:
    """A candidate folder as ``miner generate`` would write it (Candidate API)."""
    d = Path(root) / cid
    d.mkdir(parents=True, exist_ok=True)
    (d / "pattern.py").write_text(PATTERN_PY)
    (d / "kernel.py").write_text(KERNEL_PY)
    observed = []
    for i, shape in enumerate(shapes):
        observed.append({"model": "bert" if i == 0 else "gpt2", "phase": "forward", "count": 2,
                         "inputs": [{"shape": list(shape), "dtype": "bfloat16", "stride": None}],
                         "scalars": [0.125], "outputs": [{"shape": list(shape), "dtype": "bfloat16"}]})
    meta = {"id": cid, "label": "softmax_like_test", "observed": observed,
            "pattern": {"occurrences": [{"graph": {"model": "bert", "preset": "tiny"}},
                                        {"graph": {"model": "gpt2", "preset": "tiny"}}]}}
    (d / "candidate.json").write_text(json.dumps(meta))
    return d


# --------------------------------------------------------------------------- statistics and roofline

def test_quantiles_match_numpy():
    np = pytest.importorskip("numpy")
    xs = [5.0, 1.0, 4.0, 2.0, 3.0, 10.0, 7.5]
    for q in (0.0, 0.2, 0.5, 0.8, 1.0):
        assert rl.quantile(xs, q) == pytest.approx(float(np.quantile(xs, q)))
    assert rl.summarize([3.0, 1.0, 2.0]) == (2.0, pytest.approx(1.4), pytest.approx(2.6))
    with pytest.raises(ValueError):
        rl.quantile([], 0.5)


def test_bytes_moved_counts_each_tensor_once_and_broadcast_storage():
    # layer norm: x bf16 [8192, 768] + weight f32 [768] broadcast (stride 0 over rows) -> out bf16
    x = ((8192, 768), "bfloat16", None)
    w = ((8192, 768), "float32", (0, 1))
    out = ((8192, 768), "bfloat16", None)
    assert rl.bytes_moved([x, w], [out]) == 2 * 8192 * 768 * 2 + 768 * 4
    assert rl.tensor_bytes((4, 3), "torch.float32") == 48
    assert storage_elements((2, 3), (1, 2)) == 6  # transposed: same storage
    with pytest.raises(ValueError):
        dtypes.size("float13")


def test_roofline_math():
    # 1 GB at 4000 GB/s = 0.25 ms; a kernel taking 0.5 ms reaches 50% of the roofline
    assert rl.roofline_ms(10**9, 4000.0) == pytest.approx(0.25)
    assert rl.roofline_share(10**9, 0.5, 4000.0) == pytest.approx(0.5)
    assert rl.achieved_gbps(10**9, 0.5) == pytest.approx(2000.0)
    assert math.isnan(rl.roofline_share(10**9, 0.0, 4000.0))


def test_rotation_leaves_l2_out():
    l2 = 60 * 2**20
    k = rl.rotation_count(12 * 2**20, l2)
    assert (k - 1) * 12 * 2**20 >= 3 * l2  # bytes touched between two uses of one set
    assert rl.rotation_count(10**10, l2) == 2  # one huge set: two alternate anyway
    assert rl.rotation_count(1, l2) == 64  # capped


# --------------------------------------------------------------------------- shapes

@pytest.mark.parametrize("model,shape,expected,roles", [
    ("bert", (2, 4, 64, 64), (16, 12, 512, 512), ("B", "H", "S", "S")),
    ("bert", (8, 64, 64), (192, 512, 512), ("B*H", "S", "S")),
    ("gpt2", (128, 1000), (8192, 50257), ("B*S", "vocab")),
    ("gpt2", (126, 1000), (8176, 50257), ("B*(S-1)", "vocab")),
    ("llama", (2, 64, 128), (16, 512, 2048), ("B", "S", "hidden")),
    ("llama", (2, 64, 512), (16, 512, 8192), ("B", "S", "inter")),
    ("t5", (128,), (768,), ("hidden",)),
    ("t5", (2, 1, 1, 64), (16, 1, 1, 512), ("B", "1", "1", "S")),
])
def test_derive_shape(model, shape, expected, roles):
    assert bench.derive_shape(shape, model) == (expected, roles)


def test_derive_shape_refuses_unknown_sizes():
    with pytest.raises(ValueError, match="matches no role"):
        bench.derive_shape((2, 77), "bert")
    with pytest.raises(ValueError, match="no published size"):
        bench.derive_shape((2, 64), "resnet")


def test_derived_case_keeps_layout_and_says_where_it_came_from():
    case = BenchCase(inputs=(TensorSpec((2, 64, 128), "bfloat16"),
                             TensorSpec((2, 64, 128), "float32", (0, 0, 1))), models=("bert",))
    d = bench.derive_case(case, "bert")
    assert d.source == "derived" and d.preset == "base" and d.models == ("bert",)
    assert d.inputs[0] == TensorSpec((16, 512, 768), "bfloat16", None)
    assert d.inputs[1].stride == (0, 0, 1)
    assert d.derived_from == case.inputs and d.roles[0] == "[B,S,hidden]"


def test_cases_from_candidate_json_and_plan(tmp_path):
    path = write_candidate(tmp_path)
    meta = json.loads((path / "candidate.json").read_text())
    meta["observed"].append(dict(meta["observed"][0], model="t5"))  # same signature in another model
    cases = bench.cases_from_meta(meta)
    assert len(cases) == 2
    assert cases[0].models == ("bert", "t5") and cases[0].count == 4 and cases[0].scalars == (0.125,)
    assert cases[0].preset == "tiny" and cases[0].phases == ("forward",)
    planned = bench.plan_cases(meta, "all")
    labels = {(c.source, c.label, c.models) for c in planned}
    # bert and t5 share the attention-softmax shape at base size: one case, both models
    assert ("derived", "bfloat16[16,12,512,512]", ("bert", "t5")) in labels
    assert ("derived", "bfloat16[8192,50257]", ("gpt2",)) in labels
    assert sum(c.source == "captured" for c in planned) == 2
    assert all(c.source == "captured" for c in bench.plan_cases(meta, "captured"))
    assert [c.models for c in bench.plan_cases(meta, "base", models=["gpt2"])] == [("gpt2",)]


def test_dtypes_cast_float_inputs_only_and_keep_observed_first(tmp_path):
    path = write_candidate(tmp_path)
    meta = json.loads((path / "candidate.json").read_text())
    observed = bench.plan_cases(meta, "captured")
    both = bench.plan_cases(meta, "captured", casts=("captured", "float16"))
    assert both[: len(observed)] == observed and len(both) == 2 * len(observed)
    cast = both[len(observed):]
    assert all(c.cast == "float16" and all(s.dtype == "float16" for s in c.inputs) for c in cast)
    assert [s.shape for s in cast[0].inputs] == [s.shape for s in observed[0].inputs]
    mask = bench.BenchCase(inputs=(bench.TensorSpec((4, 8), "bool"), bench.TensorSpec((4, 8), "float32")))
    assert [s.dtype for s in bench.cast_case(mask, "bfloat16").inputs] == ["bool", "bfloat16"]
    assert bench.cast_case(mask, "float32") is mask  # nothing to cast: the same case, merged away
    with pytest.raises(ValueError):
        bench.cast_case(mask, "int8")
    row = dataclasses.replace(_row(), case=cast[0])
    assert bench.row_from_json(json.loads(json.dumps(bench.row_to_json(row)))).case.cast == "float16"


# --------------------------------------------------------------------------- numerics

def test_compare_tolerances_and_nan_positions():
    import torch

    ref = torch.randn(64, 64, dtype=torch.float64)
    assert bench.compare([ref.float()], [ref])[2]
    assert bench.compare([ref.to(torch.bfloat16)], [ref])[2]
    assert not bench.compare([(ref * 1.01).float()], [ref])[2]
    assert bench.compare([(ref * 1.001).to(torch.bfloat16)], [ref])[2]
    bad = ref.clone()
    bad[0, 0] = float("nan")
    assert not bench.compare([bad.float()], [ref])[2]
    both = ref.clone()
    both[1, 1] = float("nan")
    assert bench.compare([both.float()], [both])[2]  # NaN where the reference has NaN is fine
    assert not bench.compare([ref[:2].float()], [ref])[2]


def test_float64_reference_widens_casts_inside_the_pattern(tmp_path):
    import torch

    cand = candidates.at(write_candidate(tmp_path))
    x = torch.randn(4, 100).to(torch.bfloat16)
    (ref,) = bench.reference64(cand.pattern_module.pattern, [x, 0.125])
    assert ref.dtype == torch.float64
    exact = torch.softmax(x.double() * 0.125, -1)
    assert (ref - exact).abs().max().item() < 1e-12


# --------------------------------------------------------------------------- records

def _row(**kw) -> BenchRow:
    env = Env(device="cuda", gpu="NVIDIA H200", torch="2.11.0", triton="3.6.0", date="2026-12-02T12:00:00Z",
              copy_gbps=4000.0, l2_bytes=60 * 2**20, sm_count=132, cuda="13.0")
    case = BenchCase(inputs=(TensorSpec((8192, 768), "bfloat16"),), scalars=(0.125,), models=("bert", "gpt2"),
                     source="derived", preset="base", roles=("[B*S,hidden]",),
                     derived_from=(TensorSpec((128, 128), "bfloat16"),), phases=("forward",), count=4)
    nbytes = 2 * 8192 * 768 * 2
    variants = (VariantResult("eager", Timing(0.05, 0.049, 0.051, 25, 100), 1e-3, 1e-3, True, None, 0.1),
                VariantResult("inductor", Timing(0.012, 0.0119, 0.0121, 25, 400), 1e-3, 1e-3, True, None, 3.0),
                VariantResult("max-autotune", None, None, None, None, "RuntimeError: boom", 5.0),
                VariantResult("candidate", Timing(0.010, 0.0099, 0.0101, 25, 400), 1e-3, 1e-3, True, None, 0.5),
                VariantResult("copy", Timing(0.008, 0.008, 0.008, 25, 400)))
    row = BenchRow(candidate="softmaxlike0", name="softmax_like", case=case,
                   outputs=(TensorSpec((8192, 768), "bfloat16"),), bytes_moved=nbytes,
                   roofline_ms=rl.roofline_ms(nbytes, 4000.0), rotation=9, variants=variants, env=env)
    return row


def test_row_json_round_trip_and_derived_numbers():
    row = _row()
    data = json.loads(json.dumps(bench.row_to_json(row)))
    assert bench.row_from_json(data) == row
    assert row.speedup() == pytest.approx(1.2)
    assert row.speedup(over="max-autotune") is None
    assert data["speedup_vs_inductor"] == pytest.approx(1.2)
    assert row.roofline_pct("candidate") == pytest.approx(100 * row.roofline_ms / 0.010)
    assert row.case.row_length == 768


def test_tables_wins_and_files(tmp_path):
    import dataclasses

    win = _row()
    lose = dataclasses.replace(win, case=dataclasses.replace(win.case, inputs=(TensorSpec((192, 512, 512), "bfloat16"),)),
                               variants=tuple(dataclasses.replace(v, timing=Timing(0.02, 0.02, 0.02, 25, 100))
                                              if v.name == "candidate" else v for v in win.variants))
    table = bench.wins_table([win, lose])["softmaxlike0"]
    assert len(table["wins"]) == 1 and len(table["loses"]) == 1
    assert table["max_winning_row"] == 768 and table["min_losing_row"] == 512
    md = bench.markdown_table([win, lose])
    assert "derived from bfloat16[128,128] as [B*S,hidden]" in md and "1.20x" in md and "0.60x" in md
    t = bench.targets([win, lose])
    assert t[0] == "- at least 1.0x Inductor: 1 of 2 timed shapes"
    assert any("slower than Inductor" in line and "0.60x" in line for line in t)
    # 768-wide row: candidate 10 us against a 6.3 us roofline = 63%: a miss, with the copy's share
    assert any("under 90% of the roofline" in line and "768" in line for line in t)
    cdir = tmp_path / "candidates" / "softmaxlike0"
    cdir.mkdir(parents=True)
    written = bench.save_results([win, lose], win.env, candidate_dirs={"softmaxlike0": cdir},
                                 report_dir=tmp_path / "reports" / "gpu" / "x")
    names = {p.name for p in written}
    assert {"bench.json", "bench.md", "wins.json"} <= names
    assert bench.load_rows(cdir / "bench.json") == [win, lose]
    assert bench.load_rows(tmp_path / "reports" / "gpu" / "x" / "bench.json") == [win, lose]
    # a second run on the same GPU replaces that GPU's rows, another GPU's stay
    other = dataclasses.replace(win, env=dataclasses.replace(win.env, gpu="NVIDIA H100"))
    bench.save_results([other], other.env, candidate_dirs={"softmaxlike0": cdir}, report_dir=None)
    bench.save_results([win], win.env, candidate_dirs={"softmaxlike0": cdir}, report_dir=None)
    assert {r.env.gpu for r in bench.load_rows(cdir / "bench.json")} == {"NVIDIA H100", "NVIDIA H200"}
    assert len(bench.load_rows(cdir / "bench.json")) == 2
    assert bench.gpu_slug(win.env) == "h200"


# --------------------------------------------------------------------------- CLI

def test_no_cuda_is_one_clear_line_and_nonzero(tmp_path, monkeypatch, capsys):
    import torch
    from miner import cli

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    write_candidate(tmp_path / "candidates")
    assert cli.main(["--workspace", str(tmp_path), "bench"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a CUDA GPU" in err[0] and "--allow-cpu" in err[0]


def test_unknown_candidate_and_variant(tmp_path, monkeypatch, capsys):
    import torch
    from miner import cli

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    write_candidate(tmp_path / "candidates")
    assert cli.main(["--workspace", str(tmp_path), "bench", "--candidates", "nope"]) == 2
    assert "softmaxlike0" in capsys.readouterr().err
    assert cli.main(["--workspace", str(tmp_path), "bench", "--variants", "eager,fast"]) == 2
    assert "unknown variant" in capsys.readouterr().err


def test_cpu_smoke_run_end_to_end(tmp_path):
    """The whole command on the CPU: Triton interpreter for the kernel, wall-clock times."""
    write_candidate(tmp_path / "candidates", shapes=((2, 4, 8, 8), (6, 100)))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "miner", "--workspace", str(tmp_path), "bench", "--allow-cpu",
                           "--shapes", "captured", "--variants", "eager,candidate", "--replays", "2",
                           "--out", str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = bench.load_rows(tmp_path / "out" / "bench.json")
    assert len(rows) == 2
    for r in rows:
        assert r.env.interpret and r.env.device == "cpu"
        cand = r.variant("candidate")
        assert cand.numerics_ok and cand.timing is not None and cand.rel_err < 1e-2
    assert (tmp_path / "candidates" / "softmaxlike0" / "bench.json").exists()
    assert "TRITON_INTERPRET=1" in (tmp_path / "out" / "bench.md").read_text()


@pytest.mark.slow
def test_cpu_smoke_with_inductor(tmp_path):
    write_candidate(tmp_path / "candidates", shapes=((6, 100),))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "miner", "--workspace", str(tmp_path), "bench", "--allow-cpu",
                           "--shapes", "captured", "--replays", "2", "--out", str(tmp_path / "out")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = bench.load_rows(tmp_path / "out" / "bench.json")
    assert all(v.numerics_ok for v in row.variants), row.variants


# --------------------------------------------------------------------------- GPU

@pytest.mark.gpu
def test_gpu_bench_softmax_like(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cand = candidates.at(write_candidate(tmp_path, shapes=((8192, 768),)))
    options = bench.BenchOptions(device="cuda", shapes="captured", replays=5)
    env, rows = bench.run_bench([cand], options, log=lambda s: None)
    (row,) = rows
    # eager is the float64 check's subject too; a variant with no check (None) is not a failure
    assert all(v.numerics_ok is not False and v.error is None for v in row.variants), row.variants
    assert row.variant("candidate").numerics_ok is True
    assert row.rotation >= 2 and env.copy_gbps > 100
    assert row.ms("candidate") > 0


def test_run_bench_orders_base_cases_first_and_keeps_to_the_budget(tmp_path, monkeypatch):
    cand = candidates.at(write_candidate(tmp_path))
    seen = []
    monkeypatch.setattr(bench_run, "bench_case", lambda c, case, env, **kw: seen.append(case) or case)
    monkeypatch.setattr(bench_run, "environment", lambda device, bw=None: _row().env)
    env, rows = bench.run_bench([cand], bench.BenchOptions(device="cuda"), log=lambda s: None)
    assert [c.preset for c in seen] == ["base", "base", "tiny", "tiny"]
    logs = []
    env, rows = bench.run_bench([cand], bench.BenchOptions(device="cuda"), time_budget_s=-1.0, log=logs.append)
    assert rows == [] and sum("not timed (time budget)" in line for line in logs) == 4


def test_import_a_run_table_into_candidate_folders(tmp_path, capsys):
    from miner import cli

    write_candidate(tmp_path / "candidates")
    row = _row()
    run = tmp_path / "reports" / "gpu" / "run"
    bench.save_results([row], row.env, candidate_dirs=None, report_dir=run)
    assert cli.main(["--workspace", str(tmp_path), "bench", "--import", str(run / "bench.json")]) == 0
    assert bench.load_rows(tmp_path / "candidates" / "softmaxlike0" / "bench.json") == [row]
    assert "at least 1.0x Inductor: 1 of 1" in capsys.readouterr().out


def test_gpu_timing_lock_is_exclusive(tmp_path, monkeypatch):
    import fcntl

    lock = tmp_path / "gpu.lock"
    monkeypatch.setenv("MINER_GPU_LOCK", str(lock))
    with bench.gpu_timing_lock():
        with open(lock, "a") as f, pytest.raises(BlockingIOError):
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released
    monkeypatch.delenv("MINER_GPU_LOCK")
    with bench.gpu_timing_lock():
        pass
