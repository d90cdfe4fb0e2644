"""Dropout inside fused attention kernels in the "masks injected" parity (``miner.check.masks``).

On a GPU, ``scaled_dot_product_attention`` with a mask that needs no gradient (t5's cross-attention)
runs in a cuDNN or memory-efficient kernel that draws its own dropout: the compiled step records
each such call's Philox ``(seed, offset)`` and the eager reference runs the same kernel again at
it. Here: the recording through Inductor's wrapper code (a custom op stands in for the CUDA ops on
the CPU), the reference's pairing of calls (Inductor's seeds for the others, renumbered), and, on a
GPU, the replay itself: the default compile is as close to its reference as without dropout, and a
planted wrong offset is caught.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from miner.check import masks

RETURNED: list = []  # what the stand-in op returned, to compare with what the recording kept


def _define_stand_in():
    """``miner_test::fused_drop``: an op with the CUDA attention ops' dropout argument and Philox
    outputs; it draws its ``(seed, offset)`` from the default generator."""
    if hasattr(torch.ops.miner_test, "fused_drop"):
        return
    lib = torch.library.Library("miner_test", "DEF")  # noqa: TOR901 - kept alive on the module
    lib.define("fused_drop(Tensor q, float dropout_p=0.) -> (Tensor output, Tensor philox_seed, Tensor philox_offset)")

    def impl(q, dropout_p=0.0):
        pair = torch.randint(0, 2**31, (2,))
        RETURNED.append((int(pair[0]), int(pair[1])))
        return q * 2, pair[0].clone(), pair[1].clone()

    def fake(q, dropout_p=0.0):
        return torch.empty_like(q), q.new_empty((), dtype=torch.int64), q.new_empty((), dtype=torch.int64)

    lib.impl("fused_drop", impl, "CPU")
    torch.library.register_fake("miner_test::fused_drop", fake, lib=lib)
    _define_stand_in.lib = lib


def test_the_recording_keeps_each_fused_draw_inductor_code_makes():
    # catches a recording that misses the calls of compiled code (the overload looked up elsewhere) or
    # keeps another pair than the op returned, and one that keeps calls without dropout
    _define_stand_in()

    def f(x):
        a = torch.ops.miner_test.fused_drop(x, 0.25)[0]
        b = torch.ops.miner_test.fused_drop(a.sin(), 0.0)[0]  # no dropout: not a draw
        return torch.ops.miner_test.fused_drop(b, 0.5)[0].cos()

    compiled = torch.compile(f, dynamic=False)
    x = torch.randn(2, 3, 4)
    compiled(x)  # compiles outside the recording
    RETURNED.clear()
    with masks.recording_fused_attention({"miner_test::fused_drop": "MATH"}) as draws:
        compiled(x)
    assert [(d.p, d.seed, d.offset) for d in draws] == [(0.25, *RETURNED[0]), (0.5, *RETURNED[2])], (draws, RETURNED)
    assert all(d.shape == (2, 3, 4) and d.backend == "MATH" for d in draws)
    assert torch.ops.miner_test.fused_drop.default(x, 0.5)[0].shape == x.shape  # the overload is restored
    with masks.recording_fused_attention({}) as none:  # planted: nothing patched, nothing kept
        compiled(x)
    assert none == []


class Block(nn.Module):
    """Two attention calls with dropout around a plain dropout: the second attention stands for one
    the compiled step ran in a fused kernel."""

    def forward(self, x):
        a = F.scaled_dot_product_attention(x, x, x, dropout_p=0.5)
        b = F.dropout(a, 0.5)
        c = F.scaled_dot_product_attention(b, b, b, dropout_p=0.25)
        return F.dropout(c, 0.5)


def _inject(fused, chosen=(1,)):
    asked, replayed, drawn = [], [], []

    def choose(call):
        asked.append(len(asked))
        return len(asked) - 1 in chosen

    def replay(sdpa, draw, call, dtype):
        replayed.append((draw, dtype))
        return sdpa(call.q, call.k, call.v, attn_mask=call.attn_mask, dropout_p=0.0, is_causal=call.is_causal)

    def mask_of(k, shape, p):
        drawn.append((k, shape, p))
        return torch.ones(shape, dtype=torch.bool)

    inj = masks.Injector(mask_of, fused=fused, dtype=torch.bfloat16, choose=choose, replay=replay)
    with inj.active():
        Block()(torch.randn(2, 3, 5, 4))
    return inj, replayed, drawn


def test_the_reference_replays_fused_calls_and_renumbers_inductors_seeds():
    # catches a fused call that still takes an Inductor seed (every later seed index off by one),
    # a replay of the wrong draw, and a call count that leaves the fused calls out
    draw = masks.FusedDraw("aten::x", "CUDNN_ATTENTION", 0.25, (2, 3, 5, 4), 7, 64)
    inj, replayed, drawn = _inject([draw])
    assert [k for k, _, _ in drawn] == [0, 1, 2]  # the three calls Inductor draws, numbered without the fused one
    assert [p for _, _, p in drawn] == [0.5, 0.5, 0.5]
    assert replayed == [(draw, torch.bfloat16)]
    assert inj.fused_calls == 1 and not inj.unmatched and len(inj.calls) == 4
    assert inj.calls[2] == ((2, 3, 5, 5), 0.25)  # the attention probabilities' shape, its p


def test_a_fused_call_without_its_draw_is_reported_not_guessed():
    # a recorded draw of another shape or p, or none left, is never replayed: the reference says so
    # (the parity is then not judged) instead of pairing the wrong mask
    for fused in ([masks.FusedDraw("aten::x", "CUDNN_ATTENTION", 0.25, (2, 3, 5, 8), 7, 64)],
                  [masks.FusedDraw("aten::x", "CUDNN_ATTENTION", 0.5, (2, 3, 5, 4), 7, 64)]):
        inj, replayed, _ = _inject(fused)
        assert replayed == [] and inj.unmatched and inj.fused_calls == 1
    draw = masks.FusedDraw("aten::x", "CUDNN_ATTENTION", 0.5, (2, 3, 5, 4), 7, 64)
    inj, replayed, _ = _inject([draw], chosen=(0, 1))  # two chosen, one recorded
    assert len(replayed) == 1 and len(inj.unmatched) == 1 and inj.fused_calls == 2
    inj, replayed, drawn = _inject([])  # nothing recorded: every call is Inductor's (the CPU, most steps)
    assert replayed == [] and inj.fused_calls == 0 and [k for k, _, _ in drawn] == [0, 1, 2, 3]


def test_a_draw_recorded_twice_exactly_counts_once_and_a_mismatch_says_which_draws():
    # a fused call recorded again with the same op, shape and (seed, offset) draws the same mask: kept
    # once; two calls with other offsets are two draws (never merged), and the description names them
    a = masks.FusedDraw("aten::_scaled_dot_product_cudnn_attention", "CUDNN_ATTENTION", 0.1, (16, 12, 512, 64), 7, 64)
    b = masks.FusedDraw(a.op, a.backend, 0.1, a.shape, 7, 128)
    c = masks.Compiled.of((None, None, {}), [], [a, b, a, b])
    assert c.fused == [a, b] and c.repeated == 2
    c = masks.Compiled.of((None, None, {}), [], [a, b])
    assert c.fused == [a, b] and c.repeated == 0
    assert masks.describe_draws([a, b], 2) == "2 scaled_dot_product_cudnn_attention 16x12x512x64; 2 more repeated exactly"


# --------------------------------------------------------------------------- on a GPU: the replay itself

class CrossAttention(nn.Module):
    """t5's cross-attention in small: an additive mask that needs no gradient, so SDPA under bf16
    autocast runs a fused kernel (cuDNN or memory-efficient) with its own dropout; then a plain
    dropout Inductor draws."""

    def __init__(self, d: int = 64, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.q, self.kv, self.o = nn.Linear(d, d), nn.Linear(d, 2 * d), nn.Linear(d, d)

    def forward(self, x, memory, bias):
        b, s, d = x.shape
        q = self.q(x).view(b, s, self.heads, -1).transpose(1, 2)
        k, v = self.kv(memory).view(b, memory.size(1), 2, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=0.3)
        y = F.dropout(self.o(a.transpose(1, 2).reshape(b, s, d)), 0.1)
        return y.float().pow(2).mean()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fused attention kernels need a GPU")
def test_on_a_gpu_the_replayed_kernel_reproduces_the_compiled_steps_masks():
    # the floor (the default compile against its reference) is as small as bf16 allows when the fused
    # calls replay their draws; a planted wrong offset (the next draw) makes it large
    import dataclasses

    from miner_models import Built

    torch.manual_seed(0)
    dev = "cuda"
    model = CrossAttention().to(dev)
    x, mem = torch.randn(2, 128, 64, device=dev), torch.randn(2, 96, 64, device=dev)
    bias = torch.zeros(2, 1, 128, 96, device=dev).masked_fill(torch.rand(2, 1, 1, 96, device=dev) < 0.2, -1e4)
    built = Built(model, {"x": x, "memory": mem, "bias": bias}, lambda out: out)
    count = len(masks.dropout_calls(built, "train", dev))
    got = masks.observe_compiled(built, "train", dev, autocast=True, seed=0)
    assert len(got.fused) == 1, got.fused  # the attention ran fused, with its own dropout
    floor, why = masks._errors_to_reference(built, "train", dev, got, {}, 0, count, True)
    assert floor is not None, why
    assert all(v < 0.05 for v in floor.values() if v is not None), floor
    planted = dataclasses.replace(got, fused=[dataclasses.replace(got.fused[0], offset=got.fused[0].offset + 4096)])
    wrong, _ = masks._errors_to_reference(built, "train", dev, planted, {}, 0, count, True)
    assert max(v for v in wrong.values() if v is not None) > 0.2, wrong


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_on_a_gpu_a_cuda_graph_variant_is_observed_through_the_warm_up_path():
    # a replayed CUDA graph runs no Python: without graphs_run_eagerly the fused attention call of a
    # reduce-overhead step would go unrecorded and its parity could never be judged
    from miner.check.verify import make_step
    from miner_models import Built

    torch.manual_seed(0)
    dev = "cuda"
    model = CrossAttention().to(dev)
    x, mem = torch.randn(2, 128, 64, device=dev), torch.randn(2, 96, 64, device=dev)
    bias = torch.zeros(2, 1, 128, 96, device=dev)
    built = Built(model, {"x": x, "memory": mem, "bias": bias}, lambda out: out)
    compiled = torch.compile(model, options={"triton.cudagraphs": True}, dynamic=False)
    step = make_step(compiled, built.inputs, built.loss, "train", dev, autocast=True)
    for _ in range(4):  # warm-up, record, replay
        step()
    got = masks.observe_runner((step, model), "train", dev, seed=0)
    assert len(got.fused) == 1, got.fused
