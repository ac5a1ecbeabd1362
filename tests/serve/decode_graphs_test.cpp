// DecodeGraphs on the CPU (src/serve/decode_graphs.h): graphs are off there, and a step is
// forward_slots and the argmax over the rows it is given, the bits the scheduler computed before
// graphs existed. The graphs themselves are checked against this eager step in gpu_test.cpp.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "src/model/gpt2_model.h"
#include "src/serve/decode_graphs.h"

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

TEST(ServeDecodeGraphs, OnCpuAStepIsForwardSlotsAndTheArgmax) {
  GPT2 model = random_model();
  torch::NoGradGuard no_grad;
  const int64_t rows = 3;
  // The same prefills into two caches: one stepped by DecodeGraphs, one by forward_slots.
  auto stepped = model->make_kv_cache(16, std::vector<int64_t>(rows, 0));
  auto reference = model->make_kv_cache(16, std::vector<int64_t>(rows, 0));
  for (KVCache* cache : {&stepped, &reference}) {
    KVCache row0 = cache->row_view(0), row2 = cache->row_view(2);
    model->forward_cached(torch::tensor(std::vector<int64_t>{4, 5, 6, 7, 8}).view({1, -1}), row0);
    model->forward_cached(torch::tensor(std::vector<int64_t>{1, 2, 3}).view({1, -1}), row2);
  }
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

}  // namespace
}  // namespace gpt2::serve
