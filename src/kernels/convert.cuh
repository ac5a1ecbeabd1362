#pragma once
// Device helpers of the kernels in this folder: fp32 <-> storage types (fp32 math everywhere),
// packed vector loads, warp sums, and the second pass of the column sums (bias and LayerNorm
// parameter gradients): out_k[c] = sum over chunks b of partial[(b * n_out + k) * cols + c].
// On the host side, with_storage_type: a launcher's Dtype -> the storage type its kernels take.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "src/kernels/launch.h"

namespace gpt2::kernels {

template <typename T>
struct StorageType {
  using type = T;
};

// Calls launch(StorageType<T>{}) with T = float, __half or __nv_bfloat16 as `dtype` says, and
// returns its result; a Dtype outside the three is cudaErrorInvalidValue. One switch for every
// launcher: `with_storage_type(dtype, [&](auto t) { return run<typename decltype(t)::type>(...); })`.
template <typename Launch>
cudaError_t with_storage_type(Dtype dtype, Launch&& launch) {
  switch (dtype) {
    case Dtype::kF32:
      return launch(StorageType<float>{});
    case Dtype::kF16:
      return launch(StorageType<__half>{});
    case Dtype::kBF16:
      return launch(StorageType<__nv_bfloat16>{});
  }
  return cudaErrorInvalidValue;
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// VEC elements of T in one 16-byte (or smaller) load.
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

// 16-byte packs when every row starts 16-byte aligned, else one element at a time.
template <typename T>
inline bool can_pack(const void* p, int64_t row_elems) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (row_elems * static_cast<int64_t>(sizeof(T))) % 16 == 0;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// A block of 32 columns x 8 lanes over the chunks, then a shared-memory sum of the lanes.
template <typename T>
__global__ void __launch_bounds__(256) finish_column_sums(const float* __restrict__ partial, int64_t chunks,
                                                          int64_t cols, T* __restrict__ out0, T* __restrict__ out1) {
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + tx;
  const int n_out = out1 ? 2 : 1;
  float a = 0.0f, b = 0.0f;
  if (c < cols) {
    for (int64_t k = ty; k < chunks; k += 8) {
      a += partial[(k * n_out) * cols + c];
      if (out1) b += partial[(k * n_out + 1) * cols + c];
    }
  }
  __shared__ float sa[8][33], sb[8][33];
  sa[ty][tx] = a;
  sb[ty][tx] = b;
  __syncthreads();
  if (ty == 0 && c < cols) {
    for (int i = 1; i < 8; ++i) {
      a += sa[i][tx];
      b += sb[i][tx];
    }
    out0[c] = from_float<T>(a);
    if (out1) out1[c] = from_float<T>(b);
  }
}

template <typename T>
inline void launch_finish_column_sums(const float* partial, int64_t chunks, int64_t cols, void* out0, void* out1,
                                      cudaStream_t stream) {
  finish_column_sums<T><<<static_cast<unsigned>((cols + 31) / 32), 256, 0, stream>>>(
      partial, chunks, cols, static_cast<T*>(out0), static_cast<T*>(out1));
}

}  // namespace gpt2::kernels
