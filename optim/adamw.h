#pragma once
// AdamW (decoupled weight decay, Loshchilov & Hutter) over groups of parameters, each with its own
// weight decay; the update is ATen's fused multi-tensor kernel (CPU and CUDA), the same arithmetic
// as torch.optim.AdamW(fused=True). Moments are fp32-or-param-dtype tensors shaped like the params.
#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace gpt2::optim {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
};

class AdamW {
 public:
  struct Group {
    std::vector<torch::Tensor> params;
    double weight_decay = 0;
    // The gradient of each param; empty = use each param's .grad() (skipped when undefined).
    std::vector<torch::Tensor> grads;
    // Where the moments live (views into a caller's flat buffers, so they can be saved and
    // loaded as one range); empty = AdamW allocates them.
    std::vector<torch::Tensor> exp_avg, exp_avg_sq;
  };

  AdamW(std::vector<Group> groups, AdamWOptions options);

  // One update with learning rate `lr` from each param's .grad(); params without a grad are skipped.
  // found_inf (a 1-element fp32 tensor on the params' device, from LossScaler): when it holds 1 the
  // fused kernel leaves parameters and moments untouched and the step count is not advanced.
  void step(double lr, const torch::Tensor& found_inf = {});

  // The bias-correction step count (updates applied, skipped ones not counted; a host sync), and
  // setting it when resuming.
  int64_t adam_step() const;
  void set_adam_step(int64_t step);
  // Bytes of optimizer state (both moments and step counters) held by this rank.
  int64_t state_bytes() const;

 private:
  struct GroupState {
    std::vector<torch::Tensor> params, grads, exp_avg, exp_avg_sq, step;
    double weight_decay = 0;
  };
  std::vector<GroupState> groups_;
  AdamWOptions options_;
};

}  // namespace gpt2::optim
