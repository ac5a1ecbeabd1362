// Slot decoding's attention (launch.h, slot_attention.h): one block of kSlotWarps (16) warps per
// (row, head), each running attend_slot (slot_attention.cuh, where the algorithm is described).
#include <cuda_runtime.h>

#include <cstdint>

#include "src/kernels/convert.cuh"
#include "src/kernels/launch.h"
#include "src/kernels/slot_attention.cuh"

namespace gpt2::kernels {
namespace {

template <typename T, int PPL, bool PACKED, bool EARLY, int HS = 0>
__global__ void __launch_bounds__(kSlotWarps * 32) slot_attention_kernel(SlotAttentionArgs a, T* __restrict__ y) {
  __shared__ SlotAttentionShared sh;
  // Launched as a programmatic dependent (launch_dependent): q and this step's key and value come
  // from the kernel before, the older positions from earlier steps (L2 fetches them meanwhile); the
  // projection after may start taking free SM slots now.
  if (threadIdx.x == 0) prefetch_slot_cache<T>(a, blockIdx.x, blockIdx.y);
  wait_for_previous_kernel();
  allow_next_kernel();
  attend_slot<T, PPL, PACKED, EARLY, HS>(a, y, blockIdx.x, blockIdx.y, sh);
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
  const bool packed = slot_keys_packed<T>(a);
  T* yt = static_cast<T*>(y);
  // Values read with the keys (attend_slot's EARLY) where every (row, head) has an SM of its own (batch-1
  // decoding): the registers it takes would otherwise halve the blocks an SM holds.
  static const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
  const bool early = a.heads * a.batch <= sms;
  const auto kernel = [&] {
    if (a.head_size > 64)
      return packed ? slot_attention_kernel<T, 2, true, false> : slot_attention_kernel<T, 2, false, false>;
    if (!packed) return slot_attention_kernel<T, 1, false, false>;
    if (!early) return slot_attention_kernel<T, 1, true, false>;
    // GPT-2's head size (64 at every size) at batch 1 gets its key loads unrolled and q held in
    // registers (attend_slot's HS), where q's rows are 16-byte aligned.
    const int64_t vec = 16 / sizeof(T);
    if (a.head_size == 64 && reinterpret_cast<uintptr_t>(a.q) % 16 == 0 && a.q_stride_b % vec == 0 &&
        a.q_stride_h % vec == 0)
      return slot_attention_kernel<T, 1, true, true, 64>;
    return slot_attention_kernel<T, 1, true, true>;
  }();
  return launch_dependent(kernel, grid, dim3(kSlotWarps * 32), 0, stream, a, yt);
}

}  // namespace

bool slot_attention_supported(int64_t head_size) {
  return head_size >= 2 && head_size <= kSlotMaxHeadSize && head_size % 2 == 0;
}

cudaError_t launch_slot_attention(Dtype dtype, const SlotAttentionArgs& args, void* y, cudaStream_t stream) {
  if (!slot_attention_supported(args.head_size) || args.capacity < 1) return cudaErrorInvalidValue;
  return with_storage_type(dtype, [&](auto t) { return launch_typed<typename decltype(t)::type>(args, y, stream); });
}

}  // namespace gpt2::kernels
