#pragma once
// AdamW over this rank's shard of the flat parameter space (ZeRO stage 1/2), or over all of it
// (stage 0). The parameters become views into one flat buffer (FlatLayout order); the rank keeps
// AdamW state only for its shard [shard_begin, shard_end), cut into segments at parameter
// boundaries so weight decay still applies to 2-D tensors only. After step(), gather() all-gathers
// the updated shards so every rank holds the whole model again. The global gradient norm and every
// update are computed so that ZeRO 1/2 and offload give ZeRO 0's bits (Note [Partition-free
// arithmetic], grad_norm.h).
//
// Precision: when the parameters are bf16/fp16 (what the GPU computes with), the optimizer keeps
// fp32 master weights for its shard and writes the rounded result into the parameters after each
// update. The gradient buffer may be fp32 or the parameters' dtype (precision.reduce_dtype).
//
// The update (no offload) is one pass over the shard's blocks (moments_8bit.h, for fp32 moments as
// for 8-bit ones): one CUDA kernel on the GPU (launch_adamw_8bit), cpu_adamw_update_8bit on the
// CPU, the same arithmetic as torch.optim.AdamW(fused=True) element by element (cpu_adamw.h). On
// the GPU each element's gradient (fp32 or bf16 as the buffer holds it, times the clip
// coefficient), master and moments are read once, and the master, moments and bf16 parameters
// written once: 30 bytes per element with an fp32 gradient (28 with bf16), where a clip pass over
// the gradient (8), ATen's fused AdamW (28) and the rounding copy into the bf16 parameters (6) moved
// 42, in three passes. The step count is kept on the host.
//
// Offload (Options::offload): masters, moments and a gradient copy live in (pinned) host memory;
// step() streams the gradient shard to the host chunk by chunk, a HostThreadPool runs CpuAdamW on
// each chunk as it lands, and the updated parameters stream back, the three overlapping.
//
// 8-bit moments (Options::moments_8bit, moment_layout.h): both moments block-wise quantized, fp32
// for parameters under kMinQuantNumel values. Shards are whole quantization blocks (FlatLayout's
// grid). With found_inf (fp16) the step reads the flag first (one host sync), since the step count
// is on the host.
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "optim/cpu_adamw.h"
#include "optim/moment_layout.h"
#include "parallel/communicator.h"
#include "parallel/flat_layout.h"

namespace gpt2::optim {

class HostThreadPool;

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
};

class ShardedAdamW {
 public:
  struct Options {
    AdamWOptions adamw;
    double weight_decay = 0.1;
    bool sharded = false;        // false: stage 0, every rank updates everything, gather() does nothing
    bool offload = false;        // state in host memory, CPU AdamW
    int host_threads = 0;        // offload: CPU AdamW threads (<= 0: all hardware threads)
    int64_t chunk_elements = int64_t{1} << 24;  // offload: pipeline granularity (64 MiB of fp32)
    bool moments_8bit = false;   // block-wise 8-bit AdamW moments (memory.optimizer_moments = 8bit)
  };

  // grad_flat: the gradient buffer in the same layout (GradBuckets::flat()), fp32 or the params' dtype.
  ShardedAdamW(const std::vector<torch::Tensor>& params, const parallel::FlatLayout& layout,
               const torch::Tensor& grad_flat, parallel::Communicator& comm, Options options);
  ~ShardedAdamW();

  // Global L2 norm of the gradient (an fp64 device scalar; no host sync) and clipping to max_norm
  // (<= 0: no clipping) by the coefficient min(1, max_norm / (norm + 1e-6)). Reads only this rank's
  // shard; its cells' sums of squares are all-gathered (Note [Partition-free arithmetic]). Where the update is the GPU kernel (CUDA, no offload)
  // the gradient is left as it is: the coefficient stays on the device and the next step()
  // multiplies each gradient by it as it reads it (then forgets it; another clip_grad_norm before
  // that step replaces it, measuring the unclipped gradient again). Elsewhere the gradient shard is
  // scaled in place. So between this call and step() read the gradient through the optimizer only.
  torch::Tensor clip_grad_norm(double max_norm);
  // found_inf (fp16 loss scaling): when it holds 1 nothing changes and the step does not count
  // (the flag is read first: one host sync).
  void step(double lr, const torch::Tensor& found_inf = {});
  // All-gathers the updated shards into every rank's parameters (sharded only).
  void gather();

  // Bytes of optimizer state on the parameters' device (moments, masters, scratch) and in host
  // memory (offload: masters, moments, the gradient and parameter staging buffers).
  int64_t state_bytes() const;
  int64_t host_state_bytes() const;
  int64_t shard_begin() const { return begin_; }
  int64_t shard_numel() const { return end_ - begin_; }

  // This rank's optimizer state as CPU tensors, for checkpoints: the fp32 master weights (the
  // parameters themselves when they are fp32), the moments, and the bias-correction step count.
  // fp32 moments: exp_avg and exp_avg_sq, one fp32 value per element. 8-bit moments: the codes
  // (uint8, one per element), the absmax values of the 8-bit blocks, and exp_avg / exp_avg_sq hold
  // only the fp32 moments of the small parameters, packed in flat order (Note [Moment blocks]).
  // load_state() takes the same in this optimizer's format and writes the masters, rounded, into
  // this rank's parameters; gather() then gives every rank the whole model.
  struct ShardState {
    bool moments_8bit = false;
    torch::Tensor master, exp_avg, exp_avg_sq;
    torch::Tensor exp_avg_codes, exp_avg_sq_codes, exp_avg_absmax, exp_avg_sq_absmax;  // 8-bit only
    int64_t adam_step = 0;
    MomentBuffers moment_buffers() const;  // 8-bit: pointers into the tensors above (CPU)
  };
  ShardState state() const;
  // The state of the flat range [begin, end) inside this rank's (on the kQuantBlock grid with 8-bit
  // moments): what a ZeRO 0 rank writes of the state every rank holds.
  ShardState state(int64_t begin, int64_t end) const;
  void load_state(const ShardState& state);
  bool moments_8bit() const { return options_.moments_8bit; }
  // Where 8-bit moments are in the flat space (built for fp32 moments too: checkpoints convert).
  const MomentLayout& moment_layout() const { return moment_layout_; }
  // This rank's shard of the gradient (what clipping and loss-scale unscaling act on; with the GPU
  // kernel clipping only measures it, see clip_grad_norm).
  const torch::Tensor& grad_shard() const { return grad_shard_; }
  bool sharded() const { return sharded_; }
  // Whether the update on this device is the GPU kernel (CUDA, no offload, the kernels built): it
  // reads fp32 and bf16 gradients as they are and clips them as it reads them.
  static bool kernel_update(const torch::Device& device, bool offload);
  // Host bytes offload needs for a shard of n elements with these dtypes (for the memory check).
  static int64_t host_bytes_for(int64_t n, at::ScalarType param_dtype, at::ScalarType grad_dtype, bool moments_8bit);

 private:
  struct Segment {  // a piece of the shard inside one parameter, in shard coordinates
    int64_t begin, end;
    double weight_decay;
  };
  void step_blocks(double lr, const torch::Tensor& found_inf);  // the GPU kernel, or the CPU blocks
  void upload_blocks();                                          // blocks_ into blocks_device_
  void step_on_host(double lr, const torch::Tensor& found_inf);
  CpuAdamWStep host_step(double lr) const;  // the update's constants at steps_
  MomentBuffers moment_buffers() const;     // 8-bit, or m_ and v_ (dense fp32 blocks)

  parallel::Communicator& comm_;
  Options options_;
  bool sharded_;
  int64_t begin_ = 0, end_ = 0;
  torch::Tensor param_flat_;
  torch::Tensor param_shard_;  // view of param_flat_
  torch::Tensor grad_shard_;   // view of the gradient buffer
  torch::Tensor master_;       // fp32 shard when the params are not fp32 (device), or the host master
  torch::Tensor grad32_;       // device: fp32 copy of a gradient shard the update cannot read as it is
  torch::Tensor m_, v_;        // fp32 moments, flat over the shard (no offload)
  std::vector<Segment> segments_;
  // The update is launch_adamw_8bit (CUDA, no offload): clipping hands it clip_coef_ (a 1-element
  // fp32 device tensor, until the next step) instead of scaling the gradient.
  bool kernel_update_ = false;
  torch::Tensor clip_coef_;

  // 8-bit moments (on the device, or in host memory with offload): this shard's blocks, the codes
  // over the shard, one absmax per 8-bit block, the packed fp32 moments of small parameters. fp32
  // moments: blocks_ = the segments cut into dense_fp32_blocks over m_ and v_.
  MomentLayout moment_layout_;
  std::vector<MomentBlock> blocks_;
  torch::Tensor blocks_device_, tables_device_;  // blocks_ and quant_tables() as bytes on the GPU
  torch::Tensor codes_m_, codes_v_, absmax_m_, absmax_v_, m32_, v32_;

  // Host path (offload).
  torch::Tensor host_m_, host_v_, host_grad_, host_param_out_;
  std::unique_ptr<HostThreadPool> pool_;
  int64_t steps_ = 0;  // bias-correction step count
};

}  // namespace gpt2::optim
