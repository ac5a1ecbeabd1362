// Batch-few decoding's projections (decode_linear.h, launch.h): one kernel a projection, a block of
// kDecodeWarps warps staging its input rows and then taking columns (decode_linear.cuh).
#include <cuda_runtime.h>

#include <cstdint>

#include "src/kernels/convert.cuh"
#include "src/kernels/decode_linear.cuh"
#include "src/kernels/launch.h"

namespace gpt2::kernels {
namespace {

// Chunks a lane holds in flight. A projection without a LayerNorm at one or two rows holds 8, not 4:
// its launch has fewer blocks than SMs at GPT-2's shapes (n = C, 16 columns a block), so the
// registers cost no occupancy, and a warp's row of K = 4C takes half the round trips.
template <typename W, int ROWS, bool NORM>
__host__ __device__ constexpr int unroll_of() {
  return !NORM && ROWS <= 2 && sizeof(W) == 2 ? 8 : kDecodeUnroll;
}
// Blocks an SM must hold at once. At one row with 4 chunks a lane the kernel fits 64 registers a
// thread, so two blocks of 16 warps share an SM: at batch 1 a warp's row is one or two round trips
// of loads, and the loads in flight (so the bandwidth) grow with the warps an SM holds (int8 took
// 81 registers, one block an SM). More rows or chunks would spill at 64.
template <typename W, int ROWS, bool NORM>
__host__ __device__ constexpr int min_blocks_of() {
  return ROWS == 1 && unroll_of<W, ROWS, NORM>() == kDecodeUnroll ? 2 : 1;
}

template <typename T, typename W, int ROWS, bool NORM>
__device__ __forceinline__ void decode_linear_body(const DecodeLinearArgs& a) {
  extern __shared__ __align__(16) unsigned char staged_bytes[];
  T* staged = reinterpret_cast<T*>(staged_bytes);  // (rows, k)
  __shared__ float red[kDecodeWarps][ROWS];
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kDecodeWarps + threadIdx.x / 32,
                step = static_cast<int64_t>(gridDim.x) * kDecodeWarps;
  // The warp's first weights are requested before the wait: they do not depend on the kernel before,
  // so under programmatic dependent launch their latency overlaps that kernel's tail.
  int4 next[unroll_of<W, ROWS, NORM>()];
  prefetch_first_group<W>(a, first, next);
  prefetch_first_column<W>(a, first);
  wait_for_previous_kernel();
  allow_next_kernel();
  stage_rows<T, ROWS, NORM>(a, staged, red);
  project_columns<T, W, ROWS>(a, staged, first, step, next);
}

template <typename T, typename W, int ROWS, bool NORM>
__global__ void __launch_bounds__(kDecodeThreads) decode_linear_kernel(const DecodeLinearArgs a) {
  decode_linear_body<T, W, ROWS, NORM>(a);
}
// The same at two blocks an SM (min_blocks_of), so 64 registers a thread.
template <typename T, typename W, int ROWS, bool NORM>
__global__ void __launch_bounds__(kDecodeThreads, 2) decode_linear_kernel_two(const DecodeLinearArgs a) {
  decode_linear_body<T, W, ROWS, NORM>(a);
}

int64_t staged_size(Dtype dtype, int64_t rows, int64_t k) { return rows * k * (dtype == Dtype::kF32 ? 4 : 2); }

template <typename T, typename W, int ROWS, bool NORM>
cudaError_t launch_shape(const DecodeLinearArgs& a, cudaStream_t stream) {
  const auto kernel = [] {
    if constexpr (min_blocks_of<W, ROWS, NORM>() == 2)
      return decode_linear_kernel_two<T, W, ROWS, NORM>;
    else
      return decode_linear_kernel<T, W, ROWS, NORM>;
  }();
  const int smem = static_cast<int>(a.rows * a.k * static_cast<int64_t>(sizeof(T)));
  const cudaError_t e = allow_dynamic_shared_memory(kernel, smem);
  if (e != cudaSuccess) return e;
  static const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
  // A column a warp, but no more blocks than the SMs hold at once: past that, the warps loop over
  // columns with the next one's loads in flight, where another wave of blocks would pay the launch,
  // the staging (a LayerNorm) and the first round trip again.
  const int64_t wanted = (a.n + kDecodeWarps - 1) / kDecodeWarps,
                cap = resident_blocks(kernel, kDecodeThreads, smem) * static_cast<int64_t>(sms > 0 ? sms : 132);
  // A programmatic dependent (convert.cuh): it may start while the kernel before it drains, request
  // its first weights, and wait for that kernel's results only then.
  return launch_dependent(kernel, dim3(static_cast<unsigned>(wanted < cap ? wanted : cap)), dim3(kDecodeThreads),
                          static_cast<size_t>(smem), stream, a);
}

template <typename T, typename W, bool NORM>
cudaError_t launch_rows(const DecodeLinearArgs& a, cudaStream_t stream) {
  if (a.rows <= 1) return launch_shape<T, W, 1, NORM>(a, stream);
  if (a.rows <= 2) return launch_shape<T, W, 2, NORM>(a, stream);
  if (a.rows <= 4) return launch_shape<T, W, 4, NORM>(a, stream);
  return launch_shape<T, W, 8, NORM>(a, stream);
}

template <typename T>
cudaError_t launch_typed(const DecodeLinearArgs& a, cudaStream_t stream) {
  const bool norm = a.gamma != nullptr;
  if (a.q != nullptr) return norm ? launch_rows<T, int8_t, true>(a, stream) : launch_rows<T, int8_t, false>(a, stream);
  return norm ? launch_rows<T, T, true>(a, stream) : launch_rows<T, T, false>(a, stream);
}

// A block a row. The product and the sum round as the unfused ops store (no contraction into an FMA).
template <typename T>
__global__ void __launch_bounds__(256) decode_embedding_kernel(const DecodeEmbeddingArgs a) {
  wait_for_previous_kernel();  // the ids and positions come from the work before
  allow_next_kernel();         // the first projection may request its weights meanwhile
  const int64_t r = blockIdx.x, id = a.ids[r], pos = a.positions[r];
  const bool bad = id < 0 || id >= a.vocab || pos < 0 || pos >= a.max_positions;
  const int64_t row = bad ? 0 : id, group = a.q != nullptr ? a.c / a.groups : 1;
  const T* wpe = static_cast<const T*>(a.wpe) + (bad ? 0 : pos) * a.c;
  T* x = static_cast<T*>(a.x) + r * a.c;
  for (int64_t i = threadIdx.x; i < a.c; i += blockDim.x) {
    const float e = a.q != nullptr ? to_float(from_float<T>(__fmul_rn(static_cast<float>(a.q[row * a.c + i]),
                                                                      a.scale[row * a.groups + i / group])))
                                   : to_float(static_cast<const T*>(a.w)[row * a.c + i]);
    x[i] = from_float<T>(bad ? NAN : __fadd_rn(e, to_float(wpe[i])));
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool decode_linear_supported(Dtype dtype, int64_t rows, int64_t k) {
  static const int64_t most = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin) - 1024;  // red[] beside it
  return rows >= 1 && rows <= 8 && k >= 16 && k % 16 == 0 && staged_size(dtype, rows, k) <= most;
}

cudaError_t launch_decode_embedding(Dtype dtype, const DecodeEmbeddingArgs& a, cudaStream_t stream) {
  if (a.rows < 1 || a.rows > 65535 || a.c < 1 || a.vocab < 1 || a.max_positions < 1 || a.x == nullptr ||
      (a.q != nullptr ? a.scale == nullptr || a.groups < 1 || a.c % a.groups != 0 : a.w == nullptr))
    return cudaErrorInvalidValue;
  return with_storage_type(dtype, [&](auto t) {
    return launch_dependent(decode_embedding_kernel<typename decltype(t)::type>, dim3(static_cast<unsigned>(a.rows)),
                            dim3(256), 0, stream, a);
  });
}

cudaError_t launch_decode_linear(Dtype dtype, const DecodeLinearArgs& a, cudaStream_t stream) {
  const bool int8 = a.q != nullptr;
  const bool weights = int8 ? (a.scale != nullptr && a.groups >= 1 && a.k % a.groups == 0 && (a.k / a.groups) % 16 == 0)
                            : a.w != nullptr;
  const bool norm = a.gamma == nullptr || a.beta != nullptr;
  const bool qkv = a.epilogue != DecodeEpilogue::kQueriesKeysValues ||
                   (a.n % 3 == 0 && a.heads >= 1 && (a.n / 3) % a.heads == 0 && a.keys != nullptr &&
                    a.values != nullptr && a.positions != nullptr && a.capacity >= 1);
  if (!decode_linear_supported(dtype, a.rows, a.k) || a.n < 1 || !weights || !norm || !qkv || a.y == nullptr ||
      !aligned16(a.x) || !aligned16(int8 ? static_cast<const void*>(a.q) : a.w))
    return cudaErrorInvalidValue;
  return with_storage_type(dtype, [&](auto t) { return launch_typed<typename decltype(t)::type>(a, stream); });
}

}  // namespace gpt2::kernels
