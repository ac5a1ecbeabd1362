#pragma once
// Learning-rate schedule: linear warmup to `lr` over `warmup_steps`, then a cosine from `lr` down
// to `min_lr` at `max_steps` (and `min_lr` after). Steps count from 0.
#include <cstdint>

namespace gpt2::optim {

struct WarmupCosine {
  double lr = 6e-4;
  double min_lr = 6e-5;
  int64_t warmup_steps = 0;
  int64_t max_steps = 1;

  double at(int64_t step) const;
};

}  // namespace gpt2::optim
