#pragma once
// Device helpers of the FP8 casts (fp8_cast.cu, linear.cu's FP8 GELU backward): the scale of a
// cast, and one, two or eight values scaled, saturated and rounded as the ATen composition rounds
// them (fp8_gemm.h's quantize_fp8). For nvcc only.
#include <cuda_fp8.h>

#include "src/kernels/convert.cuh"
#include "src/kernels/launch.h"

namespace gpt2::kernels {

// The value a cast reads: x, or with GELU its gelu_tanh (rounded to T: ATen's gelu stores T).
template <typename T, bool GELU>
__device__ __forceinline__ float cast_input(T v) {
  if constexpr (GELU) return to_float(from_float<T>(gelu_tanh(to_float(v))));
  return to_float(v);
}

// fp8_scale_for: top / amax, or 1 where amax is 0 or not finite.
__device__ __forceinline__ float scale_for(float amax, float top) {
  return amax > 0.0f && isfinite(amax) ? top / amax : 1.0f;
}

// What a non-finite scaled value becomes, as the conversion without saturation (and ATen's) makes
// it: NaN 0x7f; ±inf e5m2's ±inf, or in e4m3 (no inf) NaN with inf's sign.
__device__ __forceinline__ unsigned non_finite_fp8(float v, __nv_fp8_interpretation_t format) {
  if (isnan(v)) return 0x7fu;
  return (format == __NV_E5M2 ? 0x7cu : 0x7fu) | (signbit(v) ? 0x80u : 0u);
}

// One element: finite values scaled, saturated to ±top and rounded to nearest even; inf and NaN
// stay non-finite, as quantize_fp8's where(isfinite, clamp, x). Finite values go through the
// hardware conversion (cvt.rn.satfinite, sm_89+: saturating changes nothing once clamped to ±top);
// without saturation CUDA's header converts in software through a double, which made the casts
// compute-bound.
__device__ __forceinline__ __nv_fp8_storage_t cast_one(float v, float s, float top, __nv_fp8_interpretation_t format) {
  const float scaled = v * s;
  if (!isfinite(scaled)) return static_cast<__nv_fp8_storage_t>(non_finite_fp8(scaled, format));
  return __nv_cvt_float_to_fp8(fminf(fmaxf(scaled, -top), top), __NV_SATFINITE, format);
}

// Two elements at once (the pair instruction), low byte a's: the bits of cast_one on each.
__device__ __forceinline__ unsigned cast_two(float a, float b, float s, float top, __nv_fp8_interpretation_t format) {
  const float sa = a * s, sb = b * s;
  unsigned q = __nv_cvt_float2_to_fp8x2(make_float2(fminf(fmaxf(sa, -top), top), fminf(fmaxf(sb, -top), top)),
                                        __NV_SATFINITE, format);
  if (!isfinite(sa)) q = (q & 0xff00u) | non_finite_fp8(sa, format);
  if (!isfinite(sb)) q = (q & 0x00ffu) | (non_finite_fp8(sb, format) << 8);
  return q;
}

// The largest |v| of eight values as fp32 bits (sign cleared): bits order as |v| does, and a NaN's
// lie above inf's, so a NaN among them wins (as ATen's amax propagates NaN).
__device__ __forceinline__ unsigned abs_max_bits(const float (&v)[8]) {
  unsigned m = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) m = max(m, __float_as_uint(v[k]) & 0x7fffffffu);
  return m;
}

// The rare pack (a value saturates, or is inf or NaN) out of line, so its registers do not count
// against the common path's.
static __device__ __noinline__ uint2 cast_eight_slow(float v0, float v1, float v2, float v3, float v4, float v5,
                                                     float v6, float v7, float s, float top,
                                                     __nv_fp8_interpretation_t format) {
  return make_uint2(cast_two(v0, v1, s, top, format) | cast_two(v2, v3, s, top, format) << 16,
                    cast_two(v4, v5, s, top, format) | cast_two(v6, v7, s, top, format) << 16);
}

// Eight elements (a pack; byte k is v[k]'s) with the bits of cast_one on each; `abs_max` is
// abs_max_bits(v). Where max |v| times s is at most top (fp32 multiplies are monotone, so every
// product is), no product needs the clamp or the non-finite fix-up: the conversion alone rounds it,
// in 4 pair instructions and one test for the pack instead of two clamps and a test an element.
// An inf or NaN fails the test (NaN compares false) and takes cast_two's path.
__device__ __forceinline__ uint2 cast_eight(const float (&v)[8], unsigned abs_max, float s, float top,
                                            __nv_fp8_interpretation_t format) {
  if (!(__uint_as_float(abs_max) * s <= top))
    return cast_eight_slow(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], s, top, format);
  unsigned q[4];
#pragma unroll
  for (int k = 0; k < 4; ++k)
    q[k] = __nv_cvt_float2_to_fp8x2(make_float2(v[2 * k] * s, v[2 * k + 1] * s), __NV_SATFINITE, format);
  return make_uint2(q[0] | q[1] << 16, q[2] | q[3] << 16);
}

// The scale of a cast (scale_for), called by a whole warp: from the amax at amax_bits, or
// else from the largest of history[1..len-1] (delayed scaling: the steps before this one; the
// lanes take every 32nd, max being exact in any order). Every lane returns it.
__device__ __forceinline__ float cast_scale(const Fp8CastArgs& a) {
  if (a.amax_bits != nullptr) return scale_for(__uint_as_float(*a.amax_bits), a.top);
  float amax = 0.0f;
  for (int64_t i = 1 + threadIdx.x % 32; i < a.history_len; i += 32) amax = fmaxf(amax, a.history[i]);
  for (int offset = 16; offset > 0; offset >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  return scale_for(amax, a.top);
}

// The block's largest |value| (each thread's `local`, fp32 bits) raised into *record_bits with one
// atomic; a NaN is recorded as inf (a history holds only numbers and inf, whose max every all-reduce
// takes alike; fp8_amax_roll replaces inf). Every thread of the block calls it (a barrier).
__device__ __forceinline__ void record_block_amax(unsigned local, unsigned* record_bits) {
  __shared__ unsigned block_amax;
  const int tid = threadIdx.x + threadIdx.y * blockDim.x;
  if (tid == 0) block_amax = 0;
  __syncthreads();
  for (int offset = 16; offset > 0; offset >>= 1) local = max(local, __shfl_xor_sync(0xffffffffu, local, offset));
  if (tid % 32 == 0) atomicMax(&block_amax, local);
  __syncthreads();
  if (tid == 0) atomicMax(record_bits, min(block_amax, 0x7f800000u));
}

}  // namespace gpt2::kernels
