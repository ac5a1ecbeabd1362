#pragma once
// Raw launchers of the cross-entropy kernels (cross_entropy.cu), free of torch headers so nvcc
// compiles them quickly. Row-major (rows, row_stride) logits; see cross_entropy.h.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace gpt2::kernels {

enum class Dtype { kF32, kF16, kBF16 };

// loss[r] = lse[r] - logits[r, targets[r]] (0 when ignored), lse[r] = log sum_j<vocab exp(logits[r, j]).
cudaError_t launch_cross_entropy_forward(Dtype dtype, const void* logits, const int64_t* targets, int64_t rows,
                                         int64_t row_stride, int64_t vocab, int64_t ignore_index, float* loss,
                                         float* lse, cudaStream_t stream);
// grad[r, j] = (exp(logits[r, j] - lse[r]) - [j == targets[r]]) * scale[0] for j < vocab and counted
// rows, 0 otherwise; grad has the logits' dtype and shape (rows, row_stride) and may be the logits
// buffer itself (each element is read before it is written, by the same thread).
cudaError_t launch_cross_entropy_backward(Dtype dtype, const void* logits, const int64_t* targets, const float* lse,
                                          const float* scale, int64_t rows, int64_t row_stride, int64_t vocab,
                                          int64_t ignore_index, void* grad, cudaStream_t stream);

}  // namespace gpt2::kernels
