// The decode step in one cooperative kernel (launch.h, decode_step.h). One block of kDecodeWarps
// warps per SM, resident together (a cooperative launch guarantees it), runs every phase of every
// layer; a grid barrier separates a phase from the next one that reads what it wrote. Each phase is
// the device code of the kernel it replaces (decode_linear.cuh, slot_attention.cuh), so a column or
// a (row, head) comes out the same bits as from those kernels. Between phases a warp requests the
// first weights of its first column of the next phase before it waits at the barrier: weights are
// read-only, so their latency overlaps the wait (what programmatic dependent launch did between the
// kernels, without a kernel boundary's drain and launch).
#include <cuda_runtime.h>

#include <cstdint>

#include "src/kernels/convert.cuh"
#include "src/kernels/decode_linear.cuh"
#include "src/kernels/launch.h"
#include "src/kernels/slot_attention.cuh"

namespace gpt2::kernels {
namespace {

// A grid barrier in two halves, so a block can request the next phase's first weights between its
// arrival and its wait. Every block arrives once per barrier; `passed` counts the barriers behind
// this block. The counter only grows (zeroed before the launch), so no reset races the next
// barrier. Thread 0's release (fence, then the add) publishes the block's writes, which the
// __syncthreads before it ordered; its acquire loads, then the fence and __syncthreads, order every
// later read of the block after the other blocks' writes (the pattern of cooperative_groups' grid
// sync).
__device__ __forceinline__ void grid_arrive(unsigned* counter, unsigned& passed) {
  ++passed;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(counter, 1u);
  }
}
__device__ __forceinline__ void grid_wait(const unsigned* counter, unsigned passed) {
  if (threadIdx.x == 0) {
    const unsigned target = passed * gridDim.x;
    unsigned seen = 0;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
    } while (seen < target);
    __threadfence();
  }
  __syncthreads();
}

// With a trace (kernel_bench), thread 0 of every block notes the global timer (ns) at each phase's
// begin (past the barrier), staged (its input rows in shared memory) and done (before arriving):
// trace[(phase * 3 + event) * gridDim.x + block].
enum TraceEvent { kBegin, kStaged, kDone };
__device__ __forceinline__ void note(unsigned long long* trace, int64_t phase, TraceEvent event) {
  if (trace == nullptr || threadIdx.x != 0) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  trace[(phase * 3 + event) * gridDim.x + blockIdx.x] = t;
}

enum class Phase { kQkv, kAttnProj, kFc, kMlpProj, kHead };

// The DecodeLinearArgs of a projection phase of layer l (kHead: ln_f and the head; l unused).
__device__ __forceinline__ DecodeLinearArgs phase_args(const DecodeStepArgs& a, int64_t l, Phase phase) {
  DecodeLinearArgs p{};
  p.rows = a.rows;
  p.eps = a.eps;
  const DecodeStepLayer* layer = phase == Phase::kHead ? nullptr : &a.layer[l];
  const DecodeStepWeight* w = nullptr;
  switch (phase) {
    case Phase::kQkv:
      p.x = a.x, p.k = a.c, p.gamma = layer->ln_1_gamma, p.beta = layer->ln_1_beta, w = &layer->c_attn;
      p.n = 3 * a.c, p.epilogue = DecodeEpilogue::kQueriesKeysValues, p.y = a.q;
      p.keys = layer->keys, p.values = layer->values, p.positions = a.positions;
      p.heads = a.heads, p.capacity = a.capacity;
      break;
    case Phase::kAttnProj:
      p.x = a.y, p.k = a.c, w = &layer->attn_proj, p.n = a.c, p.epilogue = DecodeEpilogue::kAddTo, p.y = a.x;
      break;
    case Phase::kFc:
      p.x = a.x, p.k = a.c, p.gamma = layer->ln_2_gamma, p.beta = layer->ln_2_beta, w = &layer->c_fc;
      p.n = 4 * a.c, p.epilogue = DecodeEpilogue::kGelu, p.y = a.h;
      break;
    case Phase::kMlpProj:
      p.x = a.h, p.k = 4 * a.c, w = &layer->mlp_proj, p.n = a.c, p.epilogue = DecodeEpilogue::kAddTo, p.y = a.x;
      break;
    case Phase::kHead:
      p.x = a.x, p.k = a.c, p.gamma = a.ln_f_gamma, p.beta = a.ln_f_beta, w = &a.head;
      p.n = a.vocab, p.epilogue = DecodeEpilogue::kStore, p.y = a.logits;
      break;
  }
  if (a.int8) {
    p.q = static_cast<const int8_t*>(w->w), p.scale = w->scale, p.groups = w->groups;
  } else {
    p.w = w->w;
  }
  p.bias = w->bias;
  return p;
}

template <typename T, typename W, int ROWS>
__global__ void __launch_bounds__(kDecodeThreads, 1) decode_step_kernel(const __grid_constant__ DecodeStepArgs a) {
  extern __shared__ __align__(16) unsigned char staged_bytes[];
  T* staged = reinterpret_cast<T*>(staged_bytes);  // (rows, k) of the phase
  __shared__ float red[kDecodeWarps][ROWS];
  __shared__ SlotAttentionShared attention;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kDecodeWarps + threadIdx.x / 32,
                step = static_cast<int64_t>(gridDim.x) * kDecodeWarps;
  const int64_t hs = a.c / a.heads, tasks = a.rows * a.heads;
  const SlotAttentionArgs attend_args{a.q,    a.c,     hs,         nullptr, nullptr, a.positions,
                                      a.rows, a.heads, a.capacity, hs,      a.scale};
  unsigned passed = 0;
  int64_t phase = 0;  // for the trace
  int4 next[kDecodeUnroll];

  // A projection phase: stage its input rows, its columns, then arrive at the barrier, request the
  // next phase's first weights, and wait there until every block has written its part.
  const auto project = [&](const DecodeLinearArgs& p, bool norm, const DecodeLinearArgs* then) {
    note(a.trace, phase, kBegin);
    if (norm)
      stage_rows<T, ROWS, true>(p, staged, red);
    else
      stage_rows<T, ROWS, false>(p, staged, red);
    note(a.trace, phase, kStaged);
    project_columns<T, W, ROWS>(p, staged, first, step, next);
    note(a.trace, phase++, kDone);
    if (then != nullptr) {
      grid_arrive(a.barrier, passed);
      prefetch_first_group<W>(*then, first, next);
      grid_wait(a.barrier, passed);
    }
  };

  DecodeLinearArgs p = phase_args(a, 0, a.layers > 0 ? Phase::kQkv : Phase::kHead);
  prefetch_first_group<W>(p, first, next);
  for (int64_t l = 0; l < a.layers; ++l) {
    const DecodeLinearArgs qkv = phase_args(a, l, Phase::kQkv), attn_proj = phase_args(a, l, Phase::kAttnProj);
    project(qkv, true, &attn_proj);
    // The attention: a (row, head) a block; the blocks without one wait at the barrier, holding
    // attn_proj's first weights.
    note(a.trace, phase, kBegin);
    note(a.trace, phase, kStaged);
    SlotAttentionArgs s = attend_args;
    s.keys = a.layer[l].keys, s.values = a.layer[l].values;
    for (int64_t t = blockIdx.x; t < tasks; t += gridDim.x) {
      if (hs <= 64)
        attend_slot<T, 1, true>(s, static_cast<T*>(a.y), t % a.heads, t / a.heads, attention);
      else
        attend_slot<T, 2, true>(s, static_cast<T*>(a.y), t % a.heads, t / a.heads, attention);
    }
    note(a.trace, phase++, kDone);
    grid_arrive(a.barrier, passed);
    grid_wait(a.barrier, passed);
    const DecodeLinearArgs fc = phase_args(a, l, Phase::kFc), mlp_proj = phase_args(a, l, Phase::kMlpProj);
    project(attn_proj, false, &fc);
    project(fc, true, &mlp_proj);
    const DecodeLinearArgs after = phase_args(a, l + 1, l + 1 < a.layers ? Phase::kQkv : Phase::kHead);
    project(mlp_proj, false, &after);
  }
  project(phase_args(a, 0, Phase::kHead), true, nullptr);
}

template <typename T>
int64_t staged_bytes(int64_t rows, int64_t c) {
  return rows * 4 * c * static_cast<int64_t>(sizeof(T));  // mlp proj's input, the largest
}

template <typename T, typename W, int ROWS>
cudaError_t launch_shape(const DecodeStepArgs& a, cudaStream_t stream) {
  const auto kernel = decode_step_kernel<T, W, ROWS>;
  const int smem = static_cast<int>(staged_bytes<T>(a.rows, a.c));
  cudaError_t e = allow_dynamic_shared_memory(kernel, smem);
  if (e != cudaSuccess) return e;
  int per_sm = 0;
  e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kDecodeThreads, smem);
  if (e != cudaSuccess) return e;
  if (per_sm < 1) return cudaErrorCooperativeLaunchTooLarge;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(decode_step_grid()));
  config.blockDim = dim3(kDecodeThreads);
  config.dynamicSmemBytes = static_cast<size_t>(smem);
  config.stream = stream;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeCooperative;
  attribute.val.cooperative = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, a);
}

template <typename T, typename W>
cudaError_t launch_rows(const DecodeStepArgs& a, cudaStream_t stream) {
  if (a.rows <= 1) return launch_shape<T, W, 1>(a, stream);
  if (a.rows <= 2) return launch_shape<T, W, 2>(a, stream);
  if (a.rows <= 4) return launch_shape<T, W, 4>(a, stream);
  return launch_shape<T, W, 8>(a, stream);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool weight_ok(const DecodeStepWeight& w, bool int8, int64_t k) {
  if (w.w == nullptr || !aligned16(w.w)) return false;
  return !int8 || (w.scale != nullptr && w.groups >= 1 && k % w.groups == 0 && (k / w.groups) % 16 == 0);
}

}  // namespace

int decode_step_grid() {
  static const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
  return sms;  // one block an SM: more would add barrier arrivals
}

bool decode_step_supported(Dtype dtype, int64_t rows, int64_t c, int64_t heads, int64_t layers) {
  static const bool cooperative = device_attribute(cudaDevAttrCooperativeLaunch) != 0;
  static const int64_t most = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin) -
                              static_cast<int64_t>(sizeof(SlotAttentionShared)) - 1024;  // red[] and slack
  const int64_t size = dtype == Dtype::kF32 ? 4 : 2;
  if (!cooperative || rows < 1 || rows > 8 || layers < 0 || layers > kDecodeStepMaxLayers || heads < 1 ||
      c % heads != 0 || c % 16 != 0)
    return false;
  const int64_t hs = c / heads;
  return hs <= kSlotMaxHeadSize && hs % (16 / size) == 0 && rows * 4 * c * size <= most;
}

cudaError_t launch_decode_step(Dtype dtype, const DecodeStepArgs& a, cudaStream_t stream) {
  if (!decode_step_supported(dtype, a.rows, a.c, a.heads, a.layers) || a.vocab < 1 || a.capacity < 1 ||
      a.barrier == nullptr || a.positions == nullptr || !aligned16(a.x) || !aligned16(a.q) || !aligned16(a.y) ||
      !aligned16(a.h) || !weight_ok(a.head, a.int8, a.c))
    return cudaErrorInvalidValue;
  for (int64_t l = 0; l < a.layers; ++l) {
    const DecodeStepLayer& layer = a.layer[l];
    if (!weight_ok(layer.c_attn, a.int8, a.c) || !weight_ok(layer.attn_proj, a.int8, a.c) ||
        !weight_ok(layer.c_fc, a.int8, a.c) || !weight_ok(layer.mlp_proj, a.int8, 4 * a.c) || !aligned16(layer.keys) ||
        !aligned16(layer.values))
      return cudaErrorInvalidValue;
  }
  return with_storage_type(dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    return a.int8 ? launch_rows<T, int8_t>(a, stream) : launch_rows<T, T>(a, stream);
  });
}

}  // namespace gpt2::kernels
