"""Bucketing rules on real kernel names from cuBLAS, cuDNN, CUTLASS, FlashAttention,
Triton, PyTorch, rocBLAS/hipBLASLt (Tensile), CK, ROCclr and torch CPU ops."""

import pytest

from flashscope.breakdown.buckets import classify, summarize

NAMES = [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_"
     "segment_k_off_kernel__5x_cublas", "gemm"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN", "gemm"),
    ("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>"
     "(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8::Params)", "gemm"),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn", "gemm"),
    ("Cijk_Alik_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1_SN_1LDSB0_AMAS3_GRVW8_WG32_8_1", "gemm"),
    ("Cijk_Ailk_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x256x64_MI16x16x1_SN_LDSB1_AFC1", "gemm"),
    ("void ck::kernel_gemm_xdl_cshuffle_v3<ck::GridwiseGemm_xdl_cshuffle_v3<ck::tensor_layout::"
     "gemm::RowMajor>>", "gemm"),
    ("triton_tem_fused_mm_0", "gemm"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_"
     "kernel0_0", "attention"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false,"
     " cutlass::bfloat16_t>>(pytorch_flash::Flash_fwd_params)", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::"
     "bfloat16_t, cutlass::arch::Sm80, true, 64, 128, 128, true, true>::Params)", "attention"),
    ("_attn_fwd", "attention"),
    ("_attn_bwd_dkdv", "attention"),
    ("void ck_tile::kentry<256, 2, ck_tile::FmhaFwdKernel<ck_tile::BlockFmhaPipelineQRKSVSAsync"
     "<>>>", "attention"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
     "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)",
     "attention"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("flashscope::attention", "attention"),
    ("triton_per_fused_native_layer_norm_0", "normalization"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>"
     "(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, "
     "float*, c10::BFloat16*)", "normalization"),
    ("layer_norm", "normalization"),
    ("triton_red_fused_add_rms_norm_1", "normalization"),
    ("aten::native_layer_norm", "normalization"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::"
     "TensorIteratorBase&, at::native::GeluType)::{lambda()#2}, at::detail::Array<char*, 2> >"
     "(int, at::detail::Array<char*, 2>)", "elementwise"),
    ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::"
     "CUDAFunctor_add<c10::BFloat16> >(at::TensorIteratorBase&)::{lambda(int)#1}>(int)",
     "elementwise"),
    ("triton_poi_fused_add_gelu_0", "elementwise"),
    ("void lczero::rocm_backend::addBiasBatched_kernel<__half, (lczero::rocm_backend::"
     "ActivationFunction)7>(__half*, __half const*, __half const*, int, int, int)", "elementwise"),
    ("aten::gelu", "elementwise"),
    ("Memcpy DtoD (Device -> Device)", "memory"),
    ("Memcpy HtoD (Pageable -> Device)", "memory"),
    ("Memset (Device)", "memory"),
    ("__amd_rocclr_fillBufferAligned", "memory"),
    ("__amd_rocclr_copyBuffer", "memory"),
    ("aten::copy_", "memory"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::"
     "func_wrapper_t<float, at::native::sum_functor<float, float, float>>, unsigned int, float, "
     "4> >", "other"),
    ("aten::view", "other"),
]


@pytest.mark.parametrize("name, bucket", NAMES)
def test_classify_real_names(name, bucket):
    assert classify(name) == bucket


def test_summary_shares_and_amdahl_ceiling():
    r = summarize([("Cijk_x", 0.7), ("_attn_fwd", 0.2), ("layer_norm", 0.1, 4)])
    share = {b["bucket"]: b["share"] for b in r["buckets"]}
    assert share["gemm"] == pytest.approx(0.7) and share["attention"] == pytest.approx(0.2)
    assert [b["calls"] for b in r["buckets"] if b["bucket"] == "normalization"] == [4]
    assert r["amdahl_ceiling"] == pytest.approx(1.0 / 0.8)
    assert summarize([("_attn_fwd", 1.0)])["amdahl_ceiling"] == float("inf")
