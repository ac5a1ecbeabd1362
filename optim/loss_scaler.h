#pragma once
// Dynamic loss scaling for fp16 training. The loss is multiplied by `scale` before backward; the
// gradients are unscaled in place and checked for inf/NaN (summed over ranks, so every rank takes
// the same decision); a step with a non-finite gradient is skipped (found_inf goes to the fused
// AdamW, which then leaves parameters and moments alone) and the scale backs off by `backoff`;
// after `growth_interval` good steps in a row it grows by `growth`. Everything stays on the device:
// no host synchronisation. Disabled, it is the identity; with skip_non_finite (precision.fp8, where an
// inf/NaN amax turns into non-finite gradients) it keeps the scale at 1 and still skips such a step.
#include <torch/types.h>

#include <cstdint>

#include "parallel/communicator.h"

namespace gpt2::optim {

struct LossScalerOptions {
  double init_scale = 65536.0;  // 2^16, as torch.amp.GradScaler
  double growth = 2.0;
  double backoff = 0.5;
  int64_t growth_interval = 2000;
};

class LossScaler {
 public:
  LossScaler(bool enabled, torch::Device device, LossScalerOptions options = {}, bool skip_non_finite = false);

  bool enabled() const { return enabled_; }
  // Whether unscale_and_check looks for inf/NaN (scaling, or skip_non_finite): pass found_inf on.
  bool checks() const { return enabled_ || skip_non_finite_; }
  torch::Tensor scale_loss(const torch::Tensor& loss) const { return enabled_ ? loss * scale_ : loss; }
  // Divides `grads` by the scale in place; returns found_inf (a 1-element fp32 device tensor,
  // 1 = some rank saw inf/NaN). With `comm` the flag is max-reduced across ranks.
  torch::Tensor unscale_and_check(const torch::Tensor& grads, parallel::Communicator* comm);
  // Backs off or grows the scale from found_inf.
  void update(const torch::Tensor& found_inf);

  double scale() const { return scale_.item<double>(); }  // for logs (host sync)
  // Restores a saved state (checkpoints).
  void load(double scale, int64_t growth_tracker);
  const torch::Tensor& growth_tracker() const { return growth_tracker_; }

 private:
  bool enabled_, skip_non_finite_;
  LossScalerOptions options_;
  torch::Tensor scale_;           // (1,) fp32
  torch::Tensor growth_tracker_;  // (1,) int32: good steps in a row
};

}  // namespace gpt2::optim
