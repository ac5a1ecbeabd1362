#pragma once
// Weight-only int8 projections (gpt2-generate/serve/eval --quant int8, issue 41).
// A weight W (N, K) is stored as q (N, K) int8 and scale (N, G) fp32, G = K / group: symmetric,
// W[n, k] ≈ q[n, k] · scale[n, k / group], with scale = max |W| over the group / 127 and q =
// round-to-nearest(W / scale) in [-127, 127] (Note [int8 weights]). group = K is one scale a row.
// y = x Wᵀ + b is computed from q and scale with x in its own dtype (fp32 on the CPU; fp32, bf16 or
// fp16 on CUDA) and fp32 sums; the result has x's dtype:
//  - up to kInt8GemvRows rows of x (decoding): our kernels read each int8 weight once and
//    dequantize it in registers. CPU: AVX2 + FMA over ATen's threads (portable C++ without AVX2,
//    or when GPT2_CPU_INT8_ISA=baseline); CUDA: one warp a row of W (int8_linear.cu).
//  - more rows (a prompt): the weight dequantized once into x's dtype, then at::linear (cuBLAS).
// Contract: x (..., K) contiguous, bias (N) in x's dtype or undefined, q/scale on x's device.
// Anything else is a gpt2::Error naming int8_linear.
#include <torch/types.h>

#include <cstdint>
#include <string>

namespace gpt2::kernels {

inline constexpr int64_t kInt8GemvRows = 16;

struct Int8Weight {
  torch::Tensor q;      // (N, K) int8
  torch::Tensor scale;  // (N, G) fp32
  int64_t group() const { return q.size(1) / scale.size(1); }
  int64_t bytes() const { return q.nbytes() + scale.nbytes(); }
};

// `group` 0: one scale a row. Else it must divide K. w: a 2-D float tensor on any device.
Int8Weight quantize_int8(const torch::Tensor& w, int64_t group = 0);
// q · scale in `dtype`, on q's device.
torch::Tensor dequantize_int8(const Int8Weight& w, at::ScalarType dtype);
torch::Tensor int8_linear(const torch::Tensor& x, const Int8Weight& w, const torch::Tensor& bias);
// An int8 embedding table's rows: ids (any shape, int64) -> (..., K) in `dtype`, each row bitwise
// the same row of dequantize_int8(w, dtype) (only the rows asked for are dequantized).
torch::Tensor int8_embedding(const torch::Tensor& ids, const Int8Weight& w, at::ScalarType dtype);

// Which CPU kernel int8_linear runs for few rows: "avx2" or "baseline" (for logs and tests).
std::string int8_cpu_isa();

}  // namespace gpt2::kernels
