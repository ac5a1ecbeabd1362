#pragma once
// The flat parameter space that gradient buckets and the sharded optimizer share.
// Contract: parameters are laid end to end in reverse registration order (roughly the order
// backward produces their gradients), and the total is padded to a multiple of world_size * kGrid.
// Every rank owns padded / world_size elements, as whole cells of one grid that does not depend
// on the world size or the ZeRO stage: the gradient norm sums per cell and 8-bit moments quantize
// per cell (Note [Partition-free arithmetic] in optim/grad_norm.h). The padding belongs to no
// parameter and stays zero. Who owns what:
//  - contiguous (ZeRO 1, and ZeRO 0's checkpoint partition): rank r owns [r * S, (r + 1) * S),
//    S = padded / world_size;
//  - interleaved (ZeRO 2, Note [Interleaved shards]): the space is cut into blocks, and rank r owns
//    chunk r of every block, so each block is one reduce-scatter.
#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace gpt2::parallel {

// A range [begin, end) of the flat space.
struct FlatRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
  // The part of this range inside `other` (empty() when they do not overlap).
  FlatRange intersect(const FlatRange& other) const {
    return {begin > other.begin ? begin : other.begin, end < other.end ? end : other.end};
  }
};

struct FlatLayout {
  static constexpr int64_t kGrid = 2048;  // elements per cell of the grid shards are cut on

  // interleave_elements > 0 with world_size > 1: interleaved ownership over blocks of about that
  // many elements (rounded up to a multiple of world_size * kGrid; the last block may be shorter).
  FlatLayout(const std::vector<torch::Tensor>& params, int world_size, int64_t interleave_elements = 0);

  std::vector<int> order;       // parameter indices in flat order
  std::vector<int64_t> offset;  // flat offset of parameter i (indexed by parameter index)
  std::vector<int64_t> numel;   // elements of parameter i
  int64_t total = 0;            // sum of numel
  int64_t padded = 0;           // total rounded up to a multiple of world_size * kGrid
  int world_size = 1;
  std::vector<FlatRange> blocks;  // interleaved: the blocks, in flat order, tiling [0, padded); else empty

  // The interleaved layout's block length for these settings (the last block may be shorter).
  static int64_t interleave_block(int world_size, int64_t interleave_elements);

  bool interleaved() const { return !blocks.empty(); }
  // Where parameter i lies in the flat space.
  FlatRange range_of(int i) const { return {offset[i], offset[i] + numel[i]}; }
  int64_t shard_size() const { return padded / world_size; }
  // The contiguous partition's range of `rank`.
  FlatRange contiguous_shard(int rank) const { return {rank * shard_size(), (rank + 1) * shard_size()}; }
  // What `rank` owns, in flat order: its contiguous range, or chunk `rank` of every block. Every
  // piece begins and ends on the grid; together they are shard_size() elements.
  std::vector<FlatRange> pieces(int rank) const;
};

}  // namespace gpt2::parallel
