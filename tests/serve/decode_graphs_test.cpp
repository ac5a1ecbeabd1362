// DecodeGraphs on the CPU (src/serve/decode_graphs.h): graphs are off there, and a step is
// forward_slots and the argmax over the rows it is given, the bits the scheduler computed before
// graphs existed. The graphs themselves are checked against this eager step in gpu_test.cpp.
// And generate_one (gpt2-generate's one-prompt path on this machinery) against gpt2::generate.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "src/base/errors.h"
#include "src/model/generate.h"
#include "src/model/gpt2_model.h"
#include "src/serve/decode_graphs.h"
#include "src/serve/generate_one.h"

namespace gpt2::serve {
namespace {

GPT2 random_model() {
  GPT2Config cfg;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 16;
  cfg.vocab_size = 100;
  cfg.block_size = 16;
  GPT2 model(cfg);
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  for (auto& p : model->parameters()) p.normal_(0.0, 0.3, gen);
  return model;
}

// The same prefills into two slot caches of a row a prompt (an empty prompt: a free row): one
// to step by DecodeGraphs, one by forward_slots.
std::pair<KVCache, KVCache> prefilled_caches(GPT2& model, const std::vector<std::vector<int64_t>>& prompts) {
  std::pair<KVCache, KVCache> caches;
  for (KVCache* cache : {&caches.first, &caches.second}) {
    *cache = model->make_kv_cache(16, std::vector<int64_t>(prompts.size(), 0));
    for (size_t r = 0; r < prompts.size(); ++r) {
      if (prompts[r].empty()) continue;
      KVCache row = cache->row_view(static_cast<int64_t>(r));
      model->forward_cached(torch::tensor(prompts[r]).view({1, -1}), row);
    }
  }
  return caches;
}

TEST(ServeDecodeGraphs, OnCpuAStepIsForwardSlotsAndTheArgmax) {
  GPT2 model = random_model();
  torch::NoGradGuard no_grad;
  const int64_t rows = 3;
  auto [stepped, reference] = prefilled_caches(model, {{4, 5, 6, 7, 8}, {}, {1, 2, 3}});
  DecodeGraphs decode(model, stepped, /*use_graphs=*/true);
  EXPECT_FALSE(decode.graphs_on());  // a CPU model: ignored
  // Row 1 is free (id 0 at position 0); attend 0 means the whole capacity.
  std::vector<int64_t> ids = {9, 0, 9}, positions = {5, 0, 3};
  for (const int64_t attend : {8, 0, 16, 8}) {
    const DecodeOutputs out = decode.step(ids, positions, attend);
    const auto expected = model->forward_slots(torch::tensor(ids).view({rows, 1}), torch::tensor(positions), reference,
                                               attend);  // (rows, V)
    ASSERT_TRUE(torch::equal(out.logits, expected)) << "attend " << attend;
    ASSERT_TRUE(torch::equal(out.greedy, expected.argmax(1))) << "attend " << attend;
    EXPECT_TRUE(out.greedy.is_cpu());
    for (const int64_t r : {0, 2}) ids[r] = out.greedy[r].item<int64_t>(), ++positions[r];
  }
  EXPECT_EQ(decode.graphs_captured(), 0);
  EXPECT_THROW(decode.step({1, 2}, {0, 0}, 0), c10::Error);  // one id per row
}

// A step over the first `live` rows (what the scheduler runs with the fused step, up to its last
// busy slot) is forward_slots over those rows of the cache (KVCache::first_rows), and the rows
// past them keep their bits. Then a step over every row again: forward_slots over the whole cache.
TEST(ServeDecodeGraphs, OnCpuAStepOverTheFirstRowsLeavesTheOthers) {
  GPT2 model = random_model();
  torch::NoGradGuard no_grad;
  const int64_t rows = 3;
  auto [stepped, reference] = prefilled_caches(model, {{4, 5, 6}, {5, 5, 6}, {6, 5, 6}});
  DecodeGraphs decode(model, stepped, /*use_graphs=*/false);
  std::vector<int64_t> ids = {9, 8, 7}, positions = {3, 3, 3};
  std::vector<torch::Tensor> row2;  // the third row's keys and values before the two-row step
  for (size_t l = 0; l < stepped.keys.size(); ++l) {
    row2.push_back(stepped.keys[l][2].clone());
    row2.push_back(stepped.values[l][2].clone());
  }
  const DecodeOutputs two = decode.step(ids, positions, 0, /*live=*/2);
  KVCache first = reference.first_rows(2);
  EXPECT_EQ(first.keys.front().size(0), 2);
  EXPECT_EQ(first.keys.front().data_ptr(), reference.keys.front().data_ptr());  // a view, not a copy
  const auto expected = model->forward_slots(torch::tensor(std::vector<int64_t>{9, 8}).view({2, 1}),
                                             torch::tensor(std::vector<int64_t>{3, 3}), first, 0);  // (2, V)
  ASSERT_TRUE(torch::equal(two.logits, expected));
  ASSERT_TRUE(torch::equal(two.greedy, expected.argmax(1)));
  for (size_t l = 0; l < stepped.keys.size(); ++l) {
    EXPECT_TRUE(torch::equal(stepped.keys[l][2], row2[2 * l])) << "layer " << l;
    EXPECT_TRUE(torch::equal(stepped.values[l][2], row2[2 * l + 1])) << "layer " << l;
    EXPECT_TRUE(torch::equal(stepped.keys[l], reference.keys[l])) << "layer " << l;  // rows 0-1 written alike
  }
  // Every row: the third at position 3 too, after the first two at 4.
  ids = {two.greedy[0].item<int64_t>(), two.greedy[1].item<int64_t>(), 7}, positions = {4, 4, 3};
  const DecodeOutputs all = decode.step(ids, positions, 0);
  const auto expected_all =
      model->forward_slots(torch::tensor(ids).view({rows, 1}), torch::tensor(positions), reference, 0);
  ASSERT_TRUE(torch::equal(all.logits, expected_all));
  EXPECT_EQ(all.greedy.size(0), rows);
  EXPECT_THROW(decode.step(ids, positions, 0, rows + 1), c10::Error);
  EXPECT_THROW(decode.step(ids, positions, 0, -1), c10::Error);
  EXPECT_THROW(reference.first_rows(0), c10::Error);
}

// Greedy one step ahead (start, start_greedy, finish) is step() fed its own argmax at the next
// position: the same ids each step, the same cache bits, over the first two rows of three (the
// third is left alone), with the host reading each step's ids after the next is queued.
TEST(ServeDecodeGraphs, OnCpuGreedyAheadIsStepOnItsOwnArgmax) {
  GPT2 model = random_model();
  torch::NoGradGuard no_grad;
  auto [ahead, stepped] = prefilled_caches(model, {{4, 5, 6, 7, 8}, {1, 2, 3}, {9, 9}});
  DecodeGraphs queue(model, ahead, /*use_graphs=*/false), reference(model, stepped, /*use_graphs=*/false);
  std::vector<int64_t> ids = {9, 8, 0}, positions = {5, 3, 0};
  queue.start(ids, positions, 0, /*live=*/2);
  for (int step = 0; step < 6; ++step) {
    const DecodeOutputs want = reference.step(ids, positions, 0, /*live=*/2);
    if (step < 5) queue.start_greedy(0);
    const torch::Tensor got = queue.finish();
    ASSERT_TRUE(torch::equal(got, want.greedy)) << "step " << step;
    for (const int64_t r : {0, 1}) ids[r] = want.greedy[r].item<int64_t>(), ++positions[r];
  }
  for (size_t l = 0; l < ahead.keys.size(); ++l) {
    EXPECT_TRUE(torch::equal(ahead.keys[l], stepped.keys[l])) << "layer " << l;
    EXPECT_TRUE(torch::equal(ahead.values[l], stepped.values[l])) << "layer " << l;
  }
  EXPECT_THROW(queue.finish(), c10::Error);  // nothing queued
  queue.start_greedy(0);
  EXPECT_THROW(queue.start(ids, positions, 0), c10::Error);  // a step still queued
  queue.start_greedy(0);
  EXPECT_THROW(queue.start_greedy(0), c10::Error);  // two queued already
  DecodeGraphs fresh(model, stepped, /*use_graphs=*/false);
  EXPECT_THROW(fresh.start_greedy(0), c10::Error);  // no step to take ids from
}

// gpt2::generate for one prompt is the reference: the same ids greedy and sampled (the same draws
// from the same seed), through window restarts (block_size 16: a 5-token prompt and 30 new tokens
// restart twice; a 20-token prompt starts on its last 8), and the same counts.
TEST(ServeGenerateOne, OnCpuItIsGenerateForOnePrompt) {
  GPT2 model = random_model();
  const std::vector<int64_t> short_prompt = {4, 5, 6, 7, 8};
  std::vector<int64_t> long_prompt;
  for (int64_t i = 0; i < 20; ++i) long_prompt.push_back((7 * i + 3) % 100);
  for (const auto& prompt : {short_prompt, long_prompt}) {
    for (const double temperature : {0.0, 0.9}) {
      SamplingOptions o;
      o.max_new_tokens = 30;
      o.temperature = temperature;
      o.top_k = 0;
      o.seed = 3;
      GenerationStats ours, theirs;
      std::vector<std::vector<int64_t>> streamed;
      const auto got = generate_one(
          model, prompt, o, /*use_graphs=*/true, [&](const std::vector<int64_t>& ids) { streamed.push_back(ids); },
          &ours);
      const auto want = gpt2::generate(model, {prompt}, o, {}, &theirs).front();
      const std::string what =
          "prompt of " + std::to_string(prompt.size()) + ", temperature " + std::to_string(temperature);
      EXPECT_EQ(got, want) << what;
      ASSERT_EQ(streamed.size(), got.size()) << what;
      for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(streamed[i], std::vector<int64_t>{got[i]}) << what;
      EXPECT_EQ(ours.prompt_tokens, theirs.prompt_tokens) << what;
      EXPECT_EQ(ours.new_tokens, theirs.new_tokens) << what;
      EXPECT_EQ(ours.steps, theirs.steps) << what;
      EXPECT_EQ(ours.rebuilds, theirs.rebuilds) << what;
      EXPECT_GE(ours.rebuilds, 2) << what;
    }
  }
  // A stop token ends it with that token, as generate's row; bad options are generate's errors.
  SamplingOptions o;
  o.temperature = 0.0;
  o.max_new_tokens = 30;
  const auto greedy = generate_one(model, short_prompt, o, false);
  o.stop_token = greedy[3];
  const auto stopped = generate_one(model, short_prompt, o, false);
  EXPECT_EQ(stopped, gpt2::generate(model, {short_prompt}, o).front());
  EXPECT_LE(stopped.size(), 4u);
  EXPECT_EQ(stopped.back(), greedy[3]);
  o.top_p = 0.0;
  EXPECT_THROW(generate_one(model, short_prompt, o, false), UserError);
  o.top_p = 1.0;
  EXPECT_THROW(generate_one(model, {100}, o, false), UserError);
}

}  // namespace
}  // namespace gpt2::serve
