#include "parallel/flat_layout.h"

#include "src/base/errors.h"

namespace gpt2::parallel {

FlatLayout::FlatLayout(const std::vector<torch::Tensor>& params, int world)
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
}

}  // namespace gpt2::parallel
