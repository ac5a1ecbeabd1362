#include "parallel/flat_layout.h"

#include "src/base/errors.h"

namespace gpt2::parallel {

FlatLayout::FlatLayout(const std::vector<torch::Tensor>& params, int world, int64_t shard_multiple)
    : offset(params.size()), numel(params.size()), world_size(world) {
  GPT2_ASSERT(world >= 1 && shard_multiple >= 1, "world size and shard multiple must be positive");
  for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
    order.push_back(i);
    offset[i] = total;
    numel[i] = params[i].numel();
    total += numel[i];
  }
  const int64_t unit = world * shard_multiple;
  padded = (total + unit - 1) / unit * unit;
}

}  // namespace gpt2::parallel
