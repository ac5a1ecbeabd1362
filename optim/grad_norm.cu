// The gradient norm's reductions on the GPU (grad_norm.h): one CUDA block per cell, a fixed tree, no
// atomics, so a cell's sum depends on its values alone and the same launch gives the same bits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "optim/grad_norm.h"

namespace gpt2::optim {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

// The sum over the block of each thread's v, in one fixed tree: warps by shuffles, then the warps'
// sums by warp 0. Every thread gets the result.
__device__ __forceinline__ double block_sum(double v) {
  __shared__ double warp_sums[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  v = lane < kThreads / 32 ? warp_sums[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    block_sum_squares_kernel(const T* __restrict x, int64_t cell, double* __restrict out) {
  const T* c = x + static_cast<int64_t>(blockIdx.x) * cell;
  double s = 0;
  for (int64_t i = threadIdx.x; i < cell; i += kThreads) {
    const double v = to_float(c[i]);
    s = __dadd_rn(s, __dmul_rn(v, v));  // the square is exact; spelled out so nothing is fused
  }
  s = block_sum(s);
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

__global__ void __launch_bounds__(kThreads)
    ordered_sum_kernel(const double* __restrict x, int64_t n, double* __restrict out) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) s = __dadd_rn(s, x[i]);
  s = block_sum(s);
  if (threadIdx.x == 0) *out = s;
}

}  // namespace

cudaError_t launch_block_sum_squares(const void* x, int dtype, int64_t num_cells, int64_t cell, double* out,
                                     cudaStream_t stream) {
  if (num_cells <= 0) return cudaSuccess;
  if (num_cells > INT32_MAX) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(num_cells));
  switch (dtype) {
    case 0:
      block_sum_squares_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const float*>(x), cell, out);
      break;
    case 1:
      block_sum_squares_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), cell, out);
      break;
    case 2:
      block_sum_squares_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const __half*>(x), cell, out);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_ordered_sum(const double* x, int64_t n, double* out, cudaStream_t stream) {
  ordered_sum_kernel<<<1, kThreads, 0, stream>>>(x, n, out);
  return cudaGetLastError();
}

}  // namespace gpt2::optim
