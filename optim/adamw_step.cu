// The GPU optimizer (adamw_step.h): each MomentBlock in one pass by one CUDA block: dequantize both
// 8-bit moments, update, find the new absmax values, quantize through the bucket tables (Note
// [Quantizer buckets]); an fp32 block reads and writes its moments as they are, so this is the
// device update of fp32 moments too (optim/adamw_updates.h). Every operation is
// the CPU path's, spelled with explicit rounding intrinsics (no FMA contraction, IEEE division and
// square root), so both give the same bits.
#include <cuda_runtime.h>

#include <cstdint>

#include "optim/adamw_step.h"

namespace gpt2::optim {
namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = static_cast<int>(kQuantBlock) / kThreads;  // 8
static_assert(kPerThread == 8, "a thread of update_full_block packs 8 codes into two words");

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

// The block's new absmax values from each thread's (m_amax, v_amax), stored at `state`; returns
// the divisors that quantize the block (1 for a block of zeros, whose codes then encode zeros).
__device__ __forceinline__ float2 store_absmax(float m_amax, float v_amax, float* scratch, const MomentBuffers& mb,
                                               int64_t state) {
  m_amax = block_max(m_amax, scratch);
  v_amax = block_max(v_amax, scratch);
  if (threadIdx.x == 0) {
    mb.exp_avg_absmax[state] = m_amax;
    mb.exp_avg_sq_absmax[state] = v_amax;
  }
  return make_float2(m_amax > 0.0f ? m_amax : 1.0f, v_amax > 0.0f ? v_amax : 1.0f);
}

// One element's update (the CPU path's arithmetic, operation for operation): decays and updates
// p, returns it; m and v come in as the old moments and leave as the new ones.
template <bool kLerpFromM>
__device__ __forceinline__ float update_element(const AdamWCoeffs& c, float decay, float scale, float g0, float p,
                                                float& m, float& v) {
  const float g = __fmul_rn(g0, scale);
  p = __fmul_rn(p, decay);
  const float m0 = m, v0 = v;
  m = __fmaf_rn(c.lerp_coeff, __fsub_rn(g, m0), kLerpFromM ? m0 : g);
  v = __fmaf_rn(__fmul_rn(c.one_minus_beta2, g), g, __fmul_rn(v0, c.beta2));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), c.bc2_sqrt), c.eps);
  return __fadd_rn(p, __fdiv_rn(__fmul_rn(c.neg_step_size, m), denom));
}

__device__ __forceinline__ float bf16_to_float(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }

// kPerThread contiguous values at x (16-byte aligned) in two 16-byte loads, and back.
__device__ __forceinline__ void load8(const float* x, float (&out)[kPerThread]) {
  const float4 a = *reinterpret_cast<const float4*>(x), b = *reinterpret_cast<const float4*>(x + 4);
  out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w, out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
}
__device__ __forceinline__ void store8(float* x, const float (&in)[kPerThread]) {
  *reinterpret_cast<float4*>(x) = make_float4(in[0], in[1], in[2], in[3]);
  *reinterpret_cast<float4*>(x + 4) = make_float4(in[4], in[5], in[6], in[7]);
}

// The gradient of kPerThread elements from `at`: one 16-byte load of bf16 values, or two of fp32.
template <bool kBf16Grad>
__device__ __forceinline__ void load_grad8(const void* grad, int64_t at, float (&g)[kPerThread]) {
  if constexpr (kBf16Grad) {
    const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(grad) + at);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      g[2 * k] = bf16_to_float(static_cast<uint16_t>(w[k] & 0xFFFFu));
      g[2 * k + 1] = bf16_to_float(static_cast<uint16_t>(w[k] >> 16));
    }
  } else {
    load8(static_cast<const float*>(grad) + at, g);
  }
}

// The rounded parameters of kPerThread elements in one 16-byte store (nothing without a bf16 copy).
__device__ __forceinline__ void store_bf16x8(uint16_t* param_bf16, int64_t at, const float (&p)[kPerThread]) {
  if (param_bf16 == nullptr) return;
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k)
    w[k] = static_cast<uint32_t>(to_bf16(p[2 * k])) | (static_cast<uint32_t>(to_bf16(p[2 * k + 1])) << 16);
  *reinterpret_cast<uint4*>(param_bf16 + at) = make_uint4(w[0], w[1], w[2], w[3]);
}

// A whole 8-bit block of kQuantBlock elements, kPerThread contiguous ones per thread, every buffer
// read and written in 8- and 16-byte vectors: all of a thread's loads are issued before its first
// store, so each thread keeps several hundred bytes in flight (the update is bound by memory
// latency otherwise). Needs begin % kPerThread == 0 and 16-byte aligned buffers (the caller checks).
template <bool kBf16Grad, bool kLerpFromM>
__device__ __forceinline__ void update_full_block(const AdamWStepArgs& a, const QuantTables& tables, float* scratch,
                                                  const MomentBlock& blk, float scale) {
  const MomentBuffers& mb = a.moments;
  const int64_t at = blk.begin + static_cast<int64_t>(threadIdx.x) * kPerThread;
  float g[kPerThread], p[kPerThread], m[kPerThread], v[kPerThread];
  load_grad8<kBf16Grad>(a.grad, at, g);
  load8(a.param + at, p);
  const uint2 mc = *reinterpret_cast<const uint2*>(mb.exp_avg_codes + at);
  const uint2 vc = *reinterpret_cast<const uint2*>(mb.exp_avg_sq_codes + at);
  const float m_scale = mb.exp_avg_absmax[blk.state], v_scale = mb.exp_avg_sq_absmax[blk.state];
  const QuantTable& st = tables.signed_table;
  const QuantTable& ut = tables.unsigned_table;
  const float decay = blk.weight_decay ? a.c.decay : 1.0f;
  float m_amax = 0.0f, v_amax = 0.0f;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const uint32_t mw = k < 4 ? mc.x : mc.y, vw = k < 4 ? vc.x : vc.y;
    m[k] = __fmul_rn(st.map[(mw >> (8 * (k % 4))) & 0xFFu], m_scale);
    const float root = __fmul_rn(ut.map[(vw >> (8 * (k % 4))) & 0xFFu], v_scale);  // Note [Second moment as its root]
    v[k] = __fmul_rn(root, root);
    p[k] = update_element<kLerpFromM>(a.c, decay, scale, g[k], p[k], m[k], v[k]);
    v[k] = __fsqrt_rn(v[k]);
    m_amax = fmaxf(m_amax, fabsf(m[k]));
    v_amax = fmaxf(v_amax, fabsf(v[k]));
  }
  store8(a.param + at, p);
  store_bf16x8(a.param_bf16, at, p);
  const float2 div = store_absmax(m_amax, v_amax, scratch, mb, blk.state);
  const float m_div = div.x, v_div = div.y;
  uint32_t mq[2] = {0, 0}, vq[2] = {0, 0};
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    mq[k / 4] |= static_cast<uint32_t>(quantize_with(st, __fdiv_rn(m[k], m_div))) << (8 * (k % 4));
    vq[k / 4] |= static_cast<uint32_t>(quantize_with(ut, __fdiv_rn(v[k], v_div))) << (8 * (k % 4));
  }
  *reinterpret_cast<uint2*>(mb.exp_avg_codes + at) = make_uint2(mq[0], mq[1]);
  *reinterpret_cast<uint2*>(mb.exp_avg_sq_codes + at) = make_uint2(vq[0], vq[1]);
}

// A whole fp32-moment block, the same way: the gradient, parameters and both moments (at
// exp_avg + state) loaded as vectors before anything is stored, then the parameters, moments and
// bf16 copy stored as vectors. No barrier, no tables. Needs begin and state % kPerThread == 0 and
// 16-byte aligned buffers (the caller checks).
template <bool kBf16Grad, bool kLerpFromM>
__device__ __forceinline__ void update_full_fp32_block(const AdamWStepArgs& a, const MomentBlock& blk, float scale) {
  const MomentBuffers& mb = a.moments;
  const int64_t at = blk.begin + static_cast<int64_t>(threadIdx.x) * kPerThread;
  const int64_t ms = blk.state + static_cast<int64_t>(threadIdx.x) * kPerThread;
  float g[kPerThread], p[kPerThread], m[kPerThread], v[kPerThread];
  load_grad8<kBf16Grad>(a.grad, at, g);
  load8(a.param + at, p);
  load8(mb.exp_avg + ms, m);
  load8(mb.exp_avg_sq + ms, v);
  const float decay = blk.weight_decay ? a.c.decay : 1.0f;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) p[k] = update_element<kLerpFromM>(a.c, decay, scale, g[k], p[k], m[k], v[k]);
  store8(a.param + at, p);
  store8(mb.exp_avg + ms, m);
  store8(mb.exp_avg_sq + ms, v);
  store_bf16x8(a.param_bf16, at, p);
}

// Any other block (an fp32-moment one, a short or unaligned one): element threadIdx.x + k * kThreads.
template <bool kBf16Grad, bool kLerpFromM>
__device__ __forceinline__ void update_any_block(const AdamWStepArgs& a, const QuantTables& tables, float* scratch,
                                                 const MomentBlock& blk, float scale) {
  const MomentBuffers& mb = a.moments;
  const QuantTable& st = tables.signed_table;
  const QuantTable& ut = tables.unsigned_table;
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
    const float g0 =
        kBf16Grad ? bf16_to_float(static_cast<const uint16_t*>(a.grad)[at]) : static_cast<const float*>(a.grad)[at];
    m[k] = quantized ? __fmul_rn(st.map[mb.exp_avg_codes[at]], m_scale) : mb.exp_avg[blk.state + i];
    if (quantized) {  // Note [Second moment as its root]
      const float root = __fmul_rn(ut.map[mb.exp_avg_sq_codes[at]], v_scale);
      v[k] = __fmul_rn(root, root);
    } else {
      v[k] = mb.exp_avg_sq[blk.state + i];
    }
    const float p1 = update_element<kLerpFromM>(a.c, decay, scale, g0, a.param[at], m[k], v[k]);
    a.param[at] = p1;
    if (a.param_bf16 != nullptr) a.param_bf16[at] = to_bf16(p1);
    if (!quantized) {
      mb.exp_avg[blk.state + i] = m[k];
      mb.exp_avg_sq[blk.state + i] = v[k];
    }
    v[k] = __fsqrt_rn(v[k]);
    m_amax = fmaxf(m_amax, fabsf(m[k]));
    v_amax = fmaxf(v_amax, fabsf(v[k]));
  }
  if (!quantized) return;
  const float2 div = store_absmax(m_amax, v_amax, scratch, mb, blk.state);
  const float m_div = div.x, v_div = div.y;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int i = threadIdx.x + k * kThreads;
    if (i >= blk.len) continue;
    mb.exp_avg_codes[blk.begin + i] = quantize_with(st, __fdiv_rn(m[k], m_div));
    mb.exp_avg_sq_codes[blk.begin + i] = quantize_with(ut, __fdiv_rn(v[k], v_div));
  }
}

// Which whole blocks take the vector paths: the buffers each path reads are 16-byte aligned.
struct VectorPaths {
  bool quantized;  // update_full_block
  bool fp32;       // update_full_fp32_block
};

template <bool kBf16Grad, bool kLerpFromM>
__global__ void __launch_bounds__(kThreads) adamw_step_kernel(AdamWStepArgs a, VectorPaths vectors) {
  __shared__ QuantTables tables;
  __shared__ float scratch[kThreads / 32];
  if (a.found_inf != nullptr && *a.found_inf != 0.0f) return;  // the whole grid returns: no barrier below
  if (a.tables != nullptr) {  // the tables into shared memory once per CUDA block (~30 KB, word by word)
    static_assert(sizeof(QuantTables) % 4 == 0, "tables copy in words");
    auto* dst = reinterpret_cast<uint32_t*>(&tables);
    const auto* src = reinterpret_cast<const uint32_t*>(a.tables);
    for (int w = threadIdx.x; w < static_cast<int>(sizeof(QuantTables) / 4); w += kThreads) dst[w] = src[w];
  }
  __syncthreads();
  const float scale = a.grad_scale_device != nullptr ? __fmul_rn(a.c.grad_scale, *a.grad_scale_device) : a.c.grad_scale;
  for (int64_t block = blockIdx.x; block < a.num_blocks; block += gridDim.x) {
    const MomentBlock blk = a.blocks[block];
    // The conditions depend on the block alone, so every thread of the CUDA block takes the same
    // branch (the 8-bit paths have barriers).
    const bool whole = blk.len == kQuantBlock && blk.begin % kPerThread == 0;
    if (whole && blk.quantized != 0 && vectors.quantized) {
      update_full_block<kBf16Grad, kLerpFromM>(a, tables, scratch, blk, scale);
    } else if (whole && blk.quantized == 0 && vectors.fp32 && blk.state % kPerThread == 0) {
      update_full_fp32_block<kBf16Grad, kLerpFromM>(a, blk, scale);
    } else {
      update_any_block<kBf16Grad, kLerpFromM>(a, tables, scratch, blk, scale);
    }
  }
}

}  // namespace

cudaError_t adamw_step_gpu(const AdamWStepArgs& args, cudaStream_t stream) {
  if (args.num_blocks <= 0) return cudaSuccess;
  const bool bf16 = args.grad_type == HostGradType::kBFloat16;
  const auto kernel = bf16 ? (args.c.lerp_from_m ? adamw_step_kernel<true, true> : adamw_step_kernel<true, false>)
                           : (args.c.lerp_from_m ? adamw_step_kernel<false, true> : adamw_step_kernel<false, false>);
  // Whole blocks take a vector path when every buffer it touches starts 16-byte aligned (a block's
  // offsets are then multiples of kPerThread elements of each).
  const auto aligned = [](const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const MomentBuffers& mb = args.moments;
  const bool common = aligned(args.grad) && aligned(args.param) && aligned(args.param_bf16);
  const VectorPaths vectors{common && aligned(mb.exp_avg_codes) && aligned(mb.exp_avg_sq_codes),
                            common && aligned(mb.exp_avg) && aligned(mb.exp_avg_sq)};
  // As many CUDA blocks as fit on the GPU at once walk the list, so each loads the tables once and
  // none waits for a place.
  int device = 0, sms = 0, per_sm = 0;
  cudaError_t rc = cudaGetDevice(&device);
  if (rc == cudaSuccess) rc = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (rc == cudaSuccess) rc = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0);
  if (rc != cudaSuccess) return rc;
  const int64_t resident = static_cast<int64_t>(sms) * (per_sm > 0 ? per_sm : 1);
  const int64_t blocks = args.num_blocks < resident ? args.num_blocks : resident;
  kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args, vectors);
  return cudaGetLastError();
}

}  // namespace gpt2::optim
