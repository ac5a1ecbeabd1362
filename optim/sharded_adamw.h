#pragma once
// AdamW over this rank's shard of the flat parameter space (ZeRO stage 1/2), or over all of it
// (stage 0). The parameters become views into one flat buffer (FlatLayout order); the rank keeps
// AdamW state only for its shard [shard_begin, shard_end), cut into segments at parameter
// boundaries so weight decay still applies to 2-D tensors only. After step(), gather() all-gathers
// the updated shards so every rank holds the whole model again. The global gradient norm is the
// norm over the shards, summed across ranks.
//
// Precision: when the parameters are bf16/fp16 (what the GPU computes with), the optimizer keeps
// fp32 master weights for its shard and writes the rounded result into the parameters after each
// update. The gradient buffer may be fp32 or the parameters' dtype (precision.reduce_dtype).
//
// Offload (Options::offload): masters, moments and a gradient copy live in (pinned) host memory;
// step() streams the gradient shard to the host chunk by chunk, a HostThreadPool runs CpuAdamW on
// each chunk as it lands, and the updated parameters stream back, the three overlapping.
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "optim/adamw.h"
#include "parallel/communicator.h"
#include "parallel/flat_layout.h"

namespace gpt2::optim {

class HostThreadPool;

class ShardedAdamW {
 public:
  struct Options {
    AdamWOptions adamw;
    double weight_decay = 0.1;
    bool sharded = false;        // false: stage 0, every rank updates everything, gather() does nothing
    bool offload = false;        // state in host memory, CPU AdamW
    int host_threads = 0;        // offload: CPU AdamW threads (<= 0: all hardware threads)
    int64_t chunk_elements = int64_t{1} << 24;  // offload: pipeline granularity (64 MiB of fp32)
  };

  // grad_flat: the gradient buffer in the same layout (GradBuckets::flat()), fp32 or the params' dtype.
  ShardedAdamW(const std::vector<torch::Tensor>& params, const parallel::FlatLayout& layout,
               const torch::Tensor& grad_flat, parallel::Communicator& comm, Options options);
  ~ShardedAdamW();

  // Global L2 norm of the gradient (a device scalar; no host sync) and clipping to max_norm
  // (<= 0: no clipping). Reads only this rank's shard, then sums squares across ranks.
  torch::Tensor clip_grad_norm(double max_norm);
  // found_inf (fp16 loss scaling): when it holds 1 nothing changes and the step does not count.
  void step(double lr, const torch::Tensor& found_inf = {});
  // All-gathers the updated shards into every rank's parameters (sharded only).
  void gather();

  // Bytes of optimizer state on the parameters' device (moments, masters, scratch) and in host
  // memory (offload: masters, moments, the gradient and parameter staging buffers).
  int64_t state_bytes() const;
  int64_t host_state_bytes() const;
  int64_t shard_begin() const { return begin_; }
  int64_t shard_numel() const { return end_ - begin_; }

  // This rank's optimizer state over its shard as fp32 CPU tensors, for checkpoints: the master
  // weights (the parameters themselves when they are fp32), both moments, and the bias-correction
  // step count. load_state() takes the same (shard_numel() elements) and writes the masters,
  // rounded, into this rank's parameters; gather() then gives every rank the whole model.
  struct ShardState {
    torch::Tensor master, exp_avg, exp_avg_sq;
    int64_t adam_step = 0;
  };
  ShardState state() const;
  void load_state(const ShardState& state);
  // This rank's shard of the gradient (what clipping and loss-scale unscaling act on).
  const torch::Tensor& grad_shard() const { return grad_shard_; }
  bool sharded() const { return sharded_; }
  // Host bytes offload needs for a shard of n elements with these dtypes (for the memory check).
  static int64_t host_bytes_for(int64_t n, at::ScalarType param_dtype, at::ScalarType grad_dtype);

 private:
  struct Segment {  // a piece of the shard inside one parameter, in shard coordinates
    int64_t begin, end;
    double weight_decay;
  };
  void step_on_device(double lr, const torch::Tensor& found_inf);
  void step_on_host(double lr, const torch::Tensor& found_inf);

  parallel::Communicator& comm_;
  Options options_;
  bool sharded_;
  int64_t begin_ = 0, end_ = 0;
  torch::Tensor param_flat_;
  torch::Tensor param_shard_;  // view of param_flat_
  torch::Tensor grad_shard_;   // view of the gradient buffer
  torch::Tensor master_;       // fp32 shard when the params are not fp32 (device), or the host master
  torch::Tensor grad32_;       // device: fp32 copy of a low-precision gradient shard for the fused kernel
  torch::Tensor m_, v_;        // device: the moments, flat over the shard (AdamW works on views)
  std::vector<Segment> segments_;
  std::unique_ptr<AdamW> adamw_;  // device path

  // Host path (offload).
  torch::Tensor host_m_, host_v_, host_grad_, host_param_out_;
  std::unique_ptr<HostThreadPool> pool_;
  int64_t host_steps_ = 0;
};

}  // namespace gpt2::optim
