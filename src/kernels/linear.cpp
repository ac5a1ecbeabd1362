// Linear and the MLP (linear.h) as autograd functions: GEMMs through gemm.h (ATen's, or the
// algorithm timed fastest per shape; c_fc's with its bias and GELU in a cuBLASLt epilogue), bias
// gradients and the GELU backward through this folder's kernels.
#include "src/kernels/linear.h"

#include <torch/torch.h>

#include <stdexcept>

#include "src/kernels/gemm.h"

#ifdef GPT2_WITH_CUDA
#include "src/base/cuda_check.h"
#include "src/kernels/dtype.h"
#endif

namespace gpt2::kernels {

#ifdef GPT2_WITH_CUDA
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

torch::Tensor partial_for(const torch::Tensor& rows_by_cols) {
  return torch::empty({column_sum_chunks(rows_by_cols.size(0)) * rows_by_cols.size(1)},
                      rows_by_cols.options().dtype(torch::kFloat));
}

// (dw, db) of a linear layer from its output gradient dy (N, out) and input x (N, in): the GEMM
// and the column-sum kernel. Undefined where not needed.
std::pair<torch::Tensor, torch::Tensor> weight_and_bias_grads(const torch::Tensor& dy, const torch::Tensor& x,
                                                              bool need_w, bool need_b) {
  torch::Tensor dw, db;
  if (need_w) dw = gemm(dy.t(), x);
  if (need_b) db = bias_grad(dy);
  return {dw, db};
}

class Linear : public torch::autograd::Function<Linear> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& bias) {
    ctx->save_for_backward({x, weight});
    auto sizes = x.sizes().vec();
    sizes.back() = weight.size(0);
    return gemm_bias(x.reshape({-1, x.size(-1)}), weight, bias).view(sizes);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &weight = saved[1];
    const auto dy = grads[0].contiguous().view({-1, weight.size(0)});
    torch::Tensor dx;
    if (ctx->needs_input_grad(0)) dx = gemm(dy, weight).view(x.sizes());
    auto [dw, db] =
        weight_and_bias_grads(dy, x.reshape({-1, x.size(-1)}), ctx->needs_input_grad(1), ctx->needs_input_grad(2));
    return {dx, dw, db};
  }
};

// y = c_proj(gelu(c_fc(x))) with both layers' weights and biases.
class Mlp : public torch::autograd::Function<Mlp> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& fc_w,
                               const torch::Tensor& fc_b, const torch::Tensor& proj_w, const torch::Tensor& proj_b,
                               bool keep_gelu_output) {
    const auto x2 = x.reshape({-1, x.size(-1)});
    auto pre = torch::empty({x2.size(0), fc_w.size(0)}, x.options());  // the GELU input, kept for backward
    auto h = torch::empty_like(pre);                                   // the GELU output
    if (!gemm_bias_gelu(x2, fc_w, fc_b, h, pre)) {
      pre = gemm_bias(x2, fc_w, fc_b);
      h = at::gelu(pre, "tanh");
    }
    if (keep_gelu_output) {
      ctx->save_for_backward({x, fc_w, proj_w, pre, h});
    } else {
      ctx->save_for_backward({x, fc_w, proj_w, pre});
    }
    auto y = gemm_bias(h, proj_w, proj_b);  // (N, C)
    auto sizes = x.sizes().vec();
    sizes.back() = proj_w.size(0);
    return y.view(sizes);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &fc_w = saved[1], &proj_w = saved[2], &pre = saved[3];
    const auto h = saved.size() > 4 ? saved[4] : at::gelu(pre, "tanh");
    const auto dy = grads[0].contiguous().view({-1, proj_w.size(0)});
    auto [dproj_w, dproj_b] = weight_and_bias_grads(dy, h, ctx->needs_input_grad(3), ctx->needs_input_grad(4));
    // The GELU input gradient and c_fc's bias gradient in one pass.
    const auto [dpre, dfc_b] = gelu_and_bias_backward(gemm(dy, proj_w), pre);
    torch::Tensor dx, dfc_w;
    if (ctx->needs_input_grad(0)) dx = gemm(dpre, fc_w).view(x.sizes());
    if (ctx->needs_input_grad(1)) dfc_w = gemm(dpre.t(), x.reshape({-1, x.size(-1)}));
    return {dx, dfc_w, ctx->needs_input_grad(2) ? dfc_b : torch::Tensor(), dproj_w, dproj_b, torch::Tensor()};
  }
};

}  // namespace
#endif

torch::Tensor bias_grad(const torch::Tensor& dy) {
#ifdef GPT2_WITH_CUDA
  if (dy.is_cuda() && is_kernel_dtype(dy.scalar_type()) && dy.dim() == 2 && dy.is_contiguous()) {
    auto db = torch::empty({dy.size(1)}, dy.options());
    auto partial = partial_for(dy);
    CUDA_CHECK(launch_column_sum(dtype_of(dy, "kernels::bias_grad"), dy.data_ptr(), dy.size(0), dy.size(1),
                                 partial.data_ptr<float>(), db.data_ptr(), stream_of(dy)));
    return db;
  }
#endif
  return dy.sum(0);
}

std::pair<torch::Tensor, torch::Tensor> gelu_and_bias_backward(const torch::Tensor& dh, const torch::Tensor& pre) {
#ifdef GPT2_WITH_CUDA
  if (dh.is_cuda() && is_kernel_dtype(dh.scalar_type()) && dh.dim() == 2 && dh.is_contiguous() &&
      pre.sizes() == dh.sizes() && pre.scalar_type() == dh.scalar_type() && pre.is_contiguous()) {
    auto dpre = torch::empty_like(dh);
    auto dbias = torch::empty({dh.size(1)}, dh.options());
    auto partial = partial_for(dh);
    CUDA_CHECK(launch_gelu_backward(dtype_of(dh, "kernels::gelu_and_bias_backward"), dh.data_ptr(), pre.data_ptr(),
                                    dh.size(0), dh.size(1), dpre.data_ptr(), partial.data_ptr<float>(),
                                    dbias.data_ptr(), stream_of(dh)));
    return {dpre, dbias};
  }
#endif
  auto dpre = at::gelu_backward(dh, pre, "tanh");
  return {dpre, dpre.sum(0)};
}

bool linear_applies(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
#ifdef GPT2_WITH_CUDA
  const auto t = x.scalar_type();
  return x.is_cuda() && is_kernel_dtype(t) && x.dim() >= 1 && weight.defined() && bias.defined() && weight.dim() == 2 &&
         bias.dim() == 1 && weight.size(1) == x.size(-1) && bias.size(0) == weight.size(0) &&
         weight.scalar_type() == t && bias.scalar_type() == t && weight.device() == x.device() &&
         bias.device() == x.device() && weight.is_contiguous() && bias.is_contiguous();
#else
  (void)x, (void)weight, (void)bias;
  return false;
#endif
}

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  if (!linear_applies(x, weight, bias)) {
    throw std::invalid_argument(
        "kernels::linear: x (..., in), weight (out, in), bias (out) contiguous on one CUDA "
        "device, one dtype of fp32/bf16/fp16, in a CUDA build");
  }
#ifdef GPT2_WITH_CUDA
  return Linear::apply(x.contiguous(), weight, bias);
#else
  return {};
#endif
}

bool mlp_applies(const torch::Tensor& x, const torch::Tensor& fc_weight, const torch::Tensor& fc_bias,
                 const torch::Tensor& proj_weight, const torch::Tensor& proj_bias) {
  return linear_applies(x, fc_weight, fc_bias) && proj_weight.defined() && proj_bias.defined() &&
         proj_weight.dim() == 2 && proj_bias.dim() == 1 && proj_weight.size(1) == fc_weight.size(0) &&
         proj_bias.size(0) == proj_weight.size(0) && proj_weight.scalar_type() == x.scalar_type() &&
         proj_bias.scalar_type() == x.scalar_type() && proj_weight.device() == x.device() &&
         proj_bias.device() == x.device() && proj_weight.is_contiguous() && proj_bias.is_contiguous();
}

torch::Tensor mlp(const torch::Tensor& x, const torch::Tensor& fc_weight, const torch::Tensor& fc_bias,
                  const torch::Tensor& proj_weight, const torch::Tensor& proj_bias, bool keep_gelu_output) {
  if (!mlp_applies(x, fc_weight, fc_bias, proj_weight, proj_bias)) {
    throw std::invalid_argument(
        "kernels::mlp: x (..., C), fc weight (H, C) and bias (H), proj weight (C', H) and bias "
        "(C') contiguous on one CUDA device, one dtype of fp32/bf16/fp16, in a CUDA build");
  }
#ifdef GPT2_WITH_CUDA
  return Mlp::apply(x.contiguous(), fc_weight, fc_bias, proj_weight, proj_bias, keep_gelu_output);
#else
  (void)keep_gelu_output;
  return {};
#endif
}

}  // namespace gpt2::kernels
