// The decode step over the blocks and head (decode_step.h): the checks, the one-kernel launch, and
// the call-by-call path (the CPU's, and CUDA's where the one kernel does not apply).
#include "src/kernels/decode_step.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>

#include "src/kernels/dtype.h"
#include "src/kernels/slot_attention.h"

#ifdef GPT2_WITH_CUDA
#include "src/base/cuda_check.h"
#include "src/kernels/launch.h"
#endif

namespace gpt2::kernels {
namespace {

bool aligned16(const torch::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// t is a contiguous tensor of `sizes` in x's dtype and device (or undefined, where allowed).
bool like_x(const torch::Tensor& t, const torch::Tensor& x, at::IntArrayRef sizes) {
  return t.defined() && t.sizes() == sizes && t.is_contiguous() && t.device() == x.device() &&
         t.scalar_type() == x.scalar_type();
}

bool norm_fits(const DecodeNorm& norm, const torch::Tensor& x, int64_t c, double eps) {
  return like_x(norm.gamma, x, {c}) && like_x(norm.beta, x, {c}) && norm.eps == eps;
}

// A (n, k) weight as the one kernel reads it: int8 or not as `int8` says, laid out as decode_linear's
// check wants (what the one kernel skips), its bias (n) or none, and taken by the decode_linear
// kernels (alignment, int8 groups), whose device code the one kernel runs.
bool weight_fits(const DecodeWeight& w, const torch::Tensor& x, int64_t n, int64_t k, bool int8) {
  if ((w.int8 != nullptr) != int8) return false;
  if (w.bias.defined() && !like_x(w.bias, x, {n})) return false;
  const bool layout = int8 ? w.int8->q.sizes() == at::IntArrayRef{n, k} && w.int8->q.is_contiguous() &&
                                 w.int8->q.scalar_type() == torch::kChar && w.int8->q.device() == x.device() &&
                                 w.int8->scale.dim() == 2 && w.int8->scale.size(0) == n &&
                                 w.int8->scale.is_contiguous() && w.int8->scale.scalar_type() == torch::kFloat &&
                                 w.int8->scale.device() == x.device()
                           : like_x(w.w, x, {n, k});
  return layout && decode_linear_applies(x.device(), x.scalar_type(), x.size(0), k, w);
}

#ifdef GPT2_WITH_CUDA
DecodeStepWeight step_weight(const DecodeWeight& w) {
  DecodeStepWeight s{};
  if (w.int8 != nullptr) {
    s.w = w.int8->q.data_ptr();
    s.scale = w.int8->scale.data_ptr<float>();
    s.groups = w.int8->scale.size(1);
  } else {
    s.w = w.w.data_ptr();
  }
  s.bias = w.bias.defined() ? w.bias.data_ptr() : nullptr;
  return s;
}

torch::Tensor one_kernel_step(torch::Tensor& x, const std::vector<DecodeLayer>& layers, const DecodeNorm& ln_f,
                              const DecodeWeight& head, const torch::Tensor& positions, torch::Tensor* trace) {
  const int64_t rows = x.size(0), c = x.size(1);
  const auto& keys = layers.front().keys;
  DecodeStepArgs a{};
  a.rows = rows;
  a.c = c;
  a.heads = keys.size(1);
  a.capacity = keys.size(2);
  a.layers = static_cast<int64_t>(layers.size());
  a.vocab = head.out_features();
  a.int8 = head.int8 != nullptr;
  a.eps = static_cast<float>(ln_f.eps);
  a.scale = 1.0f / std::sqrt(static_cast<float>(keys.size(3)));    // as slot_attention sets it
  const auto scratch = torch::empty({6 * rows * c}, x.options());  // q, y (rows, C) and h (rows, 4C)
  const auto barrier = torch::zeros({1}, x.options().dtype(torch::kInt));
  auto logits = torch::empty({rows, a.vocab}, x.options());  // (rows, N)
  a.x = x.data_ptr();
  a.q = scratch.data_ptr();
  a.y = scratch.narrow(0, rows * c, rows * c).data_ptr();
  a.h = scratch.narrow(0, 2 * rows * c, 4 * rows * c).data_ptr();
  a.logits = logits.data_ptr();
  a.positions = positions.data_ptr<int64_t>();
  a.barrier = static_cast<unsigned*>(barrier.data_ptr());
  if (trace != nullptr) {
    *trace = torch::zeros({a.layers * 5 + 1, 3, decode_step_grid()}, x.options().dtype(torch::kLong));
    a.trace = reinterpret_cast<unsigned long long*>(trace->data_ptr<int64_t>());
  }
  a.ln_f_gamma = ln_f.gamma.data_ptr();
  a.ln_f_beta = ln_f.beta.data_ptr();
  a.head = step_weight(head);
  for (size_t l = 0; l < layers.size(); ++l) {
    const DecodeLayer& in = layers[l];
    DecodeStepLayer& out = a.layer[l];
    out.ln_1_gamma = in.ln_1.gamma.data_ptr();
    out.ln_1_beta = in.ln_1.beta.data_ptr();
    out.c_attn = step_weight(in.c_attn);
    out.attn_proj = step_weight(in.attn_proj);
    out.ln_2_gamma = in.ln_2.gamma.data_ptr();
    out.ln_2_beta = in.ln_2.beta.data_ptr();
    out.c_fc = step_weight(in.c_fc);
    out.mlp_proj = step_weight(in.mlp_proj);
    out.keys = in.keys.data_ptr();
    out.values = in.values.data_ptr();
  }
  CUDA_CHECK(launch_decode_step(dtype_of(x, "decode_step"), a, stream_of(x)));
  return logits;
}
#endif

}  // namespace

bool decode_step_in_one_kernel(const torch::Tensor& x, const std::vector<DecodeLayer>& layers, const DecodeNorm& ln_f,
                               const DecodeWeight& head) {
#ifdef GPT2_WITH_CUDA
  if (!x.defined() || !x.is_cuda() || x.dim() != 2 || !x.is_contiguous() || !aligned16(x) ||
      !is_kernel_dtype(x.scalar_type()) || layers.empty() || !layers.front().keys.defined() ||
      layers.front().keys.dim() != 4)
    return false;
  const int64_t rows = x.size(0), c = x.size(1);
  const auto& k0 = layers.front().keys;
  const int64_t heads = k0.size(1), capacity = k0.size(2);
  if (k0.size(0) != rows || heads * k0.size(3) != c ||
      !decode_step_supported(dtype_of(x.scalar_type(), "decode_step"), rows, c, heads,
                             static_cast<int64_t>(layers.size())))
    return false;
  const bool int8 = head.int8 != nullptr;
  const double eps = ln_f.eps;
  if (!norm_fits(ln_f, x, c, eps) || !weight_fits(head, x, head.out_features(), c, int8) || head.bias.defined())
    return false;
  for (const auto& layer : layers) {
    if (!norm_fits(layer.ln_1, x, c, eps) || !norm_fits(layer.ln_2, x, c, eps) ||
        !weight_fits(layer.c_attn, x, 3 * c, c, int8) || !weight_fits(layer.attn_proj, x, c, c, int8) ||
        !weight_fits(layer.c_fc, x, 4 * c, c, int8) || !weight_fits(layer.mlp_proj, x, c, 4 * c, int8))
      return false;
    for (const auto* t : {&layer.keys, &layer.values})
      if (!like_x(*t, x, {rows, heads, capacity, c / heads}) || !aligned16(*t)) return false;
  }
  return true;
#else
  (void)x, (void)layers, (void)ln_f, (void)head;
  return false;
#endif
}

torch::Tensor decode_step(torch::Tensor& x, const std::vector<DecodeLayer>& layers, const DecodeNorm& ln_f,
                          const DecodeWeight& head, const torch::Tensor& positions, OneKernel one_kernel,
                          torch::Tensor* trace) {
#ifdef GPT2_WITH_CUDA
  if (one_kernel == OneKernel::kYes && positions.defined() && positions.dim() == 1 && positions.size(0) == x.size(0) &&
      positions.scalar_type() == torch::kLong && positions.is_contiguous() && positions.device() == x.device() &&
      decode_step_in_one_kernel(x, layers, ln_f, head))
    return one_kernel_step(x, layers, ln_f, head, positions, trace);
#else
  (void)one_kernel, (void)trace;
#endif
  const int64_t rows = x.size(0), c = x.size(1);
  for (const auto& layer : layers) {
    const int64_t heads = layer.keys.size(1), hs = c / heads;
    torch::Tensor keys = layer.keys, values = layer.values;  // handles: decode_qkv writes into the cache
    const auto q = decode_qkv(x, layer.ln_1, layer.c_attn, keys, values, positions);  // (rows, C)
    const auto y = slot_attention(q.view({rows, heads, 1, hs}), layer.keys, layer.values, positions);
    decode_linear_add_to(y.view({rows, c}), layer.attn_proj, x);
    const auto h = decode_linear(x, layer.ln_2, layer.c_fc, /*gelu=*/true);  // (rows, 4C)
    decode_linear_add_to(h, layer.mlp_proj, x);
  }
  return decode_linear(x, ln_f, head, /*gelu=*/false);  // (rows, N)
}

}  // namespace gpt2::kernels
