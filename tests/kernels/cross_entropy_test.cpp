// The fused cross-entropy (src/kernels/cross_entropy.h), on CUDA and on CPU, and LibTorch's cross_entropy on the
// same logits (upcast to fp32, as the model's plain path does), both against a float64 reference,
// under Note [Kernel accuracy rule] (compare.h): loss, gradient, padding columns, ignored rows,
// unaligned rows, in fp32, bf16 and fp16; the head + loss node against the GEMM and LibTorch's
// loss; the head + loss node refusing a second backward by name; target ids outside the vocabulary
// noted without a host sync and raised by name (Note [Target check]); and the model's loss and
// gradients with every fused kernel against the model without them.
// The CUDA cases skip cleanly without a GPU (CI); the CPU cases (FusedCrossEntropyCpu) run everywhere.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#ifdef GPT2_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "src/base/errors.h"
#include "src/kernels/cross_entropy.h"
#include "src/kernels/target_check.h"
#include "src/model/chunked_loss.h"
#include "src/model/gpt2_model.h"
#include "tests/kernels/compare.h"
#include "tests/test_util.h"

namespace gpt2 {
namespace {

constexpr int64_t kIgnore = -1;
namespace F = torch::nn::functional;

torch::Tensor mean_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  return F::cross_entropy(logits, targets, F::CrossEntropyFuncOptions().ignore_index(kIgnore));
}

// Loss and gradient of the fused kernel and of LibTorch for logits (rows, width) of which `vocab`
// columns are classes, against float64 on the same logits.
void compare(torch::ScalarType dtype, int64_t rows, int64_t width, int64_t vocab, double scale = 1.0,
             torch::Device dev = torch::kCUDA) {
  torch::manual_seed(rows * 7 + width);
  auto base = (torch::randn({rows, width}, torch::dtype(torch::kFloat).device(dev)) * 3).to(dtype);
  auto targets = torch::randint(0, vocab, {rows}, torch::dtype(torch::kLong).device(dev));
  targets.index_put_({torch::arange(0, rows, 5, targets.options())}, kIgnore);  // every 5th row ignored

  auto ours_in = base.clone().requires_grad_(true);
  auto ours = kernels::cross_entropy(ours_in, targets, vocab, kIgnore);
  (ours * scale).backward();

  auto aten_in = base.clone().requires_grad_(true);
  auto aten = mean_cross_entropy(aten_in.narrow(1, 0, vocab).to(torch::kFloat), targets);
  (aten * scale).backward();

  auto ref_in = base.to(torch::kDouble).requires_grad_(true);
  auto ref = mean_cross_entropy(ref_in.narrow(1, 0, vocab), targets);
  (ref * scale).backward();

  const std::string what = std::string("cross_entropy ") + dev.str() + " " + c10::toString(dtype) + " " +
                           std::to_string(rows) + "x" + std::to_string(width) + " vocab " + std::to_string(vocab);
  EXPECT_EQ(ours.scalar_type(), torch::kFloat) << what;
  expect_as_accurate(what + " loss", ours, aten, ref);
  EXPECT_EQ(ours_in.grad().scalar_type(), dtype) << what;
  expect_as_accurate(what + " gradient", ours_in.grad(), aten_in.grad(), ref_in.grad());
  if (width > vocab) {
    EXPECT_EQ(ours_in.grad().narrow(1, vocab, width - vocab).abs().max().item<double>(), 0.0) << what << ": padding";
  }
}

TEST(FusedCrossEntropy, Fp32AsAccurateAsLibTorch) {
  REQUIRE_CUDA();
  compare(torch::kFloat, 67, 128, 113);
  compare(torch::kFloat, 16, 50304, 50257, 3.0);  // GPT-2's padded head, a scaled upstream gradient
  compare(torch::kFloat, 9, 101, 101);            // rows not 16-byte aligned: the scalar path
}

TEST(FusedCrossEntropy, Bf16AndFp16AsAccurateAsLibTorch) {
  REQUIRE_CUDA();
  for (auto dtype : {torch::kBFloat16, torch::kHalf}) {
    compare(dtype, 67, 128, 113);
    compare(dtype, 32, 50304, 50257);
    compare(dtype, 9, 101, 97);
  }
}

// CPU: rows in chunks of 32 (Note [CPU cross-entropy]), so 67 and 75 rows end in a partial chunk.
TEST(FusedCrossEntropyCpu, AsAccurateAsLibTorch) {
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    compare(dtype, 67, 128, 113, 1.0, torch::kCPU);
    compare(dtype, 9, 101, 97, 1.0, torch::kCPU);
  }
  compare(torch::kFloat, 75, 50304, 50257, 3.0, torch::kCPU);  // GPT-2's padded head, a scaled upstream
  compare(torch::kBFloat16, 32, 50304, 50257, 1.0, torch::kCPU);
}

// head_cross_entropy(h, W) and LibTorch's cross_entropy(h W^T narrowed to the vocab, in fp32),
// against float64 from the same h and W: loss and the gradients of h and W under an upstream
// gradient `scale`; without gradients, the same loss.
void compare_head(torch::ScalarType dtype, int64_t rows, int64_t C, int64_t padded, int64_t vocab, double scale,
                  torch::Device dev = torch::kCUDA) {
  torch::manual_seed(rows * 3 + C);
  const auto opts = torch::dtype(torch::kFloat).device(dev);
  auto h = torch::randn({rows, C}, opts).to(dtype);
  auto w = (torch::randn({padded, C}, opts) * 0.2).to(dtype);
  auto targets = torch::randint(0, vocab, {rows}, torch::dtype(torch::kLong).device(dev));
  targets.index_put_({torch::arange(0, rows, 4, targets.options())}, kIgnore);  // every 4th row ignored

  auto hi = h.clone().requires_grad_(true), wi = w.clone().requires_grad_(true);
  auto ours = kernels::head_cross_entropy(hi, wi, targets, vocab, kIgnore);
  (ours * scale).backward();
  torch::Tensor no_grad_loss;
  {
    torch::NoGradGuard no_grad;
    no_grad_loss = kernels::head_cross_entropy(h, w, targets, vocab, kIgnore);
  }

  auto ha = h.clone().requires_grad_(true), wa = w.clone().requires_grad_(true);
  auto aten = mean_cross_entropy(at::mm(ha, wa.t()).narrow(1, 0, vocab).to(torch::kFloat), targets);
  (aten * scale).backward();

  auto hr = h.to(torch::kDouble).requires_grad_(true), wr = w.to(torch::kDouble).requires_grad_(true);
  auto ref = mean_cross_entropy(at::mm(hr, wr.t()).narrow(1, 0, vocab), targets);
  (ref * scale).backward();

  const std::string what = std::string("head_cross_entropy ") + dev.str() + " " + c10::toString(dtype) + " " +
                           std::to_string(rows) + "x" + std::to_string(C) + " vocab " + std::to_string(vocab) + "/" +
                           std::to_string(padded);
  expect_as_accurate(what + " loss", ours, aten, ref);
  if (dev.is_cuda()) {
    EXPECT_EQ(no_grad_loss.item<double>(), ours.item<double>()) << what << ": loss without gradients";
  } else {
    // The same computation, but MKL's CPU GEMM rounds differently for differently aligned copies of
    // h (seen on a 16-core machine: 7.4142194 against 7.4142203): equal to fp32 rounding.
    EXPECT_NEAR(no_grad_loss.item<double>(), ours.item<double>(), 1e-6 * std::abs(ours.item<double>()))
        << what << ": loss without gradients";
  }
  expect_as_accurate(what + " dh", hi.grad(), ha.grad(), hr.grad());
  expect_as_accurate(what + " dW", wi.grad(), wa.grad(), wr.grad());
  EXPECT_EQ(wi.grad().narrow(0, vocab, padded - vocab).abs().max().item<double>(), 0.0) << what << ": padding rows";
}

TEST(FusedCrossEntropy, HeadAsAccurateAsLibTorch) {
  REQUIRE_CUDA();
  compare_head(torch::kFloat, 64, 32, 1024, 1000, 1.0);
  compare_head(torch::kFloat, 37, 64, 50304, 50257, 0.25);  // GPT-2's padded head, scaled upstream
  compare_head(torch::kBFloat16, 256, 128, 50304, 50257, 1.0);
  compare_head(torch::kHalf, 100, 64, 1024, 1001, 4.0);
}

TEST(FusedCrossEntropyCpu, HeadAsAccurateAsLibTorch) {
  compare_head(torch::kFloat, 64, 32, 1024, 1000, 1.0, torch::kCPU);
  compare_head(torch::kFloat, 37, 64, 50304, 50257, 0.25, torch::kCPU);
  compare_head(torch::kBFloat16, 100, 128, 50304, 50257, 1.0, torch::kCPU);
  compare_head(torch::kHalf, 100, 64, 1024, 1001, 4.0, torch::kCPU);
}

// The head + loss node writes the logits' gradient over the logits it saved, so a second backward
// through the same graph (retain_graph) would read the gradient as logits: it is refused by a named
// gpt2::Error that says what to turn off, and the gradients keep what the first backward gave. The
// loss alone (cross_entropy) keeps its logits, so there a second backward adds the same gradient.
void expect_head_second_backward_refused(torch::Device dev) {
  torch::manual_seed(5);
  const auto opts = torch::dtype(torch::kBFloat16).device(dev);
  auto h = torch::randn({64, 32}, opts).requires_grad_(true);
  auto w = (torch::randn({1024, 32}, opts) * 0.2).requires_grad_(true);
  auto targets = torch::randint(0, 1000, {64}, torch::dtype(torch::kLong).device(dev));
  auto loss = kernels::head_cross_entropy(h, w, targets, 1000, kIgnore);
  loss.backward({}, /*retain_graph=*/true);
  const auto dh = h.grad().clone(), dw = w.grad().clone();
  try {
    loss.backward();
    ADD_FAILURE() << "a second backward ran; dh moved by up to "
                  << (h.grad().to(torch::kFloat) - 2 * dh.to(torch::kFloat)).abs().max().item<double>()
                  << " from twice the first";
  } catch (const Error& e) {
    EXPECT_HAS(e.what(), "backward");
    EXPECT_HAS(e.what(), "the model's fused kernels off");
  }
  EXPECT_TRUE(torch::equal(h.grad(), dh));
  EXPECT_TRUE(torch::equal(w.grad(), dw));

  auto logits = (torch::randn({64, 1024}, opts) * 3).requires_grad_(true);
  auto plain = kernels::cross_entropy(logits, targets, 1000, kIgnore);
  plain.backward({}, /*retain_graph=*/true);
  const auto first = logits.grad().clone();
  plain.backward();
  EXPECT_TRUE(torch::equal(logits.grad(), first * 2)) << "cross_entropy's second backward";
}

TEST(FusedCrossEntropy, HeadSecondBackwardIsANamedError) {
  REQUIRE_CUDA();
  expect_head_second_backward_refused(torch::kCUDA);
}

TEST(FusedCrossEntropyCpu, HeadSecondBackwardIsANamedError) { expect_head_second_backward_refused(torch::kCPU); }

// On CPU a bad id is a UserError before anything runs (Note [Target check]), from both entry points.
TEST(FusedCrossEntropyCpu, BadTargetIsANamedUserError) {
  const auto h = torch::randn({2 * 16, 32}), w = torch::randn({1024, 32});
  auto targets = torch::randint(0, 1000, {2, 16}, torch::kLong);
  targets[1][7] = 50300;
  const std::string want = "target id 50300 at (row 1, position 7) is outside the vocabulary [0, 1000)";
  EXPECT_EQ(test::user_error([&] { kernels::head_cross_entropy(h, w, targets, 1000, kIgnore); }), want);
  EXPECT_EQ(test::user_error([&] { kernels::cross_entropy(at::mm(h, w.t()), targets, 1000, kIgnore); }), want);
  targets[1][7] = 1000;  // a padding column
  EXPECT_EQ(test::user_error([&] { kernels::head_cross_entropy(h, w, targets, 1000, kIgnore); }),
            "target id 1000 at (row 1, position 7) is outside the vocabulary [0, 1000)");
}

#ifdef GPT2_WITH_CUDA
// Makes every synchronising CUDA call LibTorch makes throw while it lives (what
// torch.cuda.set_sync_debug_mode("error") does in Python).
class NoHostSync {
 public:
  NoHostSync() : was_(c10::cuda::warning_state().get_sync_debug_mode()) {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  }
  ~NoHostSync() { c10::cuda::warning_state().set_sync_debug_mode(was_); }
  NoHostSync(const NoHostSync&) = delete;
  NoHostSync& operator=(const NoHostSync&) = delete;

 private:
  c10::cuda::SyncDebugMode was_;
};
#endif

// Note [Target check] on CUDA, for each loss as the model's paths call it: a target id outside the
// vocabulary gives a NaN loss and finite gradients, with no exception and no host synchronisation
// in forward and backward (LibTorch's sync debug mode would throw on one), and
// raise_noted_bad_target() then throws the UserError naming the first bad id noted, once.
TEST(FusedCrossEntropy, BadTargetIsNotedWithoutSyncAndRaisedByName) {
  REQUIRE_CUDA();
#ifdef GPT2_WITH_CUDA
  torch::manual_seed(9);
  const auto dev = torch::Device(torch::kCUDA);
  const auto opts = torch::dtype(torch::kBFloat16).device(dev);
  const int64_t vocab = 1000, padded = 1024, B = 2, T = 16, C = 32;
  const auto h = torch::randn({B * T, C}, opts), w = torch::randn({padded, C}, opts) * 0.2;
  auto targets = torch::randint(0, vocab, {B, T}, torch::dtype(torch::kLong).device(dev));
  targets[0][3] = kIgnore;
  auto bad = targets.clone(), later = targets.clone();
  bad[1][7] = 50300;
  later[0][0] = -3;  // noted after `bad`: the first note stands until it is raised

  using Loss = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&)>;
  const std::vector<std::pair<std::string, Loss>> losses = {
      {"head_cross_entropy (the model's fused path)",
       [&](const auto& hh, const auto& ww, const auto& t) {
         return kernels::head_cross_entropy(hh, ww, t, vocab, kIgnore);
       }},
      {"cross_entropy", [&](const auto& hh, const auto& ww,
                            const auto& t) { return kernels::cross_entropy(at::mm(hh, ww.t()), t, vocab, kIgnore); }},
      {"chunked_cross_entropy (memory.chunked_loss)",
       [&](const auto& hh, const auto& ww, const auto& t) {
         return chunked_cross_entropy(hh, ww, t, vocab, kIgnore, 8);
       }},
      {"check_targets + LibTorch (train.fused_kernels = false)",
       [&](const auto& hh, const auto& ww, const auto& t) {
         const auto checked = kernels::check_targets(t, vocab, kIgnore);
         auto logits = at::mm(hh, ww.t()).narrow(1, 0, vocab).to(torch::kFloat);
         return mean_cross_entropy(logits, checked.targets.reshape({-1})) + checked.poison;
       }},
  };
  try {
    kernels::raise_noted_bad_target();  // a clean record to start from, whatever ran before
  } catch (const UserError&) {
  }
  for (const auto& [name, loss_of] : losses) {
    {  // clean targets: a finite loss, nothing to raise (and every first-use allocation done)
      auto hi = h.clone().requires_grad_(true), wi = w.clone().requires_grad_(true);
      auto loss = loss_of(hi, wi, targets);
      loss.backward();
      EXPECT_TRUE(std::isfinite(loss.item<double>())) << name;
      EXPECT_NO_THROW(kernels::raise_noted_bad_target()) << name;
    }
    auto hi = h.clone().requires_grad_(true), wi = w.clone().requires_grad_(true);
    torch::Tensor first, second;
    try {
      NoHostSync no_sync;
      first = loss_of(hi, wi, bad);
      first.backward();
      second = loss_of(h, w, later);
    } catch (const std::exception& e) {
      ADD_FAILURE() << name << ": " << e.what();
      continue;
    }
    EXPECT_TRUE(std::isnan(first.item<double>())) << name << ": loss " << first.item<double>();
    EXPECT_TRUE(std::isnan(second.item<double>())) << name << ": loss " << second.item<double>();
    EXPECT_TRUE(torch::isfinite(hi.grad()).all().item<bool>()) << name << ": dh";
    EXPECT_TRUE(torch::isfinite(wi.grad()).all().item<bool>()) << name << ": dW";
    try {
      kernels::raise_noted_bad_target();
      ADD_FAILURE() << name << ": nothing raised";
    } catch (const UserError& e) {
      EXPECT_EQ(std::string(e.what()), "target id 50300 at (row 1, position 7) is outside the vocabulary [0, 1000)")
          << name;
    }
    EXPECT_NO_THROW(kernels::raise_noted_bad_target()) << name << ": raised twice";
  }
#endif
}

void expect_all_rows_ignored_give_zero(torch::Device dev) {
  auto logits = torch::randn({4, 64}, torch::dtype(torch::kFloat).device(dev)).requires_grad_(true);
  auto targets = torch::full({4}, kIgnore, torch::dtype(torch::kLong).device(dev));
  auto loss = kernels::cross_entropy(logits, targets, 64, kIgnore);
  loss.backward();
  EXPECT_EQ(loss.item<double>(), 0.0) << dev;
  EXPECT_EQ(logits.grad().abs().max().item<double>(), 0.0) << dev;
}

TEST(FusedCrossEntropy, AllRowsIgnoredGivesZero) {
  REQUIRE_CUDA();
  expect_all_rows_ignored_give_zero(torch::kCUDA);
}

TEST(FusedCrossEntropyCpu, AllRowsIgnoredGivesZero) { expect_all_rows_ignored_give_zero(torch::kCPU); }

// The model in bf16 with every fused kernel (head + loss, residual LayerNorm, linear and MLP) and
// without them (LibTorch's ops), against the same weights in float64: the loss and every
// parameter's gradient. Each gradient's relative norm error is held to Note [Kernel accuracy rule]
// (the max error is printed, not bound: past a few layers the worst element of two differently
// rounded bf16 computations is noise). The loss is one number whose error is a signed sum of
// rounding errors that can cancel for one path by chance, so it is held to bf16's unit roundoff
// (2^-8) instead.
void expect_model_fused_as_accurate_as_without(torch::Device dev) {
  GPT2Config cfg;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 64;
  cfg.vocab_size = 1000;  // padded to 1024 inside
  cfg.block_size = 32;
  GPT2 model(cfg), reference(cfg);
  model->init_weights(3);
  model->to(dev, torch::kBFloat16);
  {
    torch::NoGradGuard no_grad;
    auto from = model->parameters();
    auto to = reference->parameters();
    for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i].to(torch::kCPU, torch::kFloat));
  }
  reference->to(dev, torch::kDouble);  // the bf16 weights exactly, in float64
  auto idx = torch::randint(0, 1000, {4, 32}, torch::dtype(torch::kLong).device(dev));
  auto targets = torch::randint(0, 1000, {4, 32}, idx.options());
  auto ref_loss = reference->loss(idx, targets);
  ref_loss.backward();
  const double ref_value = ref_loss.item<double>();
  const auto names = model->named_parameters().keys();
  // Every block plain, and block 0 recomputed (its input is then the materialised residual stream).
  for (int64_t recompute_every : {0, 2}) {
    model->set_recompute_every(recompute_every);
    std::vector<torch::Tensor> grads[2];
    double losses[2];
    for (int fused = 0; fused < 2; ++fused) {
      model->set_fused_kernels(fused == 1);
      model->zero_grad();
      auto loss = model->loss(idx, targets);
      loss.backward();
      losses[fused] = loss.item<double>();
      for (auto& p : model->parameters()) grads[fused].push_back(p.grad().clone());
    }
    const std::string what = "model bf16 on " + dev.str() + ", recompute every " + std::to_string(recompute_every);
    const double fused_err = std::abs(losses[1] - ref_value) / ref_value;
    const double unfused_err = std::abs(losses[0] - ref_value) / ref_value;
    std::printf("[ measured ] %s loss: relative error fused %.3g unfused %.3g (float64 %.6f)\n", what.c_str(),
                fused_err, unfused_err, ref_value);
    EXPECT_LE(fused_err, std::max(kAccuracyRatio * unfused_err, 1.0 / 256))
        << what << ": loss " << losses[1] << " unfused " << losses[0] << " float64 " << ref_value;
    const auto ref_params = reference->parameters();
    for (size_t i = 0; i < grads[0].size(); ++i) {
      expect_as_accurate(what + " d" + names[i], grads[1][i], grads[0][i], ref_params[i].grad(), /*check_max=*/false);
    }
  }
}

TEST(FusedCrossEntropy, ModelWithFusedKernelsAsAccurateAsWithout) {
  REQUIRE_CUDA();
  expect_model_fused_as_accurate_as_without(torch::kCUDA);
}

// On CPU only the head + loss is fused; the rest of the model runs LibTorch's ops either way.
TEST(FusedCrossEntropyCpu, ModelWithFusedKernelsAsAccurateAsWithout) {
  expect_model_fused_as_accurate_as_without(torch::kCPU);
}

TEST(FusedCrossEntropyCpu, RejectsTensorsOutsideTheContract) {
  auto targets = torch::zeros({4}, torch::kLong);
  const auto refused = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(nothing thrown)");
  };
  EXPECT_HAS(refused([&] {
               kernels::cross_entropy(torch::randn({4, 64}, torch::kDouble), targets, 64, kIgnore);
             }),
             "fp32/bf16/fp16");
  EXPECT_HAS(refused([&] { kernels::cross_entropy(torch::randn({64, 4}).t(), targets, 64, kIgnore); }), "contiguous");
  EXPECT_HAS(refused([&] { kernels::cross_entropy(torch::randn({4, 64}), targets, 65, kIgnore); }), "vocab <= Vp");
  EXPECT_HAS(refused([&] {
               kernels::cross_entropy(torch::randn({4, 64}), targets.to(torch::kInt), 64, kIgnore);
             }),
             "int64");
  EXPECT_HAS(refused([&] {
               kernels::head_cross_entropy(torch::randn({4, 8}), torch::randn({64, 8}, torch::kBFloat16), targets, 64,
                                           kIgnore);
             }),
             "one dtype");
}

}  // namespace
}  // namespace gpt2
