// The 8-bit AdamW update on the GPU (moments_8bit.h): each MomentBlock in one pass by one CUDA
// block: dequantize both moments, update, find the new absmax values, quantize through the bucket
// tables (Note [Quantizer buckets]; an fp32 block reads and writes its moments as they are). Every operation is
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
  __shared__ QuantTables tables;
  __shared__ float scratch[kThreads / 32];
  if (a.found_inf != nullptr && *a.found_inf != 0.0f) return;  // the whole grid returns: no barrier below
  {  // the tables into shared memory once per CUDA block (~30 KB, word by word)
    static_assert(sizeof(QuantTables) % 4 == 0, "tables copy in words");
    auto* dst = reinterpret_cast<uint32_t*>(&tables);
    const auto* src = reinterpret_cast<const uint32_t*>(a.tables);
    for (int w = threadIdx.x; w < static_cast<int>(sizeof(QuantTables) / 4); w += kThreads) dst[w] = src[w];
  }
  __syncthreads();
  const QuantTable& st = tables.signed_table;
  const QuantTable& ut = tables.unsigned_table;
  const MomentBuffers& mb = a.moments;
  const float scale =
      a.grad_scale_device != nullptr ? __fmul_rn(a.c.grad_scale, *a.grad_scale_device) : a.c.grad_scale;
  for (int64_t block = blockIdx.x; block < a.num_blocks; block += gridDim.x) {
    const MomentBlock blk = a.blocks[block];
    const bool quantized = blk.quantized != 0;  // the same for the whole CUDA block: barriers stay uniform
    const float decay = blk.weight_decay ? a.c.decay : 1.0f;
    const float m_scale = quantized ? mb.exp_avg_absmax[blk.state] : 0.0f;
    const float v_scale = quantized ? mb.exp_avg_sq_absmax[blk.state] : 0.0f;
    float m[kPerThread], v[kPerThread];
    float m_amax = 0.0f, v_amax = 0.0f;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int i = threadIdx.x + k * kThreads;
      m[k] = v[k] = 0.0f;
      if (i >= blk.len) continue;
      const int64_t at = blk.begin + i;
      const float g0 = kBf16Grad ? __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(a.grad)[at]) << 16)
                                 : static_cast<const float*>(a.grad)[at];
      const float g = __fmul_rn(g0, scale);
      const float p = __fmul_rn(a.param[at], decay);
      const float m0 = quantized ? __fmul_rn(st.map[mb.exp_avg_codes[at]], m_scale) : mb.exp_avg[blk.state + i];
      const float v0 = quantized ? __fmul_rn(ut.map[mb.exp_avg_sq_codes[at]], v_scale) : mb.exp_avg_sq[blk.state + i];
      m[k] = __fmaf_rn(a.c.lerp_coeff, __fsub_rn(g, m0), kLerpFromM ? m0 : g);
      v[k] = __fmaf_rn(__fmul_rn(a.c.one_minus_beta2, g), g, __fmul_rn(v0, a.c.beta2));
      const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v[k]), a.c.bc2_sqrt), a.c.eps);
      const float p1 = __fadd_rn(p, __fdiv_rn(__fmul_rn(a.c.neg_step_size, m[k]), denom));
      a.param[at] = p1;
      if (a.param_bf16 != nullptr) a.param_bf16[at] = to_bf16(p1);
      if (!quantized) {
        mb.exp_avg[blk.state + i] = m[k];
        mb.exp_avg_sq[blk.state + i] = v[k];
      }
      m_amax = fmaxf(m_amax, fabsf(m[k]));
      v_amax = fmaxf(v_amax, fabsf(v[k]));
    }
    if (!quantized) continue;
    m_amax = block_max(m_amax, scratch);
    v_amax = block_max(v_amax, scratch);
    if (threadIdx.x == 0) {
      mb.exp_avg_absmax[blk.state] = m_amax;
      mb.exp_avg_sq_absmax[blk.state] = v_amax;
    }
    const float m_div = m_amax > 0.0f ? m_amax : 1.0f, v_div = v_amax > 0.0f ? v_amax : 1.0f;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int i = threadIdx.x + k * kThreads;
      if (i >= blk.len) continue;
      mb.exp_avg_codes[blk.begin + i] = quantize_with(st, __fdiv_rn(m[k], m_div));
      mb.exp_avg_sq_codes[blk.begin + i] = quantize_with(ut, __fdiv_rn(v[k], v_div));
    }
  }
}

}  // namespace

cudaError_t launch_adamw_8bit(const Adamw8bitArgs& args, cudaStream_t stream) {
  if (args.num_blocks <= 0) return cudaSuccess;
  // A few CUDA blocks per SM walk the list, so each loads the tables once.
  static const int sms = [] {
    int device = 0, count = 0;
    if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      count = 132;
    }
    return count;
  }();
  const int64_t blocks = args.num_blocks < 6 * static_cast<int64_t>(sms) ? args.num_blocks : 6 * static_cast<int64_t>(sms);
  const bool bf16 = args.grad_type == HostGradType::kBFloat16;
  const auto kernel = bf16 ? (args.c.lerp_from_m ? adamw_8bit_kernel<true, true> : adamw_8bit_kernel<true, false>)
                           : (args.c.lerp_from_m ? adamw_8bit_kernel<false, true> : adamw_8bit_kernel<false, false>);
  kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace gpt2::optim
