// AdamW, the LR schedule and clipping against hand-computed float64 references.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/sharded_optimizer.h"
#include "parallel/flat_layout.h"
#include "tests/optim/one_rank.h"

namespace gpt2::optim {
namespace {

using test::OneRank;

// Decoupled AdamW written out element by element in double (Loshchilov & Hutter, Algorithm 2).
struct ReferenceAdamW {
  std::vector<double> p, m, v;
  double b1, b2, eps, wd;
  int t = 0;
  void step(const std::vector<double>& g, double lr) {
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      const double mhat = m[i] / (1 - std::pow(b1, t));
      const double vhat = v[i] / (1 - std::pow(b2, t));
      p[i] -= lr * wd * p[i];
      p[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
  }
};

std::vector<double> doubles(const torch::Tensor& t) {
  auto c = t.detach().to(torch::kDouble).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

// ShardedOptimizer in fp32 against AdamW in float64, with GPT-2's split: weight decay on 2-D tensors,
// none on 1-D ones.
// Note [fp32 AdamW tolerance]: round to nearest errs by at most 2^-24 relative per operation. A
// step rounds p twice (p (1 - lr wd), then p + u): 2 * 2^-24 |p|. The update u = lr m^ / (sqrt(v^) +
// eps) takes ~8 fp32 operations, and the moments carry about one rounding more per step (m by its
// lerp, v by its fma): at most (8 + 2t) 2^-24 |u| at step t. |u| <= lr: by Cauchy-Schwarz
// |m^| / sqrt(v^) <= sqrt(sum_k a_k^2 / b_k) with a_k = (1-b1) b1^k / (1-b1^t), b_k = (1-b2) b2^k /
// (1-b2^t), which is 1.00 at t = 5 for b1 = 0.9, b2 = 0.95 (exactly 1 at t = 1). Over T steps the
// parameters drift from float64's by at most T 2^-24 (2 |p| + (8 + 2T) lr_max): the bound below.
TEST(ShardedOptimizer, MatchesFloat64ReferenceOverSteps) {
  torch::manual_seed(0);
  auto w = torch::randn({4, 5}).set_requires_grad(true);  // decayed
  auto b = torch::randn({5}).set_requires_grad(true);     // not decayed
  const std::vector<torch::Tensor> params{w, b};
  const parallel::FlatLayout layout(params, 1);
  auto grads = torch::zeros({layout.padded});
  OneRank one;
  ShardedOptimizer::Options options;
  options.adamw.weight_decay = 0.1;
  ShardedOptimizer opt(params, layout, grads, one, options);
  ReferenceAdamW rw{doubles(w), std::vector<double>(20), std::vector<double>(20), 0.9, 0.95, 1e-8, 0.1};
  ReferenceAdamW rb{doubles(b), std::vector<double>(5), std::vector<double>(5), 0.9, 0.95, 1e-8, 0.0};
  const int steps = 5;
  double lr_max = 0;
  for (int s = 0; s < steps; ++s) {
    const double lr = 1e-2 * (s + 1);
    lr_max = std::max(lr_max, lr);
    grads.normal_();
    opt.step(lr);
    rw.step(doubles(grads.narrow(0, layout.offset[0], 20)), lr);
    rb.step(doubles(grads.narrow(0, layout.offset[1], 5)), lr);
  }
  auto tol = [&](double p) { return steps * std::ldexp(1.0, -24) * (2 * std::abs(p) + (8 + 2 * steps) * lr_max); };
  const auto pw = doubles(w), pb = doubles(b);
  for (size_t i = 0; i < pw.size(); ++i) EXPECT_NEAR(pw[i], rw.p[i], tol(rw.p[i])) << i;
  for (size_t i = 0; i < pb.size(); ++i) EXPECT_NEAR(pb[i], rb.p[i], tol(rb.p[i])) << i;
  EXPECT_EQ(opt.state().adam_step, steps);
  // Two fp32 moments per parameter (the padding has none).
  EXPECT_EQ(opt.state_bytes(), 2 * layout.total * 4);
}

TEST(LrSchedule, CosineHandComputedValues) {
  LrSchedule s{1.0, 0.1, 10, 110};
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);      // (0 + 1) / 10
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);      // end of warmup
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);     // cosine starts at the peak
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);  // half way: min + (max - min) / 2
  EXPECT_NEAR(s.at(35), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-12);
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);
  EXPECT_DOUBLE_EQ(s.at(500), 0.1);
  LrSchedule no_warmup{1.0, 0.0, 0, 4};
  EXPECT_DOUBLE_EQ(no_warmup.at(0), 1.0);
  EXPECT_NEAR(no_warmup.at(2), 0.5, 1e-12);
}

// Warmup-stable-decay: 10 warmup steps, the peak until the last 20% of 110 steps (22 steps, from
// step 88), then a straight line to min_lr at step 110.
TEST(LrSchedule, WsdHandComputedValues) {
  LrSchedule s{1.0, 0.1, 10, 110, LrShape::kWsd, 0.2};
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);  // warmup as cosine's
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_EQ(s.decay_start(), 88);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_DOUBLE_EQ(s.at(87), 1.0);                        // still stable
  EXPECT_DOUBLE_EQ(s.at(88), 1.0);                        // the decay's first step: progress 0
  EXPECT_NEAR(s.at(99), 1.0 - 0.9 * 11.0 / 22.0, 1e-12);  // half way down: 0.55
  EXPECT_NEAR(s.at(109), 1.0 - 0.9 * 21.0 / 22.0, 1e-12);
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);
  // A decay longer than what follows the warmup starts when the warmup ends.
  LrSchedule all_decay{1.0, 0.0, 10, 20, LrShape::kWsd, 1.0};
  EXPECT_EQ(all_decay.decay_start(), 10);
  EXPECT_NEAR(all_decay.at(15), 0.5, 1e-12);
  // decay_frac 0: constant after warmup, min_lr only past max_steps.
  LrSchedule no_decay{1.0, 0.0, 0, 20, LrShape::kWsd, 0.0};
  EXPECT_DOUBLE_EQ(no_decay.at(19), 1.0);
  EXPECT_DOUBLE_EQ(no_decay.at(20), 0.0);
}

// 3 and 4 (and a parameter without a gradient, which counts as 0): norm 5, exactly.
TEST(GradClip, NormAndScaling) {
  auto a = torch::zeros({2}).set_requires_grad(true);
  auto b = torch::zeros({1}).set_requires_grad(true);
  auto c = torch::zeros({1}).set_requires_grad(true);  // no gradient: counts as 0
  const std::vector<torch::Tensor> params{a, b, c};
  const parallel::FlatLayout layout(params, 1);
  auto grads = torch::zeros({layout.padded});
  grads.narrow(0, layout.offset[0], 2).copy_(torch::tensor({3.0f, 0.0f}));
  grads.narrow(0, layout.offset[1], 1).fill_(4.0);
  OneRank one;
  ShardedOptimizer::Options options;
  options.adamw.weight_decay = 0.0;
  ShardedOptimizer opt(params, layout, grads, one, options);
  auto norm = opt.clip_grad_norm(1.0);
  EXPECT_EQ(norm.item<double>(), 5.0);
  const float coef = static_cast<float>(1.0 / (5.0 + 1e-6));
  EXPECT_EQ(grads[layout.offset[0]].item<float>(), 3.0f * coef);
  EXPECT_EQ(grads[layout.offset[1]].item<float>(), 4.0f * coef);
  // Below the threshold nothing changes.
  auto before = grads.clone();
  opt.clip_grad_norm(10.0);
  EXPECT_TRUE(torch::equal(before, grads));
}

// bf16 parameters with fp32 masters: the masters follow exactly the trajectory fp32 AdamW takes
// from the same start and gradients, and the parameters are the masters rounded to bf16 after
// every step (not bf16 AdamW updates, which would lose updates smaller than bf16's resolution).
TEST(ShardedOptimizer, Bf16ParametersKeepFp32Masters) {
  torch::manual_seed(3);
  auto w = torch::randn({7, 5}).to(torch::kBFloat16).set_requires_grad(true);
  auto b = torch::randn({5}).to(torch::kBFloat16).set_requires_grad(true);
  const std::vector<torch::Tensor> params{w, b};
  const parallel::FlatLayout layout(params, 1);
  auto grads = torch::zeros({layout.padded}, torch::kFloat);
  OneRank one;
  ShardedOptimizer::Options options;
  options.adamw.weight_decay = 0.1;
  ShardedOptimizer opt(params, layout, grads, one, options);
  // Reference: fp32 AdamW (MatchesFloat64ReferenceOverSteps) over fp32 copies of the same start.
  auto w_ref = w.detach().to(torch::kFloat).set_requires_grad(true);
  auto b_ref = b.detach().to(torch::kFloat).set_requires_grad(true);
  const std::vector<torch::Tensor> ref_params{w_ref, b_ref};
  auto ref_grads = torch::zeros({layout.padded});
  ShardedOptimizer ref(ref_params, layout, ref_grads, one, options);
  for (int step = 0; step < 6; ++step) {
    grads.normal_(0, 1e-3);  // small: bf16 updates in place would round many of them away
    ref_grads.copy_(grads);
    opt.step(1e-3);
    ref.step(1e-3);
    ASSERT_EQ(w.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::equal(w.detach(), w_ref.detach().to(torch::kBFloat16))) << "step " << step;
    EXPECT_TRUE(torch::equal(b.detach(), b_ref.detach().to(torch::kBFloat16))) << "step " << step;
  }
  // Masters (fp32, 4 bytes) per element of the padded space + two moments (8 bytes) per parameter.
  EXPECT_EQ(opt.state_bytes(), layout.padded * 4 + layout.total * 8);
}

// Offload runs the CPU AdamW over host copies; it must give the same parameters, bit for bit, as
// the update without offload (the same cpu_adamw_update, split otherwise), for fp32 parameters and
// for bf16 parameters with bf16 gradients, across several chunks of the offload pipeline.
TEST(ShardedOptimizer, OffloadMatchesTheDevicePath) {
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    torch::manual_seed(4);
    auto w0 = torch::randn({33, 9}), b0 = torch::randn({9});
    auto make = [&] {
      return std::vector<torch::Tensor>{w0.to(dtype).set_requires_grad(true), b0.to(dtype).set_requires_grad(true)};
    };
    auto on_device = make(), offloaded = make();
    const parallel::FlatLayout layout(on_device, 1);
    auto grads = torch::zeros({layout.padded}, dtype);
    OneRank one;
    ShardedOptimizer::Options options;
    options.adamw.weight_decay = 0.1;
    ShardedOptimizer device_opt(on_device, layout, grads, one, options);
    options.offload = true;
    options.adamw.host_threads = 3;
    options.adamw.chunk_elements = 100;  // several chunks, boundaries inside parameters
    ShardedOptimizer host_opt(offloaded, layout, grads, one, options);
    EXPECT_EQ(host_opt.state_bytes(), 0);
    EXPECT_EQ(host_opt.host_state_bytes(), offload_host_bytes(layout.padded, layout.total, dtype, dtype, false));
    for (int step = 0; step < 5; ++step) {
      grads.copy_(torch::randn({layout.padded}) * 0.1);
      device_opt.step(2e-2);
      host_opt.step(2e-2);
    }
    for (size_t i = 0; i < on_device.size(); ++i) {
      EXPECT_TRUE(torch::equal(offloaded[i].detach(), on_device[i].detach())) << "parameter " << i;
    }
    EXPECT_TRUE(torch::equal(host_opt.state().master, device_opt.state().master)) << "masters";
  }
}

// fp16 loss-scale skip with offload: found_inf = 1 leaves everything as it was.
TEST(ShardedOptimizer, OffloadSkipsAStepOnFoundInf) {
  auto w = torch::randn({4, 4}).set_requires_grad(true);
  const std::vector<torch::Tensor> params{w};
  const parallel::FlatLayout layout(params, 1);
  auto grads = torch::ones({layout.padded});
  OneRank one;
  ShardedOptimizer::Options options;
  options.offload = true;
  ShardedOptimizer opt(params, layout, grads, one, options);
  const auto before = w.detach().clone();
  opt.step(1e-2, torch::ones({1}));
  EXPECT_TRUE(torch::equal(before, w.detach()));
  opt.step(1e-2, torch::zeros({1}));
  EXPECT_FALSE(torch::equal(before, w.detach()));
}

}  // namespace
}  // namespace gpt2::optim

namespace gpt2::optim {
namespace {

// The fp16 scaler: an injected inf skips the step (parameters, moments and step count untouched)
// and halves the scale; the next finite step is the step an unscaled AdamW would take; the scale
// doubles after growth_interval good steps.
TEST(LossScaler, SkipsAStepWithAnInjectedInfAndRecovers) {
  LossScaler scaler(true, torch::kCPU, {/*init_scale=*/1024.0, /*growth=*/2.0, /*backoff=*/0.5, /*growth_interval=*/3});
  auto w = torch::tensor({1.0f, -2.0f, 3.0f}).set_requires_grad(true);
  auto ref = torch::tensor({1.0f, -2.0f, 3.0f}).set_requires_grad(true);
  // A second parameter: the skip must apply to every tensor of the shard.
  auto other = torch::tensor({4.0f, 5.0f}).set_requires_grad(true);
  const std::vector<torch::Tensor> params{w, other}, ref_params{ref};
  const parallel::FlatLayout layout(params, 1), ref_layout(ref_params, 1);
  auto grads = torch::zeros({layout.padded}), ref_grads = torch::zeros({ref_layout.padded});
  OneRank one;
  ShardedOptimizer::Options options;
  options.adamw.weight_decay = 0.0;
  ShardedOptimizer opt(params, layout, grads, one, options);
  ShardedOptimizer ref_opt(ref_params, ref_layout, ref_grads, one, options);
  const auto true_grad = torch::tensor({0.5f, -0.25f, 1.0f});
  auto w_grad = grads.narrow(0, layout.offset[0], 3);
  grads.narrow(0, layout.offset[1], 2).fill_(1.0f);

  // Step 1: a scaled gradient with an inf in it.
  w_grad.copy_(true_grad * 1024.0f);
  w_grad[1] = std::numeric_limits<float>::infinity();
  auto found = scaler.unscale_and_check(opt.grad_shard(), nullptr);
  EXPECT_EQ(found.item<float>(), 1.0f);
  opt.step(0.1, found);
  scaler.update(found);
  EXPECT_TRUE(torch::equal(w.detach(), torch::tensor({1.0f, -2.0f, 3.0f})));  // skipped
  EXPECT_TRUE(torch::equal(other.detach(), torch::tensor({4.0f, 5.0f})));
  EXPECT_EQ(opt.state().adam_step, 0);
  EXPECT_EQ(scaler.scale(), 512.0);

  // Step 2: finite; must equal the reference's first step exactly.
  auto good_step = [&] {
    w_grad.copy_(true_grad * static_cast<float>(scaler.scale()));
    grads.narrow(0, layout.offset[1], 2).fill_(static_cast<float>(scaler.scale()));
    found = scaler.unscale_and_check(opt.grad_shard(), nullptr);
    EXPECT_EQ(found.item<float>(), 0.0f);
    opt.step(0.1, found);
    scaler.update(found);
    ref_grads.narrow(0, ref_layout.offset[0], 3).copy_(true_grad);
    ref_opt.step(0.1);
  };
  good_step();
  EXPECT_TRUE(torch::equal(w.detach(), ref.detach()));

  // Two more good steps: three in a row -> the scale doubles.
  for (int i = 0; i < 2; ++i) good_step();
  EXPECT_EQ(scaler.scale(), 1024.0);
  EXPECT_TRUE(torch::equal(w.detach(), ref.detach()));  // bias correction saw 3 steps, not 4
  EXPECT_EQ(opt.state().adam_step, 3);
}

// precision.fp8's use: no scaling, but a non-finite gradient is found (and the step skipped, as above)
// while finite gradients pass through unchanged, bit for bit.
TEST(LossScaler, SkipNonFiniteChecksWithoutScaling) {
  LossScaler check(false, torch::kCPU, {}, /*skip_non_finite=*/true);
  EXPECT_TRUE(check.checks());
  auto loss = torch::tensor(2.5f);
  EXPECT_TRUE(torch::equal(check.scale_loss(loss), loss));
  auto g = torch::tensor({0.1f, -3.0e-38f, 7.0f});
  const auto before = g.clone();
  auto found = check.unscale_and_check(g, nullptr);
  EXPECT_EQ(found.item<float>(), 0.0f);
  EXPECT_TRUE(torch::equal(g, before));
  g[1] = std::numeric_limits<float>::quiet_NaN();
  found = check.unscale_and_check(g, nullptr);
  EXPECT_EQ(found.item<float>(), 1.0f);
  check.update(found);
  EXPECT_EQ(check.scale(), 1.0);
  EXPECT_FALSE(LossScaler(false, torch::kCPU).checks());
  // bf16 gradients (precision.fp8 keeps them): their own check, the same answers.
  for (const float bad : {0.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()}) {
    auto b = torch::tensor({0.1f, -3.0f, 7.0f}).to(torch::kBFloat16);
    if (bad != 0.0f) b[2] = bad;
    const auto kept = b.clone();
    EXPECT_EQ(check.unscale_and_check(b, nullptr).item<float>(), bad != 0.0f ? 1.0f : 0.0f) << bad;
    EXPECT_TRUE(torch::equal(b.isnan(), kept.isnan()));
    EXPECT_TRUE(torch::equal(b.nan_to_num(0), kept.nan_to_num(0))) << "a check only leaves the values alone";
  }
}

TEST(LossScaler, DisabledIsTheIdentity) {
  LossScaler off(false, torch::kCPU);
  auto loss = torch::tensor(2.5f);
  EXPECT_TRUE(torch::equal(off.scale_loss(loss), loss));
  auto g = torch::tensor({std::numeric_limits<float>::infinity()});
  EXPECT_EQ(off.unscale_and_check(g, nullptr).item<float>(), 0.0f);
}

}  // namespace
}  // namespace gpt2::optim
