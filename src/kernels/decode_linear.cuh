#pragma once
// Batch-few decoding's projections as device functions (decode_linear.h, launch.h), shared by
// decode_linear.cu (a kernel a projection) and decode_step.cu (the whole step in one kernel), so
// both give the same bits. A block of kDecodeWarps warps first stages its input rows in shared
// memory in the storage type (stage_rows: x itself, or x's LayerNorm rounded as the LayerNorm
// kernel writes it: fp32 statistics, two passes), then each warp takes columns j of W in turn
// (project_columns, first, first + step, ...): every lane loads 16-byte chunks of W's row j, several
// before it uses any so the loads overlap, and multiplies them with the same positions of each
// staged row; a warp sum gives a[r, j], and the epilogue writes it (lane r for row r). A column's
// bits depend on the staged rows and W alone, not on which warp or block computes it; the staged
// LayerNorm's depend on the block's kDecodeWarps.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "src/kernels/convert.cuh"
#include "src/kernels/launch.h"

namespace gpt2::kernels {

constexpr int kDecodeWarps = 16, kDecodeThreads = 32 * kDecodeWarps;
// 16-byte chunks of a W row in flight per lane, unless a caller holds more (decode_linear.cu). A
// group's size does not change the order of any sum, so not the bits either.
constexpr int kDecodeUnroll = 4;

// The 16-byte chunk of W as floats: 16 / sizeof(W) of them.
template <typename W>
__device__ __forceinline__ void unpack(const int4& chunk, float* out) {
  constexpr int kVec = 16 / sizeof(W);
  const W* w = reinterpret_cast<const W*>(&chunk);
#pragma unroll
  for (int e = 0; e < kVec; ++e) out[e] = to_float(w[e]);
}
template <>
__device__ __forceinline__ void unpack<int8_t>(const int4& chunk, float* out) {
  int8x16_to_float(chunk, out);
}

// Per-row sums of the block's threads: part[r] in, the block's total of row r out (every thread).
template <int ROWS>
__device__ __forceinline__ void block_row_sums(float* part, float (*red)[ROWS]) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int r = 0; r < ROWS; ++r) part[r] = warp_sum(part[r]);
  __syncthreads();  // red may still be read from the previous call
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) red[warp][r] = part[r];
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) s += red[w][r];
    part[r] = s;
  }
}

// One group of U 16-byte chunks of a W row, lane-strided from i0; chunks past k are not loaded.
template <typename W, int U>
__device__ __forceinline__ void load_group(const W* row, int64_t i0, int64_t k, int4 (&chunk)[U]) {
  constexpr int64_t kStride = 32 * (16 / sizeof(W));
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t i = i0 + u * kStride;
    if (i < k) chunk[u] = __ldg(reinterpret_cast<const int4*>(row + i));
  }
}

// The weight a projection reads: q (int8) when set, else w.
template <typename W>
__device__ __forceinline__ const W* weight_rows(const DecodeLinearArgs& a) {
  return static_cast<const W*>(a.q != nullptr ? static_cast<const void*>(a.q) : a.w);
}

// The first group of the warp's first column (`first`), before anything an earlier phase writes is
// read: weights are read-only, so this load's latency may overlap the wait.
template <typename W, int U>
__device__ __forceinline__ void prefetch_first_group(const DecodeLinearArgs& a, int64_t first, int4 (&next)[U]) {
  constexpr int kVec = 16 / sizeof(W);
  if (first < a.n) load_group(weight_rows<W>(a) + first * a.k, (threadIdx.x % 32) * kVec, a.k, next);
}

// The warp's first column of W into L2, whole, before the wait (prefetch_to_l2): at GPT-2's shapes a
// warp has one column a layer, so a block's weights stream in while the kernel before drains. Only
// the first: a head's columns together (161 MB at gpt2-1558m) would not fit in L2. Rows are 16-byte
// aligned with k % 16 == 0 (decode_linear_supported), so the row is a whole number of 16 bytes.
template <typename W>
__device__ __forceinline__ void prefetch_first_column(const DecodeLinearArgs& a, int64_t first) {
  if (threadIdx.x % 32 == 0 && first < a.n)
    prefetch_to_l2(weight_rows<W>(a) + first * a.k, static_cast<uint32_t>(a.k * static_cast<int64_t>(sizeof(W))));
}

template <typename T>
__device__ __forceinline__ void store_column(const DecodeLinearArgs& a, int r, int64_t j, float v) {
  switch (a.epilogue) {
    case DecodeEpilogue::kStore:
      static_cast<T*>(a.y)[r * a.n + j] = from_float<T>(v);
      break;
    case DecodeEpilogue::kGelu:
      static_cast<T*>(a.y)[r * a.n + j] = from_float<T>(gelu_tanh(v));
      break;
    case DecodeEpilogue::kAddTo: {  // the branch output is rounded before the add, as the unfused add reads it
      T* y = static_cast<T*>(a.y) + r * a.n + j;
      *y = from_float<T>(to_float(*y) + to_float(from_float<T>(v)));
      break;
    }
    case DecodeEpilogue::kQueriesKeysValues: {
      const int64_t c = a.n / 3;
      if (j < c) {
        static_cast<T*>(a.y)[r * c + j] = from_float<T>(v);
        break;
      }
      const int64_t pos = a.positions[r];
      if (pos < 0 || pos >= a.capacity) break;  // the attention gives this row NaN
      const int64_t jj = (j - c) % c, hs = c / a.heads;
      T* cache = static_cast<T*>(j < 2 * c ? a.keys : a.values);
      cache[((r * a.heads + jj / hs) * a.capacity + pos) * hs + jj % hs] = from_float<T>(v);
      break;
    }
  }
}

// The block's input rows into `staged` (rows, k): x, or LayerNorm(x) when NORM. Ends with the
// block synchronised. A thread's first kHeld elements of a row (and of gamma and beta) are loaded
// together before any is used, so their latencies overlap (a loop with a use between loads waited
// out one round trip per load); the sums still run in the loop's order.
template <typename T, int ROWS, bool NORM>
__device__ __forceinline__ void stage_rows(const DecodeLinearArgs& a, T* staged, float (*red)[ROWS]) {
  constexpr int kHeld = 4;
  const int tid = threadIdx.x, rows = static_cast<int>(a.rows);
  const int64_t k = a.k, tail = static_cast<int64_t>(kHeld) * kDecodeThreads;
  const T* x = static_cast<const T*>(a.x);
  if constexpr (NORM) {
    // x is read from global memory once, into the staging area (a copy), then the statistics and
    // the normalised values come from there; a thread touches the same elements in every pass, so
    // the last one overwrites them in place.
    const T* gamma = static_cast<const T*>(a.gamma);
    const T* beta = static_cast<const T*>(a.beta);
    float g[kHeld], bt[kHeld];
#pragma unroll
    for (int m = 0; m < kHeld; ++m) {
      const int64_t i = tid + m * kDecodeThreads;
      if (i < k) g[m] = to_float(gamma[i]), bt[m] = to_float(beta[i]);
    }
    float mean[ROWS], rstd[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      mean[r] = 0.0f;
      if (r >= rows) continue;
      T v[kHeld];
#pragma unroll
      for (int m = 0; m < kHeld; ++m) {
        const int64_t i = tid + m * kDecodeThreads;
        if (i < k) v[m] = x[r * k + i];
      }
#pragma unroll
      for (int m = 0; m < kHeld; ++m) {
        const int64_t i = tid + m * kDecodeThreads;
        if (i < k) staged[r * k + i] = v[m], mean[r] += to_float(v[m]);
      }
      for (int64_t i = tid + tail; i < k; i += kDecodeThreads) {
        const T u = x[r * k + i];
        staged[r * k + i] = u;
        mean[r] += to_float(u);
      }
    }
    block_row_sums<ROWS>(mean, red);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      mean[r] /= static_cast<float>(k);
      rstd[r] = 0.0f;
      if (r < rows)
        for (int64_t i = tid; i < k; i += kDecodeThreads) {
          const float d = to_float(staged[r * k + i]) - mean[r];
          rstd[r] += d * d;
        }
    }
    block_row_sums<ROWS>(rstd, red);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      rstd[r] = rsqrtf(rstd[r] / static_cast<float>(k) + a.eps);
      if (r >= rows) continue;
      const auto normalise = [&](int64_t i, float gi, float bi) {
        staged[r * k + i] = from_float<T>((to_float(staged[r * k + i]) - mean[r]) * rstd[r] * gi + bi);
      };
#pragma unroll
      for (int m = 0; m < kHeld; ++m) {
        const int64_t i = tid + m * kDecodeThreads;
        if (i < k) normalise(i, g[m], bt[m]);
      }
      for (int64_t i = tid + tail; i < k; i += kDecodeThreads) normalise(i, to_float(gamma[i]), to_float(beta[i]));
    }
  } else {
    const int4* src = reinterpret_cast<const int4*>(x);
    int4* dst = reinterpret_cast<int4*>(staged);
    const int64_t chunks = rows * k * static_cast<int64_t>(sizeof(T)) / 16;
    for (int64_t i0 = tid; i0 < chunks; i0 += tail) {
      int4 v[kHeld];
#pragma unroll
      for (int m = 0; m < kHeld; ++m) {
        const int64_t i = i0 + m * kDecodeThreads;
        if (i < chunks) v[m] = src[i];
      }
#pragma unroll
      for (int m = 0; m < kHeld; ++m) {
        const int64_t i = i0 + m * kDecodeThreads;
        if (i < chunks) dst[i] = v[m];
      }
    }
  }
  __syncthreads();
}

// Columns first, first + step, ... of a = staged Wᵀ + bias, each through the epilogue. `next` holds
// the first group of column `first` (prefetch_first_group) and, on return, stale data.
template <typename T, typename W, int ROWS, int U>
__device__ __forceinline__ void project_columns(const DecodeLinearArgs& a, const T* staged, int64_t first, int64_t step,
                                                int4 (&next)[U]) {
  const int lane = threadIdx.x % 32, rows = static_cast<int>(a.rows);
  const int64_t k = a.k;
  constexpr int kVec = 16 / sizeof(W);  // W elements in a 16-byte chunk
  constexpr int64_t kStride = 32 * kVec, kGroup = U * kStride;
  const W* w = weight_rows<W>(a);
  const int64_t group = a.q != nullptr ? k / a.groups : k;
  for (int64_t j = first; j < a.n; j += step) {
    const W* wrow = w + j * k;
    // Loaded now, used after the row's sums: their latency overlaps the weight loads.
    const float b = a.bias != nullptr ? to_float(static_cast<const T*>(a.bias)[j]) : 0.0f;
    const float row_scale = a.q != nullptr && a.groups == 1 ? a.scale[j] : 1.0f;
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] = 0.0f;
    for (int64_t i0 = lane * kVec; i0 < k; i0 += kGroup) {
      int4 chunk[U];
#pragma unroll
      for (int u = 0; u < U; ++u) chunk[u] = next[u];
      // The next group is in flight while this one is summed: later in this row, or the warp's next row.
      if (i0 + kGroup < k)
        load_group(wrow, i0 + kGroup, k, next);
      else if (j + step < a.n)
        load_group(wrow + step * k, lane * kVec, k, next);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t i = i0 + u * kStride;
        if (i >= k) break;
        float wv[kVec];
        unpack<W>(chunk[u], wv);
        const float s = a.q != nullptr && a.groups > 1 ? a.scale[j * a.groups + i / group] : row_scale;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          if (r >= rows) break;
          float xv[kVec];
          load_floats<T, kVec>(staged + r * k + i, xv);
          float p = 0.0f;
#pragma unroll
          for (int e = 0; e < kVec; ++e) p = fmaf(wv[e], xv[e], p);
          acc[r] = fmaf(p, s, acc[r]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float v = warp_sum(acc[r]) + b;
      if (r < rows && lane == r) store_column<T>(a, r, j, v);
    }
  }
}

}  // namespace gpt2::kernels
