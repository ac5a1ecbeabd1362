// The residual LayerNorm (layer_norm.h) as an autograd function over the CUDA launchers.
#include "src/kernels/layer_norm.h"

#include <torch/torch.h>

#include <optional>
#include <stdexcept>

#ifdef GPT2_WITH_CUDA
#include "src/base/cuda_check.h"
#include "src/kernels/dtype.h"
#endif

namespace gpt2::kernels {

#ifdef GPT2_WITH_CUDA
namespace {

bool aligned16(const torch::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// t as contiguous rows starting 16-byte aligned, as the packed path needs (a copy only for views
// that are not). Every buffer the launchers get goes through it: rows over 256 columns have only
// the packed path. Gradients too: autograd hands backward a view (a slice at an odd offset, say)
// as it is.
torch::Tensor aligned_contiguous(const torch::Tensor& t) {
  auto c = t.contiguous();
  return aligned16(c) ? c : c.clone();
}

class ResidualLayerNorm : public torch::autograd::Function<ResidualLayerNorm> {
 public:
  // Outputs: (s, out) with y, (out) without.
  // y is optional rather than undefined: autograd records every Tensor argument as an input.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const std::optional<torch::Tensor>& y_opt, const torch::Tensor& weight,
                                                const torch::Tensor& bias, double eps) {
    const torch::Tensor y = y_opt.value_or(torch::Tensor());
    const int64_t cols = x.size(-1), rows = x.numel() / cols;
    auto out = torch::empty_like(x);
    auto s = y.defined() ? torch::empty_like(x) : x;
    const auto f32 = x.options().dtype(torch::kFloat);
    auto mean = torch::empty({rows}, f32), rstd = torch::empty({rows}, f32);
    const LayerNormArgs args{x.data_ptr(), weight.data_ptr(), bias.data_ptr(), rows, cols};
    CUDA_CHECK(launch_layer_norm_forward(dtype_of(x, "kernels::residual_layer_norm"), args, static_cast<float>(eps),
                                         y.defined() ? y.data_ptr() : nullptr, y.defined() ? s.data_ptr() : nullptr,
                                         out.data_ptr(), mean.data_ptr<float>(), rstd.data_ptr<float>(), stream_of(x)));
    ctx->save_for_backward({s, weight, mean, rstd});
    ctx->saved_data["residual"] = y.defined();
    if (y.defined()) return {s, out};
    return {out};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &s = saved[0], &weight = saved[1], &mean = saved[2], &rstd = saved[3];
    const bool residual = ctx->saved_data["residual"].toBool();
    const auto ds = residual && grads[0].defined() ? aligned_contiguous(grads[0]) : torch::Tensor();
    auto dout = grads[residual ? 1 : 0];
    dout = dout.defined() ? aligned_contiguous(dout) : torch::zeros_like(s);
    const int64_t cols = s.size(-1), rows = s.numel() / cols;
    auto dx = torch::empty_like(s);
    auto dweight = torch::empty_like(weight), dbias = torch::empty_like(weight);
    auto partial = torch::empty({2 * layer_norm_backward_blocks(rows) * cols}, s.options().dtype(torch::kFloat));
    const LayerNormArgs args{s.data_ptr(), weight.data_ptr(), nullptr, rows, cols};
    CUDA_CHECK(launch_layer_norm_backward(dtype_of(s, "kernels::residual_layer_norm"), args, dout.data_ptr(),
                                          ds.defined() ? ds.data_ptr() : nullptr, mean.data_ptr<float>(),
                                          rstd.data_ptr<float>(), dx.data_ptr(), partial.data_ptr<float>(),
                                          dweight.data_ptr(), dbias.data_ptr(), stream_of(s)));
    // x and y receive the same gradient; neither consumer modifies it in place.
    return {dx, residual ? dx : torch::Tensor(), dweight, dbias, torch::Tensor()};
  }
};

}  // namespace
#endif

bool residual_layer_norm_applies(const torch::Tensor& x, const torch::Tensor& y, const torch::Tensor& weight,
                                 const torch::Tensor& bias) {
#ifdef GPT2_WITH_CUDA
  const auto t = x.scalar_type();
  if (!x.is_cuda() || x.dim() < 1 || !is_kernel_dtype(t)) return false;
  if (!weight.defined() || !bias.defined() || weight.numel() != x.size(-1) || bias.numel() != x.size(-1) ||
      weight.scalar_type() != t || bias.scalar_type() != t || !weight.is_contiguous() || !bias.is_contiguous() ||
      !aligned16(weight) || !aligned16(bias)) {
    return false;
  }
  if (y.defined() && (y.sizes() != x.sizes() || y.scalar_type() != t || y.device() != x.device())) return false;
  return layer_norm_supported(dtype_of(x, "kernels::residual_layer_norm"), x.size(-1));
#else
  (void)x, (void)y, (void)weight, (void)bias;
  return false;
#endif
}

std::pair<torch::Tensor, torch::Tensor> residual_layer_norm(const torch::Tensor& x, const torch::Tensor& y,
                                                            const torch::Tensor& weight, const torch::Tensor& bias,
                                                            double eps) {
  if (!residual_layer_norm_applies(x, y, weight, bias)) {
    throw std::invalid_argument(
        "kernels::residual_layer_norm: x and y (..., C) CUDA fp32/bf16/fp16 with weight and bias (C) of their dtype, "
        "C up to 2048 (1024 in fp32), in a CUDA build");
  }
#ifdef GPT2_WITH_CUDA
  const auto outs = ResidualLayerNorm::apply(
      aligned_contiguous(x), y.defined() ? std::optional<torch::Tensor>(aligned_contiguous(y)) : std::nullopt, weight,
      bias, eps);
  if (y.defined()) return {outs[0], outs[1]};
  return {x, outs[0]};
#else
  (void)eps;
  return {};
#endif
}

}  // namespace gpt2::kernels
