#pragma once
// The optimizer over this rank's shard of the flat parameter space (ZeRO stage 1/2), or over all of
// it (stage 0). The parameters become views into one flat buffer (FlatLayout order); the rank keeps
// optimizer state only for its shard: the layout's pieces of this rank (one contiguous range, or
// chunk `rank` of every block for ZeRO 2's interleaved layout), end to end, cut into spans at
// parameter boundaries so weight decay still applies to 2-D tensors only. A one-piece shard is
// updated in place in the flat buffer; an interleaved one in a buffer of its own, all-gathered
// block by block. This class owns the shard: the
// layout, the global gradient norm and clipping, the step count, the all-gather after the update,
// the state's size and its checkpoint form. The update itself and its buffers are a ShardUpdate
// (shard_update.h): AdamW on the GPU, on the CPU, or offloaded to the host (adamw_updates.h). The
// norm and every update are computed so that ZeRO 1/2 and offload give ZeRO 0's bits (Note
// [Partition-free arithmetic], grad_norm.h).
//
// The gradient buffer may be fp32 or the parameters' dtype (precision.reduce_dtype). With found_inf
// (fp16 loss scaling) step() reads the flag first (one host sync), since the step count is on the
// host.
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "optim/adamw_updates.h"
#include "optim/moment_layout.h"
#include "optim/muon.h"
#include "optim/muon_owners.h"
#include "optim/shard_update.h"
#include "parallel/communicator.h"
#include "parallel/flat_layout.h"

namespace gpt2::optim {

class ShardedOptimizer {
 public:
  struct Options {
    AdamWOptions adamw;
    bool sharded = false;  // false: stage 0, every rank updates everything, gather() does nothing
    bool offload = false;  // state in host memory, CPU AdamW
    // Muon (optim.name = muon): the parameters (indices) it updates, whole 2-D matrices, each by one
    // owner rank when sharded (Note [Muon's owners]); AdamW the rest. Its learning rate is step()'s
    // lr times muon_lr_ratio.
    std::vector<int> muon_params;
    MuonOptions muon;
    double muon_lr_ratio = 1;
  };

  // grads: GradBuckets::grads(), fp32 or the params' dtype: the whole flat space, or (interleaved
  // layout) this rank's pieces end to end.
  ShardedOptimizer(const std::vector<torch::Tensor>& params, const parallel::FlatLayout& layout,
                   const torch::Tensor& grads, parallel::Communicator& comm, Options options);
  ~ShardedOptimizer();
  // The update keeps a pointer to moment_layout() and views of the flat buffer: not copied or moved.
  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;

  // Global L2 norm of the gradient (an fp64 device scalar; no host sync) and clipping to max_norm
  // (<= 0: no clipping) by the coefficient min(1, max_norm / (norm + 1e-6)). Reads only this rank's
  // shard; its cells' sums of squares are all-gathered (Note [Partition-free arithmetic]). Where the
  // update clips as it reads (GpuAdamW) the gradient is left as it is: the coefficient stays on the
  // device and the next step() multiplies each gradient by it as it reads it (then forgets it;
  // another clip_grad_norm before that step replaces it, measuring the unclipped gradient again).
  // Elsewhere the gradient shard is scaled in place. So between this call and step() read the
  // gradient through the optimizer only.
  torch::Tensor clip_grad_norm(double max_norm);
  // found_inf (fp16 loss scaling): when it holds 1 nothing changes and the step does not count
  // (the flag is read first: one host sync).
  void step(double lr, const torch::Tensor& found_inf = {});
  // All-gathers the updated shards into every rank's parameters (sharded only).
  void gather();

  // Bytes of optimizer state on the parameters' device (moments, masters, scratch, an interleaved
  // shard's own parameters, Muon's momentum) and in host memory (offload: masters, moments, the gradient and
  // parameter staging buffers).
  int64_t state_bytes() const;
  int64_t host_state_bytes() const { return update_->host_bytes(); }
  // Of state_bytes(), what Muon keeps beside AdamW's update: its owned matrices' fp32 momentum
  // (Muon's optimizer state proper, 4 bytes a parameter), and their fp32 masters where it cannot
  // share the update's (sharded, or offloaded; 0 otherwise).
  int64_t muon_state_bytes() const { return muon_momentum_bytes() + muon_master_bytes(); }
  int64_t muon_momentum_bytes() const;
  int64_t muon_master_bytes() const;
  // The flat ranges this rank's state covers, in the order state() holds them.
  const std::vector<parallel::FlatRange>& pieces() const { return shard_.pieces; }
  int64_t shard_numel() const { return shard_.numel(); }

  // This rank's optimizer state (ShardState; its pieces end to end), and that of the flat range
  // [begin, end) inside one piece (on the kQuantBlock grid with 8-bit moments): what a ZeRO 0 rank
  // writes of the state every rank holds. load_state() takes the whole shard's in this optimizer's
  // format and writes the masters, rounded, into this rank's parameters; gather() then gives every
  // rank the whole model. With Muon and a sharded optimizer all three are collective: the owners'
  // matrices move to and from the shards' ranges.
  ShardState state() const;
  ShardState state(int64_t begin, int64_t end) const;
  void load_state(const ShardState& state);
  bool moments_8bit() const { return options_.adamw.moments_8bit; }
  bool muon() const { return muon_ != nullptr; }
  // Muon's matrices and which of them this rank owns (Note [Muon's owners]); null without Muon.
  const MuonOwners* muon_owners() const { return muon_.get(); }
  // Where 8-bit moments are in the flat space (built for fp32 moments too: checkpoints convert).
  const MomentLayout& moment_layout() const { return moment_layout_; }
  // This rank's shard of the gradient (what clipping and loss-scale unscaling act on; when the
  // update clips as it reads, clipping only measures it, see clip_grad_norm).
  const torch::Tensor& grad_shard() const { return shard_.grads; }
  bool sharded() const { return sharded_; }

 private:
  parallel::Communicator& comm_;
  Options options_;
  bool sharded_;
  MomentLayout moment_layout_;
  std::vector<parallel::FlatRange> blocks_;  // interleaved: the layout's blocks, gathered one by one
  torch::Tensor cells_in_flat_order_;        // interleaved: flat cell -> its place in the gathered cells
  torch::Tensor param_flat_;
  ShardView shard_;
  std::unique_ptr<ShardUpdate> update_;
  torch::Tensor clip_coef_;  // for an update that clips as it reads, until the next step
  int64_t steps_ = 0;        // bias-correction step count
  // Muon (Note [Muon's owners]): who owns which matrix, and per owned matrix its momentum, its
  // fp32 master (a view of the parameters when they are fp32) and its parameters ([rows, cols]).
  std::unique_ptr<MuonOwners> muon_;
  // The momentum buffer holds the owned stacks end to end, the master buffer the owned matrices.
  torch::Tensor muon_momentum_buffer_, muon_master_buffer_;  // fp32
  struct OwnedStack {
    std::vector<size_t> owned;  // its matrices, as indices into muon_->owned()
    torch::Tensor momentum;     // [k, rows, cols]
  };
  std::vector<OwnedStack> muon_stacks_;
  bool muon_rounds_params_ = false;  // the masters are not the parameters: round them into them
  std::vector<torch::Tensor> muon_momentum_, muon_masters_, muon_params_;
  void set_up_muon(const std::vector<torch::Tensor>& params, const parallel::FlatLayout& layout,
                   const std::vector<char>& by_muon);
  void muon_step(double lr, const torch::Tensor& clip_coef);
  void round_muon_masters_into_params();
  // Sharded: the owners' masters and momenta in this rank's shard coordinates (fp32 on the device,
  // zero outside Muon's elements). Collective. Undefined without Muon or unsharded (this rank owns
  // everything then).
  struct MuonInShard {
    torch::Tensor master, momentum;
  };
  MuonInShard muon_in_shard() const;
  ShardState range_state(int64_t begin, int64_t end, const MuonInShard& muon) const;
};

}  // namespace gpt2::optim
