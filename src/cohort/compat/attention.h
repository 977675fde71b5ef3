#pragma once
// ATen's fused attention, where the LibTorch built against has it:
// at::scaled_dot_product_attention (2.0 and newer) picks flash or memory-efficient
// attention on CUDA, a fused kernel on the CPU, and its math fallback otherwise.
// LibTorch 1.13 has only a private prototype (_scaled_dot_product_attention) that
// nothing here has been run against, so it counts as none; ParallelSelfAttention
// then computes attention explicitly (Note [Fused attention and sharded dropout] in
// tensor_parallel/attention.cpp).
#include <ATen/ATen.h>
#include <torch/version.h>

namespace cohort::compat {

#if TORCH_VERSION_MAJOR >= 2
inline constexpr bool kHasScaledDotProductAttention = true;

// q, k, v: [batch, heads, sequence, head_dim]; scaled by 1/sqrt(head_dim), no
// dropout (the caller draws none through it: the Note above).
inline at::Tensor scaled_dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                               bool causal) {
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/causal);
}
#else
inline constexpr bool kHasScaledDotProductAttention = false;
inline at::Tensor scaled_dot_product_attention(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool) {
  TORCH_CHECK(false, "cohort: this LibTorch has no scaled_dot_product_attention (LibTorch 2.0 or newer has it)");
}
#endif

}  // namespace cohort::compat
