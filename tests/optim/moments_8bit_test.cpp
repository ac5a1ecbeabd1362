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
#include <iterator>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "optim/adamw_step.h"
#include "optim/moment_layout.h"
#include "optim/moments_8bit.h"
#include "tests/optim/bf16_grads.h"

namespace gpt2::optim {
namespace {

bool contains(const QuantMap& m, float v) { return std::find(m.begin(), m.end(), v) != m.end(); }

// adamw_step_cpu over one contiguous 8-bit parameter of n values (weight decay applies).
void update_contiguous(const CpuAdamWStep& s, int64_t n, float* param, uint8_t* mc, float* ma, uint8_t* vc, float* va,
                       const void* grad, HostGradType type, uint16_t* out) {
  const auto blocks = contiguous_blocks(n, /*weight_decay=*/true);
  MomentBuffers mb;
  mb.exp_avg_codes = mc;
  mb.exp_avg_absmax = ma;
  mb.exp_avg_sq_codes = vc;
  mb.exp_avg_sq_absmax = va;
  adamw_step_cpu(s, blocks.data(), static_cast<int64_t>(blocks.size()), param, mb, grad, type, out);
}

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
      const float below = std::nextafter(static_cast<float>(mid), -2.0f),
                  above = std::nextafter(static_cast<float>(mid), 2.0f);
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
    quantize_blocks(quant_table(is_signed), x.data(), n, codes.data(), absmax.data());
    dequantize_blocks(quant_table(is_signed), codes.data(), absmax.data(), n, back.data());
    for (int64_t i = 0; i < n; ++i) {
      const int c = codes[i];
      const float a = absmax[i / kQuantBlock];
      const double gap = std::max(c > 0 ? m[c] - m[c - 1] : 0.0f, c < 255 ? m[c + 1] - m[c] : 0.0f);
      ASSERT_LE(std::abs(back[i] - x[i]), (gap / 2 + 1e-7) * a) << (is_signed ? "signed " : "unsigned ") << i;
    }
    EXPECT_EQ(absmax[3], std::abs(*std::max_element(x.begin() + 3 * kQuantBlock, x.end(),
                                                    [](float p, float q) { return std::abs(p) < std::abs(q); })))
        << "the short last block's absmax";
  }
}

// Note [Second moment as its root]: a checkpoint from before it holds v's own codes; converted, its
// roots decode to the roots of what the old codes decoded to, within half the map's local gap at
// the new code (the round trip's bound above), and v itself is the square of that.
TEST(MomentLayout, PlainSecondMomentsOfOlderCheckpointsBecomeRoots) {
  const int64_t n = 2 * kQuantBlock + 77;
  const MomentLayout layout({{0, n, true}});
  const auto v = moment_like(n, false, 21);
  const auto& um = dynamic_map(false);
  std::vector<uint8_t> codes(n);
  std::vector<float> absmax(layout.num_absmax()), plain(n), root(n);
  quantize_blocks(quant_table(false), v.data(), n, codes.data(), absmax.data());  // what older checkpoints hold
  dequantize_blocks(quant_table(false), codes.data(), absmax.data(), n, plain.data());
  MomentBuffers mb;
  mb.exp_avg_sq_codes = codes.data();
  mb.exp_avg_sq_absmax = absmax.data();
  roots_from_plain_second_moments(layout, 0, n, mb);
  dequantize_blocks(quant_table(false), codes.data(), absmax.data(), n, root.data());
  for (int64_t i = 0; i < n; ++i) {
    const int c = codes[i];
    const double gap = std::max(c > 0 ? um[c] - um[c - 1] : 0.0f, c < 255 ? um[c + 1] - um[c] : 0.0f);
    ASSERT_LE(std::abs(root[i] - std::sqrt(plain[i])), (gap / 2 + 1e-7) * absmax[i / kQuantBlock]) << i;
  }
}

// Note [Quantizer buckets]: the bucketed search gives quantize_value's code for every map entry,
// every midpoint and the floats on either side of it, both edges of every bucket for both signs,
// special values, and 4 million random values over 40 decades; each bucket spans at most 1 entry.
// quantize_blocks (AVX-512 where the CPU has it) gives the same codes for the finite ones.
TEST(Moments8bit, BucketedSearchEqualsTheBinarySearch) {
  for (bool is_signed : {true, false}) {
    SCOPED_TRACE(is_signed ? "signed map" : "unsigned map");
    const QuantMap& m = dynamic_map(is_signed);
    const QuantTable& t = quant_table(is_signed);
    int widest = 0;
    for (int sign = 0; sign < 2; ++sign) {
      for (int b = 0; b < kNumBuckets; ++b) widest = std::max(widest, static_cast<int>(t.span[sign][b]));
    }
    EXPECT_EQ(widest, 1);
    std::vector<float> xs = {0.0f,
                             -0.0f,
                             1.0f,
                             -1.0f,
                             2.0f,
                             -2.0f,
                             1e-30f,
                             -1e-30f,
                             1e-45f,
                             5e-8f,
                             -5e-7f,
                             std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::max(),
                             std::nanf("")};
    for (int i = 0; i < 256; ++i) {
      xs.push_back(m[i]);
      if (i + 1 < 256) {
        const float mid = static_cast<float>((static_cast<double>(m[i]) + m[i + 1]) / 2);
        for (float x : {mid, std::nextafter(mid, -2.0f), std::nextafter(mid, 2.0f)}) xs.push_back(x);
      }
    }
    for (uint32_t e = 0; e < 256; ++e) {  // both edges of every bucket, every exponent, both signs
      for (uint32_t f = 0; f < (1u << kBucketMantissaBits); ++f) {
        const uint32_t first = (e << 23) | (f << (23 - kBucketMantissaBits));
        for (uint32_t u : {first, first - 1, first | 1u}) {
          for (uint32_t sign : {0u, 0x80000000u}) {
            float x;
            const uint32_t bits = (u & 0x7FFFFFFFu) | sign;
            std::memcpy(&x, &bits, 4);
            xs.push_back(x);
          }
        }
      }
    }
    std::mt19937 gen(17);
    std::uniform_real_distribution<double> exponent(-40.0, 0.1);
    for (int i = 0; i < 4000000; ++i) {
      const double mag = std::pow(10.0, exponent(gen));
      xs.push_back(static_cast<float>((gen() & 1) ? mag : -mag));
    }
    int64_t differ = 0;
    for (float x : xs) {
      if (quantize_with(t, x) != quantize_value(m, x) && ++differ <= 5) {
        ADD_FAILURE() << "x = " << x << ": bucketed " << int(quantize_with(t, x)) << ", binary search "
                      << int(quantize_value(m, x));
      }
    }
    EXPECT_EQ(differ, 0) << "of " << xs.size();
    // quantize_blocks (its AVX-512 form where the CPU has it) on the finite values, in blocks:
    // each code is the binary search's for the value divided by its block's absmax.
    std::vector<float> finite;
    for (float x : xs) {
      if (std::isfinite(x) && std::fabs(x) <= 2.0f) finite.push_back(x);
    }
    const auto n = static_cast<int64_t>(finite.size());
    std::vector<uint8_t> codes(n);
    std::vector<float> absmax((n + kQuantBlock - 1) / kQuantBlock);
    quantize_blocks(t, finite.data(), n, codes.data(), absmax.data());
    int64_t block_differ = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float div = absmax[i / kQuantBlock] > 0 ? absmax[i / kQuantBlock] : 1.0f;
      block_differ += codes[i] != quantize_value(m, finite[i] / div);
    }
    EXPECT_EQ(block_differ, 0) << "quantize_blocks, of " << n;
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

// One step of AdamW with 8-bit moments against the same algorithm in float64: dequantize (the second
// moment from its root, Note [Second moment as its root]), update (decoupled decay, bias
// correction), and quantize with new absmax values. The parameters agree to
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
  quantize_blocks(quant_table(true), m0.data(), n, mc.data(), ma.data());
  quantize_second_moments(v0.data(), n, vc.data(), va.data());

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
    const double root = static_cast<double>(um[vc[i]]) * va[i / kQuantBlock];
    const double v = root * root;
    m_ref[i] = s.beta1 * m + (1 - s.beta1) * g;
    v_ref[i] = s.beta2 * v + (1 - s.beta2) * g * g;
    const double p = param[i] * (1 - s.lr * s.weight_decay);
    p_ref[i] = p - s.lr / bc1 * m_ref[i] / (std::sqrt(v_ref[i]) / std::sqrt(bc2) + s.eps);
  }
  update_contiguous(s, n, param.data(), mc.data(), ma.data(), vc.data(), va.data(), grad.data(), HostGradType::kFloat32,
                    nullptr);

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
    for (int64_t i = lo; i < hi; ++i)
      m_abs = std::max(m_abs, std::abs(m_ref[i])), v_abs = std::max(v_abs, std::sqrt(v_ref[i]));
    EXPECT_NEAR(ma[b], m_abs, 1e-6 * m_abs) << "first moment absmax, block " << b;
    EXPECT_NEAR(va[b], v_abs, 1e-6 * v_abs) << "second moment's root absmax, block " << b;
    for (int64_t i = lo; i < hi; ++i) {
      const int mw = nearest(sm, m_ref[i] / m_abs), vw = nearest(um, std::sqrt(v_ref[i]) / v_abs);
      m_differ += mc[i] != mw;
      v_differ += vc[i] != vw;
      ASSERT_LE(std::abs(mc[i] - mw), 1) << "first moment code " << i;
      ASSERT_LE(std::abs(vc[i] - vw), 1) << "second moment code " << i;
    }
  }
  EXPECT_LE(m_differ, n / 500) << "first-moment codes off by one";
  EXPECT_LE(v_differ, n / 500) << "second-moment codes off by one";
  std::printf(
      "[ measured ] 8-bit update vs float64: parameters within %.2f rounding units; codes off by one: "
      "first moment %lld, second %lld of %lld\n",
      worst, static_cast<long long>(m_differ), static_cast<long long>(v_differ), static_cast<long long>(n));
}

// Note [Second moment as its root]: in one block, one gradient of 1 and the rest 1.7e-4 (v's ratio
// 2.9e-8, under half the map's smallest step of 1e-7: quantized as v it decoded to 0 and the small ones
// moved by m / eps, ~1e4 times their fp32 step). With roots every element's move over three steps
// is its fp32 move to within the maps' resolution at 1e-4 of the absmax (2 fraction bits there:
// at most a factor of ~1.5 either way for m, less for sqrt(v)); the bound checked is a factor 2.
TEST(Moments8bit, SmallGradientsBesideALargeOneMoveAsWithFp32Moments) {
  const int64_t n = kQuantBlock;
  std::vector<float> grad(n, 1.7e-4f);  // between two map entries
  grad[0] = 1.0f;
  std::vector<float> p8(n, 0.5f), p32(n, 0.5f), m32(n, 0.0f), v32(n, 0.0f);
  std::vector<uint8_t> mc(n, 0), vc(n, 0);
  std::vector<float> ma(1, 0.0f), va(1, 0.0f);
  quantize_blocks(quant_table(true), m32.data(), n, mc.data(), ma.data());
  quantize_second_moments(v32.data(), n, vc.data(), va.data());
  CpuAdamWStep s;
  s.lr = 1e-3;
  for (s.step = 1; s.step <= 3; ++s.step) {
    update_contiguous(s, n, p8.data(), mc.data(), ma.data(), vc.data(), va.data(), grad.data(), HostGradType::kFloat32,
                      nullptr);
    cpu_adamw_update(s, n, p32.data(), m32.data(), v32.data(), grad.data(), HostGradType::kFloat32, nullptr);
  }
  double worst = 1;
  for (int64_t i = 0; i < n; ++i) {
    const double ratio = (p8[i] - 0.5) / (p32[i] - 0.5);
    worst = std::max(worst, std::max(ratio, 1 / ratio));
    ASSERT_GT(ratio, 0.5) << i;
    ASSERT_LT(ratio, 2.0) << i;
  }
  std::printf("[ measured ] 8-bit vs fp32 moments, gradients 1 and 1.7e-4 in one block: moves within a factor %.3f\n",
              worst);
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
    quantize_blocks(quant_table(true), moment_like(n, true, 8).data(), n, mc[k].data(), ma[k].data());
    quantize_blocks(quant_table(false), moment_like(n, false, 9).data(), n, vc[k].data(), va[k].data());
  }
  CpuAdamWStep s;
  s.lr = 3e-4;
  s.step = 2;
  update_contiguous(s, n, p[0].data(), mc[0].data(), ma[0].data(), vc[0].data(), va[0].data(), grad.data(),
                    HostGradType::kFloat32, nullptr);
  update_contiguous(s, n, p[1].data(), mc[1].data(), ma[1].data(), vc[1].data(), va[1].data(), grad_bf16.data(),
                    HostGradType::kBFloat16, out.data());
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

// Note [Moment blocks] by hand: A = [0, 5000) 8-bit with decay, B = [5000, 5100) fp32,
// C = [5100, 9196) 8-bit (exactly kMinQuantNumel values) without decay.
TEST(MomentLayout, CutsTheGridAtParameterBoundaries) {
  const MomentLayout layout({{5100, 4096, false}, {0, 5000, true}, {5000, 100, false}});  // any order
  const auto all = layout.blocks(0, 9196);
  const std::vector<std::vector<int64_t>> want = {// begin, state, len, quantized, weight_decay
                                                  {0, 0, 2048, 1, 1},   {2048, 1, 2048, 1, 1}, {4096, 2, 904, 1, 1},
                                                  {5000, 0, 100, 0, 0}, {5100, 3, 1044, 1, 0}, {6144, 4, 2048, 1, 0},
                                                  {8192, 5, 1004, 1, 0}};
  ASSERT_EQ(all.size(), want.size());
  for (size_t k = 0; k < all.size(); ++k) {
    const auto& b = all[k];
    EXPECT_EQ((std::vector<int64_t>{b.begin, b.state, b.len, b.quantized, b.weight_decay}), want[k]) << "block " << k;
  }
  EXPECT_EQ(layout.num_absmax(), 6);
  EXPECT_EQ(layout.num_fp32(), 100);
  EXPECT_EQ(layout.absmax_before(6144), 4);
  EXPECT_EQ(layout.fp32_before(6144), 100);
  EXPECT_EQ(layout.fp32_before(4096), 0);
  EXPECT_EQ(layout.absmax_before(10240), 6) << "past the last parameter (padding)";
  EXPECT_THROW(layout.absmax_before(5000), std::logic_error) << "off the grid";
  EXPECT_EQ(layout.absmax_block(4).begin, 6144);
  EXPECT_EQ(layout.absmax_block(2).len, 904);
  EXPECT_THROW(layout.absmax_block(6), std::out_of_range);
  // A range on the grid: positions and state indices relative to it.
  const auto part = layout.blocks(4096, 8192);
  ASSERT_EQ(part.size(), 4u);
  EXPECT_EQ(part[0].begin, 0);
  EXPECT_EQ(part[0].state, 0);  // absmax 2, less the 2 before 4096
  EXPECT_EQ(part[1].begin, 904);
  EXPECT_EQ(part[1].state, 0);  // the first fp32 value of the range
  EXPECT_EQ(part[3].begin, 2048);
  EXPECT_EQ(part[3].state, 2);
}

// The update over a layout's blocks (8-bit and fp32 moments, with and without decay) is, block by
// block, dequantize -> the fp32 AdamW of cpu_adamw_update -> quantize: the same bits as running the
// fp32 path over the dense dequantized moments (each parameter with its own weight decay) and
// quantizing the result with quantize_moments. Checks the block bookkeeping; the arithmetic is
// checked against float64 above.
TEST(MomentLayout, UpdateOverMixedBlocksIsTheFp32PathBetweenDequantizeAndQuantize) {
  const int64_t a = 3 * kQuantBlock + 515, b = 700, c = 2 * kQuantBlock + 100, d = 3000, n = a + b + c + d;
  const std::vector<MomentLayout::Param> params = {
      {0, a, true}, {a, b, false}, {a + b, c, false}, {a + b + c, d, true}};
  const MomentLayout layout(params);
  const auto blocks = layout.blocks(0, n);
  std::vector<uint8_t> mc(n), vc(n);
  std::vector<float> ma(layout.num_absmax()), va(ma.size()), m32(layout.num_fp32()), v32(m32.size());
  MomentBuffers mb;
  mb.exp_avg_codes = mc.data(), mb.exp_avg_sq_codes = vc.data(), mb.exp_avg_absmax = ma.data();
  mb.exp_avg_sq_absmax = va.data(), mb.exp_avg = m32.data(), mb.exp_avg_sq = v32.data();
  const auto m0 = moment_like(n, true, 11), v0 = moment_like(n, false, 12), grad = moment_like(n, true, 13);
  quantize_moments(layout, 0, n, m0.data(), v0.data(), mb);
  // The reference: dense dequantized moments, the fp32 update per parameter, quantized.
  std::vector<float> m(n), v(n), p_ref = moment_like(n, true, 14);
  auto p = p_ref;
  dequantize_moments(layout, 0, n, mb, m.data(), v.data());
  CpuAdamWStep s;
  s.lr = 1e-3;
  s.weight_decay = 0.1;
  s.step = 4;
  for (const auto& q : params) {
    CpuAdamWStep sq = s;
    sq.weight_decay = q.weight_decay ? s.weight_decay : 0.0;
    cpu_adamw_update(sq, q.numel, p_ref.data() + q.offset, m.data() + q.offset, v.data() + q.offset,
                     grad.data() + q.offset, HostGradType::kFloat32, nullptr);
  }
  std::vector<uint8_t> mc_ref(n), vc_ref(n);
  std::vector<float> ma_ref(ma.size()), va_ref(ma.size()), m32_ref(m32.size()), v32_ref(m32.size());
  MomentBuffers ref;
  ref.exp_avg_codes = mc_ref.data(), ref.exp_avg_sq_codes = vc_ref.data(), ref.exp_avg_absmax = ma_ref.data();
  ref.exp_avg_sq_absmax = va_ref.data(), ref.exp_avg = m32_ref.data(), ref.exp_avg_sq = v32_ref.data();
  quantize_moments(layout, 0, n, m.data(), v.data(), ref);

  adamw_step_cpu(s, blocks.data(), static_cast<int64_t>(blocks.size()), p.data(), mb, grad.data(),
                 HostGradType::kFloat32, nullptr);
  EXPECT_EQ(p, p_ref);
  EXPECT_EQ(mc, mc_ref);
  EXPECT_EQ(vc, vc_ref);
  EXPECT_EQ(ma, ma_ref);
  EXPECT_EQ(va, va_ref);
  EXPECT_EQ(m32, m32_ref);
  EXPECT_EQ(v32, v32_ref);
  // The fp32 moments are the small parameters' values exactly (b, then d), not quantized.
  EXPECT_EQ(m32_ref[0], m[a]);
  EXPECT_EQ(m32_ref[b], m[a + b + c]);
}

// ShardedOptimizer's fp32 moments on the GPU (dense over the shard): each parameter's span cut at the
// multiples of kQuantBlock, so the blocks inside a span are whole and on the grid (the kernel's
// vector path) and the pieces at span ends are short; the update over those blocks is
// cpu_adamw_update over each span, bit for bit.
TEST(MomentLayout, DenseFp32BlocksCutSpansOnTheGrid) {
  const int64_t g = kQuantBlock;
  const std::vector<ParamSpan> spans = {{0, 2 * g + 5, true},
                                        {2 * g + 5, 2 * g + 705, false},
                                        {2 * g + 705, 5 * g + 100, true},
                                        {5 * g + 100, 5 * g + 100, false}};  // empty: no block
  const auto blocks = dense_fp32_blocks(spans);
  struct Want {
    int64_t begin, len;
    uint16_t decay;
  };
  const Want want[] = {{0, g, 1},     {g, g, 1},     {2 * g, 5, 1},  {2 * g + 5, 700, 0}, {2 * g + 705, g - 705, 1},
                       {3 * g, g, 1}, {4 * g, g, 1}, {5 * g, 100, 1}};
  ASSERT_EQ(blocks.size(), std::size(want));
  for (size_t k = 0; k < blocks.size(); ++k) {
    SCOPED_TRACE("block " + std::to_string(k));
    EXPECT_EQ(blocks[k].begin, want[k].begin);
    EXPECT_EQ(blocks[k].state, want[k].begin);  // dense moments: a block's are at its own offset
    EXPECT_EQ(blocks[k].len, want[k].len);
    EXPECT_EQ(blocks[k].quantized, 0);
    EXPECT_EQ(blocks[k].weight_decay, want[k].decay);
  }
  EXPECT_THROW(dense_fp32_blocks({{0, 10, true}, {5, 20, false}}), std::logic_error);
  EXPECT_THROW(dense_fp32_blocks({{10, 5, true}}), std::logic_error);

  const int64_t n = 5 * g + 100;
  std::mt19937 gen(11);
  std::normal_distribution<float> normal;
  auto randn = [&](float scale) {
    std::vector<float> x(n);
    for (auto& v : x) v = normal(gen) * scale;
    return x;
  };
  auto p = randn(0.02f), grad = randn(1e-3f), m = randn(1e-3f), v = randn(1e-3f);
  for (auto& x : v) x *= x;
  auto p_ref = p, m_ref = m, v_ref = v;
  std::vector<uint16_t> out(n), out_ref(n);
  CpuAdamWStep s;
  s.lr = 6e-4;
  s.weight_decay = 0.1;
  s.step = 5;
  s.grad_scale = 0.3;
  for (const ParamSpan& span : spans) {
    CpuAdamWStep ss = s;
    ss.weight_decay = span.weight_decay ? s.weight_decay : 0.0;
    const int64_t b = span.begin;
    cpu_adamw_update(ss, span.end - b, p_ref.data() + b, m_ref.data() + b, v_ref.data() + b, grad.data() + b,
                     HostGradType::kFloat32, out_ref.data() + b);
  }
  MomentBuffers mb;
  mb.exp_avg = m.data();
  mb.exp_avg_sq = v.data();
  adamw_step_cpu(s, blocks.data(), static_cast<int64_t>(blocks.size()), p.data(), mb, grad.data(),
                 HostGradType::kFloat32, out.data());
  EXPECT_EQ(p, p_ref);
  EXPECT_EQ(m, m_ref);
  EXPECT_EQ(v, v_ref);
  EXPECT_EQ(out, out_ref);
}

}  // namespace
}  // namespace gpt2::optim
