#include "optim/moments_8bit.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace gpt2::optim {
namespace {

// Note [Dynamic map]: every (E, F) decade's values, then zero (and 1e-7 for the signed map), sorted.
QuantMap build_map(bool is_signed) {
  std::vector<double> values{0.0};
  const int fraction_bits = is_signed ? 6 : 7;  // bits after the sign bit, less the one bit
  double decade = 1.0;                          // 10^E, exact in double for E <= 7
  for (int e = 0; e <= fraction_bits; ++e, decade *= 10.0) {
    const int f = fraction_bits - e;
    const double levels = static_cast<double>(int64_t{1} << f);
    for (int64_t j = 0; j < (int64_t{1} << f); ++j) {
      const double v = (1.0 / decade) * (0.1 + 0.9 * static_cast<double>(j + 1) / levels);
      values.push_back(v);
      if (is_signed) values.push_back(-v);
    }
  }
  if (is_signed) values.push_back(1e-7);
  if (values.size() != 256) throw std::logic_error("optim::dynamic_map: not 256 values");
  std::sort(values.begin(), values.end());
  QuantMap map{};
  for (size_t i = 0; i < map.size(); ++i) map[i] = static_cast<float>(values[i]);
  return map;
}

}  // namespace

const QuantMap& dynamic_map(bool is_signed) {
  static const QuantMap kSigned = build_map(true), kUnsigned = build_map(false);
  return is_signed ? kSigned : kUnsigned;
}

Moment8Maps moment8_maps() {
  Moment8Maps maps{};
  std::copy(dynamic_map(true).begin(), dynamic_map(true).end(), maps.signed_map);
  std::copy(dynamic_map(false).begin(), dynamic_map(false).end(), maps.unsigned_map);
  return maps;
}

uint8_t quantize_value(const QuantMap& map, float x) {
  if (std::isnan(x)) x = 0.0f;
  // First entry >= x; then the nearer of it and the one below, the lower on a tie.
  const auto it = std::lower_bound(map.begin(), map.end(), x);
  if (it == map.begin()) return 0;
  if (it == map.end()) return 255;
  const auto hi = static_cast<uint8_t>(it - map.begin());
  return (x - map[hi - 1] <= map[hi] - x) ? static_cast<uint8_t>(hi - 1) : hi;
}

void quantize_blocks(const QuantMap& map, const float* x, int64_t n, uint8_t* codes, float* absmax) {
  for (int64_t b0 = 0, block = 0; b0 < n; b0 += kQuantBlock, ++block) {
    const int64_t len = std::min(kQuantBlock, n - b0);
    float amax = 0.0f;
    for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(x[b0 + i]));
    absmax[block] = amax;
    const float inv = amax > 0.0f ? amax : 1.0f;  // a block of zeros: every value 0 / 1
    for (int64_t i = 0; i < len; ++i) codes[b0 + i] = quantize_value(map, x[b0 + i] / inv);
  }
}

void dequantize_blocks(const QuantMap& map, const uint8_t* codes, const float* absmax, int64_t n, float* out) {
  for (int64_t b0 = 0, block = 0; b0 < n; b0 += kQuantBlock, ++block) {
    const int64_t len = std::min(kQuantBlock, n - b0);
    const float scale = absmax[block];
    for (int64_t i = 0; i < len; ++i) out[b0 + i] = map[codes[b0 + i]] * scale;
  }
}

void cpu_adamw_update_8bit(const CpuAdamWStep& s, int64_t n, float* param, Moment8 exp_avg, Moment8 exp_avg_sq,
                           const void* grad, HostGradType grad_type, uint16_t* param_bf16) {
  const QuantMap& signed_map = dynamic_map(true);
  const QuantMap& unsigned_map = dynamic_map(false);
  const int64_t grad_bytes = grad_type == HostGradType::kBFloat16 ? 2 : 4;
  // One block of each moment in fp32 on the stack: 16 KiB, in L1/L2 while it is updated.
  alignas(64) float m[kQuantBlock];
  alignas(64) float v[kQuantBlock];
  for (int64_t b0 = 0, block = 0; b0 < n; b0 += kQuantBlock, ++block) {
    const int64_t len = std::min(kQuantBlock, n - b0);
    dequantize_blocks(signed_map, exp_avg.codes + b0, exp_avg.absmax + block, len, m);
    dequantize_blocks(unsigned_map, exp_avg_sq.codes + b0, exp_avg_sq.absmax + block, len, v);
    cpu_adamw_update(s, len, param + b0, m, v, static_cast<const char*>(grad) + b0 * grad_bytes, grad_type,
                     param_bf16 != nullptr ? param_bf16 + b0 : nullptr);
    quantize_blocks(signed_map, m, len, exp_avg.codes + b0, exp_avg.absmax + block);
    quantize_blocks(unsigned_map, v, len, exp_avg_sq.codes + b0, exp_avg_sq.absmax + block);
  }
}

}  // namespace gpt2::optim
