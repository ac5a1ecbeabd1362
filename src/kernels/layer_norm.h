#pragma once
// LayerNorm over the last dimension with the residual add in front of it fused in, for CUDA
// tensors: (s, out) = (x + y, LayerNorm(x + y) * weight + bias) in one read of x and y, and in
// backward one read of the output gradient, s and the gradient that reached s directly, writing
// the gradient of x and y (the same tensor) and, in the same pass, weight and bias gradients. The
// separate add, LayerNorm, its GammaBeta reduction and autograd's accumulation of the two
// gradients of the residual stream were a large share of a gpt2-124m step on an H200
// (bench/results/2026-12-01-profile-h200.log, 2026-12-01-layernorm-h200.log).
// Contract: x and y (..., C) CUDA of one dtype (fp32/bf16/fp16), weight and bias (C) of that dtype;
// y may be undefined (then s is x itself and only out is computed). x, y and the gradients that
// reach backward may be any views: those that are not contiguous rows starting 16-byte aligned are
// copied into such rows first. Results equal at::layer_norm's of x + y (rounded to the dtype) up
// to the order of summation.
#include <torch/types.h>

#include <utility>

namespace gpt2::kernels {

// Whether residual_layer_norm takes these tensors (this build has CUDA, the shapes and dtypes
// follow the contract, and C fits the kernels: up to 2048 bf16/fp16 or 1024 fp32 columns).
bool residual_layer_norm_applies(const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& weight,
                                 const torch::Tensor& bias);
// Returns (s, out). Throws std::invalid_argument for tensors outside the contract.
std::pair<torch::Tensor, torch::Tensor> residual_layer_norm(const torch::Tensor& x, const torch::Tensor& y,
                                                            const torch::Tensor& weight, const torch::Tensor& bias,
                                                            double eps);

}  // namespace gpt2::kernels
