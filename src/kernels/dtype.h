#pragma once
// The launchers' Dtype for a tensor (host side; kernels take raw pointers). CUDA builds only.
#include <torch/types.h>

#include <stdexcept>
#include <string>

#include "src/kernels/launch.h"

namespace gpt2::kernels {

inline Dtype dtype_of(const torch::Tensor& t, const char* who) {
  switch (t.scalar_type()) {
    case torch::kFloat: return Dtype::kF32;
    case torch::kHalf: return Dtype::kF16;
    case torch::kBFloat16: return Dtype::kBF16;
    default: throw std::invalid_argument(std::string(who) + ": dtype " + c10::toString(t.scalar_type()) + " is not fp32, fp16 or bf16");
  }
}

}  // namespace gpt2::kernels
