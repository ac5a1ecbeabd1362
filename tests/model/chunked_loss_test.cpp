// The chunked head + cross-entropy (src/model/chunked_loss.h) against the plain composition
// F.cross_entropy(h · W[:V]ᵀ) in float64: loss and both gradients, for chunk sizes that do and do
// not divide the rows, with ignored rows and padded vocabulary rows; in bf16 against the fp32
// reference within bf16's precision; a second backward; ids outside the vocabulary.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "src/model/chunked_loss.h"
#include "src/model/gpt2_model.h"
#include "tests/test_util.h"

namespace gpt2 {
namespace {

struct Case {
  torch::Tensor h, W, targets;
};

Case make_case(torch::ScalarType dtype) {
  torch::manual_seed(7);
  const int64_t N = 37, C = 16, V = 29, Vp = 32;
  Case c;
  c.h = torch::randn({N, C}, torch::kFloat64).to(dtype).requires_grad_(true);
  auto W = torch::randn({Vp, C}, torch::kFloat64) * 0.5;
  W.narrow(0, V, Vp - V).zero_();  // padding rows, as GPT-2's padded wte
  c.W = W.to(dtype).requires_grad_(true);
  c.targets = torch::randint(0, V, {N}, torch::kInt64);
  c.targets[3] = -1;  // ignored rows
  c.targets[20] = -1;
  return c;
}

std::vector<torch::Tensor> reference(const Case& c, int64_t V) {
  auto h = c.h.detach().to(torch::kFloat64).requires_grad_(true);
  auto W = c.W.detach().to(torch::kFloat64).requires_grad_(true);
  auto logits = h.mm(W.t()).narrow(1, 0, V);
  auto loss = torch::nn::functional::cross_entropy(logits, c.targets,
                                                   torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1));
  loss.backward();
  return {loss.detach(), h.grad(), W.grad()};
}

double rel(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kFloat64) - b).norm() / b.norm()).item<double>();
}

TEST(ChunkedCrossEntropy, MatchesPlainCrossEntropyInFloat64) {
  const auto c = make_case(torch::kFloat64);
  const auto want = reference(c, 29);
  for (int64_t chunk : {1, 5, 37, 100}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    auto h = c.h.detach().clone().requires_grad_(true), W = c.W.detach().clone().requires_grad_(true);
    auto loss = chunked_cross_entropy(h, W, c.targets, 29, -1, chunk);
    loss.backward();
    EXPECT_EQ(loss.scalar_type(), torch::kFloat64);
    EXPECT_LE(std::abs(loss.item<double>() - want[0].item<double>()), 1e-12);
    EXPECT_LE(rel(h.grad(), want[1]), 1e-12);
    EXPECT_LE(rel(W.grad(), want[2]), 1e-12);
    EXPECT_EQ(W.grad().narrow(0, 29, 3).abs().max().item<double>(), 0.0);  // padding gets nothing
  }
  // A scaled upstream gradient scales both gradients.
  auto h = c.h.detach().clone().requires_grad_(true), W = c.W.detach().clone().requires_grad_(true);
  (3.0 * chunked_cross_entropy(h, W, c.targets, 29, -1, 8)).backward();
  EXPECT_LE(rel(h.grad(), 3.0 * want[1]), 1e-12);
}

TEST(ChunkedCrossEntropy, Bf16WithinBf16PrecisionOfFp32) {
  const auto c = make_case(torch::kBFloat16);
  const auto want = reference(c, 29);  // from the same bf16 inputs, in float64
  auto h = c.h.detach().clone().requires_grad_(true), W = c.W.detach().clone().requires_grad_(true);
  auto loss = chunked_cross_entropy(h, W, c.targets, 29, -1, 6);
  loss.backward();
  EXPECT_EQ(loss.scalar_type(), torch::kFloat);  // the softmax is fp32
  EXPECT_LE(std::abs(loss.item<double>() - want[0].item<double>()) / want[0].item<double>(), 1e-2);
  EXPECT_EQ(h.grad().scalar_type(), torch::kBFloat16);
  EXPECT_LE(rel(h.grad(), want[1]), 1e-2);
  EXPECT_LE(rel(W.grad(), want[2]), 1e-2);
}

// An id outside the vocabulary is a UserError naming it and its place, before anything runs:
// targets (N) are one row; targets (B, T) with B * T = N name (row, position).
TEST(ChunkedCrossEntropy, TargetOutsideTheVocabularyIsANamedUserError) {
  const auto c = make_case(torch::kFloat64);  // V = 29 of Vp = 32, 37 rows
  auto targets = c.targets.clone();
  targets[30] = 29;  // a padding column
  EXPECT_EQ(test::user_error([&] { chunked_cross_entropy(c.h, c.W, targets, 29, -1, 8); }),
            "target id 29 at (row 0, position 30) is outside the vocabulary [0, 29)");
  const auto h = c.h.detach().narrow(0, 0, 36);
  auto grid = c.targets.narrow(0, 0, 36).clone().view({4, 9});
  grid[2][4] = -7;
  EXPECT_EQ(test::user_error([&] { chunked_cross_entropy(h, c.W, grid, 29, -1, 8); }),
            "target id -7 at (row 2, position 4) is outside the vocabulary [0, 29)");
}

// A second backward through the same graph (retain_graph) adds the same gradients again: the
// chunked loss keeps h and W and recomputes its logits, so unlike the fused CUDA head + loss node
// (which overwrites its logits) it has no reason to refuse one.
TEST(ChunkedCrossEntropy, SecondBackwardAddsTheSameGradients) {
  const auto c = make_case(torch::kFloat64);
  auto h = c.h.detach().clone().requires_grad_(true), W = c.W.detach().clone().requires_grad_(true);
  auto loss = chunked_cross_entropy(h, W, c.targets, 29, -1, 8);
  loss.backward({}, /*retain_graph=*/true);
  const auto dh = h.grad().clone(), dW = W.grad().clone();
  loss.backward();
  EXPECT_LE(rel(h.grad(), 2 * dh), 1e-14);
  EXPECT_LE(rel(W.grad(), 2 * dW), 1e-14);
}

// The model's switch (memory.chunked_loss): the same loss and parameter gradients as the default
// path (logits, then cross_entropy), in float64, with a padded vocabulary and an ignored target.
TEST(ChunkedCrossEntropy, ModelLossIsTheSameWithAndWithoutChunks) {
  GPT2Config cfg;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 16;
  cfg.vocab_size = 37;  // padded to a multiple of 64 inside
  cfg.block_size = 8;
  GPT2 model(cfg);
  model->init_weights(5);
  model->to(torch::kFloat64);
  const auto idx = torch::randint(0, 37, {3, 8}, torch::kInt64);
  auto targets = torch::randint(0, 37, {3, 8}, torch::kInt64);
  targets[1][2] = -1;
  std::vector<torch::Tensor> loss, grads;
  for (bool chunked : {false, true}) {
    model->set_chunked_loss(chunked);
    model->zero_grad();
    auto l = model->loss(idx, targets);
    l.backward();
    loss.push_back(l.detach());
    std::vector<torch::Tensor> g;
    for (auto& p : model->parameters()) g.push_back(p.grad().detach().clone().flatten());
    grads.push_back(torch::cat(g));
  }
  EXPECT_LE(std::abs(loss[0].item<double>() - loss[1].item<double>()), 1e-12);
  EXPECT_LE(rel(grads[1], grads[0]), 1e-12);
}

}  // namespace
}  // namespace gpt2
