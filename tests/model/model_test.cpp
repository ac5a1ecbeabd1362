// GPT2 model, sampling and HF state-dict tests (CPU). HF logits parity lives in
// tests/python/test_hf_parity.py, which drives hf_logits_probe.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "src/base/errors.h"
#include "src/io/hf_import.h"
#include "src/kernels/fp8_gemm.h"
#include "src/model/generate.h"
#include "src/model/gpt2_model.h"
#include "tests/test_util.h"

namespace gpt2 {
namespace {

GPT2Config tiny_config(int64_t vocab = 100) {
  GPT2Config cfg;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 16;
  cfg.vocab_size = vocab;
  cfg.block_size = 16;
  return cfg;
}

// The parameter HF calls `name` ("transformer.wte.weight", ...): the model's own tensor.
torch::Tensor param(GPT2& model, const std::string& name) { return model->named_parameters()[name]; }

// Randomises every parameter (LN and biases included) so no term of the model is trivial.
void randomise(GPT2& model, uint64_t seed, double std = 0.3) {
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& p : model->parameters()) {
    p.copy_(torch::empty(p.sizes(), torch::kFloat).normal_(0.0, std, gen));
  }
  const auto& cfg = model->config();
  param(model, "transformer.wte.weight").narrow(0, cfg.vocab_size, cfg.padded_vocab_size() - cfg.vocab_size).zero_();
}

using test::user_error;

// ---------------------------------------------------------------------------------------------
// Config

// precision.fp8's wiring (GPT2Impl::set_fp8): a block's attention and MLP run their four linear
// layers through kernels::fp8_linear (bit for bit the composition written out here; fp8_linear
// itself is held to fp64 in tests/kernels/fp8_gemm_test.cpp), and a product whose rows are not a
// multiple of 16 runs as without fp8. On the CPU, through LibTorch's reference FP8 GEMM.
TEST(ModelFp8, BlocksRunTheirLinearLayersThroughFp8Linear) {
  const GPT2Config cfg{/*n_layer=*/2, /*n_head=*/2, /*n_embd=*/32, /*vocab_size=*/100, /*block_size=*/16};
  torch::manual_seed(3);
  MLP mlp(cfg);
  CausalSelfAttention attn(cfg);
  for (auto* fp8 : {&mlp->fp8, &attn->fp8}) *fp8 = true;
  const auto x = torch::randn({2, 8, 32});  // 16 rows
  const auto want_mlp =
      kernels::fp8_linear(torch::gelu(kernels::fp8_linear(x, mlp->c_fc->weight, mlp->c_fc->bias), "tanh"),
                          mlp->c_proj->weight, mlp->c_proj->bias);
  EXPECT_TRUE(torch::equal(mlp(x), want_mlp));
  const auto qkv = kernels::fp8_linear(x, attn->c_attn->weight, attn->c_attn->bias).split(32, 2);
  auto heads = [](const torch::Tensor& t) { return t.view({2, 8, 2, 16}).transpose(1, 2); };
  const auto y = torch::scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), {}, 0.0, true);
  const auto want_attn =
      kernels::fp8_linear(y.transpose(1, 2).contiguous().view({2, 8, 32}), attn->c_proj->weight, attn->c_proj->bias);
  EXPECT_TRUE(torch::equal(attn(x), want_attn));
  // 5 rows (a decoding step's shape): the layers run as without fp8.
  const auto few = torch::randn({1, 5, 32});
  const auto mlp_fp8 = mlp(few), attn_fp8 = attn(few);
  mlp->fp8 = attn->fp8 = false;
  EXPECT_TRUE(torch::equal(mlp_fp8, mlp(few)));
  EXPECT_TRUE(torch::equal(attn_fp8, attn(few)));
  EXPECT_FALSE(torch::equal(mlp(x), want_mlp));  // and FP8 changes the 16-row product
  // GPT2::set_fp8 reaches every block, and the model trains through it: finite loss and gradients.
  GPT2 model(cfg);
  model->init_weights(4);
  model->set_fp8(true);
  int64_t flagged = 0;
  for (const auto& m : model->modules()) {
    if (const auto* a = m->as<CausalSelfAttentionImpl>()) flagged += a->fp8;
    if (const auto* p = m->as<MLPImpl>()) flagged += p->fp8;
  }
  EXPECT_EQ(flagged, 2 * cfg.n_layer);
  const auto idx = torch::randint(0, cfg.vocab_size, {2, 8});
  const auto loss = model->loss(idx, torch::randint(0, cfg.vocab_size, {2, 8}));
  loss.backward();
  EXPECT_TRUE(std::isfinite(loss.item<double>()));
  for (const auto& p : model->parameters()) EXPECT_TRUE(p.grad().isfinite().all().item<bool>());
}

// Delayed scaling through the model (GPT2Impl::set_fp8 with an amax history): every FP8 tensor of
// every block records its amax in a training step, fp8_step_done moves it into the history, and
// a model given another's weights and histories mid-run (a resume) continues with the same bits;
// given fresh histories, it does not (the history is what scales the next step).
TEST(ModelFp8, DelayedScalingHistoriesRollAndResume) {
  const GPT2Config cfg{/*n_layer=*/2, /*n_head=*/2, /*n_embd=*/32, /*vocab_size=*/100, /*block_size=*/16};
  torch::manual_seed(5);
  const auto idx = torch::randint(0, cfg.vocab_size, {2, 8}), targets = torch::randint(0, cfg.vocab_size, {2, 8});
  auto step = [&](GPT2& m) {  // one SGD step; returns its loss
    const auto loss = m->loss(idx, targets);
    loss.backward();
    torch::NoGradGuard no_grad;
    for (auto& p : m->parameters()) {
      p.sub_(p.grad() * 0.05);
      p.mutable_grad().zero_();
    }
    m->fp8_step_done();
    return loss.item<float>();
  };
  GPT2 a(cfg);
  a->init_weights(4);
  a->set_fp8(true, /*amax_history=*/3);
  ASSERT_EQ(a->fp8_amax_history().sizes(), (std::vector<int64_t>{2, 4, 3, 3}));
  EXPECT_EQ(a->fp8_amax_history().abs().sum().item<float>(), 0.0f);
  step(a);
  EXPECT_EQ(a->fp8_steps_recorded(), 1);
  EXPECT_TRUE((a->fp8_amax_history().select(3, 1) > 0).all().item<bool>()) << a->fp8_amax_history();
  EXPECT_EQ(a->fp8_amax_history().select(3, 0).abs().sum().item<float>(), 0.0f);
  // Snapshot after step 1, then two more steps.
  std::vector<torch::Tensor> weights;
  for (const auto& p : a->parameters()) weights.push_back(p.detach().clone());
  const torch::Tensor history = a->fp8_amax_history().clone();
  std::vector<float> straight;
  for (int i = 0; i < 2; ++i) straight.push_back(step(a));
  auto resumed_model = [&](bool with_history) {
    GPT2 b(cfg);
    b->set_fp8(true, 3);
    torch::NoGradGuard no_grad;
    auto params = b->parameters();
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(weights[i]);
    if (with_history) b->load_fp8_amax_history(history, 1);
    return b;
  };
  GPT2 b = resumed_model(true);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(step(b), straight[i]) << "step " << i + 2;
  EXPECT_TRUE(torch::equal(b->fp8_amax_history(), a->fp8_amax_history()));
  GPT2 fresh = resumed_model(false);
  EXPECT_NE(step(fresh), straight[0]);
  // Histories of another shape, and a one-step history, are refused.
  EXPECT_THROW(b->load_fp8_amax_history(torch::zeros({2, 4, 3, 4}), 1), std::invalid_argument);
  EXPECT_THROW(b->set_fp8(true, 1), std::invalid_argument);
  b->set_fp8(true, 0);  // current scaling: no histories
  EXPECT_FALSE(b->fp8_amax_history().defined());
}

TEST(ModelConfig, PaddedVocab) {
  GPT2Config cfg;
  EXPECT_EQ(cfg.padded_vocab_size(), 50304);
  cfg.vocab_size = 64;
  EXPECT_EQ(cfg.padded_vocab_size(), 64);
  cfg.vocab_size = 65;
  EXPECT_EQ(cfg.padded_vocab_size(), 128);
}

TEST(ModelConfig, ValidateNamesKey) {
  GPT2Config cfg;
  EXPECT_NO_THROW(cfg.validate());
  cfg.n_embd = 100;  // not divisible by 12 heads
  EXPECT_HAS(user_error([&] { cfg.validate(); }), "model.n_embd");
  cfg = GPT2Config();
  cfg.n_layer = 0;
  EXPECT_HAS(user_error([&] { cfg.validate(); }), "model.n_layer");
  cfg = GPT2Config();
  cfg.vocab_size = -1;
  EXPECT_HAS(user_error([&] { cfg.validate(); }), "model.vocab_size");
  cfg = GPT2Config();
  cfg.block_size = 0;
  EXPECT_HAS(user_error([&] { cfg.validate(); }), "model.block_size");
  cfg = GPT2Config();
  cfg.n_head = 0;
  EXPECT_HAS(user_error([&] { GPT2 m(cfg); }), "model.n_head");
}

// ---------------------------------------------------------------------------------------------
// Parameter counts

GPT2Config sized(int64_t n_layer, int64_t n_head, int64_t n_embd) {
  GPT2Config cfg;
  cfg.n_layer = n_layer;
  cfg.n_head = n_head;
  cfg.n_embd = n_embd;
  return cfg;
}

TEST(ModelParamCount, HandKnownHfValues) {
  // What HF's GPT2LMHeadModel.num_parameters() reports for the released sizes (vocab 50257).
  EXPECT_EQ(sized(12, 12, 768).num_parameters(), 124'439'808);
  EXPECT_EQ(sized(24, 16, 1024).num_parameters(), 354'823'168);
  EXPECT_EQ(sized(36, 20, 1280).num_parameters(), 774'030'080);
  EXPECT_EQ(sized(48, 25, 1600).num_parameters(), 1'557'611'200);
  EXPECT_EQ(sized(12, 12, 768).num_parameters(/*count_padding=*/true), 124'439'808 + 47 * 768);
}

TEST(ModelParamCount, ModelMatchesConfig) {
  // The analytic count must describe the real modules (124M built for real: ~0.5 GB).
  for (const GPT2Config& cfg : {tiny_config(), tiny_config(50257), sized(12, 12, 768)}) {
    GPT2 model(cfg);
    EXPECT_EQ(model->num_parameters(), cfg.num_parameters());
    EXPECT_EQ(model->num_parameters(true), cfg.num_parameters(true));
  }
  GPT2 gpt2_small(sized(12, 12, 768));
  EXPECT_EQ(gpt2_small->num_parameters(), 124'439'808);
}

// ---------------------------------------------------------------------------------------------
// Structure

TEST(ModelStructure, NamedParametersMatchHf) {
  GPT2 model(tiny_config());
  std::vector<std::string> expected = {"transformer.wte.weight", "transformer.wpe.weight"};
  for (int i = 0; i < 2; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    for (const char* s : {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                          "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                          "mlp.c_proj.weight", "mlp.c_proj.bias"}) {
      expected.push_back(h + s);
    }
  }
  expected.push_back("transformer.ln_f.weight");
  expected.push_back("transformer.ln_f.bias");
  std::vector<std::string> got;
  for (const auto& item : model->named_parameters()) got.push_back(item.key());
  EXPECT_EQ(got, expected);  // also proves there is no lm_head parameter (tied)
  EXPECT_TRUE(model->named_buffers().is_empty());
}

TEST(ModelStructure, ShapesAndTiedHead) {
  const GPT2Config cfg = tiny_config(100);
  GPT2 model(cfg);
  const auto wte = param(model, "transformer.wte.weight");
  EXPECT_EQ(wte.sizes(), torch::IntArrayRef({128, 16}));  // padded rows
  // Linear's (out, in) layout, not HF's Conv1D (in, out): Note [Weight layout].
  EXPECT_EQ(param(model, "transformer.h.0.attn.c_attn.weight").sizes(), torch::IntArrayRef({48, 16}));
  EXPECT_EQ(param(model, "transformer.h.0.mlp.c_fc.weight").sizes(), torch::IntArrayRef({64, 16}));
  model->init_weights(1);
  auto idx = torch::randint(cfg.vocab_size, {3, 7}, torch::kLong);
  auto logits = model->forward(idx);
  EXPECT_EQ(logits.sizes(), torch::IntArrayRef({3, 7, 100}));  // padding never returned
  // Padded rows are neither looked up nor predicted, so they get no gradient (stay 0 under AdamW).
  auto loss = model->loss(idx, idx);
  loss.backward();
  EXPECT_TRUE(wte.grad().narrow(0, 100, 28).abs().max().item<double>() == 0.0);
}

// ---------------------------------------------------------------------------------------------
// Init

TEST(ModelInit, GptTwoInitDeterministicAndGlobalRngUntouched) {
  GPT2Config cfg = tiny_config(100);
  cfg.n_embd = 64;
  cfg.n_head = 4;
  GPT2 a(cfg), b(cfg);
  torch::manual_seed(123);
  const auto expected_next = torch::rand({4});
  torch::manual_seed(123);
  a->init_weights(42);
  EXPECT_TRUE(torch::equal(torch::rand({4}), expected_next)) << "init_weights advanced the global RNG";
  torch::manual_seed(999);
  b->init_weights(42);
  auto pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i]));
  b->init_weights(43);
  EXPECT_FALSE(torch::equal(param(a, "transformer.wpe.weight"), param(b, "transformer.wpe.weight")));

  const auto wte = param(a, "transformer.wte.weight");
  EXPECT_EQ(wte.narrow(0, 100, 28).abs().max().item<double>(), 0.0);
  EXPECT_NEAR(wte.narrow(0, 0, 100).std().item<double>(), 0.02, 0.002);
  EXPECT_NEAR(param(a, "transformer.h.0.attn.c_attn.weight").std().item<double>(), 0.02, 0.002);
  EXPECT_NEAR(param(a, "transformer.h.1.mlp.c_proj.weight").std().item<double>(), 0.02 / std::sqrt(4.0), 0.001);
  EXPECT_NEAR(param(a, "transformer.h.1.attn.c_proj.weight").std().item<double>(), 0.02 / std::sqrt(4.0), 0.001);
  EXPECT_EQ(param(a, "transformer.h.0.mlp.c_fc.bias").abs().max().item<double>(), 0.0);
  EXPECT_TRUE(torch::equal(param(a, "transformer.ln_f.weight"), torch::ones({64})));
  EXPECT_EQ(param(a, "transformer.ln_f.bias").abs().max().item<double>(), 0.0);
}

TEST(ModelInit, LossAtInitIsLogVocab) {
  GPT2Config cfg;
  cfg.n_layer = 2;
  cfg.n_head = 4;
  cfg.n_embd = 64;
  cfg.block_size = 64;
  GPT2 model(cfg);
  model->init_weights(0);
  torch::NoGradGuard no_grad;
  auto idx = torch::randint(cfg.vocab_size, {4, 64}, torch::kLong);
  auto targets = torch::randint(cfg.vocab_size, {4, 64}, torch::kLong);
  const double loss = model->loss(idx, targets).item<double>();
  EXPECT_NEAR(loss, std::log(50257.0), 0.1);
}

// ---------------------------------------------------------------------------------------------
// Correctness of the computation

TEST(ModelMath, GradientsMatchFiniteDifferencesFp64) {
  GPT2Config cfg = tiny_config(13);  // padded to 64 rows
  cfg.n_embd = 8;
  cfg.block_size = 8;
  GPT2 model(cfg);
  randomise(model, 5);
  model->to(torch::kDouble);
  torch::manual_seed(0);
  auto idx = torch::randint(cfg.vocab_size, {2, 6}, torch::kLong);
  auto targets = torch::randint(cfg.vocab_size, {2, 6}, torch::kLong);
  targets[1][2] = -1;  // an ignored position takes part too

  auto loss = model->loss(idx, targets);
  loss.backward();

  torch::NoGradGuard no_grad;
  const double eps = 1e-6;
  int checked = 0;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  for (auto& item : model->named_parameters()) {
    torch::Tensor p = item.value();
    auto flat = p.view({-1});
    auto grad = p.grad().view({-1});
    std::vector<int64_t> picks;
    if (item.key() == "transformer.wte.weight") {
      // Rows of tokens in the batch (embedding + head paths) and a row only the head touches.
      const int64_t tok = idx[0][0].item<int64_t>();
      picks = {tok * cfg.n_embd + 3, idx[1][4].item<int64_t>() * cfg.n_embd, 12 * cfg.n_embd + 7};
    } else {
      for (int k = 0; k < 2; ++k) picks.push_back(torch::randint(flat.numel(), {1}, gen).item<int64_t>());
    }
    for (int64_t i : picks) {
      const double orig = flat[i].item<double>();
      flat[i] = orig + eps;
      const double up = model->loss(idx, targets).item<double>();
      flat[i] = orig - eps;
      const double down = model->loss(idx, targets).item<double>();
      flat[i] = orig;
      const double fd = (up - down) / (2 * eps);
      const double g = grad[i].item<double>();
      EXPECT_NEAR(g, fd, 1e-5 * std::max(std::abs(g), std::abs(fd)) + 1e-9) << item.key() << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GE(checked, 30);
}

TEST(ModelMath, CausalityLaterTokensNeverChangeEarlierLogits) {
  const GPT2Config cfg = tiny_config(100);
  GPT2 model(cfg);
  randomise(model, 3);
  torch::NoGradGuard no_grad;
  torch::manual_seed(1);
  auto idx = torch::randint(cfg.vocab_size, {2, 16}, torch::kLong);
  auto base = model->forward(idx);
  for (int64_t t : {0, 5, 14}) {
    auto changed = idx.clone();
    changed.narrow(1, t + 1, 16 - t - 1).copy_(torch::randint(cfg.vocab_size, {2, 16 - t - 1}, torch::kLong));
    auto out = model->forward(changed);
    EXPECT_TRUE(torch::allclose(out.narrow(1, 0, t + 1), base.narrow(1, 0, t + 1), 1e-6, 1e-6)) << "t=" << t;
    EXPECT_FALSE(torch::allclose(out.narrow(1, t + 1, 1), base.narrow(1, t + 1, 1))) << "t=" << t;
  }
}

TEST(ModelMath, RejectsTooLongSequence) {
  GPT2 model(tiny_config());
  auto idx = torch::zeros({1, 17}, torch::kLong);
  EXPECT_HAS(user_error([&] { model->forward(idx); }), "model.block_size");
}

// A target id outside the vocabulary is one named UserError on both CPU loss paths (LibTorch's
// and the chunked one): past the padded rows, inside them (ids vocab..Vp-1 have wte rows but are
// not classes) or negative other than -1 (ignored, and fine).
TEST(ModelLoss, TargetOutsideTheVocabularyIsANamedUserError) {
  GPT2 model(tiny_config(100));  // wte padded to 128 rows
  randomise(model, 6);
  torch::manual_seed(3);
  const auto idx = torch::randint(100, {2, 8}, torch::kLong);
  for (bool chunked : {false, true}) {
    model->set_chunked_loss(chunked);
    for (int64_t bad : {143, 110, -5}) {
      auto targets = torch::randint(100, {2, 8}, torch::kLong);
      targets[0][2] = -1;
      targets[1][7] = bad;
      EXPECT_EQ(user_error([&] { model->loss(idx, targets); }),
                "target id " + std::to_string(bad) + " at (row 1, position 7) is outside the vocabulary [0, 100)")
          << (chunked ? "chunked loss" : "LibTorch's loss");
    }
  }
}

TEST(ModelTrain, OverfitsOneBatchWithAdamW) {
  torch::set_num_threads(1);
  GPT2Config cfg = tiny_config(64);
  cfg.n_embd = 32;
  GPT2 model(cfg);
  model->init_weights(0);
  torch::manual_seed(0);
  auto idx = torch::randint(cfg.vocab_size, {4, 16}, torch::kLong);
  auto targets = torch::randint(cfg.vocab_size, {4, 16}, torch::kLong);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(0.0));
  double loss = 0;
  int step = 0;
  for (; step < 400; ++step) {
    opt.zero_grad();
    auto l = model->loss(idx, targets);
    l.backward();
    opt.step();
    loss = l.item<double>();
    if (loss < 0.05) break;
  }
  EXPECT_LT(loss, 0.05) << "after " << step << " steps";
}

// ---------------------------------------------------------------------------------------------
// Sampling

TEST(ModelGenerate, IdsInVocabAndDeterministic) {
  const GPT2Config cfg = tiny_config(100);  // 28 padding rows whose logit would be 0
  GPT2 model(cfg);
  randomise(model, 9);
  // Push every real logit below zero, so a padded (zero) logit would win if it were ever exposed.
  {
    torch::NoGradGuard no_grad;
    param(model, "transformer.ln_f.weight").zero_();
    param(model, "transformer.ln_f.bias").fill_(1.0);
    param(model, "transformer.wte.weight").narrow(0, 0, 100).uniform_(-2.0, -1.0);
  }
  const std::vector<int64_t> prompt(20, 7);  // longer than block_size: the context is cropped
  for (double temperature : {0.0, 1.0, 5.0}) {
    for (int64_t top_k : {0, 1, 10, 1000}) {
      auto out = sample_tokens(model, prompt, 12, temperature, top_k, 5);
      ASSERT_EQ(out.size(), 32u);
      EXPECT_TRUE(std::equal(prompt.begin(), prompt.end(), out.begin()));
      for (int64_t id : out) EXPECT_TRUE(id >= 0 && id < 100) << id;
      EXPECT_EQ(out, sample_tokens(model, prompt, 12, temperature, top_k, 5));
    }
  }
}

TEST(ModelGenerate, GreedyFollowsArgmaxAndTopOneIsGreedy) {
  const GPT2Config cfg = tiny_config(100);
  GPT2 model(cfg);
  randomise(model, 4);
  const std::vector<int64_t> prompt = {1, 2, 3};
  auto greedy = sample_tokens(model, prompt, 6, 0.0, 0, 0);
  EXPECT_EQ(greedy, sample_tokens(model, prompt, 6, 1.0, 1, 77));
  torch::NoGradGuard no_grad;
  for (size_t n = prompt.size(); n < greedy.size(); ++n) {
    auto idx = torch::tensor(std::vector<int64_t>(greedy.begin(), greedy.begin() + n)).view({1, -1});
    EXPECT_EQ(model->forward(idx)[0][n - 1].argmax().item<int64_t>(), greedy[n]);
  }
}

TEST(ModelGenerate, RejectsBadArguments) {
  GPT2 model(tiny_config(100));
  EXPECT_HAS(user_error([&] { sample_tokens(model, {}, 1, 1.0, 0, 0); }), "prompt");
  EXPECT_HAS(user_error([&] { sample_tokens(model, {100}, 1, 1.0, 0, 0); }), "100");
  EXPECT_HAS(user_error([&] { sample_tokens(model, {1}, 1, -1.0, 0, 0); }), "temperature");
  EXPECT_HAS(user_error([&] { sample_tokens(model, {1}, 1, 1.0, -2, 0); }), "top_k");
}

// Generation with the KV cache against a plain loop over GPT2::forward, the training path: each row
// alone, its context cut by the rule generate.h states (restart at the last block_size/2 tokens).
std::vector<int64_t> reference_greedy(GPT2& model, std::vector<int64_t> tokens, int64_t n_new) {
  torch::NoGradGuard no_grad;
  const int64_t window = model->config().block_size, restart = window / 2;
  int64_t start = 0;
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n_new; ++i) {
    const int64_t n = static_cast<int64_t>(tokens.size());
    if (n - start > window) start = n - restart;
    auto idx = torch::tensor(std::vector<int64_t>(tokens.begin() + start, tokens.end())).view({1, -1});
    out.push_back(model->forward(idx)[0][-1].argmax().item<int64_t>());
    tokens.push_back(out.back());
  }
  return out;
}

TEST(ModelGenerate, KvCacheGreedyEqualsFullRecomputeAcrossWindowRestarts) {
  GPT2 model(tiny_config(100));
  randomise(model, 21);
  model->to(torch::kDouble);  // no argmax near-ties between two float orders of summation
  // Ragged prompts (left padding); 40 new tokens cross block_size = 16 several times.
  const std::vector<std::vector<int64_t>> prompts = {
      {5}, {1, 2, 3}, {9, 8, 7, 6, 5, 4, 3}, std::vector<int64_t>(20, 11)};
  SamplingOptions o;
  o.max_new_tokens = 40;
  o.temperature = 0.0;
  GenerationStats stats;
  const auto cached = generate(model, prompts, o, {}, &stats);
  o.kv_cache = false;
  const auto recomputed = generate(model, prompts, o);
  for (size_t b = 0; b < prompts.size(); ++b) {
    const auto ref = reference_greedy(model, prompts[b], 40);
    EXPECT_EQ(cached[b], ref) << "row " << b;
    EXPECT_EQ(recomputed[b], ref) << "row " << b;
  }
  EXPECT_GE(stats.rebuilds, 4);
  EXPECT_EQ(stats.new_tokens, 160);
  // Prefilled tokens: the 20-token prompt is longer than block_size = 16, so it is cropped to its
  // last block_size / 2 = 8 first (it used to count 20 here): 1 + 3 + 7 + 8.
  EXPECT_EQ(stats.prompt_tokens, 19);
}

TEST(ModelGenerate, CachedLogitsEqualForwardWithPadding) {
  GPT2 model(tiny_config(100));
  randomise(model, 22);
  model->to(torch::kDouble);
  torch::NoGradGuard no_grad;
  // Row 0: 3 padding positions then {4, 5, 6}; row 1: {1, 2, 3, 4, 5, 6}. Prefill, then two single steps.
  auto cache = model->make_kv_cache(16, {3, 0});
  auto first =
      model->forward_cached(torch::tensor({0, 0, 0, 4, 5, 6, 1, 2, 3, 4, 5, 6}, torch::kLong).view({2, 6}), cache);
  auto second = model->forward_cached(torch::tensor({7, 8}, torch::kLong).view({2, 1}), cache);
  auto third = model->forward_cached(torch::tensor({9, 9}, torch::kLong).view({2, 1}), cache);
  auto ref = [&](std::vector<int64_t> ids) { return model->forward(torch::tensor(ids).view({1, -1}))[0][-1]; };
  EXPECT_TRUE(torch::allclose(first[0], ref({4, 5, 6}), 0, 1e-12));
  EXPECT_TRUE(torch::allclose(first[1], ref({1, 2, 3, 4, 5, 6}), 0, 1e-12));
  EXPECT_TRUE(torch::allclose(second[0], ref({4, 5, 6, 7}), 0, 1e-12));
  EXPECT_TRUE(torch::allclose(third[1], ref({1, 2, 3, 4, 5, 6, 8, 9}), 0, 1e-12));
  EXPECT_EQ(cache.length, 8);
  EXPECT_HAS(user_error([&] { model->forward_cached(torch::zeros({2, 9}, torch::kLong), cache); }), "capacity 16");
}

// The server's padded prefill on CUDA (src/serve/prompt_prefill.h), here in float64: rows padded on
// the right (id 0) to one length, the logits taken at each row's last real position; they and the
// keys and values of the real positions equal those of each prompt alone, unpadded (causal
// attention keeps the padding out).
TEST(ModelGenerate, RightPaddedRowsGiveTheLogitsAtTheirLastPositions) {
  GPT2 model(tiny_config(100));
  randomise(model, 23);
  model->to(torch::kDouble);
  torch::NoGradGuard no_grad;
  auto cache = model->make_kv_cache(16, {0, 0});
  const auto ids = torch::tensor({4, 5, 6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 0}, torch::kLong).view({2, 8});
  const auto got = model->forward_cached(ids, cache, torch::tensor({2, 6}, torch::kLong));  // (2, V)
  EXPECT_EQ(cache.length, 8);
  const std::vector<std::vector<int64_t>> prompts = {{4, 5, 6}, {1, 2, 3, 4, 5, 6, 7}};
  for (int64_t r = 0; r < 2; ++r) {
    auto alone = model->make_kv_cache(16, {0});
    const auto n = static_cast<int64_t>(prompts[r].size());
    const auto want = model->forward_cached(torch::tensor(prompts[r]).view({1, -1}), alone);
    EXPECT_TRUE(torch::allclose(got[r], want[0], 0, 1e-12)) << "row " << r;
    for (size_t l = 0; l < cache.keys.size(); ++l) {
      EXPECT_TRUE(torch::allclose(cache.keys[l][r].narrow(1, 0, n), alone.keys[l][0].narrow(1, 0, n), 0, 1e-12));
      EXPECT_TRUE(torch::allclose(cache.values[l][r].narrow(1, 0, n), alone.values[l][0].narrow(1, 0, n), 0, 1e-12));
    }
  }
  auto full = model->make_kv_cache(4, {0, 0});
  EXPECT_HAS(user_error([&] { model->forward_cached(ids, full, torch::tensor({2, 6}, torch::kLong)); }), "capacity 4");
}

// Slot decoding (Note [Slot decoding], the server's step): each row is its own sequence at its own
// position, prefilled through a one-row view; its logits are those of a forward over its whole
// sequence, and for one `attend` the same bits whatever the other rows hold.
TEST(ModelGenerate, SlotDecodingRowsAreIndependentSequences) {
  GPT2 model(tiny_config(100));
  randomise(model, 24);
  torch::NoGradGuard no_grad;
  const int64_t S = 3;
  auto cache = model->make_kv_cache(16, std::vector<int64_t>(S, 0));
  auto prefill = [&](int64_t row, const std::vector<int64_t>& ids) {
    KVCache view = cache.row_view(row);
    return model->forward_cached(torch::tensor(ids).view({1, -1}), view)[0];
  };
  auto step = [&](const std::vector<int64_t>& ids, const std::vector<int64_t>& pos, int64_t attend) {
    return model->forward_slots(torch::tensor(ids).view({S, 1}), torch::tensor(pos), cache, attend);  // (S, V)
  };
  auto ref = [&](const std::vector<int64_t>& ids) { return model->forward(torch::tensor(ids).view({1, -1}))[0][-1]; };
  auto close = [](const torch::Tensor& a, const torch::Tensor& b) { return torch::allclose(a, b, 1e-4, 1e-5); };
  std::vector<int64_t> a = {4, 5, 6, 7, 8}, c = {1, 2, 3};
  EXPECT_TRUE(close(prefill(0, a), ref(a)));
  prefill(2, c);
  // Row 1 inactive (id 0 at position 0), as the scheduler runs a free slot.
  auto s1 = step({9, 0, 9}, {5, 0, 3}, 8);
  a.push_back(9);
  c.push_back(9);
  EXPECT_TRUE(close(s1[0], ref(a)));
  EXPECT_TRUE(close(s1[2], ref(c)));
  // The next step twice with attend 16: row 1 inactive, then row 1 holding a longer sequence.
  // Rows 0 and 2 write the same keys again and must give the same bits.
  const auto s2 = step({10, 0, 11}, {6, 0, 4}, 16);
  const std::vector<int64_t> b = {7, 3, 7, 3, 7, 3, 7, 3, 7, 3};
  prefill(1, b);
  const auto s2b = step({10, 12, 11}, {6, 10, 4}, 16);
  EXPECT_TRUE(torch::equal(s2[0], s2b[0]));
  EXPECT_TRUE(torch::equal(s2[2], s2b[2]));
  // Another `attend` (8): the same values up to rounding (the softmax reduces over another length).
  const auto s2c = step({10, 0, 11}, {6, 0, 4}, 8);
  EXPECT_TRUE(close(s2c[0], s2b[0]));
  EXPECT_TRUE(close(s2c[2], s2b[2]));
  a.push_back(10);
  c.push_back(11);
  auto b12 = b;
  b12.push_back(12);
  EXPECT_TRUE(close(s2b[0], ref(a)));
  EXPECT_TRUE(close(s2b[1], ref(b12)));
  EXPECT_TRUE(close(s2b[2], ref(c)));
  // Row 0's sequence alone in another row of a fresh cache (the server takes any free slot), each
  // step at the `attend` it had: the same bits.
  cache = model->make_kv_cache(16, std::vector<int64_t>(S, 0));
  prefill(1, {4, 5, 6, 7, 8});
  step({0, 9, 0}, {0, 5, 0}, 8);
  EXPECT_TRUE(torch::equal(step({0, 10, 0}, {0, 6, 0}, 16)[1], s2b[0]));
}

// kernels::slot_attention in the slot path (the CPU default, Note [Slot decoding]): each row's
// logits within rounding of forward_cached's for the same prefix (one row, its own cache), and of
// the SDPA path's (set_slot_attention(false)); a row's bits do not depend on `attend`.
TEST(ModelGenerate, SlotAttentionKernelMatchesCachedDecoding) {
  GPT2 model(tiny_config(100));
  randomise(model, 25);
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(model->slot_attention_on());  // CPU: on unless set off
  const int64_t S = 3;
  const std::vector<std::vector<int64_t>> prompts = {{4, 5, 6, 7, 8}, {1}, {9, 3, 9}};
  auto cache = model->make_kv_cache(16, std::vector<int64_t>(S, 0));
  std::vector<KVCache> alone;  // each row's sequence in its own one-row cache
  std::vector<int64_t> pos;
  for (int64_t r = 0; r < S; ++r) {
    const auto ids = torch::tensor(prompts[r]).view({1, -1});
    KVCache view = cache.row_view(r);
    model->forward_cached(ids, view);
    alone.push_back(model->make_kv_cache(16, {0}));
    model->forward_cached(ids, alone.back());
    pos.push_back(static_cast<int64_t>(prompts[r].size()));
  }
  auto close = [](const torch::Tensor& a, const torch::Tensor& b) { return torch::allclose(a, b, 1e-4, 1e-5); };
  for (int64_t step = 0; step < 6; ++step) {
    std::vector<int64_t> ids;
    for (int64_t r = 0; r < S; ++r) ids.push_back(10 + 7 * step + r);
    const auto id_tensor = torch::tensor(ids).view({S, 1});
    const auto pos_tensor = torch::tensor(pos);
    // The SDPA path first (it writes the same keys and values the kernel path writes again).
    model->set_slot_attention(false);
    EXPECT_FALSE(model->slot_attention_on());
    const auto sdpa = model->forward_slots(id_tensor, pos_tensor, cache, 16);
    model->set_slot_attention(true);
    const auto got = model->forward_slots(id_tensor, pos_tensor, cache, 16);                         // (S, V)
    EXPECT_TRUE(torch::equal(got, model->forward_slots(id_tensor, pos_tensor, cache, 12))) << step;  // attend is moot
    for (int64_t r = 0; r < S; ++r) {
      const auto want = model->forward_cached(torch::tensor({ids[r]}).view({1, 1}), alone[r])[0];
      EXPECT_TRUE(close(got[r], want)) << "step " << step << " row " << r;
      EXPECT_TRUE(close(got[r], sdpa[r])) << "step " << step << " row " << r;
      ++pos[r];
    }
  }
}

// The fused decode step (Note [Fused decode step]) through its CPU reference ops, against
// forward_slots' blocks' ops on the same prefilled caches: the logits and the keys and values it
// writes agree within fp32 rounding (the same sums in the same order, only the LayerNorm and the
// products grouped differently; the slot tests' 1e-4 relative, 1e-5 absolute), for fp32 weights
// and for int8 ones, at 1 and 3 rows. On the CPU forward_slots itself keeps the blocks'
// ops, and asking for the one-kernel step (CUDA's) runs the same ops; a position outside the cache
// is refused by name.
TEST(ModelGenerate, FusedDecodeStepMatchesTheBlocksOps) {
  GPT2 model(tiny_config(100));
  randomise(model, 26);
  torch::NoGradGuard no_grad;
  auto close = [](const torch::Tensor& a, const torch::Tensor& b) { return torch::allclose(a, b, 1e-4, 1e-5); };
  const std::vector<std::vector<int64_t>> prompts = {{4, 5, 6, 7, 8}, {1}, {9, 3, 9}};
  for (const bool int8 : {false, true}) {
    if (int8) model->quantize_int8();
    for (const int64_t S : {1, 3}) {
      auto fused = model->make_kv_cache(16, std::vector<int64_t>(S, 0));
      auto blocks = model->make_kv_cache(16, std::vector<int64_t>(S, 0));
      std::vector<int64_t> pos;
      for (int64_t r = 0; r < S; ++r) {
        const auto ids = torch::tensor(prompts[r]).view({1, -1});
        for (KVCache* cache : {&fused, &blocks}) {
          KVCache view = cache->row_view(r);
          model->forward_cached(ids, view);
        }
        pos.push_back(static_cast<int64_t>(prompts[r].size()));
      }
      EXPECT_FALSE(model->fused_decode_applies(fused, torch::tensor(pos)));
      for (int64_t step = 0; step < 6; ++step) {
        std::vector<int64_t> ids;
        for (int64_t r = 0; r < S; ++r) ids.push_back(10 + 7 * step + r);
        const auto id_tensor = torch::tensor(ids).view({S, 1});
        const auto pos_tensor = torch::tensor(pos);
        const auto got = model->forward_slots_fused(id_tensor, pos_tensor, fused);  // (S, V)
        if (step == 0) {  // the one kernel is CUDA's: asked for on the CPU, the same ops run again
          model->set_one_kernel_decode(true);
          EXPECT_FALSE(model->one_kernel_decode_applies(fused, pos_tensor));
          EXPECT_TRUE(torch::equal(model->forward_slots_fused(id_tensor, pos_tensor, fused), got));
          model->set_one_kernel_decode(false);
        }
        const auto want = model->forward_slots(id_tensor, pos_tensor, blocks);
        ASSERT_EQ(got.sizes(), want.sizes());
        EXPECT_TRUE(close(got, want)) << "int8 " << int8 << ", rows " << S << ", step " << step << ": max "
                                      << (got - want).abs().max().item<double>();
        for (size_t l = 0; l < fused.keys.size(); ++l) {
          EXPECT_TRUE(close(fused.keys[l], blocks.keys[l])) << "layer " << l;
          EXPECT_TRUE(close(fused.values[l], blocks.values[l])) << "layer " << l;
        }
        for (auto& p : pos) ++p;
      }
    }
  }
  auto cache = model->make_kv_cache(8, {0});  // shorter than block_size: the position is a valid wpe row
  try {
    model->forward_slots_fused(torch::tensor({3}, torch::kLong).view({1, 1}), torch::tensor({8}, torch::kLong), cache);
    ADD_FAILURE() << "a position outside the cache was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_HAS(e.what(), "positions[0] = 8 is outside [0, capacity = 8)");
  }
}

TEST(ModelGenerate, TopPKeepsTheNucleusAndStopTokenEndsARow) {
  GPT2 model(tiny_config(100));
  randomise(model, 23, 0.1);  // flat-ish distributions: the nucleus holds several ids
  model->to(torch::kDouble);
  const std::vector<int64_t> prompt = {3, 1, 4};
  SamplingOptions o;
  o.max_new_tokens = 12;
  o.top_p = 0.3;
  o.seed = 8;
  std::vector<std::vector<int64_t>> seen;
  const auto out = generate(model, {prompt}, o, [&](const std::vector<int64_t>& ids) { seen.push_back(ids); }).front();
  ASSERT_EQ(out.size(), 12u);
  ASSERT_EQ(seen.size(), 12u);
  torch::NoGradGuard no_grad;
  std::vector<int64_t> ctx = prompt;
  int64_t nucleus_total = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t id = out[i];
    EXPECT_EQ(seen[i][0], id);
    auto probs = torch::softmax(model->forward(torch::tensor(ctx).view({1, -1}))[0][-1], 0);
    auto [sorted, order] = probs.sort(0, true);
    const auto cum = sorted.cumsum(0);
    int64_t keep = 1;  // smallest prefix whose mass reaches 0.3
    while (cum[keep - 1].item<double>() < 0.3) ++keep;
    nucleus_total += keep;
    auto nucleus = order.narrow(0, 0, keep);
    EXPECT_TRUE((nucleus == id).any().item<bool>()) << id << " outside the top-p nucleus of " << keep;
    ctx.push_back(id);
  }
  EXPECT_GT(nucleus_total, 12) << "every nucleus had one id: the test would not see a wrong cut";
  // A tiny top_p is greedy; a stop token ends the row with it.
  o.top_p = 1e-9;
  o.temperature = 1.0;
  const auto greedy = reference_greedy(model, prompt, 12);
  EXPECT_EQ(generate(model, {prompt}, o).front(), greedy);
  o.stop_token = greedy[4];
  const auto stopped = generate(model, {prompt, prompt}, o);
  const auto cut = static_cast<size_t>(std::find(greedy.begin(), greedy.end(), greedy[4]) - greedy.begin()) + 1;
  EXPECT_EQ(stopped[0], std::vector<int64_t>(greedy.begin(), greedy.begin() + cut));
  EXPECT_EQ(stopped[1], stopped[0]);
  o.top_p = 1.5;
  EXPECT_HAS(user_error([&] { generate(model, {prompt}, o); }), "top_p");
}

// ---------------------------------------------------------------------------------------------
// HF state dict mapping (file-level parity with transformers is in tests/python)

TEST(ModelHfImport, StateDictRoundTripAndNamedErrors) {
  const GPT2Config cfg = tiny_config(100);
  GPT2 src(cfg), dst(cfg);
  randomise(src, 21);
  NamedTensors sd = hf_state_dict(src);
  ASSERT_EQ(sd.size(), src->named_parameters().size());
  EXPECT_EQ(sd[0].first, "transformer.wte.weight");
  EXPECT_EQ(sd[0].second.sizes(), torch::IntArrayRef({100, 16}));  // HF vocab rows only
  for (const auto& [name, t] : sd) {
    if (name == "transformer.h.0.attn.c_attn.weight") {
      EXPECT_EQ(t.sizes(), torch::IntArrayRef({16, 48}));  // HF Conv1D (in, out)
    }
  }

  // Without the prefix, with HF's extra keys: still loads, bit-exact.
  NamedTensors hf_style;
  for (const auto& [name, t] : sd) hf_style.emplace_back(name.substr(std::string("transformer.").size()), t);
  hf_style.emplace_back("lm_head.weight", sd[0].second);
  hf_style.emplace_back("h.0.attn.bias", torch::ones({1, 1, 16, 16}));
  dst->init_weights(0);
  {
    torch::NoGradGuard no_grad;
    param(dst, "transformer.wte.weight").fill_(3.0);  // padding rows must come back zero
  }
  load_hf_state_dict(dst, hf_style, "mem");
  auto ps = src->parameters(), pd = dst->parameters();
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_TRUE(torch::equal(ps[i], pd[i])) << i;

  NamedTensors missing(sd.begin(), sd.end() - 1);
  EXPECT_NE(user_error([&] {
              load_hf_state_dict(dst, missing, "ckpt.safetensors");
            }).find("missing tensor 'transformer.ln_f.bias'"),
            std::string::npos);
  NamedTensors wrong = sd;
  for (auto& [name, t] : wrong) {
    if (name == "transformer.h.1.mlp.c_fc.weight") t = t.t().contiguous();  // our layout, not HF's
  }
  const std::string msg = user_error([&] { load_hf_state_dict(dst, wrong, "ckpt.safetensors"); });
  EXPECT_NE(msg.find("ckpt.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("transformer.h.1.mlp.c_fc.weight"), std::string::npos) << msg;
  NamedTensors extra = sd;
  extra.emplace_back("transformer.h.2.ln_1.weight", torch::ones({16}));
  EXPECT_NE(
      user_error([&] { load_hf_state_dict(dst, extra, "x"); }).find("unexpected tensor 'transformer.h.2.ln_1.weight'"),
      std::string::npos);
}

}  // namespace
}  // namespace gpt2
