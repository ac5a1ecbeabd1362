#include "parallel/flat_layout.h"

#include <algorithm>

#include "src/base/errors.h"

namespace gpt2::parallel {

// Note [Interleaved shards]
// ZeRO 2 reduce-scatters each gradient bucket as it fills, so that a rank receives only what it
// owns. A reduce-scatter gives rank r chunk r of its input, so a bucket must be the same length on
// every rank and rank r must own chunk r of it. With contiguous shards a bucket lies in one or two
// ranks' shards; so ZeRO 2 cuts the flat space into blocks (the buckets), each a multiple of
// world_size * kGrid, and rank r owns chunk r of every block. Its shard is then a list of pieces
// that the optimizer keeps end to end; each piece is whole grid cells, so the norm, the 8-bit
// blocks and the checkpoints' coordinates are those of the contiguous layout.
FlatLayout::FlatLayout(const std::vector<torch::Tensor>& params, int world, int64_t interleave_elements)
    : offset(params.size()), numel(params.size()), world_size(world) {
  GPT2_ASSERT(world >= 1, "world size must be positive");
  for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
    order.push_back(i);
    offset[i] = total;
    numel[i] = params[i].numel();
    total += numel[i];
  }
  const int64_t unit = world * kGrid;
  padded = (total + unit - 1) / unit * unit;
  if (interleave_elements <= 0 || world == 1) return;
  const int64_t block = interleave_block(world, interleave_elements);
  for (int64_t b = 0; b < padded; b += block) blocks.push_back({b, std::min(b + block, padded)});
}

int64_t FlatLayout::interleave_block(int world, int64_t interleave_elements) {
  const int64_t unit = world * kGrid;
  return std::max<int64_t>((interleave_elements + unit - 1) / unit * unit, unit);
}

std::vector<FlatRange> FlatLayout::pieces(int rank) const {
  GPT2_ASSERT(0 <= rank && rank < world_size, "rank outside the layout's world");
  if (!interleaved()) return {contiguous_shard(rank)};
  std::vector<FlatRange> out;
  for (const FlatRange& b : blocks) {
    const int64_t n = b.size() / world_size;
    out.push_back({b.begin + rank * n, b.begin + (rank + 1) * n});
  }
  return out;
}

}  // namespace gpt2::parallel
