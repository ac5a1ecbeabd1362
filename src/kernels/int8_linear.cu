// Weight-only int8 rows (int8_linear.h, launch.h): decoding reads every weight once, as int8.
// One warp per output column j: each lane takes 16 consecutive int8 weights of W's row j (one
// 16-byte load), widens them in registers and multiplies them with the same 16 positions of every
// row of x (ROWS of them, up to 16), the partial sums scaled by the group's scale; a warp sum gives
// y[r, j]. fp32 throughout; x, bias and y in the caller's dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "src/kernels/convert.cuh"
#include "src/kernels/launch.h"

namespace gpt2::kernels {
namespace {

constexpr int kWarps = 8;

template <typename T, int ROWS>
__global__ void int8_gemv_kernel(const T* __restrict__ x, const int8_t* __restrict__ q, const float* __restrict__ scale,
                                 const T* __restrict__ bias, T* __restrict__ y, int rows, int64_t n, int64_t k,
                                 int64_t group, int64_t groups) {
  const int lane = threadIdx.x % 32;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (j >= n) return;
  const int8_t* qrow = q + j * k;
  float acc[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) acc[r] = 0.0f;
  for (int64_t i = static_cast<int64_t>(lane) * 16; i < k; i += 32 * 16) {
    const int4 packed = *reinterpret_cast<const int4*>(qrow + i);
    float w[16];
    int8x16_to_float(packed, w);
    const float s = scale[j * groups + i / group];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      if (r >= rows) break;
      float xv[16];
      load_floats<T, 16>(x + r * k + i, xv);  // x rows are 16-byte aligned: k % 16 == 0
      float p = 0.0f;
#pragma unroll
      for (int e = 0; e < 16; ++e) p = fmaf(w[e], xv[e], p);
      acc[r] = fmaf(p, s, acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
#pragma unroll
    for (int off = 16; off > 0; off /= 2) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
  }
  if (lane == 0) {
    const float b = bias != nullptr ? to_float(bias[j]) : 0.0f;
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
      if (r < rows) y[r * n + j] = from_float<T>(acc[r] + b);
  }
}

template <typename T>
cudaError_t launch_typed(const void* x, const int8_t* q, const float* scale, const void* bias, void* y, int64_t rows,
                         int64_t n, int64_t k, int64_t groups, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((n + kWarps - 1) / kWarps)), block(32 * kWarps);
  const T* xt = static_cast<const T*>(x);
  const T* bt = static_cast<const T*>(bias);
  T* yt = static_cast<T*>(y);
  const int r = static_cast<int>(rows);
  const int64_t group = k / groups;
  if (rows <= 1)
    int8_gemv_kernel<T, 1><<<grid, block, 0, stream>>>(xt, q, scale, bt, yt, r, n, k, group, groups);
  else if (rows <= 2)
    int8_gemv_kernel<T, 2><<<grid, block, 0, stream>>>(xt, q, scale, bt, yt, r, n, k, group, groups);
  else if (rows <= 4)
    int8_gemv_kernel<T, 4><<<grid, block, 0, stream>>>(xt, q, scale, bt, yt, r, n, k, group, groups);
  else if (rows <= 8)
    int8_gemv_kernel<T, 8><<<grid, block, 0, stream>>>(xt, q, scale, bt, yt, r, n, k, group, groups);
  else
    int8_gemv_kernel<T, 16><<<grid, block, 0, stream>>>(xt, q, scale, bt, yt, r, n, k, group, groups);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_int8_gemv(Dtype dtype, const void* x, const int8_t* q, const float* scale, const void* bias, void* y,
                             int64_t rows, int64_t n, int64_t k, int64_t groups, cudaStream_t stream) {
  if (rows < 1 || rows > 16 || k % 16 != 0 || groups < 1 || k % groups != 0 || (k / groups) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(q) % 16 != 0)
    return cudaErrorInvalidValue;
  return with_storage_type(dtype, [&](auto t) {
    return launch_typed<typename decltype(t)::type>(x, q, scale, bias, y, rows, n, k, groups, stream);
  });
}

}  // namespace gpt2::kernels
