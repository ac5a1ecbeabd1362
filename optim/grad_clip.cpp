#include "optim/grad_clip.h"

#include <ATen/ATen.h>

namespace gpt2::optim {

torch::Tensor global_grad_norm(const std::vector<torch::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return at::zeros({}, params.empty() ? at::TensorOptions() : params[0].options().dtype(at::kFloat));
  // One fused multi-tensor norm per tensor, then the norm of norms, in fp32 or wider (fp64 grads
  // keep fp64 so float64 tests see exact clipping).
  const auto acc = at::promote_types(grads[0].scalar_type(), at::kFloat);
  auto norms = at::_foreach_norm(grads, 2);
  std::vector<at::Tensor> as_float;
  as_float.reserve(norms.size());
  for (auto& n : norms) as_float.push_back(n.to(acc));
  return at::stack(as_float).norm(2);
}

torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  auto norm = global_grad_norm(params);
  if (max_norm <= 0) return norm;
  std::vector<at::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return norm;
  auto scale = (max_norm / (norm + 1e-6)).clamp_max(1.0);
  at::_foreach_mul_(grads, scale.to(grads[0].scalar_type()));
  return norm;
}

}  // namespace gpt2::optim
