"""The step profile (miner.scan.profile): the join of the kernel table with the capture's kernel map
on the committed H200 captures, the saved file, the composition, and `miner profile` on the CPU."""

from __future__ import annotations

import tarfile
from collections import Counter
from pathlib import Path

import pytest

from miner.cli import main
from miner.core.workspace import Workspace
from miner.mine import regions
from miner.scan import profile as prof
from miner.scan.profile import KernelTime, RawProfile, build, classify

CAPTURES = Path(__file__).resolve().parents[1] / "reports" / "gpu" / "2026-12-02-h200-scan" / "captures.tgz"
BW = 4.12e12


@pytest.fixture(scope="module")
def h200_graphs(tmp_path_factory):
    root = tmp_path_factory.mktemp("h200")
    with tarfile.open(CAPTURES) as t:
        t.extractall(root, filter="data")
    ws = Workspace(root)
    return {m: [g for g in ws.load_graphs([m])] for m in ("bert", "gpt2")}


def synthetic_raw(graphs, us_per_site=7.0, gb=lambda gi, name: 0.001 * (gi + 1)):
    """A kernel table as the profiler would give it for ``graphs`` (names without handles, merged)."""
    sites = Counter()
    for g in graphs:
        for k in g.kernels:
            sites[k.name.rpartition(":")[0]] += 1
    rows = [KernelTime(n, classify(n), us_per_site * c, float(c)) for n, c in sites.items() if n.startswith("triton")]
    rows.append(KernelTime("nvjet_sm90_tst_256x128_64x4_2x1_v_bz_coopA_TNT", "gemm", 8000.0, 150.0))
    module_gb = [{n: gb(gi, n) for n in {k.name.rpartition(":")[0] for k in g.kernels}} for gi, g in enumerate(graphs)]
    return RawProfile([30.0, 28.0, 29.0, 31.0, 27.0], rows, BW, module_gb, {}, 5)


def test_join_maps_every_triton_call_site(h200_graphs):
    graphs = h200_graphs["gpt2"]
    raw = synthetic_raw(graphs)
    p = build(raw, graphs, model="gpt2", preset="base", mode="train", device="cuda")
    seen = Counter((k.graph, s) for k in p.kernels for s in k.sites)
    triton_sites = [(str(g.key), k.name) for g in graphs for k in g.kernels if k.name.startswith("triton")]
    assert sorted(seen) == sorted(triton_sites) and set(seen.values()) == {1}
    # time is conserved through the split between graphs
    assert sum(k.us_per_step for k in p.kernels) == pytest.approx(sum(k.us_per_step for k in raw.kernels))
    # every site's nodes are the kernel map's
    for k in p.kernels:
        g = next(g for g in graphs if str(g.key) == k.graph) if k.graph else None
        for site, nodes in zip(k.sites, k.nodes):
            assert nodes and all(any(r.name == site for r in g.node(n).kernels) for n in nodes)
    assert p.step_ms == 29.0 and p.step_p20_ms < p.step_ms < p.step_p80_ms


def test_name_shared_by_forward_and_backward_is_split_by_sites_and_bytes(h200_graphs):
    graphs = h200_graphs["gpt2"]
    name = "triton_poi_fused__to_copy_11"  # launched by both gpt2 graphs (each numbers its own kernels)
    per_graph = [sum(k.name.rpartition(":")[0] == name for k in g.kernels) for g in graphs]
    assert all(per_graph)
    p = build(synthetic_raw(graphs), graphs, model="gpt2", preset="base", mode="train", device="cuda")
    rows = {k.graph: k for k in p.kernels if k.name == name}
    assert len(rows) == 2 and all(r.split for r in rows.values())
    weights = [n * 0.001 * (gi + 1) for gi, n in enumerate(per_graph)]
    total = 7.0 * sum(per_graph)
    for gi, g in enumerate(graphs):
        r = rows[str(g.key)]
        assert r.us_per_step == pytest.approx(total * weights[gi] / sum(weights))
        assert r.calls_per_step == per_graph[gi] and r.gb_per_call == 0.001 * (gi + 1)
        assert r.floor_us_per_step == pytest.approx(r.gb_per_call * 1e9 / BW * 1e6 * per_graph[gi])
        assert r.bytes_from == "module"


def test_bytes_fall_back_to_live_kernels_by_name(h200_graphs):
    graphs = h200_graphs["bert"]
    raw = synthetic_raw(graphs)
    name = next(k.name for k in raw.kernels if k.kind.startswith("triton"))
    for g in raw.module_gb:
        g.pop(name, None)
    raw.live_gb = {name: 0.5}
    p = build(raw, graphs, model="bert", preset="base", mode="train", device="cuda")
    (row,) = [k for k in p.kernels if k.name == name]
    assert row.gb_per_call == 0.5 and row.bytes_from == "live"
    assert {k.bytes_from for k in p.kernels if k.kind == "gemm"} == {None}


def test_kernel_in_no_kernel_map_takes_its_bytes_from_the_modules(h200_graphs):
    """A Triton kernel the capture's map lacks (Inductor's mix-order reductions, before
    track_mix_order_reductions) still gets Inductor's byte count from the compiled module."""
    graphs = h200_graphs["bert"]
    raw = synthetic_raw(graphs)
    name = "triton_per_fused__to_copy_add_native_dropout_backward_native_layer_norm_backward_view_9"
    raw.kernels.append(KernelTime(name, classify(name), 515.0, 11.0))
    raw.module_gb[1][name] = 0.05
    p = build(raw, graphs, model="bert", preset="base", mode="train", device="cuda")
    (row,) = [k for k in p.kernels if k.name == name]
    assert not row.sites and row.gb_per_call == 0.05 and row.bytes_from == "module"
    assert row.floor_us_per_step == pytest.approx(0.05e9 / BW * 1e6 * 11)
    raw.module_gb[0][name] = 0.07  # two modules disagree: no guess
    p = build(raw, graphs, model="bert", preset="base", mode="train", device="cuda")
    (row,) = [k for k in p.kernels if k.name == name]
    assert row.gb_per_call is None and row.floor_us_per_step is None


def test_regions_carry_the_measured_times(h200_graphs):
    graphs = h200_graphs["bert"] + h200_graphs["gpt2"]
    profiles = [build(synthetic_raw(h200_graphs[m]), h200_graphs[m], model=m, preset="base", mode="train",
                      device="cuda") for m in ("bert", "gpt2")]
    rps = regions.group(graphs, profiles)
    occs = [o for rp in rps for o in rp.occurrences]
    assert occs and all(o.source == "measured" and o.us_per_step > 0 for o in occs)
    measured = sum(o.us_per_step for o in occs)
    triton = sum(k.us_per_step for p in profiles for k in p.kernels if k.sites)
    assert measured == pytest.approx(triton)  # every mapped Triton microsecond lands in one region
    assert rps[0].above_floor_us >= rps[-1].above_floor_us


def test_save_load_and_composition(tmp_path, h200_graphs):
    graphs = h200_graphs["bert"]
    p = build(synthetic_raw(graphs, gb=lambda gi, n: 1e-5), graphs, model="bert", preset="base", mode="train",
              device="cuda")
    path = prof.save(Workspace(tmp_path), p)
    assert path == tmp_path / "profiles" / "bert" / "base" / "train.profile.json"
    q = prof.load(path)
    assert q == p
    assert prof.load_all(tmp_path, ["bert"]) == [p] and prof.load_all(tmp_path, ["gpt2"]) == []
    c = p.composition()
    assert c["gemm"] == pytest.approx(8.0)
    kernels = sum(k.us_per_step for k in p.kernels) / 1e3
    assert sum(v for k, v in c.items() if k != "idle") == pytest.approx(kernels)
    assert c["idle"] == pytest.approx(max(0.0, p.step_ms - kernels))
    t = p.totals()
    assert t["triton_ms"] == pytest.approx(c["triton_floor"] + c["triton_above_floor"])


def test_corrupt_profile_is_a_one_line_error(tmp_path):
    from miner.core.errors import WorkspaceError
    path = prof.profile_path(tmp_path, "bert", "base", "train")
    path.parent.mkdir(parents=True)
    path.write_text('{"schema": 1, "kind": "StepProfile", "profile": {"model": "bert"}}')
    with pytest.raises(WorkspaceError, match="malformed profile"):
        prof.load(path)


def test_miner_profile_on_cpu_end_to_end(tmp_path, capsys):
    """The real path: scan worker, capture, profile in the same process, saved file, printed tables."""
    model = "tests.zoo_fixtures:good"
    assert main(["--workspace", str(tmp_path), "profile", "--models", model, "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "step ms" in out and "top regions" in out and "Triton floor" in out
    [p] = prof.load_all(tmp_path)
    assert p.model == model and p.device == "cpu" and p.steps_timed == 20 and p.step_ms > 0
    assert p.recompiled == 0 and any(k.kind == "gemm" for k in p.kernels)
    assert (tmp_path / "mined" / "regions.json").exists()
    # a second call reuses the saved train profile, and --also-infer adds the inference step
    assert main(["--workspace", str(tmp_path), "profile", "--models", model, "--device", "cpu",
                 "--also-infer", model]) == 0
    out = capsys.readouterr().out
    assert "reusing" in out and "infer" in out
    assert sorted(p.mode for p in prof.load_all(tmp_path)) == ["infer", "train"]
    assert main(["--workspace", str(tmp_path), "profile", "--show", "--device", "cpu"]) == 0


def test_miner_profile_needs_models_or_show(tmp_path, capsys):
    assert main(["--workspace", str(tmp_path), "profile", "--device", "cpu"]) == 2
    assert "--models" in capsys.readouterr().err


@pytest.mark.gpu
def test_gpu_profile_joins_every_triton_kernel(tmp_path):
    """On CUDA: every profiled Triton kernel is a captured call site with Inductor's byte count."""
    model = "tests.zoo_fixtures:good"
    assert main(["--workspace", str(tmp_path), "profile", "--models", model, "--device", "cuda",
                 "--preset", "tiny"]) == 0
    [p] = prof.load_all(tmp_path)
    triton = [k for k in p.kernels if k.kind.startswith("triton")]
    assert triton and p.recompiled == 0
    assert all(k.sites and k.gb_per_call and k.floor_us_per_step for k in triton), \
        [(k.name, k.sites, k.gb_per_call) for k in triton]
    assert 1e11 < p.copy_bw < 1e14 and p.step_p20_ms <= p.step_ms <= p.step_p80_ms
