// LayerNorm with the two-pass weight/bias gradient (layer_norm.h) as an autograd function.
#include "src/kernels/layer_norm.h"

#include <torch/torch.h>

#include <stdexcept>

#ifdef GPT2_WITH_CUDA
#include <c10/cuda/CUDAStream.h>

#include "parallel/cuda_check.h"
#include "src/kernels/dtype.h"
#endif

namespace gpt2::kernels {

#ifdef GPT2_WITH_CUDA
namespace {

class LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias, double eps) {
    auto [y, mean, rstd] = at::native_layer_norm(x, {x.size(-1)}, weight, bias, eps);
    ctx->save_for_backward({x, weight, bias, mean, rstd});
    return y;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &weight = saved[1], &bias = saved[2], &mean = saved[3], &rstd = saved[4];
    const auto dy = grads[0].contiguous();
    const int64_t cols = x.size(-1), rows = x.numel() / cols;
    // The input gradient from ATen; its GammaBeta kernel is skipped (output_mask false, false).
    auto dx = std::get<0>(at::native_layer_norm_backward(dy, x, {cols}, mean, rstd, weight, bias, {true, false, false}));
    auto dgamma = torch::empty_like(weight), dbeta = torch::empty_like(bias);
    auto partial = torch::empty({2 * layer_norm_chunks(rows) * cols}, x.options().dtype(torch::kFloat));
    const auto mean32 = mean.to(torch::kFloat).contiguous(), rstd32 = rstd.to(torch::kFloat).contiguous();
    const auto xc = x.contiguous();
    const auto stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
    CUDA_CHECK(launch_layer_norm_param_grads(dtype_of(x, "kernels::layer_norm"), dy.data_ptr(), xc.data_ptr(),
                                             mean32.data_ptr<float>(), rstd32.data_ptr<float>(), rows, cols,
                                             partial.data_ptr<float>(), dgamma.data_ptr(), dbeta.data_ptr(), stream));
    return {dx, dgamma, dbeta, torch::Tensor()};
  }
};

}  // namespace
#endif

torch::Tensor layer_norm(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias, double eps) {
#ifdef GPT2_WITH_CUDA
  if (!x.is_cuda() || x.dim() < 1 || !weight.defined() || !bias.defined() || weight.numel() != x.size(-1) ||
      bias.numel() != x.size(-1) || weight.scalar_type() != x.scalar_type() || bias.scalar_type() != x.scalar_type()) {
    throw std::invalid_argument("kernels::layer_norm: x (..., C) CUDA with weight and bias (C) of its dtype");
  }
  return LayerNormFunction::apply(x, weight, bias, eps);
#else
  (void)x, (void)weight, (void)bias, (void)eps;
  throw std::logic_error("kernels::layer_norm: this build has no CUDA");
#endif
}

}  // namespace gpt2::kernels
