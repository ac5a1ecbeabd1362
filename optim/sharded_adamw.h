#pragma once
// AdamW over this rank's shard of the flat parameter space (ZeRO stage 1/2), or over all of it
// (stage 0). The parameters become views into one flat buffer (FlatLayout order); the rank keeps
// AdamW moments only for its shard [shard_begin, shard_end), cut into segments at parameter
// boundaries so weight decay still applies to 2-D tensors only. After step(), gather() all-gathers
// the updated shards so every rank holds the whole model again. The global gradient norm is the
// norm over the shards, summed across ranks.
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "optim/adamw.h"
#include "parallel/communicator.h"
#include "parallel/flat_layout.h"

namespace gpt2::optim {

class ShardedAdamW {
 public:
  // grad_flat: the gradient buffer in the same layout (GradBuckets::flat()). sharded = false:
  // stage 0, every rank updates everything and gather() does nothing.
  ShardedAdamW(const std::vector<torch::Tensor>& params, const parallel::FlatLayout& layout,
               const torch::Tensor& grad_flat, parallel::Communicator& comm, bool sharded,
               AdamWOptions options, double weight_decay);

  // Global L2 norm of the gradient (a device scalar; no host sync) and clipping to max_norm
  // (<= 0: no clipping). Reads only this rank's shard, then sums squares across ranks.
  torch::Tensor clip_grad_norm(double max_norm);
  void step(double lr, const torch::Tensor& found_inf = {});
  // All-gathers the updated shards into every rank's parameters (sharded only).
  void gather();

  int64_t state_bytes() const { return adamw_->state_bytes(); }
  int64_t shard_numel() const { return end_ - begin_; }
  // This rank's shard of the gradient (what clipping and loss-scale unscaling act on).
  const torch::Tensor& grad_shard() const { return grad_shard_; }
  bool sharded() const { return sharded_; }

 private:
  parallel::Communicator& comm_;
  bool sharded_;
  int64_t begin_ = 0, end_ = 0;
  torch::Tensor param_flat_;
  torch::Tensor grad_shard_;
  std::unique_ptr<AdamW> adamw_;
};

}  // namespace gpt2::optim
