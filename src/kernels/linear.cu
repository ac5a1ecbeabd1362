// Column passes for the bias gradients (launch.h): a block of 32 packs of columns x 8 row lanes
// walks a chunk of rows, one 16-byte load per thread and row, and leaves fp32 partial sums per
// chunk; finish_column_sums adds the chunks. The GELU variant also writes the GELU input gradient
// it sums, so that tensor is read once instead of twice.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "src/kernels/convert.cuh"
#include "src/kernels/launch.h"

namespace gpt2::kernels {
namespace {

constexpr int kPacks = 32, kLanes = 8, kRowsPerChunk = 256;

// d gelu_tanh(x) / dx, gelu_tanh(x) = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
__device__ __forceinline__ float gelu_tanh_grad(float x) {
  const float t = tanhf(kGeluAlpha * (x + kGeluBeta * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluAlpha * (1.0f + 3.0f * kGeluBeta * x * x);
}

// The same for 16-bit results, through e = exp(2u) (tanh u = 1 - 2 / (1 + e)) with the fast exp
// and reciprocal: (1 - t) / 2 = r = 1 / (1 + e) and (1 + t) / 2 = e r keep their relative accuracy
// (~1e-6) even where t is near -1, far below a bf16 or fp16 rounding of the result, in about half
// tanhf's instructions (H200, kernel_bench: gpt2-124m's 32768 x 3072 168.9 -> 165.9 us; gpt2-1558m's
// 8192 x 6400 unchanged at 103 us: the pass is bound by memory). 2u is capped at 80 so e stays finite.
__device__ __forceinline__ float gelu_tanh_grad_fast(float x) {
  const float x2 = x * x;
  const float e = __expf(fminf(2.0f * kGeluAlpha * x * (1.0f + kGeluBeta * x2), 80.0f));
  const float r = __fdividef(1.0f, 1.0f + e), er = e * r;
  return er + 2.0f * kGeluAlpha * x * (1.0f + 3.0f * kGeluBeta * x2) * r * er;
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
          const float x = to_float(pv.v[k]);
          const float d = sizeof(T) == 2 ? gelu_tanh_grad_fast(x) : gelu_tanh_grad(x);
          o.v[k] = from_float<T>(to_float(av.v[k]) * d);
          acc[k] += to_float(o.v[k]);
        }
        reinterpret_cast<P*>(out + r * cols)[p] = o;
      } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc[k] += to_float(av.v[k]);
      }
    }
  }
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

}  // namespace gpt2::kernels
