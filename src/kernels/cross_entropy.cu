// Cross-entropy kernels (launch.h): one block per row, fp32 math, 16-byte loads
// when the rows allow them. Memory-bound: forward reads the row once, backward reads it and writes
// the gradient once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "src/kernels/convert.cuh"
#include "src/kernels/launch.h"

namespace gpt2::kernels {
namespace {

constexpr int kThreads = 256;

// Running (max, sum of exp(x - max)) of an online softmax.
struct MaxSum {
  float m, s;
};

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};
  return {m, a.s * __expf(a.m - m) + b.s * __expf(b.m - m)};
}

__device__ __forceinline__ MaxSum add_value(MaxSum a, float x) { return merge(a, MaxSum{x, 1.0f}); }

// VEC elements of T in one 16-byte (or smaller) load.
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) forward_kernel(const T* __restrict__ logits, const int64_t* __restrict__ targets,
                                                           int64_t row_stride, int64_t vocab, int64_t ignore_index,
                                                           float* __restrict__ loss, float* __restrict__ lse) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * row_stride;
  MaxSum acc{-INFINITY, 0.0f};
  const int64_t packs = vocab / VEC;
  for (int64_t p = threadIdx.x; p < packs; p += kThreads) {
    const Pack<T, VEC> pk = reinterpret_cast<const Pack<T, VEC>*>(x)[p];
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < VEC; ++i) m = fmaxf(m, to_float(pk.v[i]));
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < VEC; ++i) s += __expf(to_float(pk.v[i]) - m);
    acc = merge(acc, MaxSum{m, s});
  }
  for (int64_t j = packs * VEC + threadIdx.x; j < vocab; j += kThreads) acc = add_value(acc, to_float(x[j]));

  // Block reduction: warps by shuffles, then the first warp over the warps' results.
  for (int offset = 16; offset > 0; offset >>= 1) {
    acc = merge(acc, MaxSum{__shfl_down_sync(0xffffffffu, acc.m, offset), __shfl_down_sync(0xffffffffu, acc.s, offset)});
  }
  __shared__ MaxSum warps[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warps[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < kThreads / 32 ? warps[lane] : MaxSum{-INFINITY, 0.0f};
    for (int offset = 16; offset > 0; offset >>= 1) {
      acc = merge(acc, MaxSum{__shfl_down_sync(0xffffffffu, acc.m, offset), __shfl_down_sync(0xffffffffu, acc.s, offset)});
    }
    if (lane == 0) {
      const float l = acc.m + logf(acc.s);
      lse[row] = l;
      const int64_t t = targets[row];
      if (t == ignore_index) {
        loss[row] = 0.0f;
      } else if (t < 0 || t >= vocab) {
        loss[row] = NAN;  // an id outside the vocabulary: make the run stop on a non-finite loss
      } else {
        loss[row] = l - to_float(x[t]);
      }
    }
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads) backward_kernel(const T* logits, const int64_t* __restrict__ targets,
                                                            const float* __restrict__ lse, const float* __restrict__ scale,
                                                            int64_t row_stride, int64_t vocab, int64_t ignore_index,
                                                            T* grad) {  // grad may be logits itself
  const int64_t row = blockIdx.x;
  const T* x = logits + row * row_stride;
  T* g = grad + row * row_stride;
  const int64_t t = targets[row];
  const float k = t == ignore_index ? 0.0f : scale[0];
  const float l = lse[row];
  const int64_t packs = row_stride / VEC;  // the padded width: padding columns get zeros
  for (int64_t p = threadIdx.x; p < packs; p += kThreads) {
    const Pack<T, VEC> pk = reinterpret_cast<const Pack<T, VEC>*>(x)[p];
    Pack<T, VEC> out;
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      const int64_t j = p * VEC + i;
      const float d = j < vocab ? (__expf(to_float(pk.v[i]) - l) - (j == t ? 1.0f : 0.0f)) * k : 0.0f;
      out.v[i] = from_float<T>(d);
    }
    reinterpret_cast<Pack<T, VEC>*>(g)[p] = out;
  }
  for (int64_t j = packs * VEC + threadIdx.x; j < row_stride; j += kThreads) {
    const float d = j < vocab ? (__expf(to_float(x[j]) - l) - (j == t ? 1.0f : 0.0f)) * k : 0.0f;
    g[j] = from_float<T>(d);
  }
}

// 16-byte packs when every row starts 16-byte aligned, else one element at a time.
template <typename T>
bool can_pack(const void* p, int64_t row_stride) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (row_stride * static_cast<int64_t>(sizeof(T))) % 16 == 0;
}

template <typename T>
cudaError_t forward(const void* logits, const int64_t* targets, int64_t rows, int64_t row_stride, int64_t vocab,
                    int64_t ignore_index, float* loss, float* lse, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const T* x = static_cast<const T*>(logits);
  if (can_pack<T>(logits, row_stride)) {
    forward_kernel<T, 16 / sizeof(T)><<<rows, kThreads, 0, stream>>>(x, targets, row_stride, vocab, ignore_index, loss, lse);
  } else {
    forward_kernel<T, 1><<<rows, kThreads, 0, stream>>>(x, targets, row_stride, vocab, ignore_index, loss, lse);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward(const void* logits, const int64_t* targets, const float* lse, const float* scale, int64_t rows,
                     int64_t row_stride, int64_t vocab, int64_t ignore_index, void* grad, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const T* x = static_cast<const T*>(logits);
  T* g = static_cast<T*>(grad);
  if (can_pack<T>(logits, row_stride) && can_pack<T>(grad, row_stride)) {
    backward_kernel<T, 16 / sizeof(T)><<<rows, kThreads, 0, stream>>>(x, targets, lse, scale, row_stride, vocab,
                                                                      ignore_index, g);
  } else {
    backward_kernel<T, 1><<<rows, kThreads, 0, stream>>>(x, targets, lse, scale, row_stride, vocab, ignore_index, g);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_cross_entropy_forward(Dtype dtype, const void* logits, const int64_t* targets, int64_t rows,
                                         int64_t row_stride, int64_t vocab, int64_t ignore_index, float* loss,
                                         float* lse, cudaStream_t stream) {
  switch (dtype) {
    case Dtype::kF32: return forward<float>(logits, targets, rows, row_stride, vocab, ignore_index, loss, lse, stream);
    case Dtype::kF16: return forward<__half>(logits, targets, rows, row_stride, vocab, ignore_index, loss, lse, stream);
    case Dtype::kBF16:
      return forward<__nv_bfloat16>(logits, targets, rows, row_stride, vocab, ignore_index, loss, lse, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_cross_entropy_backward(Dtype dtype, const void* logits, const int64_t* targets, const float* lse,
                                          const float* scale, int64_t rows, int64_t row_stride, int64_t vocab,
                                          int64_t ignore_index, void* grad, cudaStream_t stream) {
  switch (dtype) {
    case Dtype::kF32:
      return backward<float>(logits, targets, lse, scale, rows, row_stride, vocab, ignore_index, grad, stream);
    case Dtype::kF16:
      return backward<__half>(logits, targets, lse, scale, rows, row_stride, vocab, ignore_index, grad, stream);
    case Dtype::kBF16:
      return backward<__nv_bfloat16>(logits, targets, lse, scale, rows, row_stride, vocab, ignore_index, grad, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace gpt2::kernels
