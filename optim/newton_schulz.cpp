#include "optim/newton_schulz.h"

#include <ATen/ATen.h>

#include "src/base/errors.h"
#include "src/kernels/gemm.h"

namespace gpt2::optim {

torch::Tensor newton_schulz(const torch::Tensor& g, const NewtonSchulz& ns, at::ScalarType compute) {
  GPT2_ASSERT(g.dim() == 2 || g.dim() == 3, "newton_schulz takes a matrix or a stack of matrices");
  at::NoGradGuard no_grad;
  if (compute == at::ScalarType::Undefined) compute = g.is_cuda() ? at::kBFloat16 : at::kFloat;
  const bool stack = g.dim() == 3, tall = g.size(-2) > g.size(-1);
  // One product for the whole stack: a batched GEMM (ATen's), a single matrix through src/kernels.
  auto product = [stack](const at::Tensor& a, const at::Tensor& b) {
    return stack ? at::bmm(a, b) : kernels::gemm(a, b);
  };
  at::Tensor x = (tall ? g.transpose(-2, -1) : g).to(compute).contiguous();
  x.div_(
      (stack ? at::linalg_vector_norm(x, 2, at::IntArrayRef{-2, -1}, /*keepdim=*/true) : x.norm()).clamp_min(ns.eps));
  for (int i = 0; i < ns.steps; ++i) {
    const at::Tensor a = product(x, x.transpose(-2, -1));
    const at::Tensor b = product(a, a).mul_(NewtonSchulz::kC).add_(a, NewtonSchulz::kB);  // b A + c A²
    x = product(b, x).add_(x, NewtonSchulz::kA);
  }
  return (tall ? x.transpose(-2, -1) : x).to(g.scalar_type()).contiguous();
}

double newton_schulz_map(double x, const NewtonSchulz& ns) {
  for (int i = 0; i < ns.steps; ++i) {
    const double x2 = x * x;
    x = x * (NewtonSchulz::kA + x2 * (NewtonSchulz::kB + NewtonSchulz::kC * x2));
  }
  return x;
}

}  // namespace gpt2::optim
