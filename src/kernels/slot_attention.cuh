#pragma once
// The slot attention of one (row, head) as a device function (slot_attention.h): a block of
// kSlotWarps warps calls attend_slot with the same arguments in every thread. slot_attention.cu's
// kernel runs one (row, head) a block; decode_step.cu's one-kernel decode step runs them as one of
// its phases, so both give the same bits. Warp w takes the tiles w, w + kSlotWarps, ... of
// kSlotTile positions of the row, in increasing order: each lane computes the whole dot product of
// q with its position's key (q sits in shared memory as fp32), the warp keeps an online softmax
// (running max, running sum, and the accumulator rescaled when the max grows), and the value rows
// are read a pair of dims per lane, coalesced, the tile's 32 rows without a branch so their loads
// overlap. At the end the warps' states merge in warp order. Which positions a warp takes, and the
// order of every sum, depend on positions[b] alone: row b's bits do not depend on the other rows,
// on the batch, or on the cache's capacity.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "src/kernels/convert.cuh"
#include "src/kernels/launch.h"

namespace gpt2::kernels {

// Warps per (row, head). At batch 1 the grid is one block a head (12 at gpt2-124m), so the
// positions must spread over many warps: with 16, a 384-position context is one tile a warp.
constexpr int kSlotWarps = 16;
constexpr int kSlotTile = 32;          // positions per warp step: one per lane
constexpr int kSlotMaxHeadSize = 128;  // 2 pairs of dims per lane in the accumulator

// What a block's attend_slot keeps in shared memory (the caller declares it).
struct SlotAttentionShared {
  float2 q[kSlotMaxHeadSize / 2];
  float m[kSlotWarps], l[kSlotWarps];
  float acc[kSlotWarps][kSlotMaxHeadSize];
};

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
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// y[(b, head)] (head_size elements) of the contract; every thread of a kSlotWarps-warp block calls it.
// PPL: accumulator pairs per lane (hs <= 64 * PPL). PACKED: keys read 16 bytes a load (hs a
// multiple of 16 / sizeof(T), the cache 16-byte aligned), else a pair at a time; the dot product
// sums the dims in the same order either way. EARLY (below) changes when values are read, not the sums.
// HS: the head size when the caller knows it at compile time (0: a.head_size), so a lane's key loads
// unroll fully and are in flight together. With PACKED, every lane then also holds q itself (16-byte
// loads, the same addresses in every lane) requested with its keys, not staged in shared memory, so q
// takes no round trip and no barrier of its own: the caller passes q 16-byte aligned and calls it
// once a block (no barrier then keeps sh from a previous call's merge). A T widens to
// fp32 exactly, so the products and sums are the same either way.
template <typename T, int PPL, bool PACKED, bool EARLY = false, int HS = 0>
__device__ __forceinline__ void attend_slot(const SlotAttentionArgs& a, T* __restrict__ y, int64_t head, int64_t b,
                                            SlotAttentionShared& sh) {
  using T2 = typename PairOf<T>::type;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int hs = HS > 0 ? HS : static_cast<int>(a.head_size), pairs = hs / 2;
  // Requested before the barrier and q's staging, so its round trip overlaps theirs: every load
  // below depends on it.
  const int64_t pos = a.positions[b];
  const T* q = static_cast<const T*>(a.q) + b * a.q_stride_b + head * a.q_stride_h;
  constexpr bool kQHeld = HS > 0 && PACKED;
  constexpr int kQVec = 16 / sizeof(T);
  Pack<T, kQVec> q_held[kQHeld ? HS / kQVec : 1];
  if constexpr (kQHeld) {
#pragma unroll
    for (int i = 0; i < HS / kQVec; ++i) q_held[i] = reinterpret_cast<const Pack<T, kQVec>*>(q)[i];
  } else {
    __syncthreads();  // sh may still be read by the block's previous call
    for (int i = static_cast<int>(threadIdx.x); i < pairs; i += kSlotWarps * 32) {
      sh.q[i] = make_float2(to_float(q[2 * i]), to_float(q[2 * i + 1]));
    }
    __syncthreads();
  }

  const int64_t row = b * a.heads + head;  // (row, head) of the cache and of y
  const T2* k2 = reinterpret_cast<const T2*>(static_cast<const T*>(a.keys) + row * a.capacity * hs);
  const T2* v2 = reinterpret_cast<const T2*>(static_cast<const T*>(a.values) + row * a.capacity * hs);
  const bool bad = pos < 0 || pos >= a.capacity;
  const int64_t n = bad ? 0 : pos + 1;  // positions attended

  float m = -INFINITY, l = 0.0f;  // running max and sum of exp(s - m)
  float2 acc[PPL];                // sum of exp(s - m) v, dims 2 (lane + 32 k) and the next
#pragma unroll
  for (int k = 0; k < PPL; ++k) acc[k] = make_float2(0.0f, 0.0f);
  // EARLY, with 2-byte storage and one pair a lane: the tile's value pairs (a register each) are
  // requested with its keys, as their addresses do not depend on the scores, so the two round trips
  // overlap. It costs 32 registers a thread (slot_attention.cu takes it where the grid is one wave;
  // the one-kernel step, short of registers, does not).
  constexpr bool kEarlyValues = EARLY && sizeof(T2) == 4 && PPL == 1;
  for (int64_t t0 = static_cast<int64_t>(warp) * kSlotTile; t0 < n; t0 += kSlotWarps * kSlotTile) {
    const int64_t j = t0 + lane;
    const int count = static_cast<int>(n - t0 < kSlotTile ? n - t0 : kSlotTile);  // the same in every lane
    // Position jj of the tile's value pairs, dims 2 (lane + 32 k) and the next. A step past `count`
    // reads the tile's last written position (finite), and a lane past the head's dims (hs < 64 PPL)
    // a real dim, that is never written out: no branch around the loads.
    const auto value_pair = [&](int jj, int k) {
      const int d = lane + 32 * k;
      return v2[(t0 + (jj < count ? jj : count - 1)) * pairs + (d < pairs ? d : pairs - 1)];
    };
    T2 early[kEarlyValues ? kSlotTile : 1];
    if constexpr (kEarlyValues) {
#pragma unroll
      for (int jj = 0; jj < kSlotTile; ++jj) early[jj] = value_pair(jj, 0);
    }
    float s = -INFINITY;
    if (j < n) {
      float dot = 0.0f;
      if constexpr (PACKED) {
        constexpr int kVec = 16 / sizeof(T);
        const Pack<T, kVec>* kj = reinterpret_cast<const Pack<T, kVec>*>(k2 + j * pairs);
        const float* qf = reinterpret_cast<const float*>(sh.q);
        const auto add_chunk = [&](int i) {
          const Pack<T, kVec> kv = kj[i];
#pragma unroll
          for (int e = 0; e < kVec; ++e) {
            const float qe = kQHeld ? to_float(q_held[kQHeld ? i : 0].v[e]) : qf[i * kVec + e];
            dot = fmaf(qe, to_float(kv.v[e]), dot);
          }
        };
        if constexpr (HS > 0) {
#pragma unroll
          for (int i = 0; i < HS / kVec; ++i) add_chunk(i);
        } else {
          for (int i = 0; i < hs / kVec; ++i) add_chunk(i);
        }
      } else {
        const T2* kj = k2 + j * pairs;
        for (int i = 0; i < pairs; ++i) {
          const float2 kv = to_float2(kj[i]), qv = sh.q[i];
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
    // All kSlotTile steps, unrolled, with no branch around the loads, so they are in flight together
    // (a step per position with a guarded load waited out each load's latency in turn: at batch 1
    // that was the decode step's cost). A step past `count` has pj = 0, so it adds exactly 0 (the
    // sum is that of count steps, up to the sign of a zero).
#pragma unroll
    for (int jj = 0; jj < kSlotTile; ++jj) {
      const float pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
      for (int k = 0; k < PPL; ++k) {
        float2 vv;
        if constexpr (kEarlyValues)
          vv = to_float2(early[jj]);
        else
          vv = to_float2(value_pair(jj, k));
        acc[k].x = fmaf(pj, vv.x, acc[k].x);
        acc[k].y = fmaf(pj, vv.y, acc[k].y);
      }
    }
    m = m_new;
  }

  // The warps' states, merged in warp order (a warp without a tile has m = -inf and counts for nothing).
  if (lane == 0) {
    sh.m[warp] = m;
    sh.l[warp] = l;
  }
#pragma unroll
  for (int k = 0; k < PPL; ++k) {
    const int d = lane + 32 * k;
    if (d < pairs) {
      sh.acc[warp][2 * d] = acc[k].x;
      sh.acc[warp][2 * d + 1] = acc[k].y;
    }
  }
  __syncthreads();
  for (int d = static_cast<int>(threadIdx.x); d < hs; d += kSlotWarps * 32) {
    float top = -INFINITY;
#pragma unroll
    for (int w = 0; w < kSlotWarps; ++w) top = fmaxf(top, sh.m[w]);
    float num = 0.0f, den = 0.0f;
#pragma unroll
    for (int w = 0; w < kSlotWarps; ++w) {
      if (sh.m[w] != -INFINITY) {
        const float c = expf(sh.m[w] - top);
        num = fmaf(sh.acc[w][d], c, num);
        den = fmaf(sh.l[w], c, den);
      }
    }
    y[row * hs + d] = from_float<T>(bad ? NAN : num / den);
  }
}

// Row b's keys and values of head `head` at positions [0, positions[b]) into L2 (prefetch_to_l2),
// before the wait for the kernel before, which writes position positions[b] (earlier steps wrote the
// rest). positions is read before that wait too: a kernel that lets its dependents start early
// (ours, by allow_next_kernel) never writes it, and does so only after its own wait, so every kernel
// before it has finished; any other kernel before this one has finished when this one starts
// (launch_dependent's rules). Skipped unless the cache is 16-byte aligned and a position's
// bytes a multiple of 16.
template <typename T>
__device__ __forceinline__ void prefetch_slot_cache(const SlotAttentionArgs& a, int64_t head, int64_t b) {
  const int64_t pos = a.positions[b], bytes = a.head_size * static_cast<int64_t>(sizeof(T));
  if (pos <= 0 || pos >= a.capacity || bytes % 16 != 0 || reinterpret_cast<uintptr_t>(a.keys) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.values) % 16 != 0)
    return;
  const int64_t offset = (b * a.heads + head) * a.capacity * a.head_size;
  const uint32_t n = static_cast<uint32_t>(pos * bytes);
  prefetch_to_l2(static_cast<const T*>(a.keys) + offset, n);
  prefetch_to_l2(static_cast<const T*>(a.values) + offset, n);
}

// Whether keys are read 16 bytes a load (attend_slot's PACKED) for this cache.
template <typename T>
__host__ __device__ inline bool slot_keys_packed(const SlotAttentionArgs& a) {
  return a.head_size % (16 / sizeof(T)) == 0 && reinterpret_cast<uintptr_t>(a.keys) % 16 == 0;
}

}  // namespace gpt2::kernels
