#pragma once
// Host-side helpers of the autograd wrappers in this folder: whether a dtype is one the kernels
// take (every build: the CPU cross-entropy takes the same three), and in CUDA builds the
// launchers' Dtype for a tensor and the stream to launch on.
#include <torch/types.h>

#ifdef GPT2_WITH_CUDA
#include <c10/cuda/CUDAStream.h>

#include <stdexcept>
#include <string>

#include "src/kernels/launch.h"
#endif

namespace gpt2::kernels {

inline bool is_kernel_dtype(c10::ScalarType t) {
  return t == torch::kFloat || t == torch::kHalf || t == torch::kBFloat16;
}

#ifdef GPT2_WITH_CUDA
inline cudaStream_t stream_of(const torch::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

inline Dtype dtype_of(const torch::Tensor& t, const char* who) {
  switch (t.scalar_type()) {
    case torch::kFloat: return Dtype::kF32;
    case torch::kHalf: return Dtype::kF16;
    case torch::kBFloat16: return Dtype::kBF16;
    default: throw std::invalid_argument(std::string(who) + ": dtype " + c10::toString(t.scalar_type()) + " is not fp32, fp16 or bf16");
  }
}
#endif

}  // namespace gpt2::kernels
