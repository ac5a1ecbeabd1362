// The per-tensor FP8 cast with the tensor's own amax (launch.h, fp8_gemm.h's
// quantize_fp8_current) in two kernels instead of ATen's chain of element-wise ops with fp32
// temporaries: one pass reduces max |x| into a device scalar, one pass scales, saturates and
// rounds every element, writing the row-major result and, if asked, its transpose (the backward
// GEMMs' operand) through a shared-memory tile. Every value is computed as the ATen composition
// computes it (fp32 multiply, clamp, round to nearest even), so the bits agree. Delayed scaling
// takes its scale from an amax history and records the tensor's amax in the same pass: one read.
// Where the shapes allow (16-bit inputs, sizes multiples of 8), both passes read 16 bytes and the
// cast writes 8 bytes at a time: one element a thread with a block per 32 x 32 tile ran at about a
// sixth of the memory bandwidth (kernel_bench fp8 on an H100: 0.15-0.18 ms for gpt2-124m's (M, C)
// activation, whose bytes take 0.026 ms). With `gelu` a cast reads gelu_tanh(x) as ATen computes
// and stores it, so the GELU's output goes to FP8 without being written in x's dtype first.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "src/kernels/convert.cuh"
#include "src/kernels/launch.h"

namespace gpt2::kernels {
namespace {

constexpr int kAmaxThreads = 256;
constexpr int kTile = 32;  // the cast's tile: 32 x 32 elements, 32 x 8 threads
// The packed cast (16-bit inputs, rows and cols multiples of 8): 64 x 64 tiles, 256 threads, each
// reading 8 elements (16 bytes) and writing 8 bytes at a time, a block taking tiles in turn.
constexpr int kPackedTile = 64, kPackedThreads = 256;

// The value a cast reads: x, or with GELU its gelu_tanh.
template <typename T, bool GELU>
__device__ __forceinline__ float cast_input(T v) {
  if constexpr (GELU) return to_float(from_float<T>(gelu_tanh(to_float(v))));  // ATen's gelu stores T
  return to_float(v);
}

// max |x| over n elements into *amax (zeroed by the launcher), VEC elements a load (8: 16-byte
// packs of a 16-bit T, n a multiple of 8 and x 16-byte aligned; else 1). |x| as fp32 bits orders as
// unsigned integers (sign cleared), and NaN's bits lie above inf's, so a NaN anywhere wins, as
// ATen's amax propagates NaN.
// A thread requests kAmaxLoads packs before it uses any (a loop that used each load before the
// next waited out one round trip per pack); max is exact in any order.
constexpr int kAmaxLoads = 4;
template <typename T, bool GELU, int VEC>
__global__ void __launch_bounds__(kAmaxThreads) amax_kernel(const T* __restrict__ x, int64_t n, unsigned* amax) {
  unsigned best = 0;
  const auto* packs = reinterpret_cast<const Pack<T, VEC>*>(x);
  const int64_t count = n / VEC, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i0 = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i0 < count;
       i0 += kAmaxLoads * stride) {
    Pack<T, VEC> v[kAmaxLoads];
#pragma unroll
    for (int u = 0; u < kAmaxLoads; ++u)
      if (i0 + u * stride < count) v[u] = packs[i0 + u * stride];
#pragma unroll
    for (int u = 0; u < kAmaxLoads; ++u) {
      if (i0 + u * stride >= count) break;
#pragma unroll
      for (int e = 0; e < VEC; ++e) best = max(best, __float_as_uint(cast_input<T, GELU>(v[u].v[e])) & 0x7fffffffu);
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) best = max(best, __shfl_xor_sync(0xffffffffu, best, offset));
  __shared__ unsigned warp_best[kAmaxThreads / 32];
  if (threadIdx.x % 32 == 0) warp_best[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kAmaxThreads / 32; ++w) best = max(best, warp_best[w]);
    atomicMax(amax, best);
  }
}

// fp8_scale_for: top / amax, or 1 where amax is 0 or not finite.
__device__ __forceinline__ float scale_for(float amax, float top) {
  return amax > 0.0f && isfinite(amax) ? top / amax : 1.0f;
}

// One element: finite values scaled, saturated to ±top and rounded to nearest even; inf and NaN
// stay non-finite (NaN in e4m3, which has no inf), as quantize_fp8's where(isfinite, clamp, x).
__device__ __forceinline__ __nv_fp8_storage_t cast_one(float v, float s, float top, __nv_fp8_interpretation_t format) {
  const float scaled = v * s;
  if (!isfinite(scaled)) return __nv_cvt_float_to_fp8(scaled, __NV_NOSAT, format);
  return __nv_cvt_float_to_fp8(fminf(fmaxf(scaled, -top), top), __NV_NOSAT, format);
}

// The scale of a cast (scale_for), called by a block's first warp: from the amax at amax_bits, or
// else from the largest of history[1..len-1] (delayed scaling: the steps before this one; the
// lanes take every 32nd, max being exact in any order). Every lane returns it.
__device__ __forceinline__ float cast_scale(const Fp8CastArgs& a) {
  if (a.amax_bits != nullptr) return scale_for(__uint_as_float(*a.amax_bits), a.top);
  float amax = 0.0f;
  for (int64_t i = 1 + threadIdx.x % 32; i < a.history_len; i += 32) amax = fmaxf(amax, a.history[i]);
  for (int offset = 16; offset > 0; offset >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  return scale_for(amax, a.top);
}

// Block (32 x 8 threads) per 32 x 32 tile of x (rows x cols; grid x over row tiles, y over column
// tiles): out[r, c] and, if out_t, out_t[c, r]; if record_bits, the tile's max |x| into it (NaN
// as inf).
template <typename T, bool GELU>
__global__ void __launch_bounds__(kTile * 8) cast_kernel(Fp8CastArgs a, __nv_fp8_interpretation_t format) {
  __shared__ float scale_s;
  __shared__ unsigned block_amax;
  const int thread = threadIdx.y * kTile + threadIdx.x;
  if (thread < 32) {
    const float scale = cast_scale(a);
    if (thread == 0) {
      scale_s = scale;
      block_amax = 0;
      if (blockIdx.x == 0 && blockIdx.y == 0) *a.scale_inv = 1.0f / scale;
    }
  }
  __syncthreads();
  const float s = scale_s;
  const T* x = static_cast<const T*>(a.x);
  auto* out = static_cast<__nv_fp8_storage_t*>(a.out);
  auto* out_t = static_cast<__nv_fp8_storage_t*>(a.out_t);
  __shared__ __nv_fp8_storage_t tile[kTile][kTile + 4];
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kTile, c0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t c = c0 + threadIdx.x;
  unsigned local = 0;
  for (int i = threadIdx.y; i < kTile; i += 8) {
    const int64_t r = r0 + i;
    if (r < a.rows && c < a.cols) {
      const float v = cast_input<T, GELU>(x[r * a.cols + c]);
      local = max(local, __float_as_uint(v) & 0x7fffffffu);
      const __nv_fp8_storage_t q = cast_one(v, s, a.top, format);
      if (out != nullptr) out[r * a.cols + c] = q;
      tile[i][threadIdx.x] = q;
    }
  }
  if (a.record_bits != nullptr) {
    for (int offset = 16; offset > 0; offset >>= 1) local = max(local, __shfl_xor_sync(0xffffffffu, local, offset));
    if (threadIdx.x == 0) atomicMax(&block_amax, local);
  }
  __syncthreads();
  // A NaN is recorded as inf: a history holds only numbers and inf, whose max every all-reduce
  // (NCCL's, MPI's) takes alike, and fp8_amax_roll replaces inf.
  if (a.record_bits != nullptr && thread == 0) atomicMax(a.record_bits, min(block_amax, 0x7f800000u));
  if (out_t == nullptr) return;
  const int64_t tr = r0 + threadIdx.x;  // out_t's column
  for (int i = threadIdx.y; i < kTile; i += 8) {
    const int64_t tc = c0 + i;  // out_t's row
    if (tc < a.cols && tr < a.rows) out_t[tc * a.rows + tr] = tile[threadIdx.x][i];
  }
}

// The packed cast: the same values as cast_kernel, read 16 bytes and written 8 bytes at a time.
// A block computes the scale once (cast_scale), then takes 64 x 64 tiles in turn: a thread converts 8 consecutive
// elements of a row, and for out_t gathers 8 consecutive rows of a column from the shared tile. One atomic per block
// for the recorded amax.
template <typename T, bool GELU>
__global__ void __launch_bounds__(kPackedThreads) cast_packed_kernel(Fp8CastArgs a, __nv_fp8_interpretation_t format) {
  __shared__ float scale_s;
  __shared__ unsigned block_amax;
  __shared__ __align__(16) __nv_fp8_storage_t tile[kPackedTile][kPackedTile + 8];
  const int tid = threadIdx.x;
  if (tid < 32) {
    const float scale = cast_scale(a);
    if (tid == 0) {
      scale_s = scale;
      block_amax = 0;
      if (blockIdx.x == 0) *a.scale_inv = 1.0f / scale;
    }
  }
  __syncthreads();
  const float s = scale_s;
  const T* x = static_cast<const T*>(a.x);
  auto* out = static_cast<__nv_fp8_storage_t*>(a.out);
  auto* out_t = static_cast<__nv_fp8_storage_t*>(a.out_t);
  const int row_in_pass = tid / 8, col = (tid % 8) * 8;  // 32 rows a pass, 8 elements a thread
  const int64_t tiles_c = (a.cols + kPackedTile - 1) / kPackedTile;
  const int64_t tiles = (a.rows + kPackedTile - 1) / kPackedTile * tiles_c;
  unsigned local = 0;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t r0 = t / tiles_c * kPackedTile, c0 = t % tiles_c * kPackedTile;
    // Both passes' packs are requested before either is used: the stores between them may alias x
    // for all the compiler knows, so it would not move the second load up by itself.
    constexpr int kPasses = kPackedTile / 32;
    Pack<T, 8> loaded[kPasses];
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int64_t r = r0 + pass * 32 + row_in_pass, c = c0 + col;
      if (r < a.rows && c < a.cols) loaded[pass] = *reinterpret_cast<const Pack<T, 8>*>(x + r * a.cols + c);
    }
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int i = pass * 32 + row_in_pass;
      const int64_t r = r0 + i, c = c0 + col;
      if (r < a.rows && c < a.cols) {  // rows and cols are multiples of 8: a pack is wholly in or out
        const Pack<T, 8>& v = loaded[pass];
        uint2 packed;
        auto* q = reinterpret_cast<__nv_fp8_storage_t*>(&packed);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float f = cast_input<T, GELU>(v.v[e]);
          local = max(local, __float_as_uint(f) & 0x7fffffffu);
          q[e] = cast_one(f, s, a.top, format);
        }
        if (out != nullptr) *reinterpret_cast<uint2*>(out + r * a.cols + c) = packed;
        if (out_t != nullptr) *reinterpret_cast<uint2*>(&tile[i][col]) = packed;
      }
    }
    if (out_t == nullptr) continue;
    __syncthreads();
#pragma unroll
    for (int pass = 0; pass < kPackedTile / 32; ++pass) {
      const int j = pass * 32 + row_in_pass;     // the tile's column: out_t's row c0 + j
      const int64_t tc = c0 + j, tr = r0 + col;  // out_t[tc, tr .. tr + 7] = x's rows tr .. tr + 7
      if (tc < a.cols && tr < a.rows) {
        uint2 packed;
        auto* q = reinterpret_cast<__nv_fp8_storage_t*>(&packed);
#pragma unroll
        for (int e = 0; e < 8; ++e) q[e] = tile[col + e][j];
        *reinterpret_cast<uint2*>(out_t + tc * a.rows + tr) = packed;
      }
    }
    __syncthreads();  // the next tile rewrites the shared one
  }
  if (a.record_bits == nullptr) return;
  for (int offset = 16; offset > 0; offset >>= 1) local = max(local, __shfl_xor_sync(0xffffffffu, local, offset));
  if (tid % 32 == 0) atomicMax(&block_amax, local);
  __syncthreads();
  // A NaN is recorded as inf, as in cast_kernel.
  if (tid == 0) atomicMax(a.record_bits, min(block_amax, 0x7f800000u));
}

// Whether the packed kernels take the buffers: a 16-bit type, the sizes multiples of 8, x 16-byte
// and the outputs 8-byte aligned.
bool packs(Dtype dtype, const void* x, int64_t n) {
  return dtype != Dtype::kF32 && n % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

}  // namespace

cudaError_t launch_fp8_amax(Dtype dtype, const void* x, int64_t n, unsigned* amax_bits, cudaStream_t stream,
                            bool gelu) {
  cudaError_t err = cudaMemsetAsync(amax_bits, 0, sizeof(unsigned), stream);
  if (err != cudaSuccess || n == 0) return err;
  const bool packed = packs(dtype, x, n);
  const int64_t work = packed ? n / 8 : n;
  const int64_t blocks = std::min<int64_t>((work + kAmaxThreads - 1) / kAmaxThreads, 1024);
  return with_storage_type(dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    const auto kernel = packed && sizeof(T) == 2 ? (gelu ? amax_kernel<T, true, 8> : amax_kernel<T, false, 8>)
                                                 : (gelu ? amax_kernel<T, true, 1> : amax_kernel<T, false, 1>);
    kernel<<<static_cast<unsigned>(blocks), kAmaxThreads, 0, stream>>>(static_cast<const T*>(x), n, amax_bits);
    return cudaGetLastError();
  });
}

cudaError_t launch_fp8_cast(Dtype dtype, const Fp8CastArgs& args, cudaStream_t stream) {
  if ((args.amax_bits == nullptr && args.history == nullptr) || (args.out == nullptr && args.out_t == nullptr))
    return cudaErrorInvalidValue;
  if (args.rows == 0 || args.cols == 0) return cudaSuccess;
  const int64_t grid_x = (args.rows + kTile - 1) / kTile, grid_y = (args.cols + kTile - 1) / kTile;
  if (grid_x > 0x7fffffff || grid_y > 65535) return cudaErrorInvalidValue;
  const __nv_fp8_interpretation_t format = args.e5m2 ? __NV_E5M2 : __NV_E4M3;
  const bool packed = packs(dtype, args.x, args.rows) && args.cols % 8 == 0 &&
                      reinterpret_cast<uintptr_t>(args.out) % 8 == 0 &&
                      reinterpret_cast<uintptr_t>(args.out_t) % 8 == 0;
  if (packed) {
    static const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
    const int64_t tiles = (args.rows + kPackedTile - 1) / kPackedTile * ((args.cols + kPackedTile - 1) / kPackedTile);
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(tiles, 8 * static_cast<int64_t>(sms > 0 ? sms : 132)));
    return with_storage_type(dtype, [&](auto t) {
      using T = typename decltype(t)::type;
      if constexpr (sizeof(T) == 2) {
        const auto kernel = args.gelu ? cast_packed_kernel<T, true> : cast_packed_kernel<T, false>;
        kernel<<<blocks, kPackedThreads, 0, stream>>>(args, format);
        return cudaGetLastError();
      }
      return cudaErrorInvalidValue;  // not reached: packs() takes 16-bit types only
    });
  }
  return with_storage_type(dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    const auto kernel = args.gelu ? cast_kernel<T, true> : cast_kernel<T, false>;
    kernel<<<dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y)), dim3(kTile, 8), 0, stream>>>(args,
                                                                                                              format);
    return cudaGetLastError();
  });
}

}  // namespace gpt2::kernels
