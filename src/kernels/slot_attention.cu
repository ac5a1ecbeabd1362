// Slot decoding's attention (launch.h, slot_attention.h). One block of kWarps (16) warps per (row,
// head). Warp w takes the tiles w, w + kWarps, w + 2 kWarps, ... of kTile positions of the row, in
// increasing order: each lane computes the whole dot product of q with its position's key (q sits
// in shared memory as fp32), the warp keeps an online softmax (running max, running sum, and the
// accumulator rescaled when the max grows), and the value rows are read a pair of dims per lane,
// coalesced, the tile's 32 rows without a branch so their loads overlap. At the end the warps' states merge in warp
// order. Which positions a warp takes, and the order of every sum, depend on positions[b] alone: row b's bits do not
// depend on the other rows, on the batch, or on the cache's capacity.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "src/kernels/convert.cuh"
#include "src/kernels/launch.h"

namespace gpt2::kernels {
namespace {

// Warps per (row, head). At batch 1 the grid is one block a head (12 at gpt2-124m), so the
// positions must spread over many warps: with 16, a 384-position context is one tile a warp.
constexpr int kWarps = 16;
constexpr int kTile = 32;          // positions per warp step: one per lane
constexpr int kMaxHeadSize = 128;  // 2 pairs of dims per lane in the accumulator
constexpr unsigned kFullMask = 0xffffffffu;

// Two elements of T in one load, and their fp32 values.
template <typename T>
struct PairOf;
template <>
struct PairOf<float> {
  using type = float2;
};
template <>
struct PairOf<__half> {
  using type = __half2;
};
template <>
struct PairOf<__nv_bfloat16> {
  using type = __nv_bfloat162;
};
__device__ __forceinline__ float2 to_float2(float2 v) { return v; }
__device__ __forceinline__ float2 to_float2(__half2 v) { return __half22float2(v); }
__device__ __forceinline__ float2 to_float2(__nv_bfloat162 v) { return __bfloat1622float2(v); }

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// PPL: accumulator pairs per lane (hs <= 64 * PPL). PACKED: keys read 16 bytes a load (hs a
// multiple of 16 / sizeof(T), the cache 16-byte aligned), else a pair at a time; the dot product
// sums the dims in the same order either way.
template <typename T, int PPL, bool PACKED>
__global__ void __launch_bounds__(kWarps * 32) slot_attention_kernel(SlotAttentionArgs a, T* __restrict__ y) {
  using T2 = typename PairOf<T>::type;
  const int64_t head = blockIdx.x, b = blockIdx.y;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int hs = static_cast<int>(a.head_size), pairs = hs / 2;
  __shared__ float2 q_s[kMaxHeadSize / 2];
  __shared__ float m_s[kWarps], l_s[kWarps];
  __shared__ float acc_s[kWarps][kMaxHeadSize];
  // Launched as a programmatic dependent (launch_dependent): q and this step's key and value come
  // from the kernel before; the projection after may start taking free SM slots now.
  wait_for_previous_kernel();
  allow_next_kernel();

  const T* q = static_cast<const T*>(a.q) + b * a.q_stride_b + head * a.q_stride_h;
  for (int i = static_cast<int>(threadIdx.x); i < pairs; i += kWarps * 32) {
    q_s[i] = make_float2(to_float(q[2 * i]), to_float(q[2 * i + 1]));
  }
  __syncthreads();

  const int64_t row = b * a.heads + head;  // (row, head) of the cache and of y
  const T2* k2 = reinterpret_cast<const T2*>(static_cast<const T*>(a.keys) + row * a.capacity * hs);
  const T2* v2 = reinterpret_cast<const T2*>(static_cast<const T*>(a.values) + row * a.capacity * hs);
  const int64_t pos = a.positions[b];
  const bool bad = pos < 0 || pos >= a.capacity;
  const int64_t n = bad ? 0 : pos + 1;  // positions attended

  float m = -INFINITY, l = 0.0f;  // running max and sum of exp(s - m)
  float2 acc[PPL];                // sum of exp(s - m) v, dims 2 (lane + 32 k) and the next
#pragma unroll
  for (int k = 0; k < PPL; ++k) acc[k] = make_float2(0.0f, 0.0f);
  for (int64_t t0 = static_cast<int64_t>(warp) * kTile; t0 < n; t0 += kWarps * kTile) {
    const int64_t j = t0 + lane;
    float s = -INFINITY;
    if (j < n) {
      float dot = 0.0f;
      if constexpr (PACKED) {
        constexpr int kVec = 16 / sizeof(T);
        const Pack<T, kVec>* kj = reinterpret_cast<const Pack<T, kVec>*>(k2 + j * pairs);
        const float* qf = reinterpret_cast<const float*>(q_s);
        for (int i = 0; i < hs / kVec; ++i) {
          const Pack<T, kVec> kv = kj[i];
#pragma unroll
          for (int e = 0; e < kVec; ++e) dot = fmaf(qf[i * kVec + e], to_float(kv.v[e]), dot);
        }
      } else {
        const T2* kj = k2 + j * pairs;
        for (int i = 0; i < pairs; ++i) {
          const float2 kv = to_float2(kj[i]), qv = q_s[i];
          dot = fmaf(qv.x, kv.x, dot);
          dot = fmaf(qv.y, kv.y, dot);
        }
      }
      s = dot * a.scale;
    }
    const float m_new = fmaxf(m, warp_max(s));  // finite: lane 0's position is always < n
    const float p = j < n ? expf(s - m_new) : 0.0f;
    const float alpha = expf(m - m_new);  // 0 on the first tile (m = -inf)
    l = l * alpha + warp_sum(p);          // the butterfly leaves the same bits in every lane
#pragma unroll
    for (int k = 0; k < PPL; ++k) {
      acc[k].x *= alpha;
      acc[k].y *= alpha;
    }
    const int count = static_cast<int>(n - t0 < kTile ? n - t0 : kTile);  // the same in every lane
    // All kTile steps, unrolled, with no branch around the loads, so they are in flight together
    // (a step per position with a guarded load waited out each load's latency in turn: at batch 1
    // that was the decode step's cost). A step past `count` has pj = 0 and reads the tile's last
    // written position (finite), so it adds exactly 0 (the sum is that of count steps, up to the
    // sign of a zero).
#pragma unroll
    for (int jj = 0; jj < kTile; ++jj) {
      const float pj = __shfl_sync(kFullMask, p, jj);
      const T2* vj = v2 + (t0 + (jj < count ? jj : count - 1)) * pairs;
#pragma unroll
      for (int k = 0; k < PPL; ++k) {
        // A lane past the head's dims (hs < 64 PPL) sums a real dim's values into an accumulator
        // that is never written out: no branch.
        const int d = lane + 32 * k;
        const float2 vv = to_float2(vj[d < pairs ? d : pairs - 1]);
        acc[k].x = fmaf(pj, vv.x, acc[k].x);
        acc[k].y = fmaf(pj, vv.y, acc[k].y);
      }
    }
    m = m_new;
  }

  // The warps' states, merged in warp order (a warp without a tile has m = -inf and counts for nothing).
  if (lane == 0) {
    m_s[warp] = m;
    l_s[warp] = l;
  }
#pragma unroll
  for (int k = 0; k < PPL; ++k) {
    const int d = lane + 32 * k;
    if (d < pairs) {
      acc_s[warp][2 * d] = acc[k].x;
      acc_s[warp][2 * d + 1] = acc[k].y;
    }
  }
  __syncthreads();
  for (int d = static_cast<int>(threadIdx.x); d < hs; d += kWarps * 32) {
    float top = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) top = fmaxf(top, m_s[w]);
    float num = 0.0f, den = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      if (m_s[w] != -INFINITY) {
        const float c = expf(m_s[w] - top);
        num = fmaf(acc_s[w][d], c, num);
        den = fmaf(l_s[w], c, den);
      }
    }
    y[row * hs + d] = from_float<T>(bad ? NAN : num / den);
  }
}

template <typename T>
cudaError_t launch_typed(const SlotAttentionArgs& a, void* y, cudaStream_t stream) {
  const uintptr_t align = 2 * sizeof(T);
  if (reinterpret_cast<uintptr_t>(a.keys) % align != 0 || reinterpret_cast<uintptr_t>(a.values) % align != 0) {
    return cudaErrorInvalidValue;
  }
  if (a.batch == 0 || a.heads == 0) return cudaSuccess;
  if (a.batch > 65535 || a.heads > 0x7fffffff) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(a.heads), static_cast<unsigned>(a.batch));
  const bool packed = a.head_size % (16 / sizeof(T)) == 0 && reinterpret_cast<uintptr_t>(a.keys) % 16 == 0;
  T* yt = static_cast<T*>(y);
  const auto kernel = a.head_size <= 64
                          ? (packed ? slot_attention_kernel<T, 1, true> : slot_attention_kernel<T, 1, false>)
                          : (packed ? slot_attention_kernel<T, 2, true> : slot_attention_kernel<T, 2, false>);
  return launch_dependent(kernel, grid, dim3(kWarps * 32), 0, stream, a, yt);
}

}  // namespace

bool slot_attention_supported(int64_t head_size) {
  return head_size >= 2 && head_size <= kMaxHeadSize && head_size % 2 == 0;
}

cudaError_t launch_slot_attention(Dtype dtype, const SlotAttentionArgs& args, void* y, cudaStream_t stream) {
  if (!slot_attention_supported(args.head_size) || args.capacity < 1) return cudaErrorInvalidValue;
  return with_storage_type(dtype, [&](auto t) { return launch_typed<typename decltype(t)::type>(args, y, stream); });
}

}  // namespace gpt2::kernels
