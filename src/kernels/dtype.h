#pragma once
// Host-side helpers of the autograd wrappers in this folder: whether a dtype is one the kernels
// take (every build: the CPU cross-entropy takes the same three), whether this CPU's bf16 GEMMs
// are fast, the ScalarType a precision setting names, and in CUDA builds the launchers' Dtype for
// a tensor and the stream to launch on.
#include <torch/types.h>

#include "src/base/choices.h"
#include "src/base/errors.h"

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

// bf16, fp16 or fp32 as a ScalarType; `auto` must have been resolved first.
inline c10::ScalarType scalar_type_of(DtypeChoice d) {
  GPT2_ASSERT(d != DtypeChoice::kAuto, "a dtype of auto is resolved before it names a ScalarType");
  return d == DtypeChoice::kBf16 ? torch::kBFloat16 : d == DtypeChoice::kFp16 ? torch::kHalf : torch::kFloat;
}

// Note [bf16 on CPU]
// LibTorch hands a CPU bf16 GEMM to oneDNN only where oneDNN has bf16 kernels for the CPU: AVX-512
// (BW, VL, DQ) or AVX-VNNI with AVX-NE-CONVERT; elsewhere the product runs in a portable loop. On a 2-core AMD
// EPYC with AVX2 that made a configs/tiny.ini step take 61 s in bf16 against 1.0 s in fp32, so
// precision.dtype = auto takes bf16 on a CPU only where this returns true.
bool cpu_has_fast_bf16_gemm();

#ifdef GPT2_WITH_CUDA
inline cudaStream_t stream_of(const torch::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

inline Dtype dtype_of(c10::ScalarType t, const char* who) {
  switch (t) {
    case torch::kFloat:
      return Dtype::kF32;
    case torch::kHalf:
      return Dtype::kF16;
    case torch::kBFloat16:
      return Dtype::kBF16;
    default:
      throw std::invalid_argument(std::string(who) + ": dtype " + c10::toString(t) + " is not fp32, fp16 or bf16");
  }
}
inline Dtype dtype_of(const torch::Tensor& t, const char* who) { return dtype_of(t.scalar_type(), who); }
#endif

}  // namespace gpt2::kernels
