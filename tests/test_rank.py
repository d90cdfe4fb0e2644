"""Ranking, families and `miner candidates` on a small synthetic workspace.

``build_workspace`` writes a workspace the way the other stages do (``miner.core.pattern.save_patterns``,
candidate.json per docs/architecture.md "Candidate API", ``miner.bench.results.save_results``), so these
tests break when a producer's format drifts from what ranking reads. The report tests reuse it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from miner.rank import costmodel
from miner.rank import families
from miner.rank import rank
from miner.cli import main
from miner.core.errors import UsageError
from miner.core.pattern import (Counts, InductorView, Occurrence, Pattern, PatternNode, Support, Verdict,
                           canonical_form, ops_summary, pattern_id, save_patterns, to_json)
from miner.core.records import GraphKey, KernelRef, ScanResult
from miner.core import dtypes
from miner.core.tensors import TensorSpec
from miner.core.workspace import Workspace, write_json

A = "aten."
BANDWIDTH_GBPS = 3000.0


def node(op: str, cat: str, *args) -> PatternNode:
    return PatternNode(op, cat, args)


def SOFTMAX(cast: bool = False):
    nodes = [node(A + "amax.default", "reduction", {"input": 0}, [-1], True),
             node(A + "sub.Tensor", "pointwise", {"input": 0}, {"node": 0}),
             node(A + "exp.default", "pointwise", {"node": 1}),
             node(A + "sum.dim_IntList", "reduction", {"node": 2}, [-1], True),
             node(A + "div.Tensor", "pointwise", {"node": 2}, {"node": 3})]
    if cast:
        nodes.append(node("prims.convert_element_type.default", "pointwise", {"node": 4}, {"dtype": "bfloat16"}))
    return nodes


RMSNORM = [node(A + "pow.Tensor_Scalar", "pointwise", {"input": 0}, 2),
           node(A + "mean.dim", "reduction", {"node": 0}, [-1], True),
           node(A + "add.Tensor", "pointwise", {"node": 1}, {"const": 0}),
           node(A + "rsqrt.default", "pointwise", {"node": 2}),
           node(A + "mul.Tensor", "pointwise", {"input": 0}, {"node": 3}),
           node(A + "mul.Tensor", "pointwise", {"input": 1}, {"node": 4})]
GELU = [node(A + "mul.Tensor", "pointwise", {"input": 0}, {"const": 0}),
        node(A + "erf.default", "pointwise", {"node": 0}),
        node(A + "add.Tensor", "pointwise", {"node": 1}, 1),
        node(A + "mul.Tensor", "pointwise", {"input": 0}, {"const": 1}),
        node(A + "mul.Tensor", "pointwise", {"node": 3}, {"node": 2})]
SILU_MUL = [node(A + "sigmoid.default", "pointwise", {"input": 0}),
            node(A + "mul.Tensor", "pointwise", {"input": 0}, {"node": 0}),
            node(A + "mul.Tensor", "pointwise", {"node": 1}, {"input": 1})]
ADD_TANH = [node(A + "add.Tensor", "pointwise", {"input": 0}, {"input": 1}),
            node(A + "tanh.default", "pointwise", {"node": 0})]


def make_pattern(nodes, n_inputs, n_consts, occs, n_kernels=2, rejected=0) -> Pattern:
    """A pattern with ``occs`` = [(model, phase, input shapes, dtype, count)] and ``rejected`` unsafe ones."""
    outputs = (len(nodes) - 1,)
    occurrences, graphs, models = [], [], []
    for model, phase, shapes, dtype, count in occs:
        key = GraphKey(model, "tiny", "train", phase)
        graphs.append(str(key))
        models.append(model)
        for i in range(count):
            occurrences.append(Occurrence(
                graph=key, nodes=tuple(f"{model}_{i}_{j}" for j in range(len(nodes))),
                input_meta=tuple(TensorSpec(tuple(s), dtype) for s in shapes),
                output_meta=(TensorSpec(tuple(shapes[0]), dtype),), phase=phase, verdict=Verdict(True),
                kernels=tuple(KernelRef(f"triton_k{j}", "reduction") for j in range(n_kernels))))
    for i in range(rejected):
        model, phase, shapes, dtype, _ = occs[0]
        occurrences.append(Occurrence(
            graph=GraphKey(model, "tiny", "train", phase), nodes=tuple(f"bad_{i}_{j}" for j in range(len(nodes))),
            input_meta=tuple(TensorSpec(tuple(s), dtype) for s in shapes), phase=phase,
            verdict=Verdict.of(["users: n1 is used outside and the cap of extra outputs is reached"])))
    safe = sum(o.verdict.ok for o in occurrences)
    canon = canonical_form(nodes, n_inputs, n_consts)
    return Pattern(id=pattern_id(canon), nodes=tuple(nodes), n_inputs=n_inputs, n_consts=n_consts, outputs=outputs,
                   ops=ops_summary(nodes), support=Support(tuple(dict.fromkeys(models)), tuple(dict.fromkeys(graphs))),
                   counts=Counts(len(occurrences), len(occurrences), safe, {}),
                   inductor=InductorView({str(n_kernels): safe}, 0 if n_kernels > 1 else safe, n_kernels > 1),
                   rejections={"users: n1 is used outside and the cap of extra outputs is reached": rejected} if rejected else {},
                   occurrences=tuple(occurrences))


def synthetic_time_ms(nbytes: float, kernels: int) -> float:
    """A made-up device: memory time at BANDWIDTH_GBPS plus 3 us per launch."""
    return nbytes / (BANDWIDTH_GBPS * 1e9) * 1e3 + kernels * 0.003


def write_candidate(ws: Workspace, p: Pattern, label: str, validation: dict | None = None) -> Path:
    d = ws.candidates / p.id
    observed = []
    groups = {}
    for o in p.occurrences:
        if o.verdict.ok:
            k = (o.graph.model, o.phase, tuple((m.shape, m.dtype) for m in o.input_meta))
            groups.setdefault(k, [o, 0])[1] += 1
    for (model, phase, _), (o, count) in groups.items():
        ins = [{"shape": list(m.shape), "dtype": m.dtype, "stride": None} for m in o.input_meta]
        outs = [{"shape": list(m.shape), "dtype": m.dtype} for m in o.output_meta]
        nin = sum(math.prod(m.shape) * dtypes.size(m.dtype) for m in o.input_meta)
        nout = sum(math.prod(m.shape) * dtypes.size(m.dtype) for m in o.output_meta)
        observed.append({"model": model, "phase": phase, "count": count, "inputs": ins, "scalars": [],
                         "outputs": outs, "bytes": {"unfused": 4 * (nin + nout), "fused": nin + nout,
                                                    "inductor": nin * o.n_kernels + nout},
                         "inductor_kernels": o.n_kernels})
    write_json(d / "candidate.json", {"id": p.id, "miner_version": "0.1.0", "op": f"miner::c{p.id}", "label": label,
                                      "pattern": to_json(p), "observed": observed})
    (d / "pattern.py").write_text(f"# generated by miner 0.1.0 for pattern {p.id}\n")
    if validation is not None:
        write_json(d / "validation.json", validation)
    return d


def bench_rows(p: Pattern, gpu: str = "NVIDIA H200", date: str = "2026-12-02T11:00:00Z", slow: float = 1.0):
    """BenchRows for every observed input set of ``p`` (captured and derived), times from a formula."""
    from miner import bench as B

    env = B.Env(device="cuda", gpu=gpu, torch="2.11.0", triton="3.6.0", date=date, copy_gbps=BANDWIDTH_GBPS,
                l2_bytes=50 << 20)
    rows = []
    meta = {"observed": json.loads(json.dumps(write_observed(p)))}
    cases = B.cases_from_meta(meta)
    cases += [B.derive_case(c, m) for c in cases for m in c.models]
    for case in cases:
        nin = sum(s.nbytes for s in case.inputs)
        big = max(case.inputs, key=lambda s: s.nbytes)
        nout = big.nbytes
        k = p.inductor.typical_kernels or 1
        t = {"eager": synthetic_time_ms(4 * (nin + nout), len(p.nodes)),
             "inductor": synthetic_time_ms(nin * k + nout, k),
             "max-autotune": synthetic_time_ms(nin * k + nout, k) * 0.97,
             "candidate": synthetic_time_ms(nin + nout, 1) * slow}
        variants = tuple(B.VariantResult(name, B.Timing(ms, ms * 0.97, ms * 1.04, 25, 10), numerics_ok=True)
                         for name, ms in t.items())
        rows.append(B.BenchRow(candidate=p.id, name=p.id, case=case, outputs=(B.TensorSpec(big.shape, big.dtype),),
                               bytes_moved=nin + nout, roofline_ms=(nin + nout) / (BANDWIDTH_GBPS * 1e9) * 1e3,
                               rotation=4, variants=variants, env=env))
    return env, rows


def write_observed(p: Pattern) -> list[dict]:
    seen = {}
    for o in p.occurrences:
        if o.verdict.ok:
            k = (o.graph.model, o.phase, tuple((m.shape, m.dtype) for m in o.input_meta))
            if k not in seen:
                seen[k] = {"model": o.graph.model, "phase": o.phase, "count": 1, "scalars": [],
                           "inputs": [{"shape": list(m.shape), "dtype": m.dtype, "stride": None} for m in o.input_meta]}
            else:
                seen[k]["count"] += 1
    return list(seen.values())


def patterns_zoo() -> dict[str, Pattern]:
    attn = [2, 4, 64, 64]
    hid = [2, 64, 128]
    return {
        "softmax": make_pattern(SOFTMAX(), 1, 0, [("bert", "forward", [attn], "float32", 2),
                                                  ("gpt2", "forward", [attn], "float32", 2)], n_kernels=3),
        "softmax_cast": make_pattern(SOFTMAX(cast=True), 1, 0, [("llama", "forward", [attn], "float32", 2)],
                                     n_kernels=3),
        "rmsnorm": make_pattern(RMSNORM, 2, 1, [("llama", "forward", [hid, [128]], "float32", 5)], n_kernels=2),
        "gelu": make_pattern(GELU, 1, 2, [("bert", "forward", [[2, 64, 512]], "float32", 2),
                                          ("gpt2", "forward", [[2, 64, 512]], "float32", 2)],
                             n_kernels=1, rejected=2),
        "silu_mul": make_pattern(SILU_MUL, 2, 0, [("llama", "forward", [[2, 64, 512], [2, 64, 512]], "float32", 2)],
                                 n_kernels=2),
        "add_tanh": make_pattern(ADD_TANH, 2, 0, [("t5", "backward", [hid, hid], "float32", 1)], n_kernels=2),
    }


def build_workspace(root: Path, bench: bool = True, candidates: bool = True, scans: bool = True,
                    more_bench: bool = False) -> Workspace:
    """Six patterns; four candidates (three benchmarked when ``bench``), one promoted.

    ``more_bench`` also benchmarks gelu and t5's softmax, enough points to cross-validate the cost model.
    """
    ws = Workspace(root)
    pats = patterns_zoo()
    if more_bench:
        pats["softmax"] = make_pattern(SOFTMAX(), 1, 0, [("bert", "forward", [[2, 4, 64, 64]], "float32", 2),
                                                         ("gpt2", "forward", [[2, 4, 64, 64]], "float32", 2),
                                                         ("t5", "forward", [[2, 4, 64, 64]], "float32", 2)],
                                       n_kernels=3)
    save_patterns(ws, pats.values(), params={"min_support": 2}, stats={})
    if scans:
        for model in ("bert", "gpt2", "llama", "t5"):
            ws.save_scan(ScanResult(model, "tiny", "train", "cpu", True, graphs=(GraphKey(model, "tiny", "train", "forward"),),
                                    nodes_by_category={"pointwise": 120, "reduction": 14, "view": 60, "matmul": 24},
                                    kernels=40, seconds=20.0))
    if candidates:
        ok = {"ok": True, "failure": None, "device": "cpu", "checks": [
            {"kind": "numerics", "case": "observed float32[2,4,64,64]", "ok": True, "detail": "", "max_abs": 1e-7},
            {"kind": "rewrite", "case": "gpt2 train", "ok": True, "detail": "outputs and grads match", "matches": 2}]}
        write_candidate(ws, pats["softmax"], "softmax_like", ok)
        write_candidate(ws, pats["rmsnorm"], "rms_norm", ok)
        write_candidate(ws, pats["silu_mul"], "silu_mul", ok)
        write_candidate(ws, pats["softmax_cast"], "softmax_like",
                        {"ok": False, "failure": "bfloat16 max_abs_err 0.2 > 0.016", "checks": [
                            {"kind": "numerics", "case": "odd bf16", "ok": False, "detail": "max_abs 0.2 > 0.016"}]})
        fusion = ws.fusions / "softmax_like"
        fusion.mkdir(parents=True)
        write_json(fusion / "fusion.json", {"name": "softmax_like", "pattern_id": pats["softmax"].id})
        if bench:
            from miner.bench.results import save_results
            benched = [("softmax", 1.0), ("rmsnorm", 1.2), ("silu_mul", 1.0)]
            if more_bench:
                write_candidate(ws, pats["gelu"], "gelu_erf", ok)
                benched.append(("gelu", 1.1))
            for name, slow in benched:
                env, rows = bench_rows(pats[name], slow=slow)
                save_results(rows, env, candidate_dirs={pats[name].id: ws.candidates / pats[name].id},
                             report_dir=ws.reports / "gpu" / f"2026-12-02-h200-{name}" if name == "rmsnorm" else None)
    return ws


# --------------------------------------------------------------------------- tests

@pytest.fixture
def ws(tmp_path) -> Workspace:
    return build_workspace(tmp_path)


def test_ranking_orders_by_saved_time_and_marks_sources(ws):
    rv = rank.review(ws)
    pats = patterns_zoo()
    ids = [r.id for r in rv.rows]
    assert set(ids) == {p.id for p in pats.values()}
    saved = [r.saved_ms.value for r in rv.rows]
    assert saved == sorted(saved, reverse=True)
    by = {r.id: r for r in rv.rows}
    sm = by[pats["softmax"].id]
    assert sm.status == "promoted" and sm.candidate.fusion == "softmax_like"
    # every call of a benchmarked candidate was timed at its published size: all measured
    assert sm.calls and all(e.saved_ms.measured for e in sm.calls)
    assert sm.saved_ms.measured and sm.speedup.measured
    # the measured saving is exactly Inductor minus candidate, times the count
    e = sm.calls[0]
    assert e.total_saved_ms == pytest.approx((e.bench.times["inductor"][0] - e.bench.times["candidate"][0]) * e.call.count)
    # a pattern without candidate is predicted, never measured
    gelu = by[pats["gelu"].id]
    assert gelu.status == "mined" and not gelu.saved_ms.measured and gelu.saved_ms.source in ("model", "analytical")
    assert gelu.safe_share == pytest.approx(4 / 6)
    # Inductor emits gelu as one kernel: fusing it again saves (about) nothing; missed share 0
    assert gelu.missed_share == 0.0 and gelu.inductor_kernels == 1
    assert by[pats["softmax_cast"].id].status == "failed"


def test_published_scale_uses_derived_shapes(ws):
    rv = rank.review(ws)
    sm = {r.id: r for r in rv.rows}[patterns_zoo()["softmax"].id]
    assert all(e.call.source == "derived" for e in sm.calls)
    assert {e.call.inputs[0].shape for e in sm.calls} == {(16, 12, 512, 512)}
    cap = {r.id: r for r in rank.review(ws, scale="captured").rows}[sm.id]
    assert {e.call.inputs[0].shape for e in cap.calls} == {(2, 4, 64, 64)}
    assert sm.saved_ms.value > cap.saved_ms.value


def test_without_bench_everything_is_predicted(tmp_path):
    ws = build_workspace(tmp_path, bench=False)
    rv = rank.review(ws)
    assert rv.runs == ()
    assert "No GPU benchmark results" in rv.basis
    assert rv.model.source == "analytical" and not rv.model.accuracy.ok
    for r in rv.rows:
        assert not r.saved_ms.measured and all(not e.speedup.measured for e in r.calls)
        assert all(e.saved_ms.source == "analytical" for e in r.calls)
    by = {r.id: r for r in rv.rows}
    # the analytical model: one kernel (gelu) saves nothing, a 3-kernel split saves something
    assert by[patterns_zoo()["gelu"].id].saved_ms.value == pytest.approx(0.0, abs=1e-9)
    assert by[patterns_zoo()["softmax"].id].saved_ms.value > 0


def test_empty_and_partial_workspaces(tmp_path):
    rv = rank.review(tmp_path)
    assert rv.rows == () and rv.families == ()
    ws = build_workspace(tmp_path / "nocand", candidates=False, scans=False)
    rv = rank.review(ws)
    assert all(r.status == "mined" for r in rv.rows) and len(rv.rows) == 6


def test_corrupt_inputs_are_reported_not_fatal(ws):
    (ws.candidates / patterns_zoo()["silu_mul"].id / "bench.json").write_text("{not json")
    rv = rank.review(ws)
    assert any("bench.json" in p for p in rv.problems)
    r = {r.id: r for r in rv.rows}[patterns_zoo()["silu_mul"].id]
    assert r.status == "validated" and not r.saved_ms.measured


def test_a_run_table_alone_is_enough(ws):
    """Results copied back from a GPU machine as reports/gpu/<run>/bench.json only."""
    rid = patterns_zoo()["rmsnorm"].id
    both = {r.id: r for r in rank.review(ws).rows}[rid]
    assert len(both.candidate.bench) == 2  # the same rows in bench.json and the run table count once
    (ws.candidates / rid / "bench.json").unlink()
    r = {r.id: r for r in rank.review(ws).rows}[rid]
    assert r.status == "benchmarked" and r.saved_ms.measured
    assert len(r.candidate.bench) == 2  # captured + derived, each once


def test_ties_broken_by_support():
    pats = patterns_zoo()
    a = pats["gelu"]  # 2 models
    b = pats["add_tanh"]  # 1 model
    model = costmodel.CostModel()
    ra = rank.rank_one(a, None, model)
    rb = rank.rank_one(b, None, model)
    ra = rank.replace(ra, saved_ms=rank.Estimate(1.0, "analytical"))
    rb = rank.replace(rb, saved_ms=rank.Estimate(1.0, "analytical"))
    assert sorted([rb, ra], key=rank._sort_key) == [ra, rb]


def test_families_group_casts_and_one_op_differences():
    fams = families.cluster([
        ("a", [n.target for n in SOFTMAX()], [n.category for n in SOFTMAX()]),
        ("b", [n.target for n in RMSNORM], [n.category for n in RMSNORM]),
        ("c", [n.target for n in SOFTMAX(cast=True)], [n.category for n in SOFTMAX(cast=True)]),
        ("d", [n.target for n in SOFTMAX()[1:]], [n.category for n in SOFTMAX()[1:]]),  # one op fewer
        ("e", [n.target for n in SOFTMAX()[2:]], [n.category for n in SOFTMAX()[2:]]),  # two fewer: not near a
    ])
    members = {f.id: f.members for f in fams}
    assert members["a"] == ("a", "c", "d")
    assert members["b"] == ("b",)
    assert members["e"] == ("e",)  # leader-based: no chaining through d
    assert next(f for f in fams if f.id == "a").name == "amax > sub > exp > sum > div"


def test_family_rows_in_review(ws):
    rv = rank.review(ws)
    pats = patterns_zoo()
    fam = next(f for f in rv.families if pats["softmax"].id in f.members)
    assert set(fam.members) == {pats["softmax"].id, pats["softmax_cast"].id}
    assert sum(len(f.members) for f in rv.families) == len(rv.rows)


def test_find_unknown_id_suggests_close_ones(ws):
    rv = rank.review(ws)
    sm = patterns_zoo()["softmax"].id
    assert rv.find(sm[:6]).id == sm
    assert rv.find("softmax_like").id == sm
    with pytest.raises(UsageError, match="did you mean"):
        rv.find(sm[:-1] + ("0" if sm[-1] != "0" else "1"))


def test_cli_candidates_table_and_show(ws, capsys):
    assert main(["--workspace", str(ws.root), "candidates", "--top", "2"]) == 0
    out = capsys.readouterr().out
    sm = patterns_zoo()["softmax"].id
    assert sm in out and "softmax_like" in out and "promoted" in out and "1 more families" in out
    assert patterns_zoo()["gelu"].id not in out and "miner candidates --patterns" in out
    assert main(["--workspace", str(ws.root), "candidates", "--patterns"]) == 0
    out = capsys.readouterr().out
    assert patterns_zoo()["gelu"].id in out and sm not in out and "why no candidate" in out
    assert rank.PREDICTED_MARK in out and "predicted" in out
    assert main(["--workspace", str(ws.root), "candidates", "show", sm]) == 0
    out = capsys.readouterr().out
    assert "def pattern(x0)" in out and "benchmarks" in out and "rewrite: gpt2 train" in out and "matches=2" in out
    assert main(["--workspace", str(ws.root), "candidates", "--model", "llama", "--top", "0"]) == 0
    out = capsys.readouterr().out
    assert patterns_zoo()["rmsnorm"].id in out and patterns_zoo()["gelu"].id not in out
    assert main(["--workspace", str(ws.root), "candidates", "show", "pzzzz"]) == 2
    assert "unknown candidate" in capsys.readouterr().err
    assert main(["--workspace", str(ws.root), "candidates", "--model", "bret"]) == 2
    assert "did you mean bert" in capsys.readouterr().err


def test_cli_candidates_json(ws, capsys):
    assert main(["--workspace", str(ws.root), "candidates", "--json", "--members", "--top", "0"]) == 0
    rows = json.loads(capsys.readouterr().out)["ranking"]  # the rows the text shows, the decision beside each
    assert rows[0]["saved_ms_per_step"]["source"] in ("measured", "model", "analytical")
    assert {r["status"] for r in rows} >= {"promoted", "benchmarked", "failed"}
    assert main(["--workspace", str(ws.root), "candidates", "--json", "--patterns"]) == 0
    assert {r["status"] for r in json.loads(capsys.readouterr().out)["ranking"]} == {"mined"}


def test_expected_calls_stand_for_every_occurrence_not_the_sample():
    """patterns.json stores a sample; counts and the kernel histogram cover everything."""
    p = patterns_zoo()["softmax"]  # 4 stored occurrences, all with 3 kernels
    p = rank.replace(p, counts=Counts(10, 10, 10, {}), inductor=InductorView({"1": 6, "3": 4}, 6, True))
    calls = rank.expected_calls(p, rank.calls_of_pattern(p))
    assert sum(c.count for c in calls) == pytest.approx(10)
    assert all(c.mix == ((1, 0.6), (3, 0.4)) for c in calls)
    model = costmodel.CostModel()
    r = rank.rank_one(p, None, model, scale="captured")
    e = r.calls[0]
    # a one-kernel occurrence saves nothing: the expected saving is 40% of the three-kernel one's
    three = rank.estimate_call(p, rank.replace(e.call, kernel_mix=((3, 1.0),)), {}, model)
    assert e.saved_ms.value == pytest.approx(0.4 * three.saved_ms.value)
    assert r.saved_ms.value == pytest.approx(sum(x.saved_ms.value * x.call.count for x in r.calls))


def test_only_each_candidates_latest_run_trains_the_cost_model(ws):
    # an older run timed an older kernel of the same candidate: it must not train the model
    from miner.bench.results import save_results

    pats = patterns_zoo()
    rms = pats["rmsnorm"].id
    env, rows = bench_rows(pats["rmsnorm"], date="2026-11-01T00:00:00Z", slow=5.0)
    save_results(rows, env, candidate_dirs={rms: ws.candidates / rms}, report_dir=None)
    rv = rank.review(ws)
    row = {r.id: r for r in rv.rows}[rms]
    runs = {b.run for b in row.candidate.bench}
    assert len(runs) == 2  # both runs are known (and shown as history) ...
    latest = row.candidate.bench[-1].run
    samples = rank.training_samples([(p, c) for p, c in [(pats["rmsnorm"], row.candidate)]])
    assert samples and all(s.speedup == pytest.approx(b.speedup)
                           for s, b in zip(samples, [b for b in row.candidate.bench if b.run == latest and b.speedup]))
    assert all(s.speedup > 0.5 for s in samples)  # ... but none of the 5x-slower old rows trains the model
