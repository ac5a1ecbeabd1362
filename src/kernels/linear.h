#pragma once
// Linear layers and GPT-2's MLP with fewer passes over the activations: the MLP's GELU (tanh) comes
// out of its first GEMM, which also keeps the GELU input (a cuBLASLt epilogue, gemm.h;
// ATen's GELU where cuBLASLt has no algorithm); bias gradients come from a column-sum kernel, and
// the GELU backward with c_fc's bias gradient from one fused pass, instead of ATen's generic
// reduction and elementwise passes (their share of a step: bench/results/2026-12-01-profile-h200.log).
// Contract: x (..., in), weight (out, in), bias (out) contiguous, one CUDA device and dtype
// (fp32/bf16/fp16). Values equal at::linear's (and at::linear(gelu(at::linear(x), "tanh")) for
// mlp) up to the order of summation.
#include <torch/types.h>

#include <utility>

namespace gpt2::kernels {

// Whether linear / mlp take these tensors (this build has CUDA, contract above).
bool linear_applies(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);
bool mlp_applies(const torch::Tensor& x, const torch::Tensor& fc_weight, const torch::Tensor& fc_bias,
                 const torch::Tensor& proj_weight, const torch::Tensor& proj_bias);
// A bias gradient: dy (rows, cols)'s column sums in dy's dtype; the column-sum kernel (fp32 sums)
// for a contiguous CUDA kernel dtype, else dy.sum(0).
torch::Tensor bias_grad(const torch::Tensor& dy);
// The GELU (tanh) backward with the bias gradient of the layer before it: dpre = dh · gelu'(pre)
// and dpre's column sums, dh and pre (rows, cols) in one dtype. One pass of our kernel for contiguous
// CUDA kernel dtypes (its GELU derivative, not ATen's bits), else ATen's gelu_backward and sum(0).
std::pair<torch::Tensor, torch::Tensor> gelu_and_bias_backward(const torch::Tensor& dh, const torch::Tensor& pre);
// x W^T + b. Throws std::invalid_argument outside the contract.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);
// c_proj(gelu_tanh(c_fc(x))): (..., C) -> (..., C'). Throws std::invalid_argument outside the contract.
// Backward needs the GELU input and output; keep_gelu_output false keeps only the input and
// recomputes the output from it in backward (ATen's GELU of the stored input, which may differ in
// the last bit from the epilogue's, so c_proj's weight gradient may too): (..., 4C) fewer
// activations per layer for one elementwise pass.
torch::Tensor mlp(const torch::Tensor& x, const torch::Tensor& fc_weight, const torch::Tensor& fc_bias,
                  const torch::Tensor& proj_weight, const torch::Tensor& proj_bias, bool keep_gelu_output = true);

}  // namespace gpt2::kernels
