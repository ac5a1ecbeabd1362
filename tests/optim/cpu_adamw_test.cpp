// CPU AdamW for optimizer offload against ATen's fused CPU AdamW (an independent implementation),
// and the host thread pool.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "optim/cpu_adamw.h"

namespace gpt2::optim {
namespace {

constexpr int64_t kN = 10007;  // odd: every vector width leaves a tail

// Max over elements of |got - want| / |want|, where |want| is floored at 1e-3 of the tensor's
// largest magnitude: a parameter that an update happens to bring near zero is judged against the
// scale of the update rather than its own (tiny) size.
double max_rel_error(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  const double floor = 1e-3 * w.abs().max().item<double>();
  return ((g - w).abs() / w.abs().clamp_min(floor)).max().item<double>();
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t* bf16_bits(at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); }

struct AdamCase {
  double weight_decay;
  bool bf16_grads;
  double beta1 = 0.9;  // 1 - beta1 >= 0.5 takes the other form of ATen's lerp
};

class CpuAdamWVsATen : public ::testing::TestWithParam<AdamCase> {};

// Five steps from zero moments, then five more from step 1000 on (bias correction near 1), with
// grad_scale != 1; ATen gets the gradients pre-multiplied by grad_scale.
TEST_P(CpuAdamWVsATen, MatchesFusedAdamW) {
  const AdamCase c = GetParam();
  at::manual_seed(1234);
  const double beta1 = c.beta1, beta2 = 0.95, eps = 1e-8, grad_scale = 0.37;
  at::Tensor ref_p = at::randn({kN}), ref_m = at::zeros({kN}), ref_v = at::zeros({kN});
  at::Tensor steps = at::zeros({}, at::kFloat);
  at::Tensor p = ref_p.clone(), m = ref_m.clone(), v = ref_v.clone();
  const at::Tensor p0 = ref_p.clone();
  at::Tensor p_bf16 = at::empty({kN}, at::kBFloat16);
  for (int s = 1; s <= 10; ++s) {
    if (s == 6) steps.fill_(999);  // ATen counts on from here; ours is told the step explicitly
    const double lr = 1e-3 * s;
    const at::Tensor g = at::randn({kN}) * 3.0;
    at::Tensor g_bf16 = g.to(at::kBFloat16);
    const at::Tensor g_used = c.bf16_grads ? g_bf16.to(at::kFloat) : g;
    at::Tensor ref_g = g_used * grad_scale;
    steps.add_(1);
    at::_fused_adamw_({ref_p}, {ref_g}, {ref_m}, {ref_v}, /*max_exp_avg_sqs=*/{}, {steps}, lr, beta1, beta2,
                      c.weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false,
                      /*grad_scale=*/std::nullopt, /*found_inf=*/std::nullopt);

    CpuAdamWStep st;
    st.lr = lr;
    st.beta1 = beta1;
    st.beta2 = beta2;
    st.eps = eps;
    st.weight_decay = c.weight_decay;
    st.step = static_cast<int64_t>(steps.item<float>());
    st.grad_scale = grad_scale;
    const void* grad = c.bf16_grads ? static_cast<const void*>(bf16_bits(g_bf16)) : g.data_ptr<float>();
    cpu_adamw_update(st, kN, p.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), grad,
                     c.bf16_grads ? HostGradType::kBFloat16 : HostGradType::kFloat32, bf16_bits(p_bf16));

    EXPECT_LE(max_rel_error(p, ref_p), 1e-6) << "param, step " << st.step;
    EXPECT_LE(max_rel_error(m, ref_m), 1e-6) << "exp_avg, step " << st.step;
    EXPECT_LE(max_rel_error(v, ref_v), 1e-6) << "exp_avg_sq, step " << st.step;
    // The bf16 copy is exactly what torch's conversion makes of our fp32 param.
    const at::Tensor want_bf16 = p.to(at::kBFloat16);
    EXPECT_EQ(std::memcmp(p_bf16.data_ptr(), want_bf16.data_ptr(), kN * sizeof(uint16_t)), 0) << "step " << st.step;
  }
  // The update moved the parameters (so the comparison above was not vacuous).
  EXPECT_GT((p - p0).abs().max().item<float>(), 1e-3f);
}

INSTANTIATE_TEST_SUITE_P(Cases, CpuAdamWVsATen,
                         ::testing::Values(AdamCase{0.1, false}, AdamCase{0.0, false}, AdamCase{0.1, true},
                                           AdamCase{0.0, true}, AdamCase{0.1, false, 0.3}, AdamCase{0.1, true, 0.3}),
                         [](const ::testing::TestParamInfo<AdamCase>& info) {
                           return std::string(info.param.bf16_grads ? "Bf16Grad" : "Fp32Grad") +
                                  (info.param.weight_decay != 0 ? "Decay" : "NoDecay") +
                                  (info.param.beta1 < 0.5 ? "SmallBeta1" : "");
                         });

// Split over a pool in aligned ranges, the update is bitwise the single-call update.
TEST(CpuAdamW, PoolSplitMatchesOneCall) {
  at::manual_seed(7);
  at::Tensor p = at::randn({kN}), m = at::randn({kN}) * 0.1, v = at::rand({kN}) * 0.01;
  at::Tensor g = at::randn({kN}).to(at::kBFloat16);
  at::Tensor p2 = p.clone(), m2 = m.clone(), v2 = v.clone();
  at::Tensor out = at::empty({kN}, at::kBFloat16), out2 = at::empty({kN}, at::kBFloat16);
  CpuAdamWStep st;
  st.lr = 3e-4;
  st.weight_decay = 0.1;
  st.step = 17;
  st.grad_scale = 0.5;
  cpu_adamw_update(st, kN, p.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), bf16_bits(g),
                   HostGradType::kBFloat16, bf16_bits(out));
  HostThreadPool pool(3);
  const uint16_t* gb = bf16_bits(g);
  float *pp = p2.data_ptr<float>(), *mp = m2.data_ptr<float>(), *vp = v2.data_ptr<float>();
  uint16_t* op = bf16_bits(out2);
  pool.parallel_for(kN, 16, [&](int64_t b, int64_t e) {
    cpu_adamw_update(st, e - b, pp + b, mp + b, vp + b, gb + b, HostGradType::kBFloat16, op + b);
  });
  EXPECT_TRUE(at::equal(p, p2));
  EXPECT_TRUE(at::equal(m, m2));
  EXPECT_TRUE(at::equal(v, v2));
  EXPECT_EQ(std::memcmp(out.data_ptr(), out2.data_ptr(), kN * sizeof(uint16_t)), 0);
}

// bf16 output: ties round to even, NaN stays NaN, infinities and signed zero survive.
TEST(CpuAdamW, Bf16OutputRounding) {
  // With lr = 0 and no decay, the update leaves param unchanged and only converts it.
  std::vector<float> p = {1.0f,
                          from_bits(0x3F808000u),  // tie, even below: 1.0
                          from_bits(0x3F818000u),  // tie, odd below: rounds up
                          from_bits(0x3F808001u),  // above the tie: rounds up
                          -0.0f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          from_bits(0x7F7FFFFFu),  // max float rounds to inf
                          1e-40f};                 // subnormal: 0x000116C2
  const int64_t n = static_cast<int64_t>(p.size());
  std::vector<float> m(n, 0.0f), v(n, 0.0f), g(n, 0.0f);
  std::vector<uint16_t> out(n, 0);
  CpuAdamWStep st;  // lr = 0
  cpu_adamw_update(st, n, p.data(), m.data(), v.data(), g.data(), HostGradType::kFloat32, out.data());
  const std::vector<uint16_t> want = {0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7F80, 0x0001};
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(out[i], want[i]) << i;
  at::Tensor ref = at::from_blob(p.data(), {n}, at::kFloat).to(at::kBFloat16);
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(p[i])) continue;  // torch's vector and scalar paths disagree on NaN bits
    EXPECT_EQ(out[i], reinterpret_cast<const uint16_t*>(ref.data_ptr<at::BFloat16>())[i]) << i;
  }
}

TEST(CpuAdamW, RejectsStepZero) {
  float p = 1, m = 0, v = 0, g = 1;
  CpuAdamWStep st;
  st.step = 0;
  EXPECT_THROW(cpu_adamw_update(st, 1, &p, &m, &v, &g, HostGradType::kFloat32, nullptr), std::invalid_argument);
}

TEST(CpuAdamW, ReportsIsa) {
  const std::string isa = cpu_adamw_isa();
  EXPECT_TRUE(isa == "avx512" || isa == "avx2" || isa == "baseline") << isa;
}

// ---------------------------------------------------------------------------------------------
// HostThreadPool

TEST(HostThreadPool, CoversEveryIndexOnceInAlignedRanges) {
  HostThreadPool pool(3);
  ASSERT_EQ(pool.num_threads(), 3);
  for (const int64_t align : {int64_t{1}, int64_t{16}, int64_t{7}}) {
    for (const int64_t n : {int64_t{1}, int64_t{2}, int64_t{5}, int64_t{17}, int64_t{1000}, int64_t{10007}}) {
      std::vector<std::atomic<int>> hits(n);
      std::mutex mu;
      std::vector<std::pair<int64_t, int64_t>> ranges;
      std::set<std::thread::id> threads;
      pool.parallel_for(n, align, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
        std::lock_guard<std::mutex> lock(mu);
        ranges.emplace_back(b, e);
        threads.insert(std::this_thread::get_id());
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n " << n << " align " << align << " i " << i;
      EXPECT_LE(ranges.size(), 3u);
      EXPECT_EQ(ranges.size(), threads.size());  // one range per thread
      EXPECT_EQ(ranges.size(), static_cast<size_t>(std::min<int64_t>(3, (n + align - 1) / align)));
      for (const auto& [b, e] : ranges) {
        EXPECT_LT(b, e);
        EXPECT_EQ(b % align, 0) << "n " << n << " align " << align;
        if (e != n) {
          EXPECT_EQ(e % align, 0) << "n " << n << " align " << align;
        }
      }
    }
  }
}

TEST(HostThreadPool, ZeroAndTinyN) {
  HostThreadPool pool(3);
  int calls = 0;
  pool.parallel_for(0, 16, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
  std::atomic<int> sum{0};
  pool.parallel_for(2, 1, [&](int64_t b, int64_t e) { sum += static_cast<int>(e - b); });  // n < threads
  EXPECT_EQ(sum.load(), 2);
  std::vector<std::pair<int64_t, int64_t>> one;
  pool.parallel_for(5, 16, [&](int64_t b, int64_t e) { one.emplace_back(b, e); });  // one block
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0], std::make_pair(int64_t{0}, int64_t{5}));
}

TEST(HostThreadPool, ExceptionReachesCallerAndPoolStaysUsable) {
  HostThreadPool pool(3);
  const int64_t n = 3000;
  // Thrown on a worker's range (the last one) ...
  EXPECT_THROW(pool.parallel_for(n, 1,
                                 [&](int64_t, int64_t e) {
                                   if (e == n) throw std::runtime_error("worker");
                                 }),
               std::runtime_error);
  // ... on the caller's range (the first one) ...
  try {
    pool.parallel_for(n, 1, [&](int64_t b, int64_t) {
      if (b == 0) throw std::out_of_range("caller");
    });
    ADD_FAILURE() << "no exception";
  } catch (const std::out_of_range& e) {
    EXPECT_STREQ(e.what(), "caller");
  }
  // ... on every range: exactly one reaches the caller.
  EXPECT_THROW(pool.parallel_for(n, 1, [&](int64_t, int64_t) { throw std::logic_error("all"); }), std::logic_error);
  std::atomic<int64_t> covered{0};
  for (int rep = 0; rep < 200; ++rep) pool.parallel_for(n, 8, [&](int64_t b, int64_t e) { covered += e - b; });
  EXPECT_EQ(covered.load(), 200 * n);
}

TEST(HostThreadPool, DefaultSizeAndSingleThread) {
  HostThreadPool def(0);
  EXPECT_EQ(def.num_threads(), static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  HostThreadPool one(1);
  std::vector<std::pair<int64_t, int64_t>> ranges;
  one.parallel_for(100, 16, [&](int64_t b, int64_t e) { ranges.emplace_back(b, e); });
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0], std::make_pair(int64_t{0}, int64_t{100}));
}

}  // namespace
}  // namespace gpt2::optim
