// Batch-few decoding's projections (decode_linear.h, launch.h). A block of 8 warps first stages
// its input rows in shared memory in the storage type (x itself, or x's LayerNorm rounded as the
// LayerNorm kernel writes it: fp32 statistics, two passes), then each warp takes columns j of W in
// turn (grid-stride): every lane loads 16-byte chunks of W's row j, several before it uses any so
// the loads overlap, and multiplies them with the same positions of each staged row; a warp sum
// gives a[r, j], and the epilogue writes it (lane r for row r).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "src/kernels/convert.cuh"
#include "src/kernels/launch.h"

namespace gpt2::kernels {
namespace {

constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kUnroll = 4;  // 16-byte chunks of a W row in flight per lane

// N consecutive staged elements (16-byte aligned) as floats.
template <typename T, int N>
__device__ __forceinline__ void load_staged(const T* p, float* out) {
  constexpr int kVec = 16 / sizeof(T);
  static_assert(N % kVec == 0, "whole 16-byte packs");
  const Pack<T, kVec>* v = reinterpret_cast<const Pack<T, kVec>*>(p);
#pragma unroll
  for (int i = 0; i < N / kVec; ++i) {
    const Pack<T, kVec> pk = v[i];
#pragma unroll
    for (int e = 0; e < kVec; ++e) out[i * kVec + e] = to_float(pk.v[e]);
  }
}

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
  const int8_t* w = reinterpret_cast<const int8_t*>(&chunk);
#pragma unroll
  for (int e = 0; e < 16; ++e) out[e] = static_cast<float>(w[e]);
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
    for (int w = 0; w < kWarps; ++w) s += red[w][r];
    part[r] = s;
  }
}

// One group of kUnroll 16-byte chunks of a W row, lane-strided from i0; chunks past k are not loaded.
template <typename W>
__device__ __forceinline__ void load_group(const W* row, int64_t i0, int64_t k, int4 (&chunk)[kUnroll]) {
  constexpr int64_t kStride = 32 * (16 / sizeof(W));
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t i = i0 + u * kStride;
    if (i < k) chunk[u] = __ldg(reinterpret_cast<const int4*>(row + i));
  }
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

template <typename T, typename W, int ROWS, bool NORM>
__global__ void __launch_bounds__(kThreads) decode_linear_kernel(const DecodeLinearArgs a) {
  extern __shared__ __align__(16) unsigned char staged_bytes[];
  T* staged = reinterpret_cast<T*>(staged_bytes);  // (rows, k)
  __shared__ float red[kWarps][ROWS];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int rows = static_cast<int>(a.rows);
  const int64_t k = a.k;
  const T* x = static_cast<const T*>(a.x);
  constexpr int kVec = 16 / sizeof(W);  // W elements in a 16-byte chunk
  constexpr int64_t kStride = 32 * kVec, kGroup = kUnroll * kStride;
  const W* w = static_cast<const W*>(a.q != nullptr ? static_cast<const void*>(a.q) : a.w);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kWarps + warp,
                step = static_cast<int64_t>(gridDim.x) * kWarps;
  // The warp's first weights are requested before the wait: they do not depend on the kernel before,
  // so under programmatic dependent launch their latency overlaps that kernel's tail.
  int4 next[kUnroll];
  if (first < a.n) load_group(w + first * k, lane * kVec, k, next);
  wait_for_previous_kernel();
  allow_next_kernel();

  if constexpr (NORM) {
    // x is read from global memory once, into the staging area (a copy), then the statistics and
    // the normalised values come from there; a thread touches the same elements in every pass, so
    // the last one overwrites them in place. (Three passes over global memory cost a round trip
    // each: ~2 us a kernel at batch 1.)
    const T* gamma = static_cast<const T*>(a.gamma);
    const T* beta = static_cast<const T*>(a.beta);
    float mean[ROWS], rstd[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      mean[r] = 0.0f;
      if (r < rows)
        for (int64_t i = tid; i < k; i += kThreads) {
          const T v = x[r * k + i];
          staged[r * k + i] = v;
          mean[r] += to_float(v);
        }
    }
    block_row_sums<ROWS>(mean, red);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      mean[r] /= static_cast<float>(k);
      rstd[r] = 0.0f;
      if (r < rows)
        for (int64_t i = tid; i < k; i += kThreads) {
          const float d = to_float(staged[r * k + i]) - mean[r];
          rstd[r] += d * d;
        }
    }
    block_row_sums<ROWS>(rstd, red);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      rstd[r] = rsqrtf(rstd[r] / static_cast<float>(k) + a.eps);
      if (r < rows)
        for (int64_t i = tid; i < k; i += kThreads)
          staged[r * k + i] =
              from_float<T>((to_float(staged[r * k + i]) - mean[r]) * rstd[r] * to_float(gamma[i]) + to_float(beta[i]));
    }
  } else {
    const int4* src = reinterpret_cast<const int4*>(x);
    int4* dst = reinterpret_cast<int4*>(staged);
    for (int64_t i = tid; i < rows * k * static_cast<int64_t>(sizeof(T)) / 16; i += kThreads) dst[i] = src[i];
  }
  __syncthreads();

  const int64_t group = a.q != nullptr ? k / a.groups : k;
  for (int64_t j = first; j < a.n; j += step) {
    const W* wrow = w + j * k;
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] = 0.0f;
    for (int64_t i0 = lane * kVec; i0 < k; i0 += kGroup) {
      int4 chunk[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) chunk[u] = next[u];
      // The next group is in flight while this one is summed: later in this row, or the warp's next row.
      if (i0 + kGroup < k)
        load_group(wrow, i0 + kGroup, k, next);
      else if (j + step < a.n)
        load_group(wrow + step * k, lane * kVec, k, next);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = i0 + u * kStride;
        if (i >= k) break;
        float wv[kVec];
        unpack<W>(chunk[u], wv);
        const float s = a.q != nullptr ? a.scale[j * a.groups + i / group] : 1.0f;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          if (r >= rows) break;
          float xv[kVec];
          load_staged<T, kVec>(staged + r * k + i, xv);
          float p = 0.0f;
#pragma unroll
          for (int e = 0; e < kVec; ++e) p = fmaf(wv[e], xv[e], p);
          acc[r] = fmaf(p, s, acc[r]);
        }
      }
    }
    const float b = a.bias != nullptr ? to_float(static_cast<const T*>(a.bias)[j]) : 0.0f;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float v = warp_sum(acc[r]) + b;
      if (r < rows && lane == r) store_column<T>(a, r, j, v);
    }
  }
}

int64_t staged_size(Dtype dtype, int64_t rows, int64_t k) { return rows * k * (dtype == Dtype::kF32 ? 4 : 2); }

template <typename T, typename W, int ROWS, bool NORM>
cudaError_t launch_shape(const DecodeLinearArgs& a, cudaStream_t stream) {
  const auto kernel = decode_linear_kernel<T, W, ROWS, NORM>;
  const int smem = static_cast<int>(a.rows * a.k * static_cast<int64_t>(sizeof(T)));
  if (smem > 48 * 1024) {
    // Above the default 48 KiB a kernel must opt in (once per kernel; not a stream operation, so it
    // may run while a graph captures, though the eager warm-up reaches it first).
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
  }
  static const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
  // Enough blocks to fill the GPU a few times over; past that, warps take several columns each and
  // the staging (a LayerNorm) is paid by fewer blocks.
  const int64_t wanted = (a.n + kWarps - 1) / kWarps, cap = 4 * static_cast<int64_t>(sms > 0 ? sms : 132);
  // A programmatic dependent (convert.cuh): it may start while the kernel before it drains, request
  // its first weights, and wait for that kernel's results only then.
  return launch_dependent(kernel, dim3(static_cast<unsigned>(wanted < cap ? wanted : cap)), dim3(kThreads),
                          static_cast<size_t>(smem), stream, a);
}

template <typename T, typename W, bool NORM>
cudaError_t launch_rows(const DecodeLinearArgs& a, cudaStream_t stream) {
  if (a.rows <= 1) return launch_shape<T, W, 1, NORM>(a, stream);
  if (a.rows <= 2) return launch_shape<T, W, 2, NORM>(a, stream);
  if (a.rows <= 4) return launch_shape<T, W, 4, NORM>(a, stream);
  return launch_shape<T, W, 8, NORM>(a, stream);
}

template <typename T>
cudaError_t launch_typed(const DecodeLinearArgs& a, cudaStream_t stream) {
  const bool norm = a.gamma != nullptr;
  if (a.q != nullptr) return norm ? launch_rows<T, int8_t, true>(a, stream) : launch_rows<T, int8_t, false>(a, stream);
  return norm ? launch_rows<T, T, true>(a, stream) : launch_rows<T, T, false>(a, stream);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool decode_linear_supported(Dtype dtype, int64_t rows, int64_t k) {
  static const int64_t most = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin) - 1024;  // red[] beside it
  return rows >= 1 && rows <= 8 && k >= 16 && k % 16 == 0 && staged_size(dtype, rows, k) <= most;
}

cudaError_t launch_decode_linear(Dtype dtype, const DecodeLinearArgs& a, cudaStream_t stream) {
  const bool int8 = a.q != nullptr;
  const bool weights = int8 ? (a.scale != nullptr && a.groups >= 1 && a.k % a.groups == 0 && (a.k / a.groups) % 16 == 0)
                            : a.w != nullptr;
  const bool norm = a.gamma == nullptr || a.beta != nullptr;
  const bool qkv = a.epilogue != DecodeEpilogue::kQueriesKeysValues ||
                   (a.n % 3 == 0 && a.heads >= 1 && (a.n / 3) % a.heads == 0 && a.keys != nullptr &&
                    a.values != nullptr && a.positions != nullptr && a.capacity >= 1);
  if (!decode_linear_supported(dtype, a.rows, a.k) || a.n < 1 || !weights || !norm || !qkv || a.y == nullptr ||
      !aligned16(a.x) || !aligned16(int8 ? static_cast<const void*>(a.q) : a.w))
    return cudaErrorInvalidValue;
  return with_storage_type(dtype, [&](auto t) { return launch_typed<typename decltype(t)::type>(a, stream); });
}

}  // namespace gpt2::kernels
