#pragma once
// Shared by the kernel checks: the errors of a result against a float64 reference, the rule a
// fused kernel is held to (Note [Kernel accuracy rule]), and whether a GPU is there to run them.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <string>

#ifdef GPT2_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "src/kernels/cross_entropy.h"  // have_cuda_kernels

namespace gpt2 {

// Note [Kernel accuracy rule]
// A fused kernel and the LibTorch composition it replaces run on the same inputs, in the kernel's
// dtype, and both are compared with a float64 reference computed from those same (rounded) inputs.
// The fused result may be at most kAccuracyRatio times as far from the reference as LibTorch's, in
// both measures of Errors: the relative norm error (the typical element) and the relative max
// error (the worst one: a wrong tail column or padding entry shows there, not in the norm).
// Errors below kErrorFloor count as equal: there both paths compute in fp32 (fp32 runs, and the
// fp32 loss of bf16 logits) and differ only by the order of a few fp32 roundings (the fused
// softmax also uses __expf), while a bf16 rounding is 2^-9 ~ 2e-3. Every comparison prints both
// errors on a "[ measured ]" line, so the GPU machine's log carries the numbers.
inline constexpr double kAccuracyRatio = 1.5;
inline constexpr double kErrorFloor = 2e-5;

struct Errors {
  double norm;  // |got - ref|_2 / |ref|_2
  double max;   // max |got - ref| / max |ref|
};

// got against ref, in float64 on ref's device.
inline Errors errors_of(const torch::Tensor& got, const torch::Tensor& ref) {
  const auto r = ref.detach().to(torch::kDouble);
  const auto d = got.detach().to(r.device(), torch::kDouble) - r;
  const double tiny = 1e-300;  // an all-zero reference: any difference is an error
  return {d.norm().item<double>() / std::max(r.norm().item<double>(), tiny),
          d.abs().max().item<double>() / std::max(r.abs().max().item<double>(), tiny)};
}

// The bound Note [Kernel accuracy rule] puts on a fused error, given LibTorch's.
inline double accuracy_bound(double unfused_error) { return std::max(kAccuracyRatio * unfused_error, kErrorFloor); }

// Expects `fused` as accurate as `unfused` against the float64 `ref` (Note [Kernel accuracy rule])
// and of the same dtype; with check_max false only the norm error is held to the rule (both are
// printed). Returns the fused errors.
inline Errors expect_as_accurate(const std::string& what, const torch::Tensor& fused, const torch::Tensor& unfused,
                                 const torch::Tensor& ref, bool check_max = true) {
  const Errors f = errors_of(fused, ref), u = errors_of(unfused, ref);
  std::printf("[ measured ] %s: relative error fused %.3g unfused %.3g (norm), fused %.3g unfused %.3g (max)\n",
              what.c_str(), f.norm, u.norm, f.max, u.max);
  std::fflush(stdout);
  EXPECT_EQ(fused.scalar_type(), unfused.scalar_type()) << what;
  EXPECT_LE(f.norm, accuracy_bound(u.norm))
      << what << ": relative norm error, fused " << f.norm << " against unfused " << u.norm;
  if (check_max) {
    EXPECT_LE(f.max, accuracy_bound(u.max))
        << what << ": relative max error, fused " << f.max << " against unfused " << u.max;
  }
  return f;
}

inline bool have_gpu() { return kernels::have_cuda_kernels() && torch::cuda::is_available(); }

// Bytes the caching allocator has handed out on the current GPU (0 without CUDA: the tests skip).
inline int64_t allocated_bytes() {
#ifdef GPT2_WITH_CUDA
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(c10::cuda::current_device());
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current;
#else
  return 0;
#endif
}

}  // namespace gpt2

// Skips the test without a GPU (CI); the GPU machine runs it.
#define REQUIRE_CUDA()                                                                        \
  do {                                                                                        \
    if (!::gpt2::have_gpu()) GTEST_SKIP() << "needs a CUDA device (runs on the GPU machine)"; \
  } while (0)
