#include "optim/shard_update.h"

#include <ATen/ATen.h>

#include "src/base/errors.h"

namespace gpt2::optim {

int64_t ShardView::numel() const {
  int64_t n = 0;
  for (const auto& p : pieces) n += p.size();
  return n;
}

PieceAt locate(const std::vector<parallel::FlatRange>& pieces, int64_t begin, int64_t end) {
  int64_t local = 0;
  for (size_t k = 0; k < pieces.size(); ++k) {
    if (pieces[k].begin <= begin && begin <= end && end <= pieces[k].end) return {k, local + begin - pieces[k].begin};
    local += pieces[k].size();
  }
  throw Error("flat range [" + std::to_string(begin) + ", " + std::to_string(end) +
              ") is not inside one piece of this rank's shard");
}

ShardState concat_states(const std::vector<ShardState>& parts) {
  GPT2_ASSERT(!parts.empty(), "concat_states of no state");
  ShardState out;
  out.moments_8bit = parts.front().moments_8bit;
  out.adam_step = parts.front().adam_step;
  for (torch::Tensor ShardState::*field :
       {&ShardState::master, &ShardState::exp_avg, &ShardState::exp_avg_sq, &ShardState::muon_momentum,
        &ShardState::exp_avg_codes, &ShardState::exp_avg_sq_codes, &ShardState::exp_avg_absmax,
        &ShardState::exp_avg_sq_absmax}) {
    if (!(parts.front().*field).defined()) continue;
    std::vector<at::Tensor> all;
    for (const auto& p : parts) all.push_back(p.*field);
    out.*field = at::cat(all);
  }
  return out;
}

}  // namespace gpt2::optim
