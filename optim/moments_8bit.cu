// The 8-bit AdamW update on the GPU (moments_8bit.h): one CUDA block per quantization block, one
// pass: dequantize both moments, update, find the new absmax values, quantize. Every operation is
// the CPU path's, spelled with explicit rounding intrinsics (no FMA contraction, IEEE division and
// square root), so both give the same bits.
#include <cuda_runtime.h>

#include <cstdint>

#include "optim/moments_8bit.h"

namespace gpt2::optim {
namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = static_cast<int>(kQuantBlock) / kThreads;  // 8

__device__ __forceinline__ uint16_t to_bf16(float x) {  // round to nearest even, NaN -> 0x7FC0, as the CPU path
  const uint32_t u = __float_as_uint(x);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return (u & 0x7FFFFFFFu) > 0x7F800000u ? static_cast<uint16_t>(0x7FC0u) : static_cast<uint16_t>(rounded);
}

// quantize_value: first entry >= x, then the nearer of it and the one below, ties low.
__device__ __forceinline__ uint8_t quantize(const float* map, float x) {
  if (isnan(x)) x = 0.0f;
  int lo = 0, hi = 256;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (map[mid] < x) lo = mid + 1; else hi = mid;
  }
  if (lo == 0) return 0;
  if (lo == 256) return 255;
  return __fsub_rn(x, map[lo - 1]) <= __fsub_rn(map[lo], x) ? static_cast<uint8_t>(lo - 1) : static_cast<uint8_t>(lo);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read from the previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < kThreads / 32 ? scratch[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

template <bool kBf16Grad, bool kLerpFromM>
__global__ void __launch_bounds__(kThreads) adamw_8bit_kernel(Adamw8bitArgs a) {
  __shared__ float smap[256], umap[256], scratch[kThreads / 32];
  smap[threadIdx.x] = a.maps.signed_map[threadIdx.x];
  umap[threadIdx.x] = a.maps.unsigned_map[threadIdx.x];
  if (a.found_inf != nullptr && *a.found_inf != 0.0f) return;  // the whole grid returns: no barrier below
  __syncthreads();
  const int64_t block = blockIdx.x, b0 = block * kQuantBlock;
  const int64_t len = a.n - b0 < kQuantBlock ? a.n - b0 : kQuantBlock;
  const float scale =
      a.grad_scale_device != nullptr ? __fmul_rn(a.c.grad_scale, *a.grad_scale_device) : a.c.grad_scale;
  const float m_scale = a.exp_avg.absmax[block], v_scale = a.exp_avg_sq.absmax[block];
  float m[kPerThread], v[kPerThread];
  float m_amax = 0.0f, v_amax = 0.0f;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(k) * kThreads;
    m[k] = v[k] = 0.0f;
    if (i >= len) continue;
    const int64_t at = b0 + i;
    const float g0 = kBf16Grad ? __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(a.grad)[at]) << 16)
                               : static_cast<const float*>(a.grad)[at];
    const float g = __fmul_rn(g0, scale);
    const float p = __fmul_rn(a.param[at], a.c.decay);
    const float m0 = __fmul_rn(smap[a.exp_avg.codes[at]], m_scale);
    const float v0 = __fmul_rn(umap[a.exp_avg_sq.codes[at]], v_scale);
    m[k] = __fmaf_rn(a.c.lerp_coeff, __fsub_rn(g, m0), kLerpFromM ? m0 : g);
    v[k] = __fmaf_rn(__fmul_rn(a.c.one_minus_beta2, g), g, __fmul_rn(v0, a.c.beta2));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v[k]), a.c.bc2_sqrt), a.c.eps);
    const float p1 = __fadd_rn(p, __fdiv_rn(__fmul_rn(a.c.neg_step_size, m[k]), denom));
    a.param[at] = p1;
    if (a.param_bf16 != nullptr) a.param_bf16[at] = to_bf16(p1);
    m_amax = fmaxf(m_amax, fabsf(m[k]));
    v_amax = fmaxf(v_amax, fabsf(v[k]));
  }
  m_amax = block_max(m_amax, scratch);
  v_amax = block_max(v_amax, scratch);
  if (threadIdx.x == 0) {
    a.exp_avg.absmax[block] = m_amax;
    a.exp_avg_sq.absmax[block] = v_amax;
  }
  const float m_div = m_amax > 0.0f ? m_amax : 1.0f, v_div = v_amax > 0.0f ? v_amax : 1.0f;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(k) * kThreads;
    if (i >= len) continue;
    a.exp_avg.codes[b0 + i] = quantize(smap, __fdiv_rn(m[k], m_div));
    a.exp_avg_sq.codes[b0 + i] = quantize(umap, __fdiv_rn(v[k], v_div));
  }
}

}  // namespace

cudaError_t launch_adamw_8bit(const Adamw8bitArgs& args, cudaStream_t stream) {
  if (args.n <= 0) return cudaSuccess;
  const int64_t blocks = (args.n + kQuantBlock - 1) / kQuantBlock;
  const bool bf16 = args.grad_type == HostGradType::kBFloat16;
  const auto kernel = bf16 ? (args.c.lerp_from_m ? adamw_8bit_kernel<true, true> : adamw_8bit_kernel<true, false>)
                           : (args.c.lerp_from_m ? adamw_8bit_kernel<false, true> : adamw_8bit_kernel<false, false>);
  kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace gpt2::optim
