#pragma once
// Raw launchers of the kernels in this folder (*.cu), free of torch headers so nvcc
// compiles them quickly. Contracts: cross_entropy.h, layer_norm.h.
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

namespace gpt2::kernels {

// LayerNorm weight/bias gradients over rows x cols (row-major dy and x of `dtype`, fp32 mean and
// rstd per row): dgamma[c] = sum_r dy[r,c] (x[r,c] - mean[r]) rstd[r], dbeta[c] = sum_r dy[r,c],
// written in `dtype`. `partial` is scratch of 2 * layer_norm_chunks(rows) * cols floats.
int64_t layer_norm_chunks(int64_t rows);
cudaError_t launch_layer_norm_param_grads(Dtype dtype, const void* dy, const void* x, const float* mean,
                                          const float* rstd, int64_t rows, int64_t cols, float* partial,
                                          void* dgamma, void* dbeta, cudaStream_t stream);

}  // namespace gpt2::kernels
