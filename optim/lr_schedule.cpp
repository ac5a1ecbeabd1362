#include "optim/lr_schedule.h"

#include <cmath>

namespace gpt2::optim {

double WarmupCosine::at(int64_t step) const {
  // (step + 1) so the first step already moves the weights.
  if (step < warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (step >= max_steps) return min_lr;
  const double span = static_cast<double>(max_steps - warmup_steps);
  const double progress = span > 0 ? static_cast<double>(step - warmup_steps) / span : 1.0;
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));  // 1 -> 0
  return min_lr + cosine * (lr - min_lr);
}

}  // namespace gpt2::optim
