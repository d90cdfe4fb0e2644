"""miner.runtime.direct: a compiled Triton kernel launched without Triton's per-call binding, only where
its signature shows it safe, and only after one launch matched Triton's own bit for bit."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from miner.runtime import direct


class CompiledKernel:  # the name ``launcher`` accepts; records what its launcher was given
    def __init__(self, signature: dict, calls: list):
        self.src = SimpleNamespace(signature=signature)
        self.function, self.packed_metadata = "fn", "md"
        self.calls = calls

    def run(self, *a):
        self.calls.append(a)


KERNEL = SimpleNamespace(arg_names=["x_ptr", "out_ptr", "c0", "n", "BLOCK"])
SIG = {"x_ptr": "*bf16", "out_ptr": "*fp32", "c0": "i32", "n": "i32", "BLOCK": "constexpr"}


@pytest.fixture
def stream(monkeypatch):
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 1000 + index, raising=False)


def test_launcher_passes_every_argument_in_signature_order_then_the_constexprs(stream):
    calls = []
    x, out = torch.zeros(4, dtype=torch.bfloat16), torch.zeros(4)
    fn = direct.launcher(KERNEL, CompiledKernel(SIG, calls), (x, out, 3, 4), {"BLOCK": 16}, (7,), 0)
    fn((x, out, 5, 4))
    [a] = calls
    assert a[:9] == (7, 1, 1, 1000, "fn", "md", None, None, None)  # grid padded to 3, this device's stream
    assert a[9] is x and a[10] is out and a[11:] == (5, 4, 16)


@pytest.mark.parametrize("broken", ["not a CompiledKernel", "names differ", "int where a pointer is",
                                    "tensor where an int is", "constexpr not given", "no signature"])
def test_launcher_declines_what_it_cannot_show_safe(broken, stream):
    x, out = torch.zeros(4, dtype=torch.bfloat16), torch.zeros(4)
    args, constexprs, sig, kernel = (x, out, 3, 4), {"BLOCK": 16}, dict(SIG), KERNEL
    compiled = CompiledKernel(sig, [])
    if broken == "not a CompiledKernel":
        compiled = SimpleNamespace(**vars(compiled))
    elif broken == "names differ":
        kernel = SimpleNamespace(arg_names=["x_ptr", "out_ptr", "n", "c0", "BLOCK"])
    elif broken == "int where a pointer is":
        args = (x, 12345, 3, 4)
    elif broken == "tensor where an int is":
        args = (x, out, out, 4)
    elif broken == "constexpr not given":
        constexprs = {}
    else:
        compiled.src = SimpleNamespace()
    assert direct.launcher(kernel, compiled, args, constexprs, (7,), 0) is None


def test_specialization_tells_alignment_and_the_int_classes_triton_compiles_for():
    x = torch.zeros(64, dtype=torch.bfloat16)
    assert direct.specialization([x], [3]) == ((True,), ((False, False, True),))
    assert direct.specialization([x[1:]], [3]) != direct.specialization([x], [3])  # 2 bytes off: unaligned
    assert direct.specialization([x[8:]], [3]) == direct.specialization([x], [3])  # 16 bytes off
    classes = {direct.specialization([x], [v]) for v in (1, 3, 5, 16, 32, 2 ** 40)}
    assert len(classes) == 4  # 1; 3 and 5; 16 and 32; beyond 32 bits


def _triton_launch(log: list):
    """A stand-in for ``kernel[grid](*args)``: out = x * c0 (its compiled kernel named by ``c0``)."""
    def launch(args):
        x, out, c0 = args[0], args[1], args[2]
        out.copy_(x * c0)
        log.append("triton")
        return f"compiled{c0}"
    return launch


def _launcher(log: list, bug: str | None = None):
    def build(compiled):
        def fn(args):
            log.append("direct")
            if bug == "raises":
                raise TypeError("function takes exactly 12 arguments")
            args[1].copy_(args[0] * args[2] + (1e-3 if bug == "wrong value" else 0.0))
        return fn
    return build


def test_direct_launch_is_used_once_it_matched_tritons_own_launch():
    log, d = [], direct.Direct()
    x = torch.arange(6.0)
    outs = []
    for _ in range(4):
        out = torch.empty(6)
        d.launch(("spec",), (x, out, 2.0), (out,), _triton_launch(log), _launcher(log))
        outs.append(out)
    # 1st: Triton's (the direct launcher built from what it returned); 2nd: checked against Triton's; then direct
    assert log == ["triton", "triton", "direct", "direct", "direct"]
    for out in outs:
        assert torch.equal(out, x * 2)


@pytest.mark.parametrize("bug", ["wrong value", "raises"])
def test_a_direct_launch_that_differs_or_fails_is_dropped_and_its_outputs_are_tritons(bug, caplog):
    """The planted bugs: a launcher writing other values (e.g. arguments in the wrong order) or one this
    Triton refuses. The check catches each; the call still returns Triton's results; later calls go
    through Triton."""
    log, d = [], direct.Direct()
    x = torch.arange(6.0)
    with caplog.at_level(logging.WARNING, logger="miner.runtime.direct"):
        for _ in range(3):
            out = torch.empty(6)
            d.launch(("spec",), (x, out, 2.0), (out,), _triton_launch(log), _launcher(log, bug))
            assert torch.equal(out, x * 2)
    assert log == ["triton", "triton", "direct", "triton"]
    assert "not used for this kernel" in caplog.text


def test_each_specialization_gets_its_own_launcher_and_check():
    log, d = [], direct.Direct()
    x = torch.arange(6.0)
    for spec in ("a", "b", "a", "b"):
        out = torch.empty(6)
        d.launch((spec,), (x, out, 2.0), (out,), _triton_launch(log), _launcher(log))
    assert log == ["triton", "triton", "triton", "direct", "triton", "direct"]


def test_same_bits_sees_nan_and_signed_zero_in_any_shape():
    a = torch.tensor([float("nan"), 0.0])
    assert direct.same_bits([a], [a.clone()])
    assert not direct.same_bits([a], [torch.tensor([float("nan"), -0.0])])
    s = torch.tensor(1.5)  # a 0-dim output (a reduction over every dim)
    assert direct.same_bits([s], [s.clone()]) and not direct.same_bits([s], [torch.tensor(-1.5)])


def test_a_launch_hook_sends_every_launch_through_triton(monkeypatch):
    """A profiler's launch hook must see every launch: an empty hook chain (newer Tritons) or None is no hook."""
    knobs = SimpleNamespace(runtime=SimpleNamespace(launch_enter_hook=None, launch_exit_hook=SimpleNamespace(calls=[])))
    monkeypatch.setattr(direct, "_knobs", lambda: knobs)
    assert not direct.hooked()
    knobs.runtime.launch_exit_hook.calls.append(print)
    assert direct.hooked()
    knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook = print, None
    assert direct.hooked()
    monkeypatch.setattr(direct, "_knobs", lambda: None)  # a Triton without knobs
    assert direct.hooked()


def test_an_int_compiled_in_as_a_constexpr_keeps_tritons_launch(stream):
    """An int the caller varies (``varying``) that the kernel takes as ``tl.constexpr`` is compiled per
    value, which no specialization class tells apart: no direct launch then (Triton's own 1 is fine)."""
    x, out = torch.zeros(4, dtype=torch.bfloat16), torch.zeros(4)
    sig = dict(SIG, c0="constexpr")
    assert direct.launcher(KERNEL, CompiledKernel(sig, []), (x, out, 3, 4), {"BLOCK": 16}, (7,), 0, [2]) is None
    assert direct.launcher(KERNEL, CompiledKernel(sig, []), (x, out, 1, 4), {"BLOCK": 16}, (7,), 0, [2]) is not None
    assert direct.launcher(KERNEL, CompiledKernel(SIG, []), (x, out, 3, 4), {"BLOCK": 16}, (7,), 0, [2]) is not None


def test_the_ab_counts_each_variants_launches_per_path_over_its_timed_steps(monkeypatch):
    """``miner verify --ab`` says per variant how its kernels were launched in the timed steps (the run of
    2026-12-07 could not tell whether the direct launch was active in the model)."""
    from miner.check import ab

    monkeypatch.setattr(direct, "LAUNCHES", direct.Counter())

    def step_of(paths):
        def step():
            for p in paths:
                direct.LAUNCHES[p] += 1
        return step

    lives = [ab._Live(ab.VariantResult("default", [], "-"), torch.nn.Linear(1, 1), step_of([])),
             ab._Live(ab.VariantResult("all", [], "open"), torch.nn.Linear(1, 1), step_of(["direct"] * 3 + ["triton"]))]
    ab.interleave(lives, 4, "cpu")
    assert lives[0].res.launches == {"steps": 4}
    assert lives[1].res.launches == {"direct": 12, "triton": 4, "steps": 4}
    v = lives[1].res
    v.round_ms = [1.0] * 4
    assert ab.launch_share(v) == "; per step 4 launches of miner's kernels: 3 direct, 1 triton"
    assert ab.launch_share(lives[0].res) == ""


def test_a_generated_kernel_launch_is_counted(monkeypatch):
    """Every launch of a generated kernel goes into ``LAUNCHES`` (here the interpreter: Triton's path)."""
    import os
    from pathlib import Path

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs TRITON_INTERPRET=1 (the CI test command sets it)")
    from miner.runtime import launch, rewrite

    path = Path(__file__).resolve().parents[1] / "fusions" / "layer_norm" / "kernel.py"
    k = rewrite.load_module(path, rewrite.module_name(path, "kernel"))
    monkeypatch.setattr(launch, "PLANS", {})
    monkeypatch.setattr(direct, "LAUNCHES", direct.Counter())
    xs = (torch.randn(3, 40), torch.randn(40), torch.randn(40))
    for _ in range(3):
        k.launch(*xs, 1e-5)
    assert direct.LAUNCHES == {"triton": 3}
