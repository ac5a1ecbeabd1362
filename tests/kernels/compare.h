#pragma once
// Shared by the kernel checks: the relative error they bound, and whether a GPU is there to run them.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "src/kernels/cross_entropy.h"  // have_cuda_kernels

namespace gpt2 {

// max |got - ref| / max |ref|, in float64 on the CPU.
inline double rel_error(const torch::Tensor& got, const torch::Tensor& ref) {
  const auto g = got.to(torch::kCPU, torch::kDouble), r = ref.to(torch::kCPU, torch::kDouble);
  return ((g - r).abs().max() / r.abs().max().clamp_min(1e-30)).item<double>();
}

inline bool have_gpu() { return kernels::have_cuda_kernels() && torch::cuda::is_available(); }

}  // namespace gpt2

// Skips the test without a GPU (CI); the GPU machine runs it.
#define REQUIRE_CUDA()                                                               \
  do {                                                                               \
    if (!::gpt2::have_gpu()) GTEST_SKIP() << "needs a CUDA device (runs on the GPU machine)"; \
  } while (0)
