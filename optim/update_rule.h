#pragma once
// optim.name's values, and the manifest's `optimizer`: AdamW for every parameter, or Muon for the
// blocks' weight matrices and AdamW for the rest (muon.h).
#include <array>
#include <utility>

#include "src/base/choices.h"

namespace gpt2::optim {

enum class UpdateRule { kAdamW, kMuon };

}  // namespace gpt2::optim

namespace gpt2 {
template <>
struct ChoiceNames<optim::UpdateRule> {
  static constexpr std::array<std::pair<optim::UpdateRule, const char*>, 2> names{
      {{optim::UpdateRule::kAdamW, "adamw"}, {optim::UpdateRule::kMuon, "muon"}}};
};
}  // namespace gpt2
