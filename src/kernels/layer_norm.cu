// LayerNorm with an optional residual add in front (launch.h). Forward: one warp per row, a lane
// handling PPL packs of it in registers, so it reads x (and y) once and writes s and out once.
// Backward: a row over G warps, a lane one pack (backward_grouped); it reads dout, s (and ds) once
// from memory and writes dx once. The weight/bias gradients are summed per block (fp32) and a
// second kernel sums the blocks.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "src/kernels/convert.cuh"
#include "src/kernels/launch.h"

namespace gpt2::kernels {
namespace {

constexpr int kWarps = 8;  // rows in flight per block
constexpr int kMaxPacksPerLane = 8;

template <typename T, int VEC, int PPL>
__global__ void __launch_bounds__(kWarps * 32)
    layer_norm_forward_kernel(const T* __restrict__ x, const T* __restrict__ y, const T* __restrict__ gamma,
                              const T* __restrict__ beta, int64_t rows, int cols, float eps, T* __restrict__ s_out,
                              T* __restrict__ out, float* __restrict__ mean_out, float* __restrict__ rstd_out) {
  using P = Pack<T, VEC>;
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= rows) return;
  const int packs = cols / VEC;
  const int64_t base = row * cols;
  float v[PPL][VEC];
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < PPL; ++i) {
    const int p = lane + 32 * i;
    if (p < packs) {
      P a = reinterpret_cast<const P*>(x + base)[p];
      if (y != nullptr) {
        const P b = reinterpret_cast<const P*>(y + base)[p];
#pragma unroll
        for (int k = 0; k < VEC; ++k) a.v[k] = from_float<T>(to_float(a.v[k]) + to_float(b.v[k]));
        reinterpret_cast<P*>(s_out + base)[p] = a;  // the residual stream, rounded as x + y would be
      }
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        v[i][k] = to_float(a.v[k]);
        sum += v[i][k];
      }
    }
  }
  const float mean = warp_sum(sum) / cols;
  float sq = 0.0f;
#pragma unroll
  for (int i = 0; i < PPL; ++i) {
    if (lane + 32 * i < packs) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) sq += (v[i][k] - mean) * (v[i][k] - mean);
    }
  }
  const float rstd = rsqrtf(warp_sum(sq) / cols + eps);
#pragma unroll
  for (int i = 0; i < PPL; ++i) {
    const int p = lane + 32 * i;
    if (p < packs) {
      const P g = reinterpret_cast<const P*>(gamma)[p], b = reinterpret_cast<const P*>(beta)[p];
      P o;
#pragma unroll
      for (int k = 0; k < VEC; ++k)
        o.v[k] = from_float<T>((v[i][k] - mean) * rstd * to_float(g.v[k]) + to_float(b.v[k]));
      reinterpret_cast<P*>(out + base)[p] = o;
    }
  }
  if (lane == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// A row belongs to a group of G warps (G > 1 for wide rows, so that a lane holds at most a few
// packs and enough warps fit on an SM to keep memory busy); the group's partial row sums meet in
// shared memory. A lane owns the same columns in every row, so it keeps their dgamma/dbeta sums in
// registers; the second pass over a row re-reads dout and s, which the warp has just loaded (L1 hits).
template <typename T, int VEC, int PPL, int G>
__global__ void __launch_bounds__(kWarps * 32)
    layer_norm_backward_kernel(const T* __restrict__ dout, const T* __restrict__ ds, const T* __restrict__ s,
                               const float* __restrict__ mean, const float* __restrict__ rstd,
                               const T* __restrict__ gamma, int64_t rows, int cols, T* __restrict__ dx,
                               float* __restrict__ partial) {
  static_assert(kWarps % G == 0, "a block holds whole groups");
  constexpr int kGroups = kWarps / G;  // rows a block works on at once
  using P = Pack<T, VEC>;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, group = warp / G, member = warp % G;
  const int packs = cols / VEC;
  // The pack a lane handles i-th: consecutive lanes on consecutive packs, the group's warps side by side.
  const auto pack = [&](int i) { return 32 * (i * G + member) + lane; };
  __shared__ float2 group_sums[2][kWarps];  // by iteration parity, so one barrier a row suffices
  float dg[PPL][VEC], db[PPL][VEC];
#pragma unroll
  for (int i = 0; i < PPL; ++i) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) dg[i][k] = db[i][k] = 0.0f;
  }
  int parity = 0;
  // The loop bound is the block's, not the warp's, so every warp meets every barrier.
  for (int64_t tile = blockIdx.x; tile * kGroups < rows; tile += gridDim.x, parity ^= 1) {
    const int64_t row = tile * kGroups + group;
    const bool live = row < rows;
    const int64_t base = row * cols;
    const float m = live ? mean[row] : 0.0f, r = live ? rstd[row] : 0.0f;
    float sum_g = 0.0f, sum_gx = 0.0f;  // sums of g = dout * gamma and of g * xhat
    P res[PPL];                         // ds, loaded with the rest so the row waits on memory once
#pragma unroll
    for (int i = 0; i < PPL; ++i) {
      const int p = pack(i);
      if (live && p < packs) {
        if (ds != nullptr) res[i] = reinterpret_cast<const P*>(ds + base)[p];
        const P dp = reinterpret_cast<const P*>(dout + base)[p], sp = reinterpret_cast<const P*>(s + base)[p];
        const P gp = reinterpret_cast<const P*>(gamma)[p];
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float d = to_float(dp.v[k]), xh = (to_float(sp.v[k]) - m) * r, g = d * to_float(gp.v[k]);
          sum_g += g;
          sum_gx += g * xh;
          dg[i][k] += d * xh;
          db[i][k] += d;
        }
      }
    }
    sum_g = warp_sum(sum_g);
    sum_gx = warp_sum(sum_gx);
    if constexpr (G > 1) {
      if (lane == 0) group_sums[parity][warp] = make_float2(sum_g, sum_gx);
      __syncthreads();
      sum_g = sum_gx = 0.0f;
#pragma unroll
      for (int j = 0; j < G; ++j) {  // the same order in every warp of the group
        const float2 t = group_sums[parity][group * G + j];
        sum_g += t.x;
        sum_gx += t.y;
      }
    }
    const float mean_g = sum_g / cols, mean_gx = sum_gx / cols;
#pragma unroll
    for (int i = 0; i < PPL; ++i) {
      const int p = pack(i);
      if (live && p < packs) {
        const P dp = reinterpret_cast<const P*>(dout + base)[p], sp = reinterpret_cast<const P*>(s + base)[p];
        const P gp = reinterpret_cast<const P*>(gamma)[p];
        P o;
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const float xh = (to_float(sp.v[k]) - m) * r;
          float v = r * (to_float(dp.v[k]) * to_float(gp.v[k]) - mean_g - xh * mean_gx);
          if (ds != nullptr) v += to_float(res[i].v[k]);
          o.v[k] = from_float<T>(v);
        }
        reinterpret_cast<P*>(dx + base)[p] = o;
      }
    }
  }
  // The block's sums: the warps add their registers into shared memory one after another.
  extern __shared__ float acc[];  // [2][cols]
  for (int c = threadIdx.x; c < 2 * cols; c += blockDim.x) acc[c] = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    __syncthreads();
    if (warp == w) {
#pragma unroll
      for (int i = 0; i < PPL; ++i) {
        const int p = pack(i);
        if (p < packs) {
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            acc[p * VEC + k] += dg[i][k];
            acc[cols + p * VEC + k] += db[i][k];
          }
        }
      }
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < 2 * cols; c += blockDim.x)
    partial[static_cast<int64_t>(blockIdx.x) * 2 * cols + c] = acc[c];
}

template <typename T, int VEC, int PPL>
cudaError_t forward_rows(const LayerNormArgs& a, float eps, const void* y, void* s_out, void* out, float* mean,
                         float* rstd, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((a.rows + kWarps - 1) / kWarps);
  layer_norm_forward_kernel<T, VEC, PPL><<<blocks, kWarps * 32, 0, stream>>>(
      static_cast<const T*>(a.s), static_cast<const T*>(y), static_cast<const T*>(a.gamma),
      static_cast<const T*>(a.beta), a.rows, static_cast<int>(a.cols), eps, static_cast<T*>(s_out),
      static_cast<T*>(out), mean, rstd);
  return cudaGetLastError();
}

template <typename T, int VEC, int PPL, int G>
cudaError_t backward_rows(const LayerNormArgs& a, const void* dout, const void* ds, const float* mean,
                          const float* rstd, void* dx, float* partial, void* dgamma, void* dbeta, cudaStream_t stream) {
  // As many blocks as fit on the GPU at once (at most the bound the caller sized `partial` for).
  const size_t smem = 2 * static_cast<size_t>(a.cols) * sizeof(float);
  int device = 0, sms = 0, per_sm = 0;
  cudaError_t rc = cudaGetDevice(&device);
  if (rc == cudaSuccess) rc = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (rc == cudaSuccess) {
    rc = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, layer_norm_backward_kernel<T, VEC, PPL, G>, kWarps * 32,
                                                       smem);
  }
  if (rc != cudaSuccess) return rc;
  const int64_t bound = layer_norm_backward_blocks(a.rows), fit = static_cast<int64_t>(sms) * (per_sm > 0 ? per_sm : 1);
  const int64_t blocks = bound < fit ? bound : fit;
  layer_norm_backward_kernel<T, VEC, PPL, G><<<static_cast<unsigned>(blocks), kWarps * 32, smem, stream>>>(
      static_cast<const T*>(dout), static_cast<const T*>(ds), static_cast<const T*>(a.s), mean, rstd,
      static_cast<const T*>(a.gamma), a.rows, static_cast<int>(a.cols), static_cast<T*>(dx), partial);
  launch_finish_column_sums<T>(partial, blocks, a.cols, dgamma, dbeta, stream);
  return cudaGetLastError();
}

// Elements per pack for this call: 16 bytes when every row of every buffer is 16-byte aligned.
template <typename T>
int vec_for(const LayerNormArgs& a, std::initializer_list<const void*> buffers) {
  bool ok = can_pack<T>(a.gamma, a.cols) && can_pack<T>(a.beta ? a.beta : a.gamma, a.cols);
  for (const void* b : buffers) ok = ok && (b == nullptr || can_pack<T>(b, a.cols));
  return ok ? 16 / static_cast<int>(sizeof(T)) : 1;
}

template <typename T, int VEC>
int packs_per_lane(int64_t cols) {
  return static_cast<int>((cols / VEC + 31) / 32);
}

// Calls F<T, VEC, PPL>::run for the smallest PPL that holds a row (kernels are unrolled over PPL).
#define GPT2_LN_DISPATCH(VEC, PPL, CALL) \
  switch (PPL) {                         \
    case 1:                              \
      return CALL(VEC, 1);               \
    case 2:                              \
      return CALL(VEC, 2);               \
    case 3:                              \
      return CALL(VEC, 3);               \
    case 4:                              \
      return CALL(VEC, 4);               \
    case 5:                              \
      return CALL(VEC, 5);               \
    case 6:                              \
      return CALL(VEC, 6);               \
    case 7:                              \
      return CALL(VEC, 7);               \
    case 8:                              \
      return CALL(VEC, 8);               \
    default:                             \
      return cudaErrorInvalidValue;      \
  }

template <typename T>
cudaError_t forward_typed(const LayerNormArgs& a, float eps, const void* y, void* s_out, void* out, float* mean,
                          float* rstd, cudaStream_t stream) {
  if (a.rows == 0) return cudaSuccess;
  constexpr int kVec = 16 / sizeof(T);
  if (vec_for<T>(a, {a.s, y, s_out, out}) == kVec) {
#define GPT2_CALL(V, N) forward_rows<T, V, N>(a, eps, y, s_out, out, mean, rstd, stream)
    GPT2_LN_DISPATCH(kVec, (packs_per_lane<T, kVec>(a.cols)), GPT2_CALL)
  }
  if (packs_per_lane<T, 1>(a.cols) > kMaxPacksPerLane) return cudaErrorInvalidValue;
  return GPT2_CALL(1, kMaxPacksPerLane);
#undef GPT2_CALL
}

// Backward's warps per row: the fewest that leave a lane one pack. The lane's register-held
// dgamma/dbeta sums grow with its packs: gpt2-1558m's 1600 columns at one warp a row took 219
// registers (one block per SM, 1.2 TB/s); one pack a lane takes 48. Measured on an H200 (bf16,
// kernel_bench): 8192 x 1600 87.9 -> 50.9 us, 32768 x 768 81.8 -> 77.2 us; two packs a lane gave
// 52.4 and 80.8.
template <typename T, int VEC>
cudaError_t backward_grouped(const LayerNormArgs& a, const void* dout, const void* ds, const float* mean,
                             const float* rstd, void* dx, float* partial, void* dgamma, void* dbeta,
                             cudaStream_t stream) {
  const int64_t packs = a.cols / VEC;
#define GPT2_CALL(G) backward_rows<T, VEC, 1, G>(a, dout, ds, mean, rstd, dx, partial, dgamma, dbeta, stream)
  if (packs <= 32) return GPT2_CALL(1);
  if (packs <= 64) return GPT2_CALL(2);
  if (packs <= 128) return GPT2_CALL(4);
  if (packs <= 32 * kWarps) return GPT2_CALL(8);
  return cudaErrorInvalidValue;
#undef GPT2_CALL
}

template <typename T>
cudaError_t backward_typed(const LayerNormArgs& a, const void* dout, const void* ds, const float* mean,
                           const float* rstd, void* dx, float* partial, void* dgamma, void* dbeta,
                           cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  if (vec_for<T>(a, {a.s, dout, ds, dx}) == kVec)
    return backward_grouped<T, kVec>(a, dout, ds, mean, rstd, dx, partial, dgamma, dbeta, stream);
  return backward_grouped<T, 1>(a, dout, ds, mean, rstd, dx, partial, dgamma, dbeta, stream);
}

}  // namespace

bool layer_norm_supported(Dtype dtype, int64_t cols) {
  const int64_t elem = dtype == Dtype::kF32 ? 4 : 2;
  // The packed path (cols a multiple of 16 bytes) up to 8 packs per lane; the scalar one up to 8 elements.
  return cols > 0 &&
         ((cols * elem % 16 == 0 && cols * elem <= 16 * 32 * kMaxPacksPerLane) || cols <= 32 * kMaxPacksPerLane);
}

int64_t layer_norm_backward_blocks(int64_t rows) {
  int device = 0, sms = 132;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    (void)cudaGetLastError();
  }
  const int64_t want = (rows + kWarps - 1) / kWarps;
  const int64_t most = 8 * static_cast<int64_t>(sms);
  return want < most ? (want > 0 ? want : 1) : most;
}

cudaError_t launch_layer_norm_forward(Dtype dtype, const LayerNormArgs& a, float eps, const void* y, void* s_out,
                                      void* out, float* mean, float* rstd, cudaStream_t stream) {
  return with_storage_type(dtype, [&](auto t) {
    return forward_typed<typename decltype(t)::type>(a, eps, y, s_out, out, mean, rstd, stream);
  });
}

cudaError_t launch_layer_norm_backward(Dtype dtype, const LayerNormArgs& a, const void* dout, const void* ds,
                                       const float* mean, const float* rstd, void* dx, float* partial, void* dgamma,
                                       void* dbeta, cudaStream_t stream) {
  return with_storage_type(dtype, [&](auto t) {
    return backward_typed<typename decltype(t)::type>(a, dout, ds, mean, rstd, dx, partial, dgamma, dbeta, stream);
  });
}

}  // namespace gpt2::kernels
