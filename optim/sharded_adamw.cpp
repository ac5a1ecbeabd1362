#include "optim/sharded_adamw.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "src/base/errors.h"

namespace gpt2::optim {

ShardedAdamW::ShardedAdamW(const std::vector<torch::Tensor>& params, const parallel::FlatLayout& layout,
                           const torch::Tensor& grad_flat, parallel::Communicator& comm, bool sharded,
                           AdamWOptions options, double weight_decay)
    : comm_(comm), sharded_(sharded && comm.world_size() > 1) {
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
  grad_shard_ = grad_flat.narrow(0, begin_, end_ - begin_);
  AdamW::Group decay{{}, weight_decay, {}}, no_decay{{}, 0.0, {}};
  for (int i : layout.order) {
    const int64_t lo = std::max(begin_, layout.offset[i]);
    const int64_t hi = std::min(end_, layout.offset[i] + layout.numel[i]);
    if (lo >= hi) continue;
    auto& group = params[i].dim() >= 2 ? decay : no_decay;  // GPT-2: decay matmuls and embeddings only
    group.params.push_back(param_flat_.narrow(0, lo, hi - lo));
    group.grads.push_back(grad_flat.narrow(0, lo, hi - lo));
  }
  adamw_ = std::make_unique<AdamW>(std::vector<AdamW::Group>{decay, no_decay}, options);
}

torch::Tensor ShardedAdamW::clip_grad_norm(double max_norm) {
  at::NoGradGuard no_grad;
  const auto acc = at::promote_types(grad_shard_.scalar_type(), at::kFloat);
  auto sum_sq = grad_shard_.to(acc).pow(2).sum().reshape({1});
  if (sharded_) comm_.all_reduce(sum_sq, parallel::ReduceOp::kSum)->wait();
  auto norm = sum_sq.sqrt().reshape({});
  if (max_norm > 0) grad_shard_.mul_((max_norm / (norm + 1e-6)).clamp_max(1.0).to(grad_shard_.scalar_type()));
  return norm;
}

void ShardedAdamW::step(double lr, const torch::Tensor& found_inf) { adamw_->step(lr, found_inf); }

void ShardedAdamW::gather() {
  if (!sharded_) return;
  comm_.all_gather(param_flat_, param_flat_.narrow(0, begin_, end_ - begin_))->wait();
}

}  // namespace gpt2::optim
