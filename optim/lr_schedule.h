#pragma once
// Learning-rate schedules (train.lr_schedule). Both warm up linearly to `lr` over `warmup_steps`
// ((step + 1) / warmup_steps, so the first step already moves the weights), then:
//  - cosine: from `lr` down to `min_lr` at `max_steps`;
//  - wsd (warmup-stable-decay): `lr` until the last `decay_frac` of the steps, then linearly down
//    to `min_lr` at `max_steps` (the decay never starts before the warmup ends).
// `min_lr` after max_steps. Steps count from 0.
#include <array>
#include <cstdint>
#include <utility>

#include "src/base/choices.h"

namespace gpt2 {

enum class LrShape { kCosine, kWsd };
template <>
struct ChoiceNames<LrShape> {
  static constexpr std::array<std::pair<LrShape, const char*>, 2> names{
      {{LrShape::kCosine, "cosine"}, {LrShape::kWsd, "wsd"}}};
};

namespace optim {

struct LrSchedule {
  double lr = 6e-4;
  double min_lr = 6e-5;
  int64_t warmup_steps = 0;
  int64_t max_steps = 1;
  LrShape shape = LrShape::kCosine;
  double decay_frac = 0.2;  // wsd: the share of max_steps spent decaying

  double at(int64_t step) const;
  // wsd: the first step of the decay.
  int64_t decay_start() const;
};

}  // namespace optim
}  // namespace gpt2
