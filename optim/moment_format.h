#pragma once
// memory.optimizer_moments' values, and the manifest's: how AdamW keeps its moments (fp32, or
// block-wise 8-bit, moments_8bit.h).
#include <array>
#include <utility>

#include "src/base/choices.h"

namespace gpt2::optim {

enum class MomentFormat { kFp32, k8bit };

}  // namespace gpt2::optim

namespace gpt2 {
template <>
struct ChoiceNames<optim::MomentFormat> {
  static constexpr std::array<std::pair<optim::MomentFormat, const char*>, 2> names{
      {{optim::MomentFormat::kFp32, "fp32"}, {optim::MomentFormat::k8bit, "8bit"}}};
};
}  // namespace gpt2
