#pragma once
// LayerNorm over the last dimension for CUDA tensors whose backward computes the weight and bias
// gradients with a two-pass column reduction (fp32 partial sums per block of rows) instead of
// LibTorch's GammaBeta kernel, which took 3.8 of 63 ms per gpt2-124m step on an H200. The
// forward pass and the input gradient are ATen's own (native_layer_norm and its backward).
// Contract: x (..., C) CUDA, weight and bias (C) of x's dtype (fp32/bf16/fp16); the result and
// every gradient equal at::layer_norm's up to the order of summation.
#include <torch/types.h>

namespace gpt2::kernels {

// Throws std::invalid_argument for tensors outside the contract, std::logic_error without CUDA.
torch::Tensor layer_norm(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias, double eps);

}  // namespace gpt2::kernels
