#include "optim/newton_schulz.h"

#include <ATen/ATen.h>

#include "src/base/errors.h"
#include "src/kernels/gemm.h"

namespace gpt2::optim {

torch::Tensor newton_schulz(const torch::Tensor& g, const NewtonSchulz& ns, at::ScalarType compute) {
  GPT2_ASSERT(g.dim() == 2, "newton_schulz takes a matrix");
  at::NoGradGuard no_grad;
  if (compute == at::ScalarType::Undefined) compute = g.is_cuda() ? at::kBFloat16 : at::kFloat;
  const bool tall = g.size(0) > g.size(1);
  at::Tensor x = (tall ? g.t() : g).to(compute).contiguous();
  x.div_(x.norm().clamp_min(ns.eps));
  for (int i = 0; i < ns.steps; ++i) {
    const at::Tensor a = kernels::gemm(x, x.t());
    const at::Tensor b = kernels::gemm(a, a).mul_(NewtonSchulz::kC).add_(a, NewtonSchulz::kB);  // b A + c A²
    x = kernels::gemm(b, x).add_(x, NewtonSchulz::kA);
  }
  return (tall ? x.t() : x).to(g.scalar_type()).contiguous();
}

double newton_schulz_map(double x, const NewtonSchulz& ns) {
  for (int i = 0; i < ns.steps; ++i) {
    const double x2 = x * x;
    x = x * (NewtonSchulz::kA + x2 * (NewtonSchulz::kB + NewtonSchulz::kC * x2));
  }
  return x;
}

}  // namespace gpt2::optim
