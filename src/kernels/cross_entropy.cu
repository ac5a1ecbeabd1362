// Cross-entropy kernels (launch.h): one block per row, fp32 math, 16-byte loads when the rows
// allow them. Memory-bound: forward reads the row once, backward reads it and writes the gradient
// once.
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

// Adds a pack's class columns (j < vocab; padding columns count for nothing) to a thread's running
// (max, sum): one exp per element, and a rescale of the sum only when the pack raises the max.
template <typename T, int VEC>
__device__ __forceinline__ void add_pack(const Pack<T, VEC>& pk, int64_t p, int64_t vocab, MaxSum& acc) {
  float v[VEC];
  const bool whole = (p + 1) * VEC <= vocab;
#pragma unroll
  for (int i = 0; i < VEC; ++i) v[i] = whole || p * VEC + i < vocab ? to_float(pk.v[i]) : -INFINITY;
  float pm = v[0];
#pragma unroll
  for (int i = 1; i < VEC; ++i) pm = fmaxf(pm, v[i]);
  if (pm == -INFINITY) return;  // all padding (or all -inf): nothing to add
  if (pm > acc.m) {
    acc.s *= __expf(acc.m - pm);  // 0 while acc.m is -inf
    acc.m = pm;
  }
#pragma unroll
  for (int i = 0; i < VEC; ++i) acc.s += __expf(v[i] - acc.m);
}

// A pack of the gradient (exp(x - l) - one_hot(t)) * k over the classes, 0 on padding columns.
template <typename T, int VEC>
__device__ __forceinline__ Pack<T, VEC> grad_pack(const Pack<T, VEC>& pk, int64_t p, int64_t vocab, int64_t t, float l,
                                                  float k) {
  Pack<T, VEC> out;
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    const int64_t j = p * VEC + i;
    out.v[i] = from_float<T>(j < vocab ? (__expf(to_float(pk.v[i]) - l) - (j == t ? 1.0f : 0.0f)) * k : 0.0f);
  }
  return out;
}

// Note [Target check]: the first bad id to arrive claims the record; the rest leave it.
__device__ __forceinline__ void note_bad_target(const BadTargetNote& note, int64_t index, int64_t id, int64_t vocab) {
  if (note.record == nullptr) return;
  constexpr auto kFree = static_cast<unsigned long long>(-1LL);
  const int64_t row = index / note.positions;
  if (atomicCAS(reinterpret_cast<unsigned long long*>(note.record), kFree, static_cast<unsigned long long>(row)) ==
      kFree) {
    note.record[1] = index % note.positions;
    note.record[2] = id;
    note.record[3] = vocab;
  }
}

// Loss and log-sum-exp of a row (rows are whole packs: VEC divides row_stride).
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_forward(const T* __restrict__ logits, const int64_t* __restrict__ targets, int64_t row_stride,
                          int64_t vocab, int64_t ignore_index, float* __restrict__ loss, float* __restrict__ lse,
                          BadTargetNote note) {
  using P = Pack<T, VEC>;
  const int64_t row = blockIdx.x;
  const T* x = logits + row * row_stride;
  const int64_t packs = row_stride / VEC;
  MaxSum acc{-INFINITY, 0.0f};
  // kUnroll loads in flight per thread before any of them is used: the loop is otherwise bound by
  // one load's latency at a time.
  constexpr int kUnroll = 4;
  for (int64_t p0 = threadIdx.x; p0 < packs; p0 += kThreads * kUnroll) {
    P pk[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t p = p0 + u * kThreads;
      if (p < packs) pk[u] = reinterpret_cast<const P*>(x)[p];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t p = p0 + u * kThreads;
      if (p < packs) add_pack<T, VEC>(pk[u], p, vocab, acc);
    }
  }

  // Block reduction: warps by shuffles, then the first warp over the warps' results.
  for (int offset = 16; offset > 0; offset >>= 1) {
    acc =
        merge(acc, MaxSum{__shfl_down_sync(0xffffffffu, acc.m, offset), __shfl_down_sync(0xffffffffu, acc.s, offset)});
  }
  __shared__ MaxSum warps[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warps[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < kThreads / 32 ? warps[lane] : MaxSum{-INFINITY, 0.0f};
    for (int offset = 16; offset > 0; offset >>= 1) {
      acc = merge(acc,
                  MaxSum{__shfl_down_sync(0xffffffffu, acc.m, offset), __shfl_down_sync(0xffffffffu, acc.s, offset)});
    }
    if (lane == 0) {
      const float l = acc.m + logf(acc.s);
      lse[row] = l;
      const int64_t t = targets[row];
      if (t == ignore_index) {
        loss[row] = 0.0f;
      } else if (t < 0 || t >= vocab) {
        loss[row] = NAN;  // an id outside the vocabulary: noted, and the loss says so too
        note_bad_target(note, row, t, vocab);
      } else {
        loss[row] = l - to_float(x[t]);
      }
    }
  }
}

// One row's gradient; grad may be the logits themselves (each element is read before it is
// written, by the same thread).
template <typename T, int VEC>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_backward(const T* logits, const int64_t* __restrict__ targets, const float* __restrict__ lse,
                           const float* __restrict__ scale, int64_t row_stride, int64_t vocab, int64_t ignore_index,
                           T* grad) {
  using P = Pack<T, VEC>;
  const int64_t row = blockIdx.x;
  const int64_t t = targets[row];
  // Rows of ignored and of bad ids (NaN loss, noted in forward) give no gradient, as in the other losses.
  const float l = lse[row], k = t == ignore_index || t < 0 || t >= vocab ? 0.0f : scale[0];
  const P* x = reinterpret_cast<const P*>(logits + row * row_stride);
  P* g = reinterpret_cast<P*>(grad + row * row_stride);
  for (int64_t p = threadIdx.x; p < row_stride / VEC; p += kThreads) g[p] = grad_pack<T, VEC>(x[p], p, vocab, t, l, k);
}

// Note [Target check] for the losses without the kernels here: one block over the n targets.
__global__ void __launch_bounds__(1024)
    check_targets_kernel(const int64_t* __restrict__ targets, int64_t n, int64_t vocab, int64_t ignore_index,
                         BadTargetNote note, int64_t* __restrict__ safe, float* __restrict__ poison) {
  __shared__ int any_bad;
  if (threadIdx.x == 0) any_bad = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t t = targets[i];
    const bool bad = t != ignore_index && (t < 0 || t >= vocab);
    safe[i] = bad ? ignore_index : t;
    if (bad) {
      any_bad = 1;
      note_bad_target(note, i, t, vocab);
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) *poison = any_bad ? NAN : 0.0f;
}

template <typename T>
cudaError_t forward(const void* logits, const int64_t* targets, int64_t rows, int64_t row_stride, int64_t vocab,
                    int64_t ignore_index, float* loss, float* lse, BadTargetNote note, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const T* x = static_cast<const T*>(logits);
  const auto grid = static_cast<unsigned>(rows);
  if (can_pack<T>(logits, row_stride)) {
    cross_entropy_forward<T, 16 / sizeof(T)>
        <<<grid, kThreads, 0, stream>>>(x, targets, row_stride, vocab, ignore_index, loss, lse, note);
  } else {
    cross_entropy_forward<T, 1>
        <<<grid, kThreads, 0, stream>>>(x, targets, row_stride, vocab, ignore_index, loss, lse, note);
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
    cross_entropy_backward<T, 16 / sizeof(T)>
        <<<rows, kThreads, 0, stream>>>(x, targets, lse, scale, row_stride, vocab, ignore_index, g);
  } else {
    cross_entropy_backward<T, 1>
        <<<rows, kThreads, 0, stream>>>(x, targets, lse, scale, row_stride, vocab, ignore_index, g);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_cross_entropy_forward(Dtype dtype, const void* logits, const int64_t* targets, int64_t rows,
                                         int64_t row_stride, int64_t vocab, int64_t ignore_index, float* loss,
                                         float* lse, BadTargetNote note, cudaStream_t stream) {
  return with_storage_type(dtype, [&](auto t) {
    return forward<typename decltype(t)::type>(logits, targets, rows, row_stride, vocab, ignore_index, loss, lse, note,
                                               stream);
  });
}

cudaError_t launch_check_targets(const int64_t* targets, int64_t n, int64_t vocab, int64_t ignore_index,
                                 BadTargetNote note, int64_t* safe, float* poison, cudaStream_t stream) {
  check_targets_kernel<<<1, 1024, 0, stream>>>(targets, n, vocab, ignore_index, note, safe, poison);
  return cudaGetLastError();
}

cudaError_t launch_cross_entropy_backward(Dtype dtype, const void* logits, const int64_t* targets, const float* lse,
                                          const float* scale, int64_t rows, int64_t row_stride, int64_t vocab,
                                          int64_t ignore_index, void* grad, cudaStream_t stream) {
  return with_storage_type(dtype, [&](auto t) {
    return backward<typename decltype(t)::type>(logits, targets, lse, scale, rows, row_stride, vocab, ignore_index,
                                                grad, stream);
  });
}

}  // namespace gpt2::kernels
