#pragma once
// For the 8-bit moment tests: a gradient in bf16 and in fp32 holding exactly the same values, so
// the bf16-gradient path can be compared bitwise with the fp32 one.
#include <cstdint>
#include <cstring>
#include <vector>

namespace gpt2::optim {

// Truncates every value of `grad` to bf16 in place (the fp32 copy then holds the bf16 value
// exactly) and returns the bf16 bits.
inline std::vector<uint16_t> truncate_to_bf16(std::vector<float>& grad) {
  std::vector<uint16_t> bits(grad.size());
  for (size_t i = 0; i < grad.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &grad[i], 4);
    bits[i] = static_cast<uint16_t>(u >> 16);
    u = static_cast<uint32_t>(bits[i]) << 16;
    std::memcpy(&grad[i], &u, 4);
  }
  return bits;
}

}  // namespace gpt2::optim
