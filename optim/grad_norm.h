#pragma once
// The global gradient norm, computed so that its bits do not depend on how the flat space is cut
// into shards (ZeRO stage, world size) or on the CPU's vector width.
//
// Note [Partition-free arithmetic]
// ZeRO 1/2 and offload give ZeRO 0's parameters bit for bit in fp32 (and 8-bit moments ZeRO 0's
// with 8-bit moments) when every value a step computes is a function of the flat space alone:
//  - Gradients: each element is summed over ranks in rank order (the MPI communicator's sums,
//    Note [Rank-order sums] in parallel/mpi_communicator.cpp), whether all-reduced, reduced to an
//    owner or reduce-scattered.
//  - The norm: the sum of squares of each cell of FlatLayout::kGrid elements (shards are whole
//    cells) is taken in fp64 in one fixed order by block_sum_squares, the cells' sums are
//    all-gathered when sharded, and ordered_sum adds them in flat order. A cell's sum and the sum of
//    the cells are the same operations on every partition, so every rank of every layout gets the
//    same norm, hence the same clip coefficient. (A norm over each shard, then summed across ranks,
//    rounds differently for each cut: measured 1.2e-6 relative on the parameters after 20 steps.)
//  - The update: element by element (cpu_adamw_update, its GPU kernel), or per quantization block,
//    and the blocks never straddle a shard edge. ATen's fused CPU AdamW is not used: it computes a
//    tensor's tail past its last full vector with other instructions, so an element's result
//    depended on where its tensor was cut.
// On the GPU, block_sum_squares and ordered_sum are kernels with a fixed reduction tree (no atomics),
// so the norm is also the same from run to run.
#include <torch/types.h>

#include <cstdint>

#ifdef GPT2_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace gpt2::optim {

// x: contiguous fp32, bf16 or fp16, numel a multiple of `cell`; returns the fp64 sum of squares of
// each of its numel / cell cells, on x's device.
torch::Tensor block_sum_squares(const torch::Tensor& x, int64_t cell);
// The fp64 sum of a 1-D fp64 tensor, taken in one fixed order for a given length, as a 0-dim
// tensor on its device.
torch::Tensor ordered_sum(const torch::Tensor& partials);

#ifdef GPT2_WITH_CUDA
// The kernels behind the two on CUDA (grad_norm.cu): dtype 0 fp32, 1 bf16, 2 fp16.
cudaError_t launch_block_sum_squares(const void* x, int dtype, int64_t num_cells, int64_t cell, double* out,
                                     cudaStream_t stream);
cudaError_t launch_ordered_sum(const double* x, int64_t n, double* out, cudaStream_t stream);
#endif

}  // namespace gpt2::optim
