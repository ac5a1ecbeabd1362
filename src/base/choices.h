#pragma once
// Settings that take one of a few words (precision.dtype = bf16, --device cuda): each is an enum
// whose spellings live in one table, ChoiceNames<E>. Options are parsed into the enum once, where
// they are read (parse_choice), and printed back with choice_name for logs, tables and manifests.
#include <array>
#include <string>
#include <utility>

#include "src/base/errors.h"

namespace gpt2 {

// Specialize with `static constexpr std::array<std::pair<E, const char*>, N> names`.
template <typename E>
struct ChoiceNames;

template <typename E>
const char* choice_name(E value) {
  for (const auto& [v, name] : ChoiceNames<E>::names) {
    if (v == value) return name;
  }
  return "?";
}

// "a | b | c", in the table's order.
template <typename E>
std::string choice_list() {
  std::string out;
  for (const auto& entry : ChoiceNames<E>::names) out += (out.empty() ? "" : " | ") + std::string(entry.second);
  return out;
}

// The enum spelled `text`; gpt2::UserError "WHAT = TEXT: must be one of a | b" for any other word.
template <typename E>
E parse_choice(const std::string& what, const std::string& text) {
  for (const auto& [v, name] : ChoiceNames<E>::names) {
    if (text == name) return v;
  }
  throw UserError(what + " = " + text + ": must be one of " + choice_list<E>());
}

// Where a run or a tool computes (train.device, --device): auto = CUDA when there is a device.
enum class DeviceChoice { kAuto, kCpu, kCuda };
template <>
struct ChoiceNames<DeviceChoice> {
  static constexpr std::array<std::pair<DeviceChoice, const char*>, 3> names{
      {{DeviceChoice::kAuto, "auto"}, {DeviceChoice::kCpu, "cpu"}, {DeviceChoice::kCuda, "cuda"}}};
};

// Weights for inference (--quant): as they are, or the tied wte and the blocks' projections in int8
// (src/kernels/int8_linear.h).
enum class QuantChoice { kNone, kInt8 };
template <>
struct ChoiceNames<QuantChoice> {
  static constexpr std::array<std::pair<QuantChoice, const char*>, 2> names{
      {{QuantChoice::kNone, "none"}, {QuantChoice::kInt8, "int8"}}};
};

// The floating-point type of parameters and activations (precision.dtype, --dtype); auto is
// resolved by whoever reads it (Note [bf16 on CPU] for training).
enum class DtypeChoice { kAuto, kBf16, kFp16, kFp32 };
template <>
struct ChoiceNames<DtypeChoice> {
  static constexpr std::array<std::pair<DtypeChoice, const char*>, 4> names{{{DtypeChoice::kAuto, "auto"},
                                                                             {DtypeChoice::kBf16, "bf16"},
                                                                             {DtypeChoice::kFp16, "fp16"},
                                                                             {DtypeChoice::kFp32, "fp32"}}};
};

}  // namespace gpt2
