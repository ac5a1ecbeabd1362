#include "optim/cpu_adamw.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "src/base/threads.h"

// The kernels are plain loops that GCC vectorises; each is compiled three times (AVX-512, AVX2+FMA,
// baseline x86-64) through target attributes and picked once at run time with
// __builtin_cpu_supports. (target_clones is not used: its "avx2" clone has no FMA, so the fused
// lerp that ATen uses would become a libm call, and "arch=" clones dispatch on the CPU model.)
// The loops need -O3 and -fno-math-errno (else sqrt keeps a scalar errno path and nothing
// vectorises; `#pragma GCC optimize` cannot turn errno off for builtins), and -ffp-contract=off
// keeps the rounding exactly as written (see adamw_loop); optim/CMakeLists.txt sets all three for
// this file. Builtins (__builtin_sqrtf, __builtin_fmaf) rather than the std:: wrappers keep every
// call inlinable into the target-specific functions.

namespace gpt2::optim {

// ---------------------------------------------------------------------------------------------
// HostThreadPool

struct HostThreadPool::Impl {
  std::vector<std::thread> workers;  // num_threads - 1; the caller is the last thread
  std::mutex call_mu;                // serialises parallel_for callers
  std::mutex mu;
  std::condition_variable work_cv, done_cv;
  uint64_t generation = 0;  // bumped for every parallel_for that uses workers
  bool stop = false;
  // The current job: worker w runs range w + 1 if w + 1 < parts.
  const std::function<void(int64_t, int64_t)>* fn = nullptr;
  int64_t n = 0, align = 1, units = 0, parts = 0;
  int pending = 0;
  std::exception_ptr error;

  // Range `k` of `parts` over `units` blocks of `align` elements: the first units % parts ranges
  // take one block more; only the last range can end at n inside a block.
  void range(int64_t k, int64_t* begin, int64_t* end) const {
    const int64_t base = units / parts, rem = units % parts;
    const int64_t first = k * base + std::min(k, rem);
    const int64_t count = base + (k < rem ? 1 : 0);
    *begin = first * align;
    *end = std::min(n, (first + count) * align);
  }

  void record(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mu);
    if (!error) error = std::move(e);
  }

  void stop_and_join() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    work_cv.notify_all();
    for (auto& t : workers) t.join();
    workers.clear();
  }

  void worker_loop(int index) {
    uint64_t seen = 0;
    for (;;) {
      std::unique_lock<std::mutex> lock(mu);
      work_cv.wait(lock, [&] { return stop || generation != seen; });
      if (stop) return;
      seen = generation;
      const int64_t k = index + 1;
      if (k >= parts) continue;
      int64_t begin = 0, end = 0;
      range(k, &begin, &end);
      const auto* f = fn;
      lock.unlock();
      try {
        (*f)(begin, end);
      } catch (...) {
        record(std::current_exception());
      }
      lock.lock();
      if (--pending == 0) done_cv.notify_one();
    }
  }
};

HostThreadPool::HostThreadPool(int num_threads) : impl_(std::make_unique<Impl>()) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  impl_->workers.reserve(num_threads - 1);
  try {
    for (int i = 0; i + 1 < num_threads; ++i) {
      Impl* impl = impl_.get();
      impl_->workers.push_back(start_helper_thread([impl, i] { impl->worker_loop(i); }));
    }
  } catch (...) {
    impl_->stop_and_join();  // the threads already started
    throw;
  }
}

HostThreadPool::~HostThreadPool() { impl_->stop_and_join(); }

int HostThreadPool::num_threads() const { return static_cast<int>(impl_->workers.size()) + 1; }

void HostThreadPool::parallel_for(int64_t n, int64_t align, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (align < 1) align = 1;
  const int64_t units = (n + align - 1) / align;
  const int64_t parts = std::min<int64_t>(num_threads(), units);
  if (parts == 1) {
    fn(0, n);
    return;
  }
  Impl& p = *impl_;
  std::lock_guard<std::mutex> call_lock(p.call_mu);
  {
    std::lock_guard<std::mutex> lock(p.mu);
    p.fn = &fn;
    p.n = n;
    p.align = align;
    p.units = units;
    p.parts = parts;
    p.pending = static_cast<int>(parts - 1);
    p.error = nullptr;
    ++p.generation;
  }
  p.work_cv.notify_all();
  int64_t begin = 0, end = 0;
  p.range(0, &begin, &end);  // no lock needed: the job fields change only under call_mu
  try {
    fn(begin, end);
  } catch (...) {
    p.record(std::current_exception());
  }
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(p.mu);
    p.done_cv.wait(lock, [&] { return p.pending == 0; });
    p.fn = nullptr;
    error = std::move(p.error);
    p.error = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

// ---------------------------------------------------------------------------------------------
// Kernels

namespace {

using Coeffs = AdamWCoeffs;

#define GPT2_INLINE inline __attribute__((always_inline))

template <bool kBf16>
GPT2_INLINE float load_grad(const float* __restrict gf, const uint16_t* __restrict gh, int64_t i) {
  if constexpr (kBf16) {
    return __builtin_bit_cast(float, static_cast<uint32_t>(gh[i]) << 16);
  } else {
    return gf[i];
  }
}

// fp32 -> bf16, round to nearest even; NaN -> 0x7FC0 (as c10::BFloat16).
GPT2_INLINE uint16_t to_bf16(float x) {
  const uint32_t u = __builtin_bit_cast(uint32_t, x);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return (u & 0x7FFFFFFFu) > 0x7F800000u ? static_cast<uint16_t>(0x7FC0u) : static_cast<uint16_t>(rounded);
}

// a * b + c rounded once. Without hardware FMA (the baseline build) the product is formed exactly
// in double and the sum rounded to double, then to float: the correctly rounded fmaf except when
// that double rounding lands on a float tie (rare, and then 1 ulp), and unlike std::fma it
// vectorises with SSE2 instead of calling libm per element.
template <bool kFma>
GPT2_INLINE float fused_multiply_add(float a, float b, float c) {
  if constexpr (kFma) {
    return __builtin_fmaf(a, b, c);
  } else {
    return static_cast<float>(static_cast<double>(a) * static_cast<double>(b) + static_cast<double>(c));
  }
}

// The update in ATen's operation order and rounding (FusedAdamKernel.cpp, ADAMW mode, vector path,
// as the torch 2.11 wheel computes it: the lerp is Vectorized::fmadd and the compiler fused
// v * beta2 + (c2 * g) * g into fma(c2 * g, g, v * beta2); nothing else is fused). This file is
// compiled with -ffp-contract=off so that exactly these two fused operations happen; on
// x86-64 with AVX-512 this reproduces ATen's fp32 results bitwise except in the few elements
// ATen computes on its scalar tail path (1 ulp in exp_avg_sq). kFma = false: the baseline build,
// fused operations emulated through double (see fused_multiply_add).
template <bool kBf16Grad, bool kBf16Out, bool kFma, bool kLerpFromM>
GPT2_INLINE void adamw_loop(const Coeffs& c, int64_t n, float* __restrict param, float* __restrict exp_avg,
                            float* __restrict exp_avg_sq, const void* grad, uint16_t* __restrict out) {
  const float* __restrict gf = static_cast<const float*>(grad);
  const uint16_t* __restrict gh = static_cast<const uint16_t*>(grad);
  const float decay = c.decay, coeff = c.lerp_coeff, beta2 = c.beta2, c2 = c.one_minus_beta2;
  const float bc2_sqrt = c.bc2_sqrt, eps = c.eps, neg_step = c.neg_step_size, scale = c.grad_scale;
  for (int64_t i = 0; i < n; ++i) {
    const float g = load_grad<kBf16Grad>(gf, gh, i) * scale;
    const float p = param[i] * decay;  // decay == 1 exactly when wd == 0 (ATen skips it then)
    const float m0 = exp_avg[i];
    const float m = fused_multiply_add<kFma>(coeff, g - m0, kLerpFromM ? m0 : g);
    const float v = fused_multiply_add<kFma>(c2 * g, g, exp_avg_sq[i] * beta2);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    // Two divisions per element, as ATen: a hoisted reciprocal would cost bitwise agreement and
    // the loop is bound by memory bandwidth, not by the divider.
    const float denom = __builtin_sqrtf(v) / bc2_sqrt + eps;
    const float p1 = p + neg_step * m / denom;
    param[i] = p1;
    if constexpr (kBf16Out) out[i] = to_bf16(p1);
  }
}

// The lerp's two forms are separate loops: GCC does not vectorise a select on a run-time flag in
// the loops that also store bf16.
template <bool kBf16Grad, bool kBf16Out, bool kFma>
GPT2_INLINE void adamw_body(const Coeffs& c, int64_t n, float* __restrict param, float* __restrict exp_avg,
                            float* __restrict exp_avg_sq, const void* grad, uint16_t* __restrict out) {
  if (c.lerp_from_m) {
    adamw_loop<kBf16Grad, kBf16Out, kFma, true>(c, n, param, exp_avg, exp_avg_sq, grad, out);
  } else {
    adamw_loop<kBf16Grad, kBf16Out, kFma, false>(c, n, param, exp_avg, exp_avg_sq, grad, out);
  }
}

using UpdateFn = void (*)(const Coeffs&, int64_t, float*, float*, float*, const void*, uint16_t*);

struct Kernels {
  UpdateFn update[2][2];  // [bf16 grad][bf16 out]
  const char* isa;
};

// One set of kernels per instruction set; ATTR is the target attribute.
#define GPT2_CPU_ADAMW_KERNELS(NAME, ATTR, FMA)                                                                     \
  template <bool kBf16Grad, bool kBf16Out>                                                                          \
  ATTR void update_##NAME(const Coeffs& c, int64_t n, float* p, float* m, float* v, const void* g, uint16_t* out) { \
    adamw_body<kBf16Grad, kBf16Out, FMA>(c, n, p, m, v, g, out);                                                    \
  }                                                                                                                 \
  Kernels kernels_##NAME(const char* isa) {                                                                         \
    return Kernels{{{update_##NAME<false, false>, update_##NAME<false, true>},                                      \
                    {update_##NAME<true, false>, update_##NAME<true, true>}},                                       \
                   isa};                                                                                            \
  }

#if defined(__x86_64__) && defined(__GNUC__)
GPT2_CPU_ADAMW_KERNELS(avx512, __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))), true)
GPT2_CPU_ADAMW_KERNELS(avx2, __attribute__((target("avx2,fma"))), true)
#endif
#if defined(__FMA__)
GPT2_CPU_ADAMW_KERNELS(baseline, , true)
#else
GPT2_CPU_ADAMW_KERNELS(baseline, , false)
#endif

// The best set this CPU runs. GPT2_CPU_ADAMW_ISA=avx2 or =baseline caps the choice (read once, at
// the first call), so that tests and benchmarks can exercise the narrower builds on a wide CPU.
const Kernels& kernels() {
  static const Kernels k = [] {
    const char* cap_env = std::getenv("GPT2_CPU_ADAMW_ISA");
    const std::string cap = cap_env != nullptr ? cap_env : "";
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    const bool fma = __builtin_cpu_supports("fma");
    if (cap.empty() && fma && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
      return kernels_avx512("avx512");
    if (cap != "baseline" && fma && __builtin_cpu_supports("avx2")) return kernels_avx2("avx2");
#endif
    return kernels_baseline("baseline");
  }();
  return k;
}

int bf16_index(HostGradType t) { return t == HostGradType::kBFloat16 ? 1 : 0; }

}  // namespace

AdamWCoeffs adamw_coeffs(const CpuAdamWStep& s) {
  if (s.step < 1) throw std::invalid_argument("cpu_adamw_update: step must be >= 1 (1-based)");
  const double step = static_cast<double>(s.step);
  const double bc1 = 1 - std::pow(s.beta1, step);
  const double bc2 = 1 - std::pow(s.beta2, step);
  AdamWCoeffs c;
  c.decay = static_cast<float>(1 - s.lr * s.weight_decay);
  const float w = static_cast<float>(1 - s.beta1);
  c.lerp_from_m = std::abs(w) < 0.5f;
  c.lerp_coeff = c.lerp_from_m ? w : w - 1.0f;
  c.beta2 = static_cast<float>(s.beta2);
  c.one_minus_beta2 = static_cast<float>(1 - s.beta2);
  c.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  c.eps = static_cast<float>(s.eps);
  c.neg_step_size = static_cast<float>(-(s.lr / bc1));
  c.grad_scale = static_cast<float>(s.grad_scale);
  return c;
}

void cpu_adamw_update(const CpuAdamWStep& s, int64_t n, float* param, float* exp_avg, float* exp_avg_sq,
                      const void* grad, HostGradType grad_type, uint16_t* param_bf16) {
  if (n <= 0) return;
  const Coeffs c = adamw_coeffs(s);
  kernels().update[bf16_index(grad_type)][param_bf16 != nullptr ? 1 : 0](c, n, param, exp_avg, exp_avg_sq, grad,
                                                                         param_bf16);
}

const char* cpu_adamw_isa() { return kernels().isa; }

}  // namespace gpt2::optim
