#include "src/kernels/int8_linear.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "src/base/errors.h"
#include "src/kernels/dtype.h"
#include "src/kernels/int8_gemv_cpu.h"

#ifdef GPT2_WITH_CUDA
#include <c10/cuda/CUDAStream.h>

#include "src/base/cuda_check.h"
#include "src/kernels/launch.h"
#endif

namespace gpt2::kernels {

// Note [int8 weights]
// Symmetric round-to-nearest int8 with a scale per row (or per group of a row), the scheme of
// LLM.int8()'s weight half and of weight-only int8 in TensorRT-LLM: q = round(W / s), s = max|W| /
// 127, so |W − q s| <= s / 2 = max|W| / 254 elementwise. The tied wte is int8 too, a scale per
// token row (or group): it is 31% of gpt2-124m's weights, and at batch 1 its fp32 head product was
// half of a CPU decode step's time; the embedding dequantizes the few rows it reads (int8_embedding).
// wpe, LayerNorms and biases stay in the model's dtype. Zero groups get scale 1 (q = 0), not 0/0.

Int8Weight quantize_int8(const torch::Tensor& w, int64_t group) {
  GPT2_ASSERT(w.dim() == 2 && at::isFloatingType(w.scalar_type()), "quantize_int8 takes a float matrix");
  const int64_t n = w.size(0), k = w.size(1);
  if (group == 0) group = k;
  GPT2_ASSERT(group > 0 && k % group == 0, "quantize_int8: the group must divide the row length");
  at::NoGradGuard no_grad;
  const at::Tensor g = w.to(at::kFloat).reshape({n, k / group, group});
  at::Tensor scale = g.abs().amax(2).div(127.0f);
  scale.masked_fill_(scale.eq(0), 1.0f);
  const at::Tensor q = g.div(scale.unsqueeze(2)).round().clamp(-127, 127).to(at::kChar).reshape({n, k});
  return {q.contiguous(), scale.contiguous()};
}

torch::Tensor dequantize_int8(const Int8Weight& w, at::ScalarType dtype) {
  const int64_t n = w.q.size(0), k = w.q.size(1), groups = w.scale.size(1);
  const auto compute = dtype == at::kDouble ? at::kDouble : at::kFloat;  // fp64: the exact products
  return w.q.to(compute).view({n, groups, k / groups}).mul(w.scale.to(compute).unsqueeze(2)).view({n, k}).to(dtype);
}

torch::Tensor int8_embedding(const torch::Tensor& ids, const Int8Weight& w, at::ScalarType dtype) {
  at::NoGradGuard no_grad;
  const at::Tensor flat = ids.reshape({-1});
  std::vector<int64_t> out_shape = ids.sizes().vec();
  out_shape.push_back(w.q.size(1));
  return dequantize_int8({w.q.index_select(0, flat), w.scale.index_select(0, flat)}, dtype).view(out_shape);
}

namespace {

bool cpu_has_avx2() {
  static const bool yes = [] {
    const char* cap = std::getenv("GPT2_CPU_INT8_ISA");
    if (cap != nullptr && std::string(cap) == "baseline") return false;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return false;
#endif
  }();
  return yes;
}

torch::Tensor gemv_cpu(const torch::Tensor& x2, const Int8Weight& w, const torch::Tensor& bias) {
  const int64_t m = x2.size(0), n = w.q.size(0), k = w.q.size(1);
  at::Tensor y = at::empty({m, n}, x2.options());
  const Int8GemvArgs a{x2.data_ptr<float>(),
                       w.q.data_ptr<int8_t>(),
                       w.scale.data_ptr<float>(),
                       bias.defined() ? bias.data_ptr<float>() : nullptr,
                       y.data_ptr<float>(),
                       m,
                       n,
                       k,
                       w.scale.size(1)};
  int8_gemv_cpu(a, cpu_has_avx2() && w.group() % 16 == 0);
  return y;
}

}  // namespace

std::string int8_cpu_isa() { return cpu_has_avx2() ? "avx2" : "baseline"; }

torch::Tensor int8_linear(const torch::Tensor& x, const Int8Weight& w, const torch::Tensor& bias) {
  GPT2_ASSERT(w.q.dim() == 2 && w.q.scalar_type() == at::kChar && w.scale.scalar_type() == at::kFloat &&
                  w.scale.dim() == 2 && w.scale.size(0) == w.q.size(0) && w.q.size(1) % w.scale.size(1) == 0,
              "int8_linear: q must be (N, K) int8 and scale (N, G) fp32 with G dividing K");
  GPT2_ASSERT(x.size(-1) == w.q.size(1) && x.device() == w.q.device() && x.is_contiguous(),
              "int8_linear: x must be contiguous (..., K) on the weight's device");
  GPT2_ASSERT(!bias.defined() || (bias.numel() == w.q.size(0) && bias.scalar_type() == x.scalar_type()),
              "int8_linear: bias must be (N) in x's dtype");
  at::NoGradGuard no_grad;
  const int64_t k = w.q.size(1), n = w.q.size(0);
  const at::Tensor x2 = x.reshape({-1, k});
  const int64_t m = x2.size(0);
  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape.back() = n;
  if (m <= kInt8GemvRows && m > 0) {
    if (x.is_cpu() && x.scalar_type() == at::kFloat)
      return gemv_cpu(x2, w, bias.defined() ? bias.contiguous() : bias).view(out_shape);
#ifdef GPT2_WITH_CUDA
    const bool aligned = reinterpret_cast<uintptr_t>(x2.data_ptr()) % 16 == 0 && k % 16 == 0 && w.group() % 16 == 0;
    if (x.is_cuda() && aligned) {
      at::Tensor y = at::empty({m, n}, x.options());
      CUDA_CHECK(launch_int8_gemv(dtype_of(x, "int8_linear"), x2.data_ptr(), w.q.data_ptr<int8_t>(),
                                  w.scale.data_ptr<float>(), bias.defined() ? bias.data_ptr() : nullptr, y.data_ptr(),
                                  m, n, k, w.scale.size(1), c10::cuda::getCurrentCUDAStream()));
      return y.view(out_shape);
    }
#endif
  }
  return at::linear(x, dequantize_int8(w, x.scalar_type()), bias);
}

}  // namespace gpt2::kernels
