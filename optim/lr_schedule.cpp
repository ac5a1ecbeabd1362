#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace gpt2::optim {

int64_t LrSchedule::decay_start() const {
  const auto decay_steps = static_cast<int64_t>(std::llround(decay_frac * static_cast<double>(max_steps)));
  return std::max(warmup_steps, max_steps - decay_steps);
}

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (step >= max_steps) return min_lr;
  // The part of the schedule after warmup (cosine) or after the stable phase (wsd) that has passed.
  const int64_t from = shape == LrShape::kWsd ? decay_start() : warmup_steps;
  if (step < from) return lr;  // wsd's stable phase
  const double span = static_cast<double>(max_steps - from);
  const double progress = span > 0 ? static_cast<double>(step - from) / span : 1.0;
  const double left = shape == LrShape::kWsd ? 1.0 - progress : 0.5 * (1.0 + std::cos(M_PI * progress));  // 1 -> 0
  return min_lr + left * (lr - min_lr);
}

}  // namespace gpt2::optim
