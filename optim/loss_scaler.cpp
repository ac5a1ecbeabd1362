#include "optim/loss_scaler.h"

#include <ATen/ATen.h>

#include <cmath>

namespace gpt2::optim {

LossScaler::LossScaler(bool enabled, torch::Device device, LossScalerOptions options, bool skip_non_finite)
    : enabled_(enabled), skip_non_finite_(skip_non_finite), options_(options) {
  scale_ = at::full({1}, enabled ? options.init_scale : 1.0, at::TensorOptions().dtype(at::kFloat).device(device));
  growth_tracker_ = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(device));
}

torch::Tensor LossScaler::unscale_and_check(const torch::Tensor& grads, parallel::Communicator* comm) {
  auto found_inf = at::zeros({1}, scale_.options());
  if (!checks()) return found_inf;  // (unscaling by 1 when only checking leaves the values as they are)
  at::NoGradGuard no_grad;
  auto inv_scale = scale_.reciprocal();
  if (grads.scalar_type() == at::kBFloat16) {
    // ATen's check-and-unscale has no bf16 kernel on CUDA (precision.fp8 keeps bf16 gradients).
    // max |g| is inf for an inf and NaN for a NaN (max reductions propagate NaN), and never
    // overflows as a sum of squares could.
    if (grads.numel() > 0) found_inf.copy_(at::linalg_vector_norm(grads, INFINITY).isfinite().logical_not());
    if (enabled_) grads.mul_(inv_scale);
  } else {
    at::_amp_foreach_non_finite_check_and_unscale_({grads}, found_inf, inv_scale);
  }
  if (comm != nullptr && comm->world_size() > 1) comm->all_reduce(found_inf, parallel::ReduceOp::kMax)->wait();
  return found_inf;
}

void LossScaler::load(double scale, int64_t growth_tracker) {
  if (enabled_) scale_.fill_(scale);
  growth_tracker_.fill_(growth_tracker);
}

void LossScaler::update(const torch::Tensor& found_inf) {
  if (!enabled_) return;
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf, options_.growth, options_.backoff,
                         options_.growth_interval);
}

}  // namespace gpt2::optim
