#include "optim/muon.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <vector>

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
  const at::Tensor ortho = newton_schulz(update, options.ns, compute).to(params.front().scalar_type());
  std::vector<at::Tensor> rows;
  for (size_t j = 0; j < params.size(); ++j) {
    GPT2_ASSERT(params[j].sizes() == ortho.sizes().slice(1) && params[j].scalar_type() == ortho.scalar_type(),
                "muon_step: the parameters of a stack have its shape and one dtype");
    rows.push_back(ortho[static_cast<int64_t>(j)]);
  }
  // One multi-tensor kernel each over the stack (torch's _foreach ops), not two kernels a matrix.
  at::_foreach_mul_(params, 1.0 - lr * options.weight_decay);
  at::_foreach_add_(params, rows, -lr * muon_lr_scale(ortho.size(1), ortho.size(2)));
}

void muon_step(torch::Tensor param, const torch::Tensor& grad, torch::Tensor momentum, double lr,
               const MuonOptions& options, at::ScalarType compute) {
  GPT2_ASSERT(param.dim() == 2 && param.sizes() == grad.sizes() && param.sizes() == momentum.sizes(),
              "muon_step takes a matrix, its gradient and its momentum, of one shape");
  muon_step(std::vector<torch::Tensor>{param}, grad.unsqueeze(0), momentum.unsqueeze(0), lr, options, compute);
}

}  // namespace gpt2::optim
