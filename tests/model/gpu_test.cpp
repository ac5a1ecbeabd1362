// GPT2 on the GPU: what only shows there, with the fused kernels on (the default on CUDA). Needs a
// GPU: every test skips without one (CI) and runs on the GPU machine (`ctest -L gpu`).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "src/base/errors.h"
#include "src/kernels/target_check.h"
#include "src/model/gpt2_model.h"
#include "tests/kernels/compare.h"
#include "tests/test_util.h"

namespace gpt2 {
namespace {

GPT2Config small_config() {
  GPT2Config cfg;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 64;
  cfg.vocab_size = 1000;  // padded to 1024 inside
  cfg.block_size = 32;
  return cfg;
}

torch::Tensor all_grads(GPT2& model) {
  std::vector<torch::Tensor> g;
  for (auto& p : model->parameters()) g.push_back(p.grad().detach().flatten().to(torch::kDouble));
  return torch::cat(g);
}

// A second backward through the same graph (retain_graph): the fused head + loss node has
// overwritten its logits with their gradient, so it refuses by name (pointing at the settings that
// allow it); LibTorch's loss (train.fused_kernels = false) and the chunked one (memory.chunked_loss)
// add the same gradients again. fp32, so that twice the first gradients is a tight expectation.
TEST(ModelGpu, SecondBackwardIsRefusedOnlyByTheFusedHead) {
  REQUIRE_CUDA();
  GPT2 model(small_config());
  model->init_weights(1);
  model->to(torch::kCUDA);
  torch::manual_seed(2);
  const auto idx = torch::randint(0, 1000, {4, 32}, torch::dtype(torch::kLong).device(torch::kCUDA));
  const auto targets = torch::randint(0, 1000, {4, 32}, idx.options());

  model->zero_grad();
  auto fused = model->loss(idx, targets);
  fused.backward({}, /*retain_graph=*/true);
  const auto first = all_grads(model);
  try {
    fused.backward();
    ADD_FAILURE() << "a second backward through the fused head ran; the gradients moved by "
                  << ((all_grads(model) - 2 * first).norm() / (2 * first).norm()).item<double>()
                  << " (relative norm) from twice the first";
  } catch (const Error& e) {
    EXPECT_HAS(e.what(), "train.fused_kernels = false");
  }

  for (const bool chunked : {false, true}) {
    model->set_fused_kernels(chunked);  // the chunked loss takes the head whatever the kernels
    model->set_chunked_loss(chunked);
    model->zero_grad();
    auto loss = model->loss(idx, targets);
    loss.backward({}, /*retain_graph=*/true);
    const auto once = all_grads(model);
    loss.backward();
    const double moved = ((all_grads(model) - 2 * once).norm() / (2 * once).norm()).item<double>();
    EXPECT_LE(moved, 1e-6) << (chunked ? "chunked loss" : "LibTorch's loss") << ": second backward";
  }
}

// Note [Target check] through the model on CUDA, on each loss path: a target id outside the
// vocabulary makes the loss NaN (no exception in the step), the gradients stay finite, and
// raise_noted_bad_target(), which the trainer calls where it reads the loss, names it.
TEST(ModelGpu, TargetOutsideTheVocabularyIsRaisedByName) {
  REQUIRE_CUDA();
  GPT2 model(small_config());
  model->init_weights(4);
  model->to(torch::kCUDA, torch::kBFloat16);
  torch::manual_seed(5);
  const auto idx = torch::randint(0, 1000, {4, 32}, torch::dtype(torch::kLong).device(torch::kCUDA));
  auto targets = torch::randint(0, 1000, {4, 32}, idx.options());
  targets[2][17] = 1010;  // inside the padded rows (1000..1023), still not a class
  try {
    kernels::raise_noted_bad_target();  // a clean record to start from, whatever ran before
  } catch (const UserError&) {
  }
  struct Path {
    const char* name;
    bool fused, chunked;
  };
  for (const Path& p : {Path{"fused kernels", true, false}, Path{"LibTorch's loss", false, false},
                        Path{"chunked loss", true, true}}) {
    model->set_fused_kernels(p.fused);
    model->set_chunked_loss(p.chunked);
    model->zero_grad();
    torch::Tensor loss;
    ASSERT_NO_THROW({
      loss = model->loss(idx, targets);
      loss.backward();
    }) << p.name;
    EXPECT_TRUE(std::isnan(loss.item<double>())) << p.name << ": loss " << loss.item<double>();
    for (const auto& item : model->named_parameters()) {
      EXPECT_TRUE(torch::isfinite(item.value().grad()).all().item<bool>()) << p.name << ": " << item.key();
    }
    EXPECT_EQ(test::user_error([] { kernels::raise_noted_bad_target(); }),
              "target id 1010 at (row 2, position 17) is outside the vocabulary [0, 1000)")
        << p.name;
  }
}

}  // namespace
}  // namespace gpt2
