#pragma once
// CPU AdamW for optimizer offload (ZeRO-Offload style): fp32 master weights and moments live in host
// memory, the GPU sends fp32 or bf16 gradients to pinned host buffers, the host updates in place and
// can write the bf16 copy the GPU computes with. The kernels are vectorised loops compiled for
// AVX-512, AVX2+FMA and baseline x86-64 and picked at run time; each runs on the calling thread only
// and HostThreadPool splits the work. No torch headers here, no OpenMP.
#include <cstdint>
#include <functional>
#include <memory>

namespace gpt2::optim {

// A fixed set of worker threads for data-parallel loops on the host. parallel_for splits [0, n)
// into at most num_threads() contiguous ranges (each a multiple of `align` elements except the
// last) and runs fn(begin, end) on them concurrently, the calling thread taking one range; it
// returns when all are done. An exception thrown by fn is rethrown in the caller (the first one).
// Calls from several threads are serialised; fn must not call parallel_for on the same pool.
class HostThreadPool {
 public:
  explicit HostThreadPool(int num_threads);  // <= 0: std::thread::hardware_concurrency()
  ~HostThreadPool();                         // joins
  HostThreadPool(const HostThreadPool&) = delete;
  HostThreadPool& operator=(const HostThreadPool&) = delete;
  int num_threads() const;
  void parallel_for(int64_t n, int64_t align, const std::function<void(int64_t, int64_t)>& fn);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

enum class HostGradType { kFloat32, kBFloat16 };

struct CpuAdamWStep {
  double lr = 0, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0;
  int64_t step = 1;       // 1-based count including this update (bias correction)
  double grad_scale = 1;  // every gradient is multiplied by this first (unscale, clip coefficient)
};

// The update's per-call constants, rounded to fp32 the way ATen's fused CPU kernel rounds them
// (shared with the GPU kernel of 8-bit moments, which computes the same bits).
struct AdamWCoeffs {
  float decay;       // 1 - lr * wd
  float lerp_coeff;  // 1 - beta1 when |1 - beta1| < 0.5 (base m), else (1 - beta1) - 1 (base g)
  bool lerp_from_m;
  float beta2;
  float one_minus_beta2;
  float bc2_sqrt;  // sqrt(1 - beta2^step)
  float eps;
  float neg_step_size;  // -lr / (1 - beta1^step)
  float grad_scale;
};
// Throws std::invalid_argument for step < 1.
AdamWCoeffs adamw_coeffs(const CpuAdamWStep& s);

// One AdamW update of n elements in place (same arithmetic as torch.optim.AdamW / ATen's
// _fused_adamw_ in fp32): param *= 1 - lr*wd; m = lerp(m, g, 1-beta1); v = beta2*v + (1-beta2)*g*g;
// param -= lr/(1-beta1^step) * m / (sqrt(v)/sqrt(1-beta2^step) + eps).
// grad points at n fp32 or bf16 values. When param_bf16 is not null, the updated param is also
// written there as bf16 (round to nearest even), for the copy the GPU computes with.
// Runs on the calling thread only; callers split work with HostThreadPool.
void cpu_adamw_update(const CpuAdamWStep& s, int64_t n, float* param, float* exp_avg, float* exp_avg_sq,
                      const void* grad, HostGradType grad_type, uint16_t* param_bf16);

// The instruction set cpu_adamw_update runs with on this machine: "avx512", "avx2" or "baseline".
const char* cpu_adamw_isa();

}  // namespace gpt2::optim
