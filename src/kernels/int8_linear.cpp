#include "src/kernels/int8_linear.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "src/base/errors.h"
#include "src/kernels/dtype.h"

#ifdef GPT2_WITH_CUDA
#include <c10/cuda/CUDAStream.h>

#include "src/base/cuda_check.h"
#include "src/kernels/launch.h"
#endif

namespace gpt2::kernels {

// Note [int8 weights]
// Symmetric round-to-nearest int8 with a scale per row (or per group of a row), the scheme of
// LLM.int8()'s weight half and of weight-only int8 in TensorRT-LLM: q = round(W / s), s = max|W| /
// 127, so |W − q s| <= s / 2 = max|W| / 254 elementwise. Embeddings, LayerNorm and the tied head
// stay in the model's dtype: they are a fifth of gpt2-124m's weights and the head's rows are read
// one token at a time by the embedding as well. Zero groups get scale 1 (q = 0), not 0/0.

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

namespace {

// y[m, n] = sum_g scale[n, g] · sum_{k in g} q[n, k] x[m, k] (+ bias[n]), rows n in [n0, n1).
struct GemvArgs {
  const float* x;  // (m, k)
  const int8_t* q;
  const float* scale;
  const float* bias;  // nullptr: none
  float* y;           // (m, n)
  int64_t m, n, k, groups;
};

void gemv_baseline(const GemvArgs& a, int64_t n0, int64_t n1) {
  const int64_t group = a.k / a.groups;
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* qr = a.q + n * a.k;
    for (int64_t m = 0; m < a.m; ++m) {
      const float* xr = a.x + m * a.k;
      float total = 0;
      for (int64_t g = 0; g < a.groups; ++g) {
        float acc = 0;
        for (int64_t j = g * group; j < (g + 1) * group; ++j) acc += static_cast<float>(qr[j]) * xr[j];
        total += acc * a.scale[n * a.groups + g];
      }
      a.y[m * a.n + n] = total + (a.bias != nullptr ? a.bias[n] : 0.0f);
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Four rows of W at a time against one row of x, 16 weights a step in two accumulators per row
// (8 independent FMA chains; each weight widened int8 -> int32 -> fp32 in registers). Rows of x
// are taken one after another: on the CPU decoding batches are small. Needs group % 16 == 0 (else
// the baseline runs). Measured on 2 cores of an AMD EPYC: 2.5x faster than the same loop over 8
// weights a step with two rows of x (bench/int8_cpu_bench.cpp).
__attribute__((target("avx2,fma"))) void gemv_avx2(const GemvArgs& a, int64_t n0, int64_t n1) {
  const int64_t group = a.k / a.groups;
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    for (int64_t m = 0; m < a.m; ++m) {
      const float* x = a.x + m * a.k;
      float total[4] = {};
      for (int64_t g = 0; g < a.groups; ++g) {
        __m256 acc[8];
        for (auto& v : acc) v = _mm256_setzero_ps();
        for (int64_t j = g * group; j < (g + 1) * group; j += 16) {
          const __m256 x0 = _mm256_loadu_ps(x + j), x1 = _mm256_loadu_ps(x + j + 8);
          for (int r = 0; r < 4; ++r) {
            const __m128i q16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.q + (n + r) * a.k + j));
            const __m256 w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q16));
            const __m256 w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q16, 8)));
            acc[2 * r] = _mm256_fmadd_ps(w0, x0, acc[2 * r]);
            acc[2 * r + 1] = _mm256_fmadd_ps(w1, x1, acc[2 * r + 1]);
          }
        }
        for (int r = 0; r < 4; ++r)
          total[r] += hsum(_mm256_add_ps(acc[2 * r], acc[2 * r + 1])) * a.scale[(n + r) * a.groups + g];
      }
      for (int r = 0; r < 4; ++r) a.y[m * a.n + n + r] = total[r] + (a.bias != nullptr ? a.bias[n + r] : 0.0f);
    }
  }
  if (n < n1) gemv_baseline(a, n, n1);
}
#endif

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
  const GemvArgs a{x2.data_ptr<float>(),
                   w.q.data_ptr<int8_t>(),
                   w.scale.data_ptr<float>(),
                   bias.defined() ? bias.data_ptr<float>() : nullptr,
                   y.data_ptr<float>(),
                   m,
                   n,
                   k,
                   w.scale.size(1)};
  const bool avx2 = cpu_has_avx2() && w.group() % 16 == 0;
  // Each output depends on its own row of W only: the result is the same whatever the split.
  // Note: in our files (built without -fopenmp) at::parallel_for's inline OpenMP loop is serial,
  // so this runs on the calling thread. Measured on 2 cores: a pool of our own fought ATen's
  // OpenMP threads, which spin after each of their regions (1.06x fp32's tokens/s), and building
  // this file alone with -fopenmp made other files' at::parallel_for instantiations parallel
  // through the linker's choice of one copy (the CPU cross-entropy then ran without its no-grad
  // mode in OpenMP threads). Parallel CPU loops wait for one OpenMP decision for the whole build.
  at::parallel_for(0, (n + 3) / 4, 16, [&](int64_t b0, int64_t b1) {
    const int64_t n0 = b0 * 4, n1 = std::min(b1 * 4, n);
#if defined(__x86_64__) && defined(__GNUC__)
    if (avx2) return gemv_avx2(a, n0, n1);
#endif
    gemv_baseline(a, n0, n1);
  });
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
