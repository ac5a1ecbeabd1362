#include "optim/muon.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "src/base/errors.h"

namespace gpt2::optim {

double muon_lr_scale(int64_t rows, int64_t cols) {
  return std::sqrt(std::max(1.0, static_cast<double>(rows) / static_cast<double>(cols)));
}

void muon_step(const std::vector<torch::Tensor>& params, const torch::Tensor& grads, torch::Tensor momentum, double lr,
               const MuonOptions& options, at::ScalarType compute) {
  GPT2_ASSERT(
      grads.dim() == 3 && grads.sizes() == momentum.sizes() && static_cast<int64_t>(params.size()) == grads.size(0),
      "muon_step takes a stack of matrices, their gradients and their momenta, of one shape");
  at::NoGradGuard no_grad;
  const at::Tensor g = grads.to(momentum.scalar_type());
  momentum.lerp_(g, 1.0 - options.momentum);
  const at::Tensor update = options.nesterov ? g.lerp(momentum, options.momentum) : momentum;
  const at::Tensor ortho = newton_schulz(update, options.ns, compute);
  for (size_t j = 0; j < params.size(); ++j) {
    torch::Tensor param = params[j];
    GPT2_ASSERT(param.sizes() == ortho.sizes().slice(1), "muon_step: a parameter of another shape than its stack");
    param.mul_(1.0 - lr * options.weight_decay);
    param.add_(ortho[static_cast<int64_t>(j)].to(param.scalar_type()),
               -lr * muon_lr_scale(param.size(0), param.size(1)));
  }
}

void muon_step(torch::Tensor param, const torch::Tensor& grad, torch::Tensor momentum, double lr,
               const MuonOptions& options, at::ScalarType compute) {
  GPT2_ASSERT(param.dim() == 2 && param.sizes() == grad.sizes() && param.sizes() == momentum.sizes(),
              "muon_step takes a matrix, its gradient and its momentum, of one shape");
  muon_step(std::vector<torch::Tensor>{param}, grad.unsqueeze(0), momentum.unsqueeze(0), lr, options, compute);
}

}  // namespace gpt2::optim
