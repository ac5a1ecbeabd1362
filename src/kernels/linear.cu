// Column passes for the bias gradients (launch.h): a block of 32 packs of columns x 8 row lanes
// walks a chunk of rows, one 16-byte load per thread and row, and leaves fp32 partial sums per
// chunk; finish_column_sums adds the chunks. The GELU variant also writes the GELU input gradient
// it sums, so that tensor is read once instead of twice.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "src/kernels/convert.cuh"
#include "src/kernels/fp8_convert.cuh"
#include "src/kernels/launch.h"

namespace gpt2::kernels {
namespace {

constexpr int kPacks = 32, kLanes = 8, kRowsPerChunk = 256;

// dpre = dout · gelu'(pre), rounded to T as stored (the fast derivative for 16-bit T).
template <typename T>
__device__ __forceinline__ T gelu_input_grad(T dout, T pre) {
  const float x = to_float(pre);
  const float d = sizeof(T) == 2 ? gelu_tanh_grad_fast(x) : gelu_tanh_grad(x);
  return from_float<T>(to_float(dout) * d);
}

// A block's (kPacks packs x kLanes row lanes) column sums of its chunk into partial[chunk][column]:
// lane 0 adds the lanes' sums in order.
template <int VEC>
__device__ __forceinline__ void store_partial_sums(const float (&acc)[VEC], int64_t p, int64_t packs, int64_t cols,
                                                   float* __restrict__ partial) {
  const int tx = threadIdx.x, ty = threadIdx.y;
  __shared__ float red[kLanes][VEC][kPacks];  // [lane][element][pack]: conflict-free writes
#pragma unroll
  for (int k = 0; k < VEC; ++k) red[ty][k][tx] = acc[k];
  __syncthreads();
  if (ty == 0 && p < packs) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      float s = acc[k];
      for (int i = 1; i < kLanes; ++i) s += red[i][k][tx];
      partial[blockIdx.y * cols + p * VEC + k] = s;
    }
  }
}

// GELU = false: sums a. GELU = true: a is the output gradient, pre the GELU input; writes
// out = a * gelu'(pre) and sums out as stored (rounded to T, as a sum over the stored tensor would).
template <typename T, int VEC, bool GELU>
__global__ void __launch_bounds__(kPacks* kLanes)
    bias_grad_kernel(const T* __restrict__ a, const T* __restrict__ pre, int64_t rows, int64_t cols,
                     T* __restrict__ out, float* __restrict__ partial) {
  using P = Pack<T, VEC>;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t packs = cols / VEC;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * kPacks + tx;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRowsPerChunk;
  const int64_t r1 = r0 + kRowsPerChunk < rows ? r0 + kRowsPerChunk : rows;
  float acc[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) acc[k] = 0.0f;
  if (p < packs) {
#pragma unroll 4
    for (int64_t r = r0 + ty; r < r1; r += kLanes) {
      const P av = reinterpret_cast<const P*>(a + r * cols)[p];
      if constexpr (GELU) {
        const P pv = reinterpret_cast<const P*>(pre + r * cols)[p];
        P o;
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          o.v[k] = gelu_input_grad(av.v[k], pv.v[k]);
          acc[k] += to_float(o.v[k]);
        }
        reinterpret_cast<P*>(out + r * cols)[p] = o;
      } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc[k] += to_float(av.v[k]);
      }
    }
  }
  store_partial_sums<VEC>(acc, p, packs, cols, partial);
}

constexpr int kFp8TileRows = 32;

// One column of a tile of kFp8TileRows rows' FP8 bytes (the block's thread `tid` = its column)
// written to out_t's row `col` from row `base` on, 32 bytes at a time (`valid` rows, a multiple of 8).
template <int W>
__device__ __forceinline__ void store_tile_column(const unsigned char (&tile)[kFp8TileRows][W], int tid,
                                                  unsigned char* out_t, int64_t col, int64_t rows, int64_t base,
                                                  int64_t valid) {
  unsigned w[kFp8TileRows / 4];
#pragma unroll
  for (int j = 0; j < kFp8TileRows / 4; ++j) {
    w[j] = tile[4 * j][tid] | tile[4 * j + 1][tid] << 8 | tile[4 * j + 2][tid] << 16 |
           static_cast<unsigned>(tile[4 * j + 3][tid]) << 24;
  }
  unsigned char* dst = out_t + col * rows + base;  // 16-byte aligned: rows % 16 == 0, base % 32 == 0
  if (valid == kFp8TileRows) {
    reinterpret_cast<uint4*>(dst)[0] = make_uint4(w[0], w[1], w[2], w[3]);
    reinterpret_cast<uint4*>(dst)[1] = make_uint4(w[4], w[5], w[6], w[7]);
  } else {
    for (int g = 0; g < valid / 8; ++g) reinterpret_cast<uint2*>(dst)[g] = make_uint2(w[2 * g], w[2 * g + 1]);
  }
}

// The rows an FP8 column pass casts, 8 values (a 16-byte pack of T) of row r at pack p at a time:
// the GELU backward's dpre from its output gradient and input (rounded to T as stored), also giving
// gelu(pre) as a cast reads it (fp8_mlp's recomputed GELU output) ...
template <typename T>
struct GeluGradRows {
  const T* a;
  const T* pre;
  int64_t cols;
  __device__ __forceinline__ void load(int64_t r, int64_t p, bool with_gelu, float (&f)[8], float (&h)[8]) const {
    using P = Pack<T, 8>;
    const P av = reinterpret_cast<const P*>(a + r * cols)[p];
    const P pv = reinterpret_cast<const P*>(pre + r * cols)[p];
#pragma unroll
    for (int k = 0; k < 8; ++k) f[k] = to_float(gelu_input_grad(av.v[k], pv.v[k]));
    if (with_gelu) {
#pragma unroll
      for (int k = 0; k < 8; ++k) h[k] = cast_input<T, true>(pv.v[k]);
    }
  }
};
// ... or a matrix given as three column blocks of part_cols, each its own rows at its own row
// stride (the q/k/v projection's output gradient, never concatenated).
template <typename T>
struct PartRows {
  const T* part[3];
  int64_t stride[3];
  int64_t part_cols;
  __device__ __forceinline__ void load(int64_t r, int64_t p, bool, float (&f)[8], float (&)[8]) const {
    using P = Pack<T, 8>;
    const int64_t col = p * 8, which = col / part_cols;
    const P v = *reinterpret_cast<const P*>(part[which] + r * stride[which] + (col - which * part_cols));
#pragma unroll
    for (int k = 0; k < 8; ++k) f[k] = to_float(v.v[k]);
  }
};

// A column pass whose rows (Rows) go to FP8 (Fp8CastArgs c: scale, out, out_t, the recorded amax)
// instead of T, with their column sums: each lane takes the rows bias_grad_kernel gives it, in the
// same order, so the sums are that kernel's; each kFp8TileRows rows' bytes gather in a shared tile
// and a thread writes one column of it to out_t, 32 bytes at a time. With g.out_t (GeluGradRows
// only), the same pass also casts gelu_tanh(pre) into g.out_t, transposed, as launch_fp8_cast with
// gelu would (its scale from g's history; not recorded). 16-bit T, 8-element packs.
template <typename T, typename Rows>
__global__ void __launch_bounds__(kPacks* kLanes)
    fp8_column_pass_kernel(Rows src, int64_t rows, int64_t cols, Fp8CastArgs c, Fp8CastArgs g,
                           float* __restrict__ partial) {
  constexpr int VEC = 8, W = kPacks * VEC + 16;
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * kPacks + tx;
  const __nv_fp8_interpretation_t format = c.e5m2 ? __NV_E5M2 : __NV_E4M3;
  const bool with_gelu = g.out_t != nullptr;
  const float s = cast_scale(c);  // a warp is one row lane's kPacks threads: each its own
  const float sg = with_gelu ? cast_scale(g) : 1.0f;
  if (blockIdx.x == 0 && blockIdx.y == 0 && tid == 0) {
    *c.scale_inv = 1.0f / s;
    if (with_gelu) *g.scale_inv = 1.0f / sg;
  }
  auto* out = static_cast<unsigned char*>(c.out);
  auto* out_t = static_cast<unsigned char*>(c.out_t);
  const int64_t packs = cols / VEC;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * kPacks + tx;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRowsPerChunk;
  const int64_t r1 = r0 + kRowsPerChunk < rows ? r0 + kRowsPerChunk : rows;
  __shared__ __align__(16) unsigned char tile[kFp8TileRows][W];
  __shared__ __align__(16) unsigned char tile_g[kFp8TileRows][W];
  auto pack = [](const float(&v)[VEC], float scale, float top, __nv_fp8_interpretation_t fmt) {
    return make_uint2(cast_two(v[0], v[1], scale, top, fmt) | cast_two(v[2], v[3], scale, top, fmt) << 16,
                      cast_two(v[4], v[5], scale, top, fmt) | cast_two(v[6], v[7], scale, top, fmt) << 16);
  };
  float acc[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) acc[k] = 0.0f;
  unsigned local = 0;
  for (int64_t base = r0; base < r1; base += kFp8TileRows) {
#pragma unroll
    for (int i = 0; i < kFp8TileRows / kLanes; ++i) {
      const int64_t r = base + i * kLanes + ty;
      if (p < packs && r < r1) {
        float f[VEC], h[VEC];
        src.load(r, p, with_gelu, f, h);
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          acc[k] += f[k];
          local = max(local, __float_as_uint(f[k]) & 0x7fffffffu);
        }
        const uint2 q = pack(f, s, c.top, format);
        if (out != nullptr) *reinterpret_cast<uint2*>(out + r * cols + p * VEC) = q;
        *reinterpret_cast<uint2*>(&tile[i * kLanes + ty][tx * VEC]) = q;
        if (with_gelu) *reinterpret_cast<uint2*>(&tile_g[i * kLanes + ty][tx * VEC]) = pack(h, sg, g.top, __NV_E4M3);
      }
    }
    __syncthreads();
    const int64_t col = static_cast<int64_t>(blockIdx.x) * kPacks * VEC + tid;  // the block's threads = its columns
    const int64_t valid = r1 - base < kFp8TileRows ? r1 - base : kFp8TileRows;  // rows % 8 == 0
    if (col < cols) {
      if (out_t != nullptr) store_tile_column(tile, tid, out_t, col, rows, base, valid);
      if (with_gelu) store_tile_column(tile_g, tid, static_cast<unsigned char*>(g.out_t), col, rows, base, valid);
    }
    __syncthreads();  // the next rows rewrite the tiles
  }
  store_partial_sums<VEC>(acc, p, packs, cols, partial);
  if (c.record_bits != nullptr) record_block_amax(local, c.record_bits);
}

template <typename T, bool GELU>
cudaError_t run(const void* a, const void* pre, int64_t rows, int64_t cols, void* out, float* partial, void* sums,
                cudaStream_t stream) {
  const int64_t chunks = column_sum_chunks(rows);
  const bool packed = can_pack<T>(a, cols) && (!GELU || (can_pack<T>(pre, cols) && can_pack<T>(out, cols)));
  const int vec = packed ? 16 / static_cast<int>(sizeof(T)) : 1;
  const dim3 grid(static_cast<unsigned>((cols / vec + kPacks - 1) / kPacks), static_cast<unsigned>(chunks));
  const dim3 block(kPacks, kLanes);
  const T* ta = static_cast<const T*>(a);
  const T* tp = static_cast<const T*>(pre);
  T* to = static_cast<T*>(out);
  if (cols > 0 && rows > 0) {
    if (packed) {
      bias_grad_kernel<T, 16 / sizeof(T), GELU><<<grid, block, 0, stream>>>(ta, tp, rows, cols, to, partial);
    } else {
      bias_grad_kernel<T, 1, GELU><<<grid, block, 0, stream>>>(ta, tp, rows, cols, to, partial);
    }
  } else if (cols > 0) {
    cudaMemsetAsync(partial, 0, sizeof(float) * cols, stream);
  }
  if (cols > 0) launch_finish_column_sums<T>(partial, rows > 0 ? chunks : 1, cols, sums, nullptr, stream);
  return cudaGetLastError();
}

template <bool GELU>
cudaError_t dispatch(Dtype dtype, const void* a, const void* pre, int64_t rows, int64_t cols, void* out, float* partial,
                     void* sums, cudaStream_t stream) {
  return with_storage_type(dtype, [&](auto t) {
    return run<typename decltype(t)::type, GELU>(a, pre, rows, cols, out, partial, sums, stream);
  });
}

}  // namespace

int64_t column_sum_chunks(int64_t rows) { return rows > 0 ? (rows + kRowsPerChunk - 1) / kRowsPerChunk : 1; }

cudaError_t launch_column_sum(Dtype dtype, const void* a, int64_t rows, int64_t cols, float* partial, void* sums,
                              cudaStream_t stream) {
  return dispatch<false>(dtype, a, nullptr, rows, cols, nullptr, partial, sums, stream);
}

cudaError_t launch_gelu_backward(Dtype dtype, const void* dout, const void* pre, int64_t rows, int64_t cols, void* dpre,
                                 float* partial, void* dbias, cudaStream_t stream) {
  return dispatch<true>(dtype, dout, pre, rows, cols, dpre, partial, dbias, stream);
}

namespace {

// The checks both FP8 column passes share, then the pass and the sums' finish; Rows<T> built by make_rows.
template <template <typename> class Rows, typename MakeRows>
cudaError_t run_fp8_column_pass(Dtype dtype, int64_t rows, int64_t cols, bool inputs_aligned, const Fp8CastArgs& cast,
                                const Fp8CastArgs* gelu_out, float* partial, void* dbias, cudaStream_t stream,
                                MakeRows make_rows) {
  const Fp8CastArgs g = gelu_out != nullptr ? *gelu_out : Fp8CastArgs{};
  const bool aligned = inputs_aligned && reinterpret_cast<uintptr_t>(cast.out) % 8 == 0 &&
                       reinterpret_cast<uintptr_t>(cast.out_t) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(g.out_t) % 16 == 0;
  const bool gelu_ok =
      gelu_out == nullptr || (g.out_t != nullptr && g.out == nullptr && !g.e5m2 && g.history != nullptr &&
                              g.record_bits == nullptr && g.scale_inv != nullptr);
  if (dtype == Dtype::kF32 || rows <= 0 || rows % 16 != 0 || cols <= 0 || cols % 8 != 0 || !aligned || !gelu_ok ||
      (cast.amax_bits == nullptr && cast.history == nullptr) || cast.scale_inv == nullptr)
    return cudaErrorInvalidValue;
  const int64_t chunks = column_sum_chunks(rows);
  const dim3 grid(static_cast<unsigned>((cols / 8 + kPacks - 1) / kPacks), static_cast<unsigned>(chunks));
  return with_storage_type(dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    if constexpr (sizeof(T) == 2) {
      fp8_column_pass_kernel<T, Rows<T>>
          <<<grid, dim3(kPacks, kLanes), 0, stream>>>(make_rows(t), rows, cols, cast, g, partial);
      launch_finish_column_sums<T>(partial, chunks, cols, dbias, nullptr, stream);
      return cudaGetLastError();
    }
    return cudaErrorInvalidValue;  // not reached: fp32 is refused above
  });
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t launch_gelu_backward_fp8(Dtype dtype, const void* dout, const void* pre, int64_t rows, int64_t cols,
                                     const Fp8CastArgs& cast, float* partial, void* dbias, cudaStream_t stream,
                                     const Fp8CastArgs* gelu_out) {
  return run_fp8_column_pass<GeluGradRows>(
      dtype, rows, cols, aligned16(dout) && aligned16(pre), cast, gelu_out, partial, dbias, stream, [&](auto t) {
        using T = typename decltype(t)::type;
        return GeluGradRows<T>{static_cast<const T*>(dout), static_cast<const T*>(pre), cols};
      });
}

cudaError_t launch_parts_fp8(Dtype dtype, const void* const parts[3], const int64_t strides[3], int64_t rows,
                             int64_t part_cols, const Fp8CastArgs& cast, float* partial, void* dbias,
                             cudaStream_t stream) {
  bool inputs_ok = part_cols > 0 && part_cols % 8 == 0;
  for (int i = 0; i < 3; ++i) inputs_ok = inputs_ok && aligned16(parts[i]) && strides[i] % 8 == 0;
  if (!inputs_ok) return cudaErrorInvalidValue;
  return run_fp8_column_pass<PartRows>(
      dtype, rows, 3 * part_cols, true, cast, nullptr, partial, dbias, stream, [&](auto t) {
        using T = typename decltype(t)::type;
        return PartRows<T>{
            {static_cast<const T*>(parts[0]), static_cast<const T*>(parts[1]), static_cast<const T*>(parts[2])},
            {strides[0], strides[1], strides[2]},
            part_cols};
      });
}

}  // namespace gpt2::kernels
