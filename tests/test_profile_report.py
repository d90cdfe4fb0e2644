"""The report's step composition figure (miner.report.composition) from saved step profiles."""

import pytest

from miner.core.workspace import Workspace
from miner.report.composition import SEGMENTS, composition_html, segments
from miner.scan import profile as prof
from miner.scan.profile import KernelProfile, StepProfile


def _profile(model="bert", step_ms=10.0):
    rows = (KernelProfile("nvjet_x", "gemm", 4000.0, 10.0), KernelProfile("flash_fwd", "attention", 1000.0, 2.0),
            KernelProfile("triton_poi_a_0", "triton_pointwise", 3000.0, 1.0, gb_per_call=0.004,
                          floor_us_per_step=1000.0),
            KernelProfile("triton_per_b_1", "triton_persistent", 500.0, 1.0),
            KernelProfile("Memcpy DtoD", "copy", 200.0, 1.0))
    return StepProfile(model, "base", "train", "cuda", step_ms, step_ms * 0.9, step_ms * 1.1, 20, 5, 4e12, rows,
                       provenance={"gpu": "NVIDIA H200"})


def test_segments_add_up_to_the_step():
    p = _profile()
    seg = dict(segments(p))
    assert [s[0] for s in SEGMENTS] == list(seg)
    assert seg["gemm"] == pytest.approx(4.0) and seg["attention"] == pytest.approx(1.0)
    assert seg["Triton at floor"] == pytest.approx(1.0) and seg["Triton above floor"] == pytest.approx(2.0)
    assert seg["other"] == pytest.approx(0.7)  # copy + Triton without bytes
    assert sum(seg.values()) == pytest.approx(p.step_ms)


def test_report_section_only_with_profiles(tmp_path):
    ws = Workspace(tmp_path)
    assert composition_html(ws) == ""
    prof.save(ws, _profile("bert"))
    prof.save(ws, _profile("t5", 20.0))
    html = composition_html(ws)
    assert html.count("data:image/png;base64,") == 1 and "t5" in html and "NVIDIA H200" in html
