// The fused CUDA cross-entropy (src/kernels/cross_entropy.h) against LibTorch's cross_entropy on
// the same logits, in fp32 (relative error <= 1e-5) and bf16/fp16 (<= 1e-2): loss, gradient,
// padding columns, ignored rows, unaligned rows; the head + loss node against the GEMM and
// LibTorch's loss; and the model's loss and gradients with and without every fused kernel.
// Needs a GPU: every case but the argument checks skips cleanly without one (CI).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "src/model/gpt2_model.h"
#include "src/kernels/cross_entropy.h"
#include "tests/kernels/compare.h"

namespace gpt2 {
namespace {

constexpr int64_t kIgnore = -1;

// Loss and gradient of both paths for logits (rows, width) of which `vocab` columns are classes.
void compare(torch::ScalarType dtype, int64_t rows, int64_t width, int64_t vocab, double tol, double scale = 1.0) {
  torch::manual_seed(rows * 7 + width);
  const auto dev = torch::Device(torch::kCUDA);
  auto base = (torch::randn({rows, width}, torch::dtype(torch::kFloat).device(dev)) * 3).to(dtype);
  auto targets = torch::randint(0, vocab, {rows}, torch::dtype(torch::kLong).device(dev));
  targets.index_put_({torch::arange(0, rows, 5, targets.options())}, kIgnore);  // every 5th row ignored

  auto ours_in = base.clone().requires_grad_(true);
  auto ours = kernels::cross_entropy(ours_in, targets, vocab, kIgnore);
  (ours * scale).backward();

  auto ref_in = base.clone().requires_grad_(true);
  auto ref = torch::nn::functional::cross_entropy(
      ref_in.narrow(1, 0, vocab).to(torch::kFloat), targets,
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnore));
  (ref * scale).backward();

  const std::string what = std::string(c10::toString(dtype)) + " " + std::to_string(rows) + "x" + std::to_string(width) +
                           " vocab " + std::to_string(vocab);
  EXPECT_EQ(ours.scalar_type(), torch::kFloat) << what;
  EXPECT_LE(rel_error(ours, ref), tol) << what << ": loss " << ours.item<double>() << " vs " << ref.item<double>();
  EXPECT_EQ(ours_in.grad().scalar_type(), dtype) << what;
  EXPECT_LE(rel_error(ours_in.grad(), ref_in.grad()), tol) << what << ": gradient";
  if (width > vocab) {
    EXPECT_EQ(ours_in.grad().narrow(1, vocab, width - vocab).abs().max().item<double>(), 0.0) << what << ": padding";
  }
}

TEST(FusedCrossEntropy, Fp32MatchesLibTorch) {
  REQUIRE_CUDA();
  compare(torch::kFloat, 67, 128, 113, 1e-5);
  compare(torch::kFloat, 16, 50304, 50257, 1e-5, 3.0);  // GPT-2's padded head, a scaled upstream gradient
  compare(torch::kFloat, 9, 101, 101, 1e-5);            // rows not 16-byte aligned: the scalar path
}

TEST(FusedCrossEntropy, Bf16AndFp16MatchLibTorch) {
  REQUIRE_CUDA();
  for (auto dtype : {torch::kBFloat16, torch::kHalf}) {
    compare(dtype, 67, 128, 113, 1e-2);
    compare(dtype, 32, 50304, 50257, 1e-2);
    compare(dtype, 9, 101, 97, 1e-2);
  }
}

// head_cross_entropy(h, W) against cross_entropy(h W^T narrowed to the vocab, in fp32): loss and
// the gradients of h and W under an upstream gradient `scale`; without gradients, the same loss.
void compare_head(torch::ScalarType dtype, int64_t rows, int64_t C, int64_t padded, int64_t vocab, double tol,
                  double scale) {
  torch::manual_seed(rows * 3 + C);
  const auto opts = torch::dtype(torch::kFloat).device(torch::kCUDA);
  auto h = torch::randn({rows, C}, opts).to(dtype);
  auto w = (torch::randn({padded, C}, opts) * 0.2).to(dtype);
  auto targets = torch::randint(0, vocab, {rows}, torch::dtype(torch::kLong).device(torch::kCUDA));
  targets.index_put_({torch::arange(0, rows, 4, targets.options())}, kIgnore);  // every 4th row ignored

  auto hi = h.clone().requires_grad_(true), wi = w.clone().requires_grad_(true);
  auto ours = kernels::head_cross_entropy(hi, wi, targets, vocab, kIgnore);
  (ours * scale).backward();
  torch::Tensor no_grad_loss;
  {
    torch::NoGradGuard no_grad;
    no_grad_loss = kernels::head_cross_entropy(h, w, targets, vocab, kIgnore);
  }

  auto hr = h.clone().requires_grad_(true), wr = w.clone().requires_grad_(true);
  auto logits = at::mm(hr, wr.t()).narrow(1, 0, vocab).to(torch::kFloat);
  auto ref = torch::nn::functional::cross_entropy(logits, targets,
                                                  torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnore));
  (ref * scale).backward();

  const std::string what = std::string("head ") + c10::toString(dtype) + " " + std::to_string(rows) + "x" +
                           std::to_string(C) + " vocab " + std::to_string(vocab) + "/" + std::to_string(padded);
  EXPECT_LE(rel_error(ours, ref), tol) << what << ": loss " << ours.item<double>() << " vs " << ref.item<double>();
  EXPECT_EQ(no_grad_loss.item<double>(), ours.item<double>()) << what << ": loss without gradients";
  EXPECT_LE(rel_error(hi.grad(), hr.grad()), tol) << what << ": dh";
  EXPECT_LE(rel_error(wi.grad(), wr.grad()), tol) << what << ": dW";
  EXPECT_EQ(wi.grad().narrow(0, vocab, padded - vocab).abs().max().item<double>(), 0.0) << what << ": padding rows";
}

TEST(FusedCrossEntropy, HeadMatchesLibTorch) {
  REQUIRE_CUDA();
  compare_head(torch::kFloat, 64, 32, 1024, 1000, 1e-5, 1.0);
  compare_head(torch::kFloat, 37, 64, 50304, 50257, 1e-5, 0.25);  // GPT-2's padded head, scaled upstream
  compare_head(torch::kBFloat16, 256, 128, 50304, 50257, 1e-2, 1.0);
  compare_head(torch::kHalf, 100, 64, 1024, 1001, 1e-2, 4.0);
}

TEST(FusedCrossEntropy, AllRowsIgnoredGivesZero) {
  REQUIRE_CUDA();
  auto logits = torch::randn({4, 64}, torch::dtype(torch::kFloat).device(torch::kCUDA)).requires_grad_(true);
  auto targets = torch::full({4}, kIgnore, torch::dtype(torch::kLong).device(torch::kCUDA));
  auto loss = kernels::cross_entropy(logits, targets, 64, kIgnore);
  loss.backward();
  EXPECT_EQ(loss.item<double>(), 0.0);
  EXPECT_EQ(logits.grad().abs().max().item<double>(), 0.0);
}

TEST(FusedCrossEntropy, ModelLossWithAndWithoutFusedKernel) {
  REQUIRE_CUDA();
  GPT2Config cfg;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 64;
  cfg.vocab_size = 1000;  // padded to 1024 inside
  cfg.block_size = 32;
  GPT2 model(cfg);
  model->init_weights(3);
  model->to(torch::kCUDA, torch::kBFloat16);
  auto idx = torch::randint(0, 1000, {4, 32}, torch::dtype(torch::kLong).device(torch::kCUDA));
  auto targets = torch::randint(0, 1000, {4, 32}, idx.options());
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
    EXPECT_LE(std::abs(losses[1] - losses[0]) / losses[0], 1e-3) << losses[1] << " vs " << losses[0];
    for (size_t i = 0; i < grads[0].size(); ++i) {
      EXPECT_LE(rel_error(grads[1][i], grads[0][i]), 2e-2) << "parameter " << i << ", recompute every " << recompute_every;
    }
  }
}

TEST(FusedCrossEntropy, RejectsTensorsOutsideTheContract) {
  // Runs everywhere: CPU tensors are refused by name.
  auto logits = torch::randn({4, 64});
  auto targets = torch::zeros({4}, torch::kLong);
  EXPECT_ANY_THROW(kernels::cross_entropy(logits, targets, 64, kIgnore));
  EXPECT_ANY_THROW(kernels::head_cross_entropy(torch::randn({4, 8}), torch::randn({64, 8}), targets, 64, kIgnore));
}

}  // namespace
}  // namespace gpt2
