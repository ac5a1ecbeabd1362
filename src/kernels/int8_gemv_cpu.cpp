#include "src/kernels/int8_gemv_cpu.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include <algorithm>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace gpt2::kernels {
namespace {
void gemv_baseline(const Int8GemvArgs& a, int64_t n0, int64_t n1) {
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
__attribute__((target("avx2,fma"))) void gemv_avx2(const Int8GemvArgs& a, int64_t n0, int64_t n1) {
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

// Blocks of 4 rows of W (the AVX2 loop's step) in [b0, b1).
void gemv_rows(const Int8GemvArgs& a, bool avx2, int64_t b0, int64_t b1) {
  const int64_t n0 = b0 * 4, n1 = std::min(b1 * 4, a.n);
#if defined(__x86_64__) && defined(__GNUC__)
  if (avx2) return gemv_avx2(a, n0, n1);
#endif
  (void)avx2;
  gemv_baseline(a, n0, n1);
}

}  // namespace

void int8_gemv_cpu(const Int8GemvArgs& a, bool avx2) {
  const int64_t blocks = (a.n + 3) / 4;
  // 64 blocks (256 rows of W) at least a thread: below that a region costs more than it saves.
  constexpr int64_t kMinBlocks = 64;
#ifdef _OPENMP
#pragma omp parallel if (blocks >= 2 * kMinBlocks)
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t per = (blocks + threads - 1) / threads;
    const int64_t b0 = std::min(blocks, t * per), b1 = std::min(blocks, b0 + per);
    if (b0 < b1) gemv_rows(a, avx2, b0, b1);
  }
#else
  gemv_rows(a, avx2, 0, blocks);
#endif
}

}  // namespace gpt2::kernels
