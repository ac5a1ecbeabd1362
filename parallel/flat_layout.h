#pragma once
// The flat parameter space that gradient buckets and the sharded optimizer share.
// Contract: parameters are laid end to end in reverse registration order (roughly the order
// backward produces their gradients), and the total is padded to a multiple of world_size * kGrid
// so rank r owns the contiguous shard [r * S, (r + 1) * S), S = padded / world (ZeRO's partition),
// S a multiple of kGrid. Every shard is whole cells of one grid that does not depend on the world
// size or the ZeRO stage: the gradient norm sums per cell and 8-bit moments quantize per cell
// (Note [Partition-free arithmetic] in optim/grad_norm.h). The padding belongs to no parameter and
// stays zero.
#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace gpt2::parallel {

struct FlatLayout {
  static constexpr int64_t kGrid = 2048;  // elements per cell of the grid shards are cut on

  FlatLayout(const std::vector<torch::Tensor>& params, int world_size);

  std::vector<int> order;       // parameter indices in flat order
  std::vector<int64_t> offset;  // flat offset of parameter i (indexed by parameter index)
  std::vector<int64_t> numel;   // elements of parameter i
  int64_t total = 0;            // sum of numel
  int64_t padded = 0;           // total rounded up to a multiple of world_size * kGrid
  int world_size = 1;

  int64_t shard_size() const { return padded / world_size; }
  int64_t shard_begin(int rank) const { return rank * shard_size(); }
  int64_t shard_end(int rank) const { return (rank + 1) * shard_size(); }
};

}  // namespace gpt2::parallel
