// The per-tensor FP8 cast with the tensor's own amax (launch.h, fp8_gemm.h's
// quantize_fp8_current) in two kernels instead of ATen's chain of element-wise ops with fp32
// temporaries: one pass reduces max |x| into a device scalar, one pass scales, saturates and
// rounds every element, writing the row-major result and, if asked, its transpose (the backward
// GEMMs' operand). Every value is computed as the ATen composition computes it (fp32 multiply,
// clamp, round to nearest even), so the bits agree. Delayed scaling takes its scale from an amax
// history and records the tensor's amax in the same pass: one read.
// Where the shapes allow (16-bit inputs, sizes multiples of 8), the passes read 16 bytes and the
// cast writes 8 bytes at a time, transposing 8 x 8 blocks in registers. kernel_bench fp8 on an
// H100, gpt2-124m's (M, C) activation: cast + transpose 0.042 ms (2.4 TB/s; a copy of x: 2.8),
// where one element a thread with a block per 32 x 32 tile and the software conversion had taken
// 0.15-0.18 ms (bench/results/2026-12-06-fp8-fused-casts-h100.log). With `gelu` a cast
// reads gelu_tanh(x) as ATen computes and stores it, so the GELU's output goes to FP8 without being
// written in x's dtype first.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "src/kernels/convert.cuh"
#include "src/kernels/fp8_convert.cuh"
#include "src/kernels/launch.h"

namespace gpt2::kernels {
namespace {

constexpr int kAmaxThreads = 256;
constexpr int kTile = 32;  // the cast's tile: 32 x 32 elements, 32 x 8 threads

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

// The packed cast: the same values as cast_kernel, with no shared memory and no block barrier. A
// warp takes 32 x 64 tiles of x in turn; its lane l converts the 8 x 8 block at rows 8·(l / 8) and
// columns 8·(l % 8) of the tile: eight 16-byte loads (one a row, all requested before any is used),
// eight 8-byte row stores, and for out_t the block transposed in registers, eight 8-byte stores in
// which four lanes write one 32-byte sector of an out_t row. One atomic a block for the recorded amax.
// The launcher starts kCastBlocksPerSm blocks an SM; the bound keeps the registers low enough for
// them all to be resident at once (unbounded, the kernel took 80 and the grid ran in 1.33 waves).
constexpr int kCastWarps = 8, kCastTileRows = 32, kCastTileCols = 64, kCastBlocksPerSm = 4;
template <typename T, bool GELU>
__global__ void __launch_bounds__(kCastWarps * 32, kCastBlocksPerSm)
    cast_packed_kernel(Fp8CastArgs a, __nv_fp8_interpretation_t format) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const float s = cast_scale(a);  // every warp its own: no barrier
  if (blockIdx.x == 0 && threadIdx.x == 0) *a.scale_inv = 1.0f / s;
  const T* x = static_cast<const T*>(a.x);
  auto* out = static_cast<unsigned char*>(a.out);
  auto* out_t = static_cast<unsigned char*>(a.out_t);
  const int64_t tiles_c = (a.cols + kCastTileCols - 1) / kCastTileCols;
  const int64_t tiles = (a.rows + kCastTileRows - 1) / kCastTileRows * tiles_c;
  unsigned local = 0;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * kCastWarps + warp; t < tiles;
       t += static_cast<int64_t>(gridDim.x) * kCastWarps) {
    const int64_t r0 = t / tiles_c * kCastTileRows + lane / 8 * 8, c0 = t % tiles_c * kCastTileCols + lane % 8 * 8;
    if (r0 >= a.rows || c0 >= a.cols) continue;  // rows and cols are multiples of 8: a block is wholly in or out
    Pack<T, 8> v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = *reinterpret_cast<const Pack<T, 8>*>(x + (r0 + i) * a.cols + c0);
    unsigned lo[8], hi[8];  // row i's eight fp8 bytes, columns 0-3 and 4-7
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      float f[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) f[e] = cast_input<T, GELU>(v[i].v[e]);
      const unsigned m = abs_max_bits(f);
      local = max(local, m);
      const uint2 q = cast_eight(f, m, s, a.top, format);
      lo[i] = q.x;
      hi[i] = q.y;
      if (out != nullptr) *reinterpret_cast<uint2*>(out + (r0 + i) * a.cols + c0) = q;
    }
    if (out_t == nullptr) continue;
      // Column j of the block: byte j of each row. __byte_perm(p, q, sel) picks 4 of p's and q's 8 bytes.
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const unsigned* w = j < 4 ? lo : hi;
      const unsigned b = j % 4;  // the byte within the word
      const unsigned sel = b | (b + 4) << 4;
      const unsigned r01 = __byte_perm(w[0], w[1], sel), r23 = __byte_perm(w[2], w[3], sel);
      const unsigned r45 = __byte_perm(w[4], w[5], sel), r67 = __byte_perm(w[6], w[7], sel);
      const uint2 column = make_uint2(__byte_perm(r01, r23, 0x5410), __byte_perm(r45, r67, 0x5410));
      *reinterpret_cast<uint2*>(out_t + (c0 + j) * a.rows + r0) = column;
    }
  }
  if (a.record_bits != nullptr) record_block_amax(local, a.record_bits);
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
    const int64_t tiles =
        (args.rows + kCastTileRows - 1) / kCastTileRows * ((args.cols + kCastTileCols - 1) / kCastTileCols);
    // Enough blocks to fill the GPU (kCastBlocksPerSm an SM), each warp then taking tiles in turn.
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(
        (tiles + kCastWarps - 1) / kCastWarps, kCastBlocksPerSm * static_cast<int64_t>(sms > 0 ? sms : 132)));
    return with_storage_type(dtype, [&](auto t) {
      using T = typename decltype(t)::type;
      if constexpr (sizeof(T) == 2) {
        const auto kernel = args.gelu ? cast_packed_kernel<T, true> : cast_packed_kernel<T, false>;
        kernel<<<blocks, kCastWarps * 32, 0, stream>>>(args, format);
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
