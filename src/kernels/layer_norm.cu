// LayerNorm weight/bias gradients (launch.h). Pass 1: a block of 32 columns x 8 row lanes sums a
// chunk of rows into fp32 partials; pass 2: one thread per column adds the chunks. A warp reads
// 32 consecutive columns of one row, so loads coalesce; every element is read once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "src/kernels/convert.cuh"
#include "src/kernels/launch.h"

namespace gpt2::kernels {
namespace {

constexpr int kCols = 32, kLanes = 8, kRowsPerChunk = 256;

template <typename T>
__global__ void partial_sums(const T* __restrict__ dy, const T* __restrict__ x, const float* __restrict__ mean,
                             const float* __restrict__ rstd, int64_t rows, int64_t cols, float* __restrict__ partial) {
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kCols + tx;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRowsPerChunk;
  const int64_t r1 = r0 + kRowsPerChunk < rows ? r0 + kRowsPerChunk : rows;
  float g = 0.0f, b = 0.0f;
  if (c < cols) {
    for (int64_t r = r0 + ty; r < r1; r += kLanes) {
      const float d = to_float(dy[r * cols + c]);
      g += d * (to_float(x[r * cols + c]) - mean[r]) * rstd[r];
      b += d;
    }
  }
  __shared__ float sg[kLanes][kCols + 1], sb[kLanes][kCols + 1];
  sg[ty][tx] = g;
  sb[ty][tx] = b;
  __syncthreads();
  if (ty == 0 && c < cols) {
    for (int i = 1; i < kLanes; ++i) {
      g += sg[i][tx];
      b += sb[i][tx];
    }
    const int64_t chunks = gridDim.y;
    partial[blockIdx.y * cols + c] = g;
    partial[(chunks + blockIdx.y) * cols + c] = b;
  }
}

template <typename T>
__global__ void finish_sums(const float* __restrict__ partial, int64_t chunks, int64_t cols, T* __restrict__ dgamma,
                            T* __restrict__ dbeta) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float g = 0.0f, b = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) {
    g += partial[k * cols + c];
    b += partial[(chunks + k) * cols + c];
  }
  dgamma[c] = from_float<T>(g);
  dbeta[c] = from_float<T>(b);
}

template <typename T>
cudaError_t param_grads(const void* dy, const void* x, const float* mean, const float* rstd, int64_t rows, int64_t cols,
                        float* partial, void* dgamma, void* dbeta, cudaStream_t stream) {
  if (cols == 0) return cudaSuccess;
  const int64_t chunks = layer_norm_chunks(rows);
  const dim3 grid(static_cast<unsigned>((cols + kCols - 1) / kCols), static_cast<unsigned>(chunks));
  partial_sums<T><<<grid, dim3(kCols, kLanes), 0, stream>>>(static_cast<const T*>(dy), static_cast<const T*>(x), mean,
                                                             rstd, rows, cols, partial);
  finish_sums<T><<<static_cast<unsigned>((cols + 255) / 256), 256, 0, stream>>>(
      partial, chunks, cols, static_cast<T*>(dgamma), static_cast<T*>(dbeta));
  return cudaGetLastError();
}

}  // namespace

int64_t layer_norm_chunks(int64_t rows) { return rows > 0 ? (rows + kRowsPerChunk - 1) / kRowsPerChunk : 1; }

cudaError_t launch_layer_norm_param_grads(Dtype dtype, const void* dy, const void* x, const float* mean,
                                          const float* rstd, int64_t rows, int64_t cols, float* partial,
                                          void* dgamma, void* dbeta, cudaStream_t stream) {
  switch (dtype) {
    case Dtype::kF32: return param_grads<float>(dy, x, mean, rstd, rows, cols, partial, dgamma, dbeta, stream);
    case Dtype::kF16: return param_grads<__half>(dy, x, mean, rstd, rows, cols, partial, dgamma, dbeta, stream);
    case Dtype::kBF16:
      return param_grads<__nv_bfloat16>(dy, x, mean, rstd, rows, cols, partial, dgamma, dbeta, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace gpt2::kernels
