#pragma once
// Global-norm gradient clipping without a host round trip: the norm stays a device scalar (read it
// only on logging steps) and the scale factor min(1, max_norm / (norm + 1e-6)) is applied on device.
#include <torch/types.h>

#include <vector>

namespace gpt2::optim {

// L2 norm over all gradients, as an fp32 (fp64 for fp64 grads) 0-dim tensor on their device. Undefined grads count as 0.
torch::Tensor global_grad_norm(const std::vector<torch::Tensor>& params);
// Scales every gradient so the global norm is at most max_norm (no-op when max_norm <= 0).
// Returns the norm before clipping.
torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm);

}  // namespace gpt2::optim
