"""The kernel table (miner.scan.profile): classification on real H200 kernel names, the CPU profile."""

import pytest
import torch

from miner.scan.profile import KINDS, KernelTime, classify, copy_bandwidth, kernel_times

# Kernel names as torch.profiler reported them on the H200 (../shared/probes/step_profile.log and the
# H200 captures), with the class the probe's numbers rely on.
REAL = {
    "triton_poi_fused__unsafe_view_add_cat_clone_transpose_view_13": "triton_pointwise",
    "triton_red_fused__log_softmax__to_copy__unsafe_view_mm_prepare_softmax_online_view_21": "triton_reduction",
    "triton_per_fused__to_copy_add_native_dropout_backward_native_layer_norm_backward_view_11": "triton_persistent",
    "triton_tem_fused_mm_0": "triton_other",
    "nvjet_sm90_tst_256x128_64x4_2x1_v_bz_coopA_TNT": "gemm",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas": "gemm",
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8::Params)": "gemm",
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, true, false, false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)": "attention",
    "fmha_cutlassB_bf16_aligned_64x64_k64_sm80(PyTorchMemEffAttention::AttentionBackwardKernel<cutlass::arch::Sm80, cutlass::bfloat16_t, true, false, false, 64, 64, 64, false>::Params)": "attention",
    "Memcpy DtoD (Device -> Device)": "copy",
    "Memset (Device)": "copy",
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#10}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>, 4, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1> >(int, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#10}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1>)": "copy",
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)": "other_aten",
    "void at::native::(anonymous namespace)::distribution_elementwise_grid_stride_kernel<unsigned int, 4>": "other_aten",
    "aten::addmm": "gemm",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
    "aten::copy_": "copy",
    "aten::native_layer_norm": "other_aten",
}


@pytest.mark.parametrize("name", sorted(REAL))
def test_classify_real_names(name):
    assert classify(name) == REAL[name]
    assert classify(name) in KINDS


def test_classify_covers_every_kind():
    assert set(REAL.values()) == set(KINDS)


def test_kernel_times_cpu_counts_calls_and_time():
    torch.manual_seed(0)
    a, b = torch.randn(64, 64), torch.randn(64, 64)

    def step():
        for _ in range(3):
            torch.mm(a, b)
        torch.relu(a)

    rows = kernel_times(step, steps=4, device="cpu")
    assert all(isinstance(r, KernelTime) for r in rows)
    by = {r.name: r for r in rows}
    assert by["aten::mm"].calls_per_step == 3
    assert by["aten::mm"].kind == "gemm"
    assert by["aten::relu"].calls_per_step == 1 or by.get("aten::clamp_min") is not None
    assert all(r.us_per_step >= 0 for r in rows)
    assert [r.us_per_step for r in rows] == sorted((r.us_per_step for r in rows), reverse=True)


def test_kernel_times_scales_with_work():
    a = torch.randn(256, 256)
    one = {r.name: r for r in kernel_times(lambda: torch.mm(a, a), steps=3, device="cpu")}
    four = {r.name: r for r in kernel_times(lambda: [torch.mm(a, a) for _ in range(4)], steps=3, device="cpu")}
    assert four["aten::mm"].calls_per_step == 4 * one["aten::mm"].calls_per_step
    assert four["aten::mm"].us_per_step > one["aten::mm"].us_per_step


def test_kernel_times_rejects_zero_steps():
    with pytest.raises(ValueError):
        kernel_times(lambda: None, steps=0, device="cpu")


def test_copy_bandwidth_cpu_is_plausible():
    bw = copy_bandwidth("cpu", nbytes=8 << 20, repeats=3)
    assert 1e8 < bw < 1e13  # bytes/s


def test_kernels_a_miner_op_launched_are_named_after_it():
    # every generated kernel is a one_pass_kernel: only its op tells one region's from another's
    from types import SimpleNamespace as NS

    from miner.scan.profile import attribute_to_ops

    k = lambda name, us: NS(name=name, duration=us)  # noqa: E731
    totals = {"one_pass_kernel": [100.0, 4], "triton_per_fused_x": [50.0, 1]}
    events = [NS(name="miner::cpaaa_x4", kernels=[k("one_pass_kernel", 30.0), k("one_pass_kernel", 30.0)]),
              NS(name="miner::cpbbb", kernels=[k("one_pass_kernel", 25.0)]),
              NS(name="aten::mm", kernels=[k("triton_per_fused_x", 50.0)])]
    attribute_to_ops(totals, events)
    assert totals["one_pass_kernel [miner::cpaaa_x4]"] == [60.0, 2]
    assert totals["one_pass_kernel [miner::cpbbb]"] == [25.0, 1]
    assert totals["one_pass_kernel"] == [15.0, 1]  # one launch outside any miner op (e.g. in a CUDA graph)
    assert totals["triton_per_fused_x"] == [50.0, 1]
