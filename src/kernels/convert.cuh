#pragma once
// Device helpers of the kernels in this folder: fp32 <-> storage types (fp32 math everywhere),
// packed vector loads, warp sums, and the second pass of the column sums (bias and LayerNorm
// parameter gradients): out_k[c] = sum over chunks b of partial[(b * n_out + k) * cols + c].
// On the host side, with_storage_type: a launcher's Dtype -> the storage type its kernels take;
// and programmatic dependent launch (launch_dependent, with its two device calls).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "src/kernels/launch.h"

namespace gpt2::kernels {

template <typename T>
struct StorageType {
  using type = T;
};

// Calls launch(StorageType<T>{}) with T = float, __half or __nv_bfloat16 as `dtype` says, and
// returns its result; a Dtype outside the three is cudaErrorInvalidValue. One switch for every
// launcher: `with_storage_type(dtype, [&](auto t) { return run<typename decltype(t)::type>(...); })`.
template <typename Launch>
cudaError_t with_storage_type(Dtype dtype, Launch&& launch) {
  switch (dtype) {
    case Dtype::kF32:
      return launch(StorageType<float>{});
    case Dtype::kF16:
      return launch(StorageType<__half>{});
    case Dtype::kBF16:
      return launch(StorageType<__nv_bfloat16>{});
  }
  return cudaErrorInvalidValue;
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// GELU's tanh approximation, gelu_tanh(x) = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), in fp32
// with ATen's CUDA kernel's order of operations, so a kernel that rounds it to the storage type
// stores ATen's bits.
constexpr float kGeluAlpha = 0.7978845608028654f, kGeluBeta = 0.044715f;  // sqrt(2/pi), the cubic term
__device__ __forceinline__ float gelu_tanh(float x) {
  const float x_cube = x * x * x;
  return 0.5f * x * (1.0f + tanhf(kGeluAlpha * (x + kGeluBeta * x_cube)));
}

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

// The 16 int8 values of a 16-byte chunk as floats, exactly. A plain cast is I2F, a conversion the
// SM issues at an eighth of its FP32 rate (16 a clock on sm_90), and weight-only int8 decoding
// widens every weight it reads. Here a byte b, its sign bit flipped to b + 128 (0..255), becomes
// the low mantissa byte of 2^23 (one PRMT), and subtracting 2^23 + 128 leaves b (one FADD, exact:
// both are integers below 2^24): integer-ALU and FP32 rates.
__device__ __forceinline__ void int8x16_to_float(const int4& chunk, float* out) {
  const uint32_t words[4] = {static_cast<uint32_t>(chunk.x), static_cast<uint32_t>(chunk.y),
                             static_cast<uint32_t>(chunk.z), static_cast<uint32_t>(chunk.w)};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    const uint32_t biased = words[w] ^ 0x80808080u;  // little-endian: byte e is element 4w + e
#pragma unroll
    for (int e = 0; e < 4; ++e)  // bytes (e, 0, 0, 0x4B) of (biased, 0x4B000000): 0x4B0000uu = 2^23 + uu
      out[4 * w + e] = __uint_as_float(__byte_perm(biased, 0x4B000000u, 0x7440u + e)) - 8388736.0f;
  }
}

// VEC elements of T in one 16-byte (or smaller) load.
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

// N consecutive elements of T from p (16-byte aligned) as floats, 16 bytes a load.
template <typename T, int N>
__device__ __forceinline__ void load_floats(const T* p, float* out) {
  constexpr int kVec = 16 / sizeof(T);
  static_assert(N % kVec == 0, "whole 16-byte packs");
  const Pack<T, kVec>* v = reinterpret_cast<const Pack<T, kVec>*>(p);
#pragma unroll
  for (int i = 0; i < N / kVec; ++i) {
    const Pack<T, kVec> pk = v[i];
#pragma unroll
    for (int e = 0; e < kVec; ++e) out[i * kVec + e] = to_float(pk.v[e]);
  }
}

// 16-byte packs when every row starts 16-byte aligned, else one element at a time.
template <typename T>
inline bool can_pack(const void* p, int64_t row_elems) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (row_elems * static_cast<int64_t>(sizeof(T))) % 16 == 0;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// A block of 32 columns x 8 lanes over the chunks, then a shared-memory sum of the lanes.
template <typename T>
__global__ void __launch_bounds__(256) finish_column_sums(const float* __restrict__ partial, int64_t chunks,
                                                          int64_t cols, T* __restrict__ out0, T* __restrict__ out1) {
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + tx;
  const int n_out = out1 ? 2 : 1;
  float a = 0.0f, b = 0.0f;
  if (c < cols) {
    for (int64_t k = ty; k < chunks; k += 8) {
      a += partial[(k * n_out) * cols + c];
      if (out1) b += partial[(k * n_out + 1) * cols + c];
    }
  }
  __shared__ float sa[8][33], sb[8][33];
  sa[ty][tx] = a;
  sb[ty][tx] = b;
  __syncthreads();
  if (ty == 0 && c < cols) {
    for (int i = 1; i < 8; ++i) {
      a += sa[i][tx];
      b += sb[i][tx];
    }
    out0[c] = from_float<T>(a);
    if (out1) out1[c] = from_float<T>(b);
  }
}

// Programmatic dependent launch (sm_90+), for the decode step's chain of small kernels, where a
// kernel's launch and first loads would otherwise wait for the whole kernel before it:
// - launch_dependent launches `kernel` so that it may start while the kernel before it in the
//   stream drains (a CUDA graph captures that as a programmatic edge); elsewhere, a plain launch;
// - the kernel calls wait_for_previous_kernel() before it reads anything an earlier kernel wrote
//   (it returns once that kernel has finished and its writes are visible), and may load what no
//   kernel writes (weights) before;
// - allow_next_kernel() lets a dependent launched after this kernel start now, in the SM slots left.
// Both device calls are no-ops for a kernel launched plainly and before sm_90.
__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_next_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Asks L2 for `bytes` from p (sm_90's bulk prefetch; a no-op before): one instruction, no registers
// and nothing to wait for. Before wait_for_previous_kernel() it lets a dependent kernel's first reads
// stream from HBM while the kernel before it drains. p 16-byte aligned, bytes a multiple of 16.
__device__ __forceinline__ void prefetch_to_l2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
  (void)p, (void)bytes;
#endif
}

// The current device's `attr` (0 when it cannot be read).
inline int device_attribute(cudaDeviceAttr attr) {
  int device = 0, value = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&value, attr, device) != cudaSuccess) return 0;
  return value;
}

// Blocks of `threads` threads and `dynamic` bytes of shared memory an SM holds at once of `kernel`
// (at least 1). Remembered for the last 16 (kernel, threads, bytes) asked on this thread: a launch
// inside the decode loop should not ask the driver each time.
template <typename... Params>
int resident_blocks(void (*kernel)(Params...), int threads, int dynamic) {
  struct Seen {
    const void* kernel;
    int threads, dynamic, blocks;
  };
  thread_local Seen seen[16] = {};
  thread_local int next = 0;
  const void* key = reinterpret_cast<const void*>(kernel);
  for (const Seen& s : seen)
    if (s.kernel == key && s.threads == threads && s.dynamic == dynamic) return s.blocks;
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, dynamic) != cudaSuccess || blocks < 1)
    blocks = 1;
  seen[next] = {key, threads, dynamic, blocks};
  next = (next + 1) % 16;
  return blocks;
}

// Lets `kernel` launch with `dynamic` bytes of dynamic shared memory: past the default 48 KiB,
// static and dynamic together, a kernel must opt in (not a stream operation, so it may run while a
// graph captures).
template <typename... Params>
cudaError_t allow_dynamic_shared_memory(void (*kernel)(Params...), int dynamic) {
  cudaFuncAttributes attributes{};
  cudaError_t e = cudaFuncGetAttributes(&attributes, kernel);
  if (e != cudaSuccess || attributes.sharedSizeBytes + static_cast<size_t>(dynamic) <= 48 * 1024) return e;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic);
}

template <typename... Params, typename... Args>
cudaError_t launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                             Args&&... args) {
  static const bool pdl = device_attribute(cudaDevAttrComputeCapabilityMajor) >= 9;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

template <typename T>
inline void launch_finish_column_sums(const float* partial, int64_t chunks, int64_t cols, void* out0, void* out1,
                                      cudaStream_t stream) {
  finish_column_sums<T><<<static_cast<unsigned>((cols + 31) / 32), 256, 0, stream>>>(
      partial, chunks, cols, static_cast<T*>(out0), static_cast<T*>(out1));
}

}  // namespace gpt2::kernels
