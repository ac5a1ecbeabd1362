// 8-bit AdamW moments (optim/moments_8bit.h): the maps' hand-computed entries, quantization's
// nearest-entry rule and error bound, and one update with 8-bit moments against a float64
// implementation of the same algorithm (dequantize, AdamW, quantize). The numpy comparison of the
// maps and of block quantization is tests/python/test_moments_8bit.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "optim/moments_8bit.h"
#include "tests/optim/bf16_grads.h"

namespace gpt2::optim {
namespace {

bool contains(const QuantMap& m, float v) { return std::find(m.begin(), m.end(), v) != m.end(); }

TEST(Moments8bit, MapsHoldTheirHandComputedEntries) {
  const auto& s = dynamic_map(true);
  const auto& u = dynamic_map(false);
  EXPECT_TRUE(std::is_sorted(s.begin(), s.end()) && std::adjacent_find(s.begin(), s.end()) == s.end());
  EXPECT_TRUE(std::is_sorted(u.begin(), u.end()) && std::adjacent_find(u.begin(), u.end()) == u.end());
  EXPECT_EQ(s.front(), -1.0f);
  EXPECT_EQ(s.back(), 1.0f);
  EXPECT_EQ(u.front(), 0.0f);
  EXPECT_EQ(u.back(), 1.0f);
  // Signed, E = 0, 6 fraction bits: 0.1 + 0.9 * (j + 1) / 64; the next decade down; 1e-6 (E = 6,
  // no fraction bits); the spare 1e-7; zero. Unsigned: 7 fraction bits in the top decade.
  EXPECT_TRUE(contains(s, static_cast<float>(0.1 + 0.9 * 1 / 64.0)));
  EXPECT_TRUE(contains(s, static_cast<float>(-(0.1 + 0.9 * 63 / 64.0))));
  EXPECT_TRUE(contains(s, static_cast<float>(0.1 * (0.1 + 0.9 * 1 / 32.0))));
  EXPECT_TRUE(contains(s, static_cast<float>(1e-6)) && contains(s, static_cast<float>(-1e-6)));
  EXPECT_TRUE(contains(s, static_cast<float>(1e-7)) && !contains(s, static_cast<float>(-1e-7)));
  EXPECT_TRUE(contains(s, 0.0f));
  EXPECT_TRUE(contains(u, static_cast<float>(0.1 + 0.9 * 1 / 128.0)));
  EXPECT_TRUE(contains(u, static_cast<float>(1e-7)) && contains(u, 0.0f));
  // 128 positive values in the signed map (127 and the spare), 127 negative.
  EXPECT_EQ(std::count_if(s.begin(), s.end(), [](float v) { return v > 0; }), 128);
  EXPECT_EQ(std::count_if(s.begin(), s.end(), [](float v) { return v < 0; }), 127);
}

TEST(Moments8bit, QuantizeTakesTheNearestEntryAndTiesGoLow) {
  for (bool is_signed : {true, false}) {
    const auto& m = dynamic_map(is_signed);
    for (int i = 0; i < 256; ++i) EXPECT_EQ(quantize_value(m, m[i]), i) << "entry " << i;
    for (int i = 0; i + 1 < 256; ++i) {
      const double mid = (static_cast<double>(m[i]) + m[i + 1]) / 2;
      const float below = std::nextafter(static_cast<float>(mid), -2.0f), above = std::nextafter(static_cast<float>(mid), 2.0f);
      if (below > m[i]) {
        EXPECT_EQ(quantize_value(m, below), i) << "just below the midpoint of " << i;
      }
      if (above < m[i + 1]) {
        EXPECT_EQ(quantize_value(m, above), i + 1) << "just above the midpoint of " << i;
      }
      if (static_cast<double>(static_cast<float>(mid)) == mid) {
        EXPECT_EQ(quantize_value(m, static_cast<float>(mid)), i) << "the midpoint of " << i << ": a tie";
      }
    }
    EXPECT_EQ(quantize_value(m, 2.0f), 255);
    EXPECT_EQ(m[quantize_value(m, std::nanf(""))], 0.0f);
  }
  EXPECT_EQ(quantize_value(dynamic_map(false), -0.5f), 0);  // the unsigned map clamps at zero
}

// n values whose blocks span many magnitudes (moments of tensors with different gradient scales).
std::vector<float> moment_like(int64_t n, bool is_signed, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t b = 0; b < n; b += kQuantBlock) {
    const float scale = std::pow(10.0f, -static_cast<float>(gen() % 8));
    for (int64_t i = b; i < std::min(n, b + kQuantBlock); ++i) {
      const float v = normal(gen) * scale;
      x[i] = is_signed ? v : v * v;
    }
  }
  return x;
}

TEST(Moments8bit, RoundTripErrorIsAtMostHalfTheLocalGap) {
  const int64_t n = 3 * kQuantBlock + 100;
  for (bool is_signed : {true, false}) {
    const auto& m = dynamic_map(is_signed);
    const auto x = moment_like(n, is_signed, 7);
    std::vector<uint8_t> codes(n);
    std::vector<float> absmax(4), back(n);
    quantize_blocks(m, x.data(), n, codes.data(), absmax.data());
    dequantize_blocks(m, codes.data(), absmax.data(), n, back.data());
    for (int64_t i = 0; i < n; ++i) {
      const int c = codes[i];
      const float a = absmax[i / kQuantBlock];
      const double gap = std::max(c > 0 ? m[c] - m[c - 1] : 0.0f, c < 255 ? m[c + 1] - m[c] : 0.0f);
      ASSERT_LE(std::abs(back[i] - x[i]), (gap / 2 + 1e-7) * a) << (is_signed ? "signed " : "unsigned ") << i;
    }
    EXPECT_EQ(absmax[3], std::abs(*std::max_element(x.begin() + 3 * kQuantBlock, x.end(), [](float p, float q) {
      return std::abs(p) < std::abs(q);
    }))) << "the short last block's absmax";
  }
}

// Nearest code of a float64 value in the fp32 map (the reference's quantizer, written again).
int nearest(const QuantMap& m, double x) {
  int best = 0;
  for (int i = 1; i < 256; ++i) {
    if (std::abs(x - m[i]) < std::abs(x - m[best])) best = i;
  }
  return best;
}

// One step of AdamW with 8-bit moments against the same algorithm in float64: dequantize, update
// (decoupled decay, bias correction), and quantize with new absmax values. The parameters agree to
// fp32 rounding of the update; the new codes agree except where the fp32 and float64 moments fall
// on either side of a midpoint between two entries (a handful in 10^4).
TEST(Moments8bit, UpdateEqualsAFloat64ReferenceOfTheSameAlgorithm) {
  const int64_t n = 2 * kQuantBlock + 333;
  const int64_t blocks = 3;
  const auto& sm = dynamic_map(true);
  const auto& um = dynamic_map(false);
  auto param = moment_like(n, true, 1);
  const auto grad = moment_like(n, true, 2);
  std::vector<uint8_t> mc(n), vc(n);
  std::vector<float> ma(blocks), va(blocks);
  const auto m0 = moment_like(n, true, 3), v0 = moment_like(n, false, 4);
  quantize_blocks(sm, m0.data(), n, mc.data(), ma.data());
  quantize_blocks(um, v0.data(), n, vc.data(), va.data());

  CpuAdamWStep s;
  s.lr = 1e-3;
  s.weight_decay = 0.1;
  s.step = 7;
  // The float64 reference, from the same starting codes.
  std::vector<double> p_ref(n), m_ref(n), v_ref(n);
  const double bc1 = 1 - std::pow(s.beta1, s.step), bc2 = 1 - std::pow(s.beta2, s.step);
  for (int64_t i = 0; i < n; ++i) {
    const double g = grad[i];
    const double m = static_cast<double>(sm[mc[i]]) * ma[i / kQuantBlock];
    const double v = static_cast<double>(um[vc[i]]) * va[i / kQuantBlock];
    m_ref[i] = s.beta1 * m + (1 - s.beta1) * g;
    v_ref[i] = s.beta2 * v + (1 - s.beta2) * g * g;
    const double p = param[i] * (1 - s.lr * s.weight_decay);
    p_ref[i] = p - s.lr / bc1 * m_ref[i] / (std::sqrt(v_ref[i]) / std::sqrt(bc2) + s.eps);
  }
  cpu_adamw_update_8bit(s, n, param.data(), {mc.data(), ma.data()}, {vc.data(), va.data()}, grad.data(),
                        HostGradType::kFloat32, nullptr);

  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    // An update moves a parameter by about lr; its fp32 rounding by ~1e-7 of |p|.
    worst = std::max(worst, std::abs(param[i] - p_ref[i]) / (1e-7 * std::abs(p_ref[i]) + 1e-6 * s.lr));
  }
  EXPECT_LE(worst, 4.0) << "parameters, in units of the fp32 rounding allowed";
  int64_t m_differ = 0, v_differ = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t lo = b * kQuantBlock, hi = std::min(n, lo + kQuantBlock);
    double m_abs = 0, v_abs = 0;
    for (int64_t i = lo; i < hi; ++i) m_abs = std::max(m_abs, std::abs(m_ref[i])), v_abs = std::max(v_abs, v_ref[i]);
    EXPECT_NEAR(ma[b], m_abs, 1e-6 * m_abs) << "first moment absmax, block " << b;
    EXPECT_NEAR(va[b], v_abs, 1e-6 * v_abs) << "second moment absmax, block " << b;
    for (int64_t i = lo; i < hi; ++i) {
      const int mw = nearest(sm, m_ref[i] / m_abs), vw = nearest(um, v_ref[i] / v_abs);
      m_differ += mc[i] != mw;
      v_differ += vc[i] != vw;
      ASSERT_LE(std::abs(mc[i] - mw), 1) << "first moment code " << i;
      ASSERT_LE(std::abs(vc[i] - vw), 1) << "second moment code " << i;
    }
  }
  EXPECT_LE(m_differ, n / 500) << "first-moment codes off by one";
  EXPECT_LE(v_differ, n / 500) << "second-moment codes off by one";
  std::printf("[ measured ] 8-bit update vs float64: parameters within %.2f rounding units; codes off by one: "
              "first moment %lld, second %lld of %lld\n",
              worst, static_cast<long long>(m_differ), static_cast<long long>(v_differ), static_cast<long long>(n));
}

// bf16 gradients and the bf16 parameter copy give what the fp32 path gives on the same values.
TEST(Moments8bit, Bf16GradientAndCopyMatchTheFp32Path) {
  const int64_t n = kQuantBlock + 17;
  auto grad = moment_like(n, true, 5);
  const auto grad_bf16 = truncate_to_bf16(grad);
  std::vector<uint16_t> out(n);
  const auto& sm = dynamic_map(true);
  const auto& um = dynamic_map(false);
  std::vector<float> p[2] = {moment_like(n, true, 6), moment_like(n, true, 6)};
  std::vector<uint8_t> mc[2], vc[2];
  std::vector<float> ma[2], va[2];
  for (int k = 0; k < 2; ++k) {
    mc[k].resize(n), vc[k].resize(n), ma[k].resize(2), va[k].resize(2);
    quantize_blocks(sm, moment_like(n, true, 8).data(), n, mc[k].data(), ma[k].data());
    quantize_blocks(um, moment_like(n, false, 9).data(), n, vc[k].data(), va[k].data());
  }
  CpuAdamWStep s;
  s.lr = 3e-4;
  s.step = 2;
  cpu_adamw_update_8bit(s, n, p[0].data(), {mc[0].data(), ma[0].data()}, {vc[0].data(), va[0].data()}, grad.data(),
                        HostGradType::kFloat32, nullptr);
  cpu_adamw_update_8bit(s, n, p[1].data(), {mc[1].data(), ma[1].data()}, {vc[1].data(), va[1].data()},
                        grad_bf16.data(), HostGradType::kBFloat16, out.data());
  EXPECT_EQ(p[0], p[1]);
  EXPECT_EQ(mc[0], mc[1]);
  EXPECT_EQ(vc[0], vc[1]);
  EXPECT_EQ(ma[0], ma[1]);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &p[1][i], 4);
    ASSERT_LE(std::abs(static_cast<int>(out[i]) - static_cast<int>(u >> 16)), 1) << "bf16 copy of " << i;
  }
}

}  // namespace
}  // namespace gpt2::optim
