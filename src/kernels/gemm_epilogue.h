#pragma once
// A GEMM with a cuBLASLt epilogue: the MLP's first layer with its bias and GELU in the GEMM,
// which also stores the GELU input for backward (no separate GELU pass over the (tokens, 4C)
// activations). The backward epilogues (DGELU_BGRAD, BGRADB) were measured on an H200 and left
// out: cuBLASLt runs them as separate kernels, 7.5 and 1.35 ms per gpt2-124m step against 2.3
// and 1.0 ms for this folder's GELU-backward and column-sum kernels.
// Contract: row-major contiguous CUDA tensors of one dtype (fp32/bf16/fp16), outputs allocated by
// the caller; GELU is the tanh approximation. Each returns false, having written nothing, when
// cuBLASLt offers no algorithm for the case (the caller then runs the separate kernels); a failing
// cuBLASLt call throws gpt2::Error naming it. Without CUDA every function returns false.
#include <torch/types.h>

namespace gpt2::kernels {

// pre = x W^T + b, out = gelu(pre); x (M, K), w (N, K), b (N), out and pre (M, N).
bool gemm_bias_gelu(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, torch::Tensor& out,
                    torch::Tensor& pre);

}  // namespace gpt2::kernels
