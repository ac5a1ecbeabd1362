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
// written to out_t's row `col` from row `base` on, 16 bytes at a time (`valid` rows: 32, or 16 at the
// end of a chunk, since the passes take rows % 16 == 0).
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
  reinterpret_cast<uint4*>(dst)[0] = make_uint4(w[0], w[1], w[2], w[3]);
  if (valid == kFp8TileRows) reinterpret_cast<uint4*>(dst)[1] = make_uint4(w[4], w[5], w[6], w[7]);
}

// The rows an FP8 column pass casts, 8 values (a 16-byte pack of T) at a time. A thread's Reader
// walks one pack column kLanes rows at a time by pointer steps: load(i) is the pack i steps on,
// advance(n) moves n steps; convert gives the values. Either the GELU backward's dpre from its
// output gradient and input (rounded to T as stored), with GELU_OUT also gelu(pre) as a cast reads
// it (fp8_mlp's recomputed GELU output) ...
template <typename T>
struct GeluGradRows {
  using P = Pack<T, 8>;
  static constexpr bool kMayWriteGelu = true;
  const T* a;
  const T* pre;
  int64_t cols;
  struct Loaded {
    P a, pre;
  };
  struct Reader {
    const P* a;
    const P* pre;
    int64_t step;  // packs from a row to the row kLanes on
    __device__ __forceinline__ Loaded load(int i) const { return {a[i * step], pre[i * step]}; }
    __device__ __forceinline__ void advance(int n) {
      a += n * step;
      pre += n * step;
    }
  };
  __device__ __forceinline__ Reader reader(int64_t r, int64_t p) const {
    const int64_t packs = cols / 8;
    return {reinterpret_cast<const P*>(a) + r * packs + p, reinterpret_cast<const P*>(pre) + r * packs + p,
            kLanes * packs};
  }
  template <bool GELU_OUT>
  __device__ __forceinline__ static void convert(const Loaded& v, float (&f)[8], float (&h)[8]) {
#pragma unroll
    for (int k = 0; k < 8; ++k) f[k] = to_float(gelu_input_grad(v.a.v[k], v.pre.v[k]));
    if constexpr (GELU_OUT) {
#pragma unroll
      for (int k = 0; k < 8; ++k) h[k] = cast_input<T, true>(v.pre.v[k]);
    }
  }
};
// ... or a matrix given as three column blocks of part_cols, each its own rows at its own row
// stride (the q/k/v projection's output gradient, never concatenated). A thread's pack lies in
// one part (part_cols % 8 == 0), picked once: indexing the parameter arrays by a computed part at
// every load put them on the stack.
template <typename T>
struct PartRows {
  using P = Pack<T, 8>;
  static constexpr bool kMayWriteGelu = false;
  const T* part[3];
  int64_t stride[3];
  int64_t part_cols;
  struct Loaded {
    P v;
  };
  struct Reader {
    const T* row;
    int64_t step;  // elements from a row to the row kLanes on
    __device__ __forceinline__ Loaded load(int i) const { return {*reinterpret_cast<const P*>(row + i * step)}; }
    __device__ __forceinline__ void advance(int n) { row += n * step; }
  };
  __device__ __forceinline__ Reader reader(int64_t r, int64_t p) const {
    const int64_t col = p * 8, which = col / part_cols;
    const T* base = part[0];
    int64_t row_stride = stride[0];
    if (which == 1) base = part[1], row_stride = stride[1];
    if (which == 2) base = part[2], row_stride = stride[2];
    return {base + r * row_stride + (col - which * part_cols), kLanes * row_stride};
  }
  template <bool GELU_OUT>
  __device__ __forceinline__ static void convert(const Loaded& v, float (&f)[8], float (&)[8]) {
    static_assert(!GELU_OUT, "the q/k/v parts have no GELU output");
#pragma unroll
    for (int k = 0; k < 8; ++k) f[k] = to_float(v.v.v[k]);
  }
};

// A column pass whose rows (Rows) go to FP8 (Fp8CastArgs c: scale, out, out_t, the recorded amax)
// instead of T, with their column sums: each lane takes the rows bias_grad_kernel gives it, in the
// same order, so the sums are that kernel's; each kFp8TileRows rows' bytes gather in a shared tile
// and a thread writes one column of it to out_t, 16 bytes a store. A thread requests its rows of a
// tile before it converts any (one round trip a tile, not one a row). With GELU_OUT (GeluGradRows
// only), the same pass also casts gelu_tanh(pre) into g.out_t, transposed, as launch_fp8_cast with
// gelu would (its scale from g's history; not recorded). 16-bit T, 8-element packs. Two blocks an
// SM: 128 registers hold the tile's loads of a thread.
template <typename T, typename Rows, bool GELU_OUT>
__global__ void __launch_bounds__(kPacks* kLanes, 2)
    fp8_column_pass_kernel(Rows src, int64_t rows, int64_t cols, Fp8CastArgs c, Fp8CastArgs g,
                           float* __restrict__ partial) {
  constexpr int VEC = 8, W = kPacks * VEC + 16, kSteps = kFp8TileRows / kLanes;
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * kPacks + tx;
  const __nv_fp8_interpretation_t format = c.e5m2 ? __NV_E5M2 : __NV_E4M3;
  const float s = cast_scale(c);  // a warp is one row lane's kPacks threads: each its own
  const float sg = GELU_OUT ? cast_scale(g) : 1.0f;
  if (blockIdx.x == 0 && blockIdx.y == 0 && tid == 0) {
    *c.scale_inv = 1.0f / s;
    if (GELU_OUT) *g.scale_inv = 1.0f / sg;
  }
  auto* out = static_cast<unsigned char*>(c.out);
  auto* out_t = static_cast<unsigned char*>(c.out_t);
  const int64_t packs = cols / VEC;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * kPacks + tx;
  const bool active = p < packs;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRowsPerChunk;
  const int64_t r1 = r0 + kRowsPerChunk < rows ? r0 + kRowsPerChunk : rows;
  __shared__ __align__(16) unsigned char tile[kFp8TileRows][W];
  __shared__ __align__(16) unsigned char tile_g[GELU_OUT ? kFp8TileRows : 1][W];
  typename Rows::Reader reader = src.reader(r0 + ty, active ? p : 0);
  unsigned char* out_row = out != nullptr ? out + (r0 + ty) * cols + p * VEC : nullptr;
  float acc[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) acc[k] = 0.0f;
  unsigned local = 0;
  for (int64_t base = r0; base < r1; base += kFp8TileRows) {
    const int valid = static_cast<int>(r1 - base < kFp8TileRows ? r1 - base : kFp8TileRows);  // 32 or 16
    if (active) {
      typename Rows::Loaded v[kSteps];
#pragma unroll
      for (int i = 0; i < kSteps; ++i)
        if (i * kLanes + ty < valid) v[i] = reader.load(i);
#pragma unroll
      for (int i = 0; i < kSteps; ++i) {
        if (i * kLanes + ty >= valid) continue;
        float f[VEC], h[VEC];
        Rows::template convert<GELU_OUT>(v[i], f, h);
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc[k] += f[k];
        const unsigned m = abs_max_bits(f);
        local = max(local, m);
        const uint2 q = cast_eight(f, m, s, c.top, format);
        if (out_row != nullptr) *reinterpret_cast<uint2*>(out_row + i * kLanes * cols) = q;
        *reinterpret_cast<uint2*>(&tile[i * kLanes + ty][tx * VEC]) = q;
        if constexpr (GELU_OUT)
          *reinterpret_cast<uint2*>(&tile_g[i * kLanes + ty][tx * VEC]) =
              cast_eight(h, abs_max_bits(h), sg, g.top, __NV_E4M3);
      }
      reader.advance(kSteps);
      if (out_row != nullptr) out_row += kFp8TileRows * cols;
    }
    __syncthreads();
    const int64_t col = static_cast<int64_t>(blockIdx.x) * kPacks * VEC + tid;  // the block's threads = its columns
    if (col < cols) {
      if (out_t != nullptr) store_tile_column(tile, tid, out_t, col, rows, base, valid);
      if constexpr (GELU_OUT)
        store_tile_column(tile_g, tid, static_cast<unsigned char*>(g.out_t), col, rows, base, valid);
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
      const auto kernel = gelu_out != nullptr ? fp8_column_pass_kernel<T, Rows<T>, Rows<T>::kMayWriteGelu>
                                              : fp8_column_pass_kernel<T, Rows<T>, false>;
      kernel<<<grid, dim3(kPacks, kLanes), 0, stream>>>(make_rows(t), rows, cols, cast, g, partial);
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
