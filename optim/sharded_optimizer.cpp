#include "optim/sharded_optimizer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

#include "optim/grad_norm.h"
#include "src/base/errors.h"

namespace gpt2::optim {
namespace {

std::vector<MomentLayout::Param> moment_params(const std::vector<torch::Tensor>& params,
                                               const parallel::FlatLayout& layout) {
  std::vector<MomentLayout::Param> out;
  for (size_t i = 0; i < params.size(); ++i) out.push_back({layout.offset[i], layout.numel[i], params[i].dim() >= 2});
  return out;
}

// Shards are whole cells of the layout's grid, so whole quantization blocks.
static_assert(parallel::FlatLayout::kGrid % kQuantBlock == 0, "the flat grid must hold whole quantization blocks");

}  // namespace

ShardedOptimizer::ShardedOptimizer(const std::vector<torch::Tensor>& params, const parallel::FlatLayout& layout,
                                   const torch::Tensor& grad_flat, parallel::Communicator& comm, Options options)
    : comm_(comm),
      options_(options),
      sharded_(options.sharded && comm.world_size() > 1),
      moment_layout_(moment_params(params, layout)) {
  GPT2_ASSERT(grad_flat.numel() == layout.padded, "gradient buffer does not match the layout");
  begin_ = sharded_ ? layout.shard_begin(comm.rank()) : 0;
  end_ = sharded_ ? layout.shard_end(comm.rank()) : layout.padded;
  // Parameters move into one flat buffer so the shards can be all-gathered in place.
  param_flat_ = at::zeros({layout.padded}, params.front().options().requires_grad(false));
  {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      auto view = param_flat_.narrow(0, layout.offset[i], layout.numel[i]).view(params[i].sizes());
      view.copy_(params[i]);
      auto p = params[i];
      p.set_data(view);
    }
  }
  shard_.params = param_flat_.narrow(0, begin_, end_ - begin_);
  shard_.grads = grad_flat.narrow(0, begin_, end_ - begin_);
  shard_.begin = begin_;
  shard_.end = end_;
  shard_.moment_layout = &moment_layout_;
  for (int i : layout.order) {
    const int64_t lo = std::max(begin_, layout.offset[i]);
    const int64_t hi = std::min(end_, layout.offset[i] + layout.numel[i]);
    // GPT-2: decay matmuls and embeddings only.
    if (lo < hi) shard_.spans.push_back({lo - begin_, hi - begin_, params[i].dim() >= 2});
  }
  update_ = make_adamw_update(shard_, options.adamw, options.offload);
}

ShardedOptimizer::~ShardedOptimizer() = default;

torch::Tensor ShardedOptimizer::clip_grad_norm(double max_norm) {
  at::NoGradGuard no_grad;
  // Note [Partition-free arithmetic]: each cell's sum of squares, then all cells' in flat order.
  auto cells = block_sum_squares(shard_.grads, parallel::FlatLayout::kGrid);
  if (sharded_) {
    auto all = at::empty({cells.numel() * comm_.world_size()}, cells.options());
    comm_.all_gather(all, cells)->wait();
    cells = all;
  }
  auto norm = ordered_sum(cells).sqrt();
  clip_coef_ = torch::Tensor();
  if (max_norm <= 0) return norm;
  auto coef = (max_norm / (norm + 1e-6)).clamp_max(1.0);
  if (update_->clips_as_it_reads()) {
    // The kernel multiplies each gradient by it as it reads it, in fp32: the pass over the
    // gradient that mul_ costs is saved, and a bf16 gradient is not rounded to bf16 once more.
    clip_coef_ = coef.to(at::kFloat).reshape({1});
  } else {
    shard_.grads.mul_(coef.to(shard_.grads.scalar_type()));
  }
  return norm;
}

void ShardedOptimizer::step(double lr, const torch::Tensor& found_inf) {
  at::NoGradGuard no_grad;
  StepArgs args;
  args.clip_coef = std::exchange(clip_coef_, torch::Tensor());      // this step's only
  if (found_inf.defined() && found_inf.item<float>() != 0) return;  // fp16 overflow: skip (host sync)
  args.lr = lr;
  args.step = ++steps_;
  update_->step(args);
}

void ShardedOptimizer::gather() {
  if (!sharded_) return;
  comm_.all_gather(param_flat_, shard_.params)->wait();
}

ShardState ShardedOptimizer::state(int64_t begin, int64_t end) const {
  at::NoGradGuard no_grad;
  GPT2_ASSERT(begin_ <= begin && begin <= end && end <= end_, "state(): the range is not in this rank's shard");
  ShardState s = update_->state(begin, end);
  s.adam_step = steps_;
  return s;
}

void ShardedOptimizer::load_state(const ShardState& s) {
  at::NoGradGuard no_grad;
  GPT2_ASSERT(s.master.numel() == end_ - begin_, "optimizer state does not match this rank's shard");
  update_->load_state(s);
  shard_.params.copy_(s.master);
  steps_ = s.adam_step;
}

}  // namespace gpt2::optim
