#pragma once
// One optimizer's update of a shard of the flat parameter space, behind the interface that
// ShardedOptimizer (sharded_optimizer.h) drives. The shard's owner keeps the layout, the gradient
// norm and clipping, the step count, the gather and the checkpoint bookkeeping; a ShardUpdate keeps
// what its own arithmetic needs (master weights, moments, staging buffers) and changes the shard's
// parameters in place. AdamW has one per place it runs (adamw_updates.h); Muon's matrices are no span of it
// (ShardedOptimizer updates them by their owners, muon_owners.h).
#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "optim/moment_layout.h"
#include "optim/update_rule.h"
#include "parallel/flat_layout.h"

namespace gpt2::optim {

// The shard an update works on: this rank's parameters and gradient, its flat ranges (one for a
// contiguous shard, one per block for an interleaved one: Note [Interleaved shards] in
// parallel/flat_layout.cpp) kept end to end in shard coordinates, and the pieces of parameters it
// holds (shard coordinates; weight_decay marks the matrices and embeddings).
struct ShardView {
  torch::Tensor params;                     // fp32, bf16 or fp16; the update writes them
  torch::Tensor grads;                      // fp32 or the params' dtype; read only
  std::vector<parallel::FlatRange> pieces;  // flat ranges, in shard order
  std::vector<ParamSpan> spans;
  const MomentLayout* moment_layout = nullptr;  // where 8-bit moments are in the flat space

  int64_t numel() const;
};

// Where the flat range [begin, end) lies in a shard of these pieces: the piece that holds all of it
// and the shard coordinate of `begin`. gpt2::Error when no one piece holds it.
struct PieceAt {
  size_t piece;
  int64_t local;
};
PieceAt locate(const std::vector<parallel::FlatRange>& pieces, int64_t begin, int64_t end);

// This rank's optimizer state as CPU tensors, for checkpoints: the fp32 master weights (the
// parameters themselves when they are fp32), the moments, and the bias-correction step count.
// fp32 moments: exp_avg and exp_avg_sq, one fp32 value per element. 8-bit moments: the codes
// (uint8, one per element), the absmax values of the 8-bit blocks, and exp_avg / exp_avg_sq hold
// only the fp32 moments of the small parameters, packed in flat order (Note [Moment blocks]).
struct ShardState {
  bool moments_8bit = false;
  torch::Tensor master, exp_avg, exp_avg_sq;
  torch::Tensor muon_momentum;  // Muon runs: fp32 per element, zero outside Muon's matrices
  torch::Tensor exp_avg_codes, exp_avg_sq_codes, exp_avg_absmax, exp_avg_sq_absmax;  // 8-bit only
  int64_t adam_step = 0;
  MomentBuffers moment_buffers() const;  // 8-bit: pointers into the tensors above (CPU)
  // The update rule that wrote it: Muon where it holds Muon's momentum.
  UpdateRule update_rule() const { return muon_momentum.defined() ? UpdateRule::kMuon : UpdateRule::kAdamW; }
};
// The states of consecutive pieces as one (each tensor end to end; adam_step the first's).
ShardState concat_states(const std::vector<ShardState>& parts);

// What one step needs beyond the update's own state.
struct StepArgs {
  double lr = 0;
  int64_t step = 1;         // 1-based count including this update (bias correction)
  torch::Tensor clip_coef;  // clips_as_it_reads(): a 1-element fp32 device tensor, or undefined (no clip)
};

class ShardUpdate {
 public:
  virtual ~ShardUpdate() = default;
  // true: step() multiplies each gradient by StepArgs::clip_coef as it reads it; false: the owner
  // scales the gradient shard in place before step().
  virtual bool clips_as_it_reads() const = 0;
  virtual void step(const StepArgs& args) = 0;
  // Bytes of the update's buffers on the parameters' device and in host memory.
  virtual int64_t device_bytes() const = 0;
  virtual int64_t host_bytes() const = 0;
  // The fp32 masters of the whole shard (shard coordinates) where the update keeps them on the
  // parameters' device, else undefined (fp32 parameters are their own; offload keeps them on the
  // host). step() writes only the spans' elements, so an owner may keep other elements' masters there.
  virtual torch::Tensor device_masters() const { return {}; }
  // The master weights and moments of the flat range [begin, end) inside one piece of the shard
  // (adam_step is the owner's), and back: load_state takes the whole shard's (its pieces end to end)
  // and leaves the parameters to the owner.
  virtual ShardState state(int64_t begin, int64_t end) const = 0;
  virtual void load_state(const ShardState& state) = 0;
};

}  // namespace gpt2::optim
