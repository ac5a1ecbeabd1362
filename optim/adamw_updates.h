#pragma once
// AdamW's updates of a shard (shard_update.h), one per place it runs, each holding its own buffers:
//   GpuAdamW      CUDA parameters: adamw_step_gpu, one kernel pass over the shard's MomentBlocks
//                 that reads each element's gradient (fp32 or bf16 as the buffer holds it, times
//                 the clip coefficient), master and moments once and writes the master, moments and
//                 bf16 parameters once: 30 bytes per element with an fp32 gradient (28 with bf16).
//   CpuAdamW      CPU parameters: adamw_step_cpu over the same blocks, split across ATen's threads
//                 (blocks are independent, so any split gives the same bits).
//   OffloadAdamW  masters, moments and a gradient copy in (pinned) host memory, updated by the CPU
//                 kernels chunk by chunk as the gradient streams in (Note [Offload pipeline]).
// All three do the arithmetic of torch.optim.AdamW(fused=True) element by element, with fp32 or
// block-wise 8-bit moments (AdamWMoments), so a run's bits do not depend on which one updates.
// Where the parameters are bf16/fp16 the update keeps fp32 masters and writes the rounded result
// into the parameters.
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "optim/cpu_adamw.h"
#include "optim/moment_layout.h"
#include "optim/shard_update.h"

namespace gpt2::optim {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;                  // on the spans marked weight_decay
  bool moments_8bit = false;                  // block-wise 8-bit moments (memory.optimizer_moments = 8bit)
  int host_threads = 0;                       // offload: CPU AdamW threads (<= 0: all hardware threads)
  int64_t chunk_elements = int64_t{1} << 24;  // offload: pipeline granularity (64 MiB of fp32)
};

// Which update a shard gets: OffloadAdamW when `offload`, else GpuAdamW for CUDA parameters (an
// Error when this build has no CUDA kernels) and CpuAdamW for CPU ones.
std::unique_ptr<ShardUpdate> make_adamw_update(const ShardView& shard, const AdamWOptions& options, bool offload);
// Whether that choice is GpuAdamW: it reads fp32 and bf16 gradients as they are and clips them as
// it reads them (the trainer keeps bf16 gradient buckets for it).
bool gpu_adamw_updates(const torch::Device& device, bool offload);
// Host bytes OffloadAdamW holds for a shard of n elements, adamw_elements of them AdamW's (fp32
// moments cover only those), with these dtypes (the memory estimate).
int64_t offload_host_bytes(int64_t n, int64_t adamw_elements, at::ScalarType param_dtype, at::ScalarType grad_dtype,
                           bool moments_8bit);

// The moments of a shard, fp32 (m and v over AdamW's spans, packed: none over Muon's matrices) or
// 8-bit (codes over the shard, one absmax per 8-bit block, the packed fp32 moments of small
// parameters), where `where` says, and the MomentBlocks that the AdamW step walks.
class AdamWMoments {
 public:
  AdamWMoments(const ShardView& shard, bool moments_8bit, const at::TensorOptions& where);
  const std::vector<MomentBlock>& blocks() const { return blocks_; }
  MomentBuffers buffers() const;
  // Copies of the moments of the flat range [begin, end) (inside one piece) into s (CPU tensors),
  // and back (the whole shard's).
  void copy_out(int64_t begin, int64_t end, ShardState* s) const;
  void load(const ShardState& s);
  int64_t bytes() const;
  bool is_8bit() const { return eight_bit_; }
  // fp32: where span k of the shard's spans has its first moment (they are packed).
  int64_t fp32_at(size_t span) const { return span_states_[span]; }

 private:
  bool eight_bit_;
  std::vector<ParamSpan> spans_;      // fp32: the shard's spans, and
  std::vector<int64_t> span_states_;  // where each one's moments start in m_ and v_
  std::vector<parallel::FlatRange> pieces_;
  std::vector<int64_t> absmax_at_, fp32_at_;  // 8-bit: each piece's first absmax value and fp32 moment
  const MomentLayout* layout_;
  std::vector<MomentBlock> blocks_;
  torch::Tensor m_, v_;  // fp32: over the spans; 8-bit: the small parameters' fp32 moments, packed
  torch::Tensor codes_m_, codes_v_, absmax_m_, absmax_v_;  // 8-bit only
};

}  // namespace gpt2::optim
