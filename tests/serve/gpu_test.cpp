// gpt2-serve's decode step from CUDA graphs (src/serve/decode_graphs.h) against the eager step, on
// a small random bf16 model: the replayed logits are the same bits as the eager ones while rows
// join and leave, with one graph (attend = the capacity) and with one per attend value; its
// prefills (src/serve/prompt_prefill.h) likewise, one graph per padded length; a Scheduler
// with staggered prompts gives every sequence the same ids with and without graphs; and so does
// gpt2-generate's one-prompt path (src/serve/generate_one.h), through window restarts.
// Needs a GPU: every test skips without one (CI) and runs on the GPU machine (`ctest -L gpu`).
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "data/bpe_tokenizer.h"
#include "src/model/generate.h"
#include "src/model/gpt2_model.h"
#include "src/serve/decode_graphs.h"
#include "src/serve/generate_one.h"
#include "src/serve/metrics.h"
#include "src/serve/prompt_prefill.h"
#include "src/serve/scheduler.h"
#include "tests/kernels/compare.h"
#include "tests/test_util.h"

namespace gpt2::serve {
namespace {

constexpr int64_t kContext = 32;  // block_size: the slot cache's capacity

// Random weights large enough that the logits are far from uniform (distinct greedy ids): GPT-2's
// init for biases, LayerNorms and wte's padding rows, N(0, 0.3) for the other weights.
GPT2 random_bf16_model(uint64_t seed, int64_t context = kContext) {
  GPT2Config cfg;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 64;
  cfg.vocab_size = 1000;  // padded to 1024 inside
  cfg.block_size = context;
  GPT2 model(cfg);
  model->init_weights(seed);
  {
    torch::NoGradGuard no_grad;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    for (auto& item : model->named_parameters()) {
      const std::string& name = item.key();
      if (name.find(".ln_") != std::string::npos || name.find(".bias") != std::string::npos) continue;
      item.value().normal_(0.0, 0.3, gen);
    }
    auto wte = model->named_parameters()["transformer.wte.weight"];
    wte.narrow(0, cfg.vocab_size, cfg.padded_vocab_size() - cfg.vocab_size).zero_();  // padding rows stay 0
  }
  model->to(torch::kCUDA, torch::kBFloat16);
  return model;
}

// One slot cache driven as the scheduler drives it: prefills into free rows, then decode steps
// over every row, with greedy ids fed back.
struct SlotRun {
  SlotRun(GPT2& model, int64_t rows, bool use_graphs)
      : model(model),
        cache(model->make_kv_cache(kContext, std::vector<int64_t>(rows, 0))),
        decode(model, cache, use_graphs),
        last(rows, 0),
        position(rows, 0),
        active(rows, false) {}
  void prefill(int64_t row, const std::vector<int64_t>& prompt) {
    torch::NoGradGuard no_grad;
    KVCache view = cache.row_view(row);
    const auto logits = model->forward_cached(torch::tensor(prompt, torch::kLong).view({1, -1}).to(torch::kCUDA), view);
    last[row] = logits.argmax(1).item<int64_t>();
    position[row] = static_cast<int64_t>(prompt.size());
    active[row] = true;
  }
  // One step over the first `live` rows (0: all); inactive rows feed id 0 at position 0, as the
  // scheduler's free slots do.
  DecodeOutputs step(int64_t attend, int64_t live = 0) {
    std::vector<int64_t> ids(last.size(), 0), pos(last.size(), 0);
    for (size_t r = 0; r < last.size(); ++r) {
      if (active[r]) ids[r] = last[r], pos[r] = position[r];
    }
    DecodeOutputs out = decode.step(ids, pos, attend, live);
    for (size_t r = 0; r < last.size(); ++r) {
      if (active[r]) last[r] = out.greedy[static_cast<int64_t>(r)].item<int64_t>(), ++position[r];
    }
    return out;
  }
  GPT2& model;
  KVCache cache;
  DecodeGraphs decode;
  std::vector<int64_t> last, position;
  std::vector<bool> active;
};

// Rows join (prefills of different lengths between steps) and leave (a row goes inactive), the
// graph run and the eager run side by side: every step's logits torch::equal, greedy ids equal.
// `attend_block` 0: one graph over the whole capacity; N: attend = the longest row rounded up to
// N, one graph per value met. slot_attention: kernels::slot_attention (the server's default) or
// SDPA under a mask.
void expect_graphs_equal_eager(int64_t attend_block, int64_t graphs_expected, bool slot_attention) {
  NoCudnnAttention no_cudnn_attention;  // as Scheduler::run decodes
  GPT2 model = random_bf16_model(3);
  model->set_slot_attention(slot_attention);
  const int64_t rows = 4;
  SlotRun graphed(model, rows, /*use_graphs=*/true), eager(model, rows, /*use_graphs=*/false);
  ASSERT_TRUE(graphed.decode.graphs_on());
  ASSERT_FALSE(eager.decode.graphs_on());
  const std::vector<std::vector<int64_t>> prompts = {
      {464, 329}, {11, 12, 13, 14, 15, 16, 17}, {7}, {99, 98, 97, 96}};  // ids < vocab_size
  auto join = [&](int64_t row, const std::vector<int64_t>& prompt) {
    graphed.prefill(row, prompt);
    eager.prefill(row, prompt);
  };
  join(0, prompts[0]);
  join(2, prompts[1]);
  for (int64_t s = 0; s < 28; ++s) {
    if (s == 3) join(1, prompts[2]);
    if (s == 6) join(3, prompts[3]);
    if (s == 9) graphed.active[2] = eager.active[2] = false;  // leaves: its slot runs as a free one
    if (s == 12) join(2, prompts[0]);
    int64_t longest = 0;
    for (int64_t r = 0; r < rows; ++r) {
      if (graphed.active[r]) longest = std::max(longest, graphed.position[r] + 1);
    }
    const int64_t attend =
        attend_block > 0 ? std::min(kContext, (longest + attend_block - 1) / attend_block * attend_block) : 0;
    const DecodeOutputs g = graphed.step(attend);
    const DecodeOutputs e = eager.step(attend);
    ASSERT_TRUE(torch::equal(g.logits, e.logits)) << "step " << s << ", attend " << attend;
    ASSERT_TRUE(torch::equal(g.greedy, e.greedy)) << "step " << s;
  }
  EXPECT_TRUE(graphed.decode.graphs_on());
  EXPECT_EQ(graphed.decode.graphs_captured(), graphs_expected);
  EXPECT_EQ(eager.decode.graphs_captured(), 0);
}

TEST(ServeGpuDecodeGraphs, OneGraphOverTheWholeContextReplaysTheEagerBits) {
  REQUIRE_CUDA();
  expect_graphs_equal_eager(/*attend_block=*/0, /*graphs_expected=*/1, /*slot_attention=*/true);
}

TEST(ServeGpuDecodeGraphs, OneGraphPerAttendValueReplaysTheEagerBits) {
  REQUIRE_CUDA();
  // Row 0 reaches position 29: attend 8, 16, 24 and 32 all come.
  expect_graphs_equal_eager(/*attend_block=*/8, /*graphs_expected=*/4, /*slot_attention=*/false);
}

// With the fused step (8 rows or fewer) the scheduler runs only the slots up to the last busy one
// (Scheduler::decode_step). Rows join and leave as above; each step over the first `live` rows,
// from its graphs, gives those rows the bits of the eager step over all 8 rows (the fused step's
// row bits do not depend on its row count) and leaves the rows past them as they were; one graph
// per live count met.
TEST(ServeGpuDecodeGraphs, FusedStepOverTheBusyRowsHasTheFullStepsBits) {
  REQUIRE_CUDA();
  NoCudnnAttention no_cudnn_attention;
  GPT2 model = random_bf16_model(3);
  const int64_t rows = 8;
  SlotRun busy(model, rows, /*use_graphs=*/true), full(model, rows, /*use_graphs=*/false);
  ASSERT_TRUE(
      model->fused_decode_applies(full.cache, torch::zeros({rows}, torch::dtype(torch::kLong).device(torch::kCUDA))));
  ASSERT_TRUE(busy.decode.graphs_on());
  auto join = [&](int64_t row, const std::vector<int64_t>& prompt) {
    busy.prefill(row, prompt);
    full.prefill(row, prompt);
  };
  auto leave = [&](int64_t row) { busy.active[row] = full.active[row] = false; };
  join(0, {464, 329});
  std::vector<int64_t> lives;
  for (int64_t s = 0; s < 24; ++s) {
    if (s == 3) join(5, {11, 12, 13});
    if (s == 6) join(2, {7});
    if (s == 9) leave(5);  // live falls back to 3
    if (s == 12) join(7, {99, 98, 97, 96});
    if (s == 15) leave(0), leave(7);
    int64_t live = 0;
    for (int64_t r = 0; r < rows; ++r) {
      if (busy.active[r]) live = r + 1;
    }
    lives.push_back(live);
    std::vector<torch::Tensor> past;  // the cache rows past `live`, before the step
    for (size_t l = 0; l < busy.cache.keys.size(); ++l) {
      past.push_back(busy.cache.keys[l].narrow(0, live, rows - live).clone());
      past.push_back(busy.cache.values[l].narrow(0, live, rows - live).clone());
    }
    const DecodeOutputs b = busy.step(/*attend=*/0, live);
    const DecodeOutputs f = full.step(/*attend=*/0);
    ASSERT_EQ(b.logits.size(0), live);
    ASSERT_TRUE(torch::equal(b.logits, f.logits.narrow(0, 0, live))) << "step " << s << ", " << live << " rows";
    ASSERT_TRUE(torch::equal(b.greedy, f.greedy.narrow(0, 0, live))) << "step " << s;
    for (size_t l = 0; l < busy.cache.keys.size(); ++l) {
      ASSERT_TRUE(torch::equal(past[2 * l], busy.cache.keys[l].narrow(0, live, rows - live))) << "step " << s;
      ASSERT_TRUE(torch::equal(past[2 * l + 1], busy.cache.values[l].narrow(0, live, rows - live))) << "step " << s;
    }
  }
  std::sort(lives.begin(), lives.end());
  const auto distinct = std::unique(lives.begin(), lives.end()) - lives.begin();
  EXPECT_EQ(distinct, 4);  // 1, 6, 3, 8
  EXPECT_EQ(busy.decode.graphs_captured(), distinct);
}

// [ measured ]: a decode step's time with and without graphs at gpt2-124m's shape (GPT2Config's
// defaults) for 32 rows in bf16, attending over the whole context, as the server's default mode
// runs it: the host's kernel dispatch is what graphs remove. Prints only (no timing assertion;
// the server's tokens/s are bench/serve_bench.sh's to measure); the two ways' logits are the same bits.
TEST(ServeGpuDecodeGraphs, StepTimeAtTheGpt2SmallShape) {
  REQUIRE_CUDA();
  NoCudnnAttention no_cudnn_attention;
  GPT2 model{GPT2Config{}};
  model->init_weights(1);
  model->to(torch::kCUDA, torch::kBFloat16);
  const int64_t rows = 32, steps = 100;
  const int64_t capacity = model->config().block_size;
  auto graphed_cache = model->make_kv_cache(capacity, std::vector<int64_t>(rows, 0));
  auto eager_cache = model->make_kv_cache(capacity, std::vector<int64_t>(rows, 0));
  DecodeGraphs graphed(model, graphed_cache, /*use_graphs=*/true), eager(model, eager_cache, /*use_graphs=*/false);
  std::vector<int64_t> ids(rows), positions(rows);
  for (int64_t r = 0; r < rows; ++r) ids[r] = 1000 + 17 * r, positions[r] = 20 * r;  // each step rewrites these
  const DecodeOutputs g = graphed.step(ids, positions, 0);                           // captures
  const DecodeOutputs e = eager.step(ids, positions, 0);
  EXPECT_TRUE(torch::equal(g.logits, e.logits));
  EXPECT_TRUE(torch::equal(g.greedy, e.greedy));
  auto ms_per_step = [&](DecodeGraphs& decode) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < steps; ++i) decode.step(ids, positions, 0);  // each waits for its ids
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / steps;
  };
  const double eager_ms = ms_per_step(eager), graph_ms = ms_per_step(graphed);
  EXPECT_TRUE(graphed.graphs_on());
  std::printf(
      "[ measured ] decode step, gpt2-124m shape, %lld rows x %lld context, bf16: %.3f ms eager, %.3f ms "
      "from a CUDA graph (%.1fx)\n",
      static_cast<long long>(rows), static_cast<long long>(capacity), eager_ms, graph_ms, eager_ms / graph_ms);
}

// PromptPrefill on CUDA (prompt_prefill.h): prompts of lengths in three buckets of the padded
// path (64, 128, and 160 = the capacity), each into a row of a 3-row cache, the graphs and the
// eager run side by side: logits, greedy ids and the row's keys and values over the prompt the
// same bits, one graph per padded length. The same prompt again in another row after others: the
// same bits (a prompt's arithmetic is its own). Against gpt2-generate's unpadded prefill: within
// bf16 rounding (the padded product has other shapes).
TEST(ServeGpuPrefill, GraphsReplayTheEagerBitsWhateverTheRow) {
  REQUIRE_CUDA();
  NoCudnnAttention no_cudnn_attention;  // as Scheduler::run prefills
  const int64_t context = 160, rows = 3;
  GPT2 model = random_bf16_model(7, context);
  KVCache graphed_cache = model->make_kv_cache(context, std::vector<int64_t>(rows, 0));
  KVCache eager_cache = model->make_kv_cache(context, std::vector<int64_t>(rows, 0));
  PromptPrefill graphed(model, graphed_cache, /*use_graphs=*/true), eager(model, eager_cache, /*use_graphs=*/false);
  ASSERT_TRUE(graphed.graphs_on());
  ASSERT_FALSE(eager.graphs_on());
  EXPECT_EQ(graphed.padded_length(3), 64);
  EXPECT_EQ(graphed.padded_length(65), 128);
  EXPECT_EQ(graphed.padded_length(150), 160);
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> first_logits;
  const std::vector<int64_t> lengths = {3, 64, 65, 100, 150};
  for (size_t i = 0; i < lengths.size(); ++i) {
    std::vector<int64_t> prompt;
    for (int64_t t = 0; t < lengths[i]; ++t) prompt.push_back((31 * t + 7 * static_cast<int64_t>(i)) % 1000);
    const int64_t row = static_cast<int64_t>(i) % rows;
    const PromptPrefill::Result g = graphed.run(prompt, row);
    const torch::Tensor g_logits = g.logits.clone();
    const PromptPrefill::Result e = eager.run(prompt, row);
    EXPECT_TRUE(torch::equal(g_logits, e.logits)) << "length " << lengths[i];
    EXPECT_EQ(g.greedy, e.greedy) << "length " << lengths[i];
    for (size_t l = 0; l < graphed_cache.keys.size(); ++l) {
      EXPECT_TRUE(torch::equal(graphed_cache.keys[l][row].narrow(1, 0, lengths[i]),
                               eager_cache.keys[l][row].narrow(1, 0, lengths[i])))
          << "length " << lengths[i] << " layer " << l;
      EXPECT_TRUE(torch::equal(graphed_cache.values[l][row].narrow(1, 0, lengths[i]),
                               eager_cache.values[l][row].narrow(1, 0, lengths[i])))
          << "length " << lengths[i] << " layer " << l;
    }
    first_logits.push_back(g_logits);
    // gpt2-generate's prefill: one row, unpadded.
    KVCache alone = model->make_kv_cache(context, {0});
    const auto want = model->forward_cached(torch::tensor(prompt, torch::kLong).view({1, -1}).to(torch::kCUDA), alone);
    const double scale = want.abs().max().item<double>();
    EXPECT_LE((g_logits.to(torch::kFloat) - want.to(torch::kFloat)).abs().max().item<double>(), 0.05 * scale)
        << "length " << lengths[i];
  }
  for (size_t i = 0; i < lengths.size(); ++i) {  // again, each in the next row, after the others
    std::vector<int64_t> prompt;
    for (int64_t t = 0; t < lengths[i]; ++t) prompt.push_back((31 * t + 7 * static_cast<int64_t>(i)) % 1000);
    const PromptPrefill::Result g = graphed.run(prompt, (static_cast<int64_t>(i) + 1) % rows);
    EXPECT_TRUE(torch::equal(g.logits, first_logits[i])) << "length " << lengths[i];
  }
  EXPECT_EQ(graphed.graphs_captured(), 3);
  EXPECT_EQ(eager.graphs_captured(), 0);
}

// [ measured ]: one 128-token prompt's prefill at gpt2-124m's shape in bf16, eagerly and from its
// CUDA graph (what a burst of clients waits for, one prompt after another). Prints only.
TEST(ServeGpuPrefill, PrefillTimeAtTheGpt2SmallShape) {
  REQUIRE_CUDA();
  NoCudnnAttention no_cudnn_attention;
  GPT2 model{GPT2Config{}};
  model->init_weights(1);
  model->to(torch::kCUDA, torch::kBFloat16);
  const int64_t rows = 32, runs = 50;
  auto graphed_cache = model->make_kv_cache(model->config().block_size, std::vector<int64_t>(rows, 0));
  auto eager_cache = model->make_kv_cache(model->config().block_size, std::vector<int64_t>(rows, 0));
  PromptPrefill graphed(model, graphed_cache, /*use_graphs=*/true), eager(model, eager_cache, /*use_graphs=*/false);
  std::vector<int64_t> prompt(128);
  for (int64_t t = 0; t < 128; ++t) prompt[t] = (1000 + 37 * t) % 50257;
  const auto g = graphed.run(prompt, 0).logits.clone();  // captures
  EXPECT_TRUE(torch::equal(g, eager.run(prompt, 0).logits));
  auto ms_per_prefill = [&](PromptPrefill& prefill) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < runs; ++i) prefill.run(prompt, i % rows);  // each waits for its id
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / runs;
  };
  const double eager_ms = ms_per_prefill(eager), graph_ms = ms_per_prefill(graphed);
  EXPECT_TRUE(graphed.graphs_on());
  std::printf(
      "[ measured ] prefill of 128 tokens, gpt2-124m shape, bf16: %.3f ms eager, %.3f ms from a CUDA graph "
      "(%.1fx)\n",
      eager_ms, graph_ms, eager_ms / graph_ms);
}

// Every sequence's ids from a Scheduler: 10 prompts of different lengths and lengths to generate
// through 4 slots, submitted at once, so that the slots fill, free and refill in the same order on
// every run; one sequence samples (it reads the step's logits on the host).
std::vector<std::vector<int64_t>> scheduler_ids(GPT2& model, const data::Gpt2Tokenizer& tokenizer,
                                                SchedulerOptions options) {
  Metrics metrics(options.max_batch);
  std::mutex mu;
  std::condition_variable done;
  const int64_t n = 10;
  int64_t finished = 0;
  std::vector<std::vector<int64_t>> ids(n);
  std::vector<SequenceSpec> specs;
  for (int64_t i = 0; i < n; ++i) {
    SequenceSpec spec;
    for (int64_t t = 0; t <= i; ++t) spec.prompt.push_back(100 + 37 * i + t);  // i + 1 tokens
    spec.sampling.max_new_tokens = 4 + (7 * i) % 13;
    spec.sampling.temperature = i == 5 ? 0.8 : 0.0;
    spec.sampling.seed = 11;
    spec.on_event = [&, i](SequenceEvent event) {
      std::lock_guard<std::mutex> lock(mu);
      ids[i].insert(ids[i].end(), event.token_ids.begin(), event.token_ids.end());
      if (event.finished != FinishReason::kNone) {
        EXPECT_NE(event.finished, FinishReason::kError) << "sequence " << i;
        ++finished;
        done.notify_all();
      }
    };
    specs.push_back(std::move(spec));
  }
  Scheduler scheduler(model, tokenizer, options, metrics);
  EXPECT_EQ(scheduler.submit(std::move(specs)).size(), static_cast<size_t>(n));
  {
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_TRUE(done.wait_for(lock, std::chrono::seconds(60), [&] { return finished == n; }));
  }
  scheduler.stop();
  return ids;
}

TEST(ServeGpuScheduler, StaggeredSequencesGetTheSameIdsWithAndWithoutGraphs) {
  REQUIRE_CUDA();
  GPT2 model = random_bf16_model(5);
  const auto tokenizer = data::Gpt2Tokenizer::load(test::tokenizer_dir());
  for (const int64_t attend_block : {0, 8}) {
    SchedulerOptions options;
    options.max_batch = 4;
    options.attend_block = attend_block;
    options.cuda_graphs = true;
    const auto with_graphs = scheduler_ids(model, tokenizer, options);
    options.cuda_graphs = false;
    const auto without = scheduler_ids(model, tokenizer, options);
    for (size_t i = 0; i < with_graphs.size(); ++i) {
      EXPECT_FALSE(with_graphs[i].empty()) << "sequence " << i;
      EXPECT_EQ(with_graphs[i], without[i]) << "sequence " << i << ", attend_block " << attend_block;
    }
    // 4 slots take the fused step, over the slots up to the last busy one (Scheduler::decode_step),
    // whose row bits are those of one row alone: each greedy sequence's ids are generate_one's for
    // its prompt alone (the same one-row prefill, then the fused step at one row).
    const auto cache = model->make_kv_cache(kContext, std::vector<int64_t>(4, 0));
    ASSERT_TRUE(model->fused_decode_applies(cache, torch::zeros({4}, torch::dtype(torch::kLong).device(torch::kCUDA))));
    for (int64_t i = 0; i < static_cast<int64_t>(with_graphs.size()); ++i) {
      if (i == 5) continue;  // the sampled one
      SamplingOptions o;
      o.temperature = 0.0;
      o.max_new_tokens = 4 + (7 * i) % 13;
      std::vector<int64_t> prompt;
      for (int64_t t = 0; t <= i; ++t) prompt.push_back(100 + 37 * i + t);  // as scheduler_ids
      EXPECT_EQ(with_graphs[i], generate_one(model, prompt, o, /*use_graphs=*/true)) << "sequence " << i;
    }
  }
}

// Greedy one step ahead (start, start_greedy, finish: gpt2-generate's decode) replays the graph
// step() replays, its inputs fed on the device: the same ids as step() fed from the host, step by
// step, and the same cache bits, at one row (the fused step) and at 4 rows (the step over every row).
TEST(ServeGpuDecodeGraphs, GreedyAheadIsStepOnItsOwnArgmax) {
  REQUIRE_CUDA();
  NoCudnnAttention no_cudnn_attention;
  GPT2 model = random_bf16_model(5);
  for (const int64_t rows : {1, 4}) {
    SlotRun ahead(model, rows, /*use_graphs=*/true), stepped(model, rows, /*use_graphs=*/true);
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<int64_t> prompt = {17 + r, 4, 250, 999};
      ahead.prefill(r, prompt);
      stepped.prefill(r, prompt);
    }
    ahead.decode.start(ahead.last, ahead.position, 0);
    for (int step = 0; step < 20; ++step) {
      const DecodeOutputs want = stepped.step(0);
      if (step < 19) ahead.decode.start_greedy(0);
      ASSERT_TRUE(torch::equal(ahead.decode.finish(), want.greedy)) << rows << " rows, step " << step;
    }
    EXPECT_EQ(ahead.decode.graphs_captured(), 1) << rows << " rows";
    for (size_t l = 0; l < ahead.cache.keys.size(); ++l) {
      EXPECT_TRUE(torch::equal(ahead.cache.keys[l], stepped.cache.keys[l])) << rows << " rows, layer " << l;
      EXPECT_TRUE(torch::equal(ahead.cache.values[l], stepped.cache.values[l])) << rows << " rows, layer " << l;
    }
  }
}

// Graphs replay the eager step's kernels on its shapes (attend 0 either way) and the prefill's
// padded shapes: the same ids, greedy and sampled, with 60 new tokens over a 32-position window
// (restarts: the prefill again, into the same cache).
TEST(ServeGpuGenerateOne, TheSameIdsWithAndWithoutGraphs) {
  REQUIRE_CUDA();
  GPT2 model = random_bf16_model(9);
  for (const double temperature : {0.0, 0.8}) {
    SamplingOptions o;
    o.max_new_tokens = 60;
    o.temperature = temperature;
    o.top_k = 0;
    o.seed = 11;
    GenerationStats with_stats, without_stats;
    const auto with_graphs = generate_one(model, {17, 4, 250, 999, 3}, o, true, {}, &with_stats);
    const auto without = generate_one(model, {17, 4, 250, 999, 3}, o, false, {}, &without_stats);
    EXPECT_EQ(with_graphs.size(), 60u);
    EXPECT_EQ(with_graphs, without) << "temperature " << temperature;
    EXPECT_GE(with_stats.rebuilds, 2);
    std::printf("[ measured ] generate_one, 60 tokens: %.3f ms a step with graphs, %.3f without\n",
                1e3 * with_stats.decode_s / with_stats.steps, 1e3 * without_stats.decode_s / without_stats.steps);
  }
}

}  // namespace
}  // namespace gpt2::serve
