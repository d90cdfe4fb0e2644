"""The executors (miner/core/executor.py): the local pool and Ray, on scan (and the isolation helper).

The Ray tests share one local cluster (``ray.init(num_cpus=2)``, module-scoped) and skip when Ray
is not installed (``pip install -e .[ray]``; CI installs it). Each scan is of tiny fixture models in
inference mode: one forward graph each, seconds of compile.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import pytest
import torch

from miner.cli import main
from miner.core import executor as E
from miner.core.records import to_json
from miner.core.workspace import Workspace

GOOD = "tests.zoo_fixtures:good"
NORM = "tests.test_executor:norm_gelu"  # a second tiny model, other ops than GOOD's


class NormGelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x, labels=None):
        y = torch.nn.functional.gelu(self.proj(self.norm(x)))
        return {"loss": None if labels is None else (y - labels).pow(2).mean(), "y": y}


def norm_gelu(preset, mode, device):
    from miner_models import Built
    inputs = {"x": torch.randn(4, 8), "labels": torch.rand(4, 8)} if mode == "train" else {"x": torch.randn(4, 8)}
    return Built(NormGelu().to(device), inputs, lambda out: out["loss"])


def graph_digests(ws: Workspace) -> dict[str, str]:
    """Graph file name -> sha256 of its content without provenance (dates, versions, seconds):
    every node (op, target, args, users, shapes, dtypes, strides, module, kernels) and the kernel list."""
    out = {}
    for path in ws.graph_files():
        g = ws.load_graph(path)
        body = {"key": to_json(g.key), "nodes": to_json(g.nodes), "kernels": to_json(g.kernels)}
        out[str(path.relative_to(ws.captures))] = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    return out


# --------------------------------------------------------------------------- without Ray

def _boom():
    raise ValueError("bad input on purpose")


def test_in_subprocess_returns_values_and_names_crashes_and_hangs():
    # functions of importable modules only: the child imports them by name (pytest's test modules are not)
    assert E.in_subprocess(sum, ([1, 2, 3],), timeout=60) == 6
    with pytest.raises(RuntimeError, match="ValueError: invalid literal"):
        E.in_subprocess(int, ("x",), timeout=60)
    with pytest.raises(RuntimeError, match="exited with code 7"):
        E.in_subprocess(os._exit, (7,), timeout=60)
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match="timed out after 2s"):
        E.in_subprocess(time.sleep, (60,), timeout=2)
    assert time.perf_counter() - t0 < 30


def test_local_executor_keeps_order_records_errors_and_counts(capsys):
    said = []
    tasks = [E.Task("a", sum, ([1, 2],)), E.Task("b", _boom), E.Task("c", max, (3, 4))]
    outs = E.LocalExecutor(2).run(tasks, echo=said.append)
    assert [o.value for o in outs] == [3, None, 4]
    assert outs[1].error == "ValueError: bad input on purpose"
    assert len(said) == 3 and said[-1].endswith("(3/3 done, 0 running, 1 failed)")


def test_executor_flags_fail_in_one_line(tmp_path, monkeypatch, capsys):
    import sys
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    assert main(["--workspace", str(tmp_path), "scan", "--models", GOOD, "--executor", "ray"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs Ray" in err[0] and "pip install" in err[0]
    assert main(["--workspace", str(tmp_path), "scan", "--models", GOOD, "--address", "auto"]) != 0
    assert "--address needs --executor ray" in capsys.readouterr().err


def test_pack_and_unpack_carry_a_folder(tmp_path):
    (tmp_path / "fusions" / "a" / "__pycache__").mkdir(parents=True)
    (tmp_path / "fusions" / "a" / "pattern.py").write_text("X = 1\n")
    (tmp_path / "fusions" / "a" / "__pycache__" / "pattern.pyc").write_bytes(b"junk")
    files = E.pack(tmp_path, ["fusions"])
    assert files == {"fusions/a/pattern.py": b"X = 1\n"}
    assert (E.unpack(files, tmp_path / "copy") / "fusions/a/pattern.py").read_text() == "X = 1\n"


# --------------------------------------------------------------------------- on a local Ray cluster

@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    E.expose_checkout()  # the workers import this checkout's miner and tests.*
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield E.RayExecutor()  # joins the cluster above: closing it leaves the cluster up
    ray.shutdown()


CRASH = "tests.zoo_fixtures:crashes"  # os._exit(3) while building: the task dies mid-way, writing nothing


@pytest.fixture(scope="module")
def both(cluster, tmp_path_factory):
    """Two tiny models scanned by the local pool and by Ray (beside one that crashes), into two workspaces."""
    from miner.scan.scan import ScanOptions, scan

    local, remote = (Workspace(tmp_path_factory.mktemp(n)) for n in ("local", "ray"))
    said = []
    options = ScanOptions(modes=("infer",), jobs=2, timeout=300)
    r_local = scan([GOOD, NORM], options, workspace=local)
    r_ray = scan([GOOD, CRASH, NORM], options, workspace=remote, executor=cluster, echo=said.append)
    return local, remote, r_local, r_ray, said


def test_ray_writes_the_same_graphs_as_the_local_pool(both):
    local, remote, r_local, r_ray, said = both
    r_ray = [r for r in r_ray if r.model != CRASH]
    assert all(r.ok for r in r_local + r_ray), [r.error for r in r_local + r_ray]
    a, b = graph_digests(local), graph_digests(remote)
    assert len(a) == 2 and a == b  # one inference graph per model, node for node
    assert [(r.model, r.graphs, r.nodes_by_category, r.kernels) for r in r_local] == \
           [(r.model, r.graphs, r.nodes_by_category, r.kernels) for r in r_ray]
    # the driver saved the Ray workers' results, and their logs, into its own workspace
    assert remote.load_scan(NORM, "tiny", "infer").ok
    assert (remote.captures / "logs" / "tests.test_executor_norm_gelu.tiny.log").read_text().startswith("# ran on")
    assert any("submitting 3 model(s) to ray" in s for s in said)
    assert any(s.endswith("(3/3 done, 0 running or queued, 1 failed)") for s in said), said


def test_a_task_that_dies_midway_is_recorded_and_the_others_complete(both):
    _, remote, _, r_ray, said = both
    crashed = next(r for r in r_ray if r.model == CRASH)
    assert not crashed.ok and "exited with code 3" in crashed.error
    assert str(remote.root.resolve()) in crashed.error  # the log it names is the driver's copy
    assert remote.load_scan(CRASH, "tiny", "infer").error == crashed.error  # saved: a rerun retries it
    assert any(s.startswith(f"[{CRASH}] FAILED: worker exited with code 3") for s in said), said


def test_ray_resumes_from_what_is_saved_and_runs_nothing(both):
    from miner.scan.scan import ScanOptions, scan

    _, remote, _, _, _ = both

    class Refuses(E.RayExecutor):
        def run(self, tasks, on_done=None, echo=print):
            raise AssertionError(f"ran {[t.key for t in tasks]}")

    results = scan([GOOD, NORM], ScanOptions(modes=("infer",)), workspace=remote, executor=Refuses(),
                   echo=lambda s: None)
    assert [r.reused for r in results] == [True, True]


def test_a_hung_task_times_out_and_a_lost_ray_worker_is_retried_then_recorded(cluster):
    ex = E.RayExecutor(max_retries=1)
    tasks = [E.isolated("hangs", time.sleep, (120,), timeout=3),
             # os._exit in the task itself: the Ray worker process dies, as when a node or the OOM killer takes it
             E.Task("lost", os._exit, (9,)),
             E.isolated("fine", sum, ([2, 3],), timeout=60)]
    said = []
    t0 = time.perf_counter()
    hung, lost, fine = ex.run(tasks, echo=said.append)
    assert time.perf_counter() - t0 < 60
    assert fine.value == 5 and fine.error is None
    assert hung.value is None and hung.error == "RuntimeError: timed out after 3s"
    assert lost.value is None and lost.error and "Worker" in lost.error
    assert said[-1].endswith("(3/3 done, 0 running or queued, 2 failed)")


def test_bench_on_ray_gives_the_rows_of_the_local_run(cluster, tmp_path):
    """One task per (candidate, case), the candidate's folder carried as bytes: the same cases and numerics."""
    from miner import bench
    from miner.bench.remote import run_bench_on
    from miner.core import candidate as candidates
    from tests.test_bench import write_candidate

    write_candidate(tmp_path / "candidates", shapes=((2, 4, 8, 8), (6, 100)))
    cands = candidates.load_all(Workspace(tmp_path))
    options = bench.BenchOptions(device="cpu", variants=("eager", "candidate"), shapes="captured", replays=2)
    _, local = bench.run_bench(cands, options, log=lambda s: None, on_row=None)
    seen = []
    env, rows, failures = run_bench_on(cluster, cands, options, time_budget_s=None, on_row=seen.append,
                                       log=lambda s: None)
    assert failures == [] and len(rows) == 2 and len(seen) == 2 and env.interpret
    assert [r.case.label for r in rows] == [r.case.label for r in local]  # the plan's order
    for a, b in zip(local, rows):
        assert b.variant("candidate").numerics_ok and b.variant("candidate").rel_err == a.variant("candidate").rel_err


def test_on_cuda_each_model_asks_ray_for_one_gpu_and_its_compile_cpus(tmp_path, monkeypatch):
    """What `miner scan/profile --device cuda --executor ray` submits: one task per model, 1 GPU, CPUs/jobs CPUs."""
    from miner.scan import scan as S

    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    asked = []

    class Cluster:  # records the tasks instead of running them
        remote = True

        def largest_node(self, resource):
            return 64.0

        def describe(self):
            return "a cluster"

        def run(self, tasks, on_done=None, echo=print):
            asked.extend(tasks)
            for t in tasks:
                on_done(E.Outcome(t, error="not run"))

    options = S.ScanOptions(preset="base", device="cuda", jobs=4, profile=True)
    results = S.scan(["bert", "gpt2", "llama", "t5"], options, workspace=Workspace(tmp_path), executor=Cluster(),
                     echo=lambda s: None)
    assert [t.key for t in asked] == ["bert", "gpt2", "llama", "t5"]
    assert all(t.gpus == 1 and t.cpus == 16 and t.fn is S.scan_remote and t.args[0].profile for t in asked)
    assert all(not r.ok and r.error == "not run" for r in results)  # a lost task is a failed, saved result
    assert Workspace(tmp_path).load_scan("t5", "base", "train").error == "not run"
