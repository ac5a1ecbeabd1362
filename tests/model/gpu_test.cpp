// GPT2 on the GPU: what only shows there, with the fused kernels on (the default on CUDA): a second
// backward through the fused head, target ids outside the vocabulary, and KV-cache decoding
// (generate.h) against full recomputation in fp32 and bf16. Needs a GPU: every test skips without
// one (CI) and runs on the GPU machine (`ctest -L gpu`). The same decoding checks on CPU, in fp64
// with a tiny model, are in model_test.cpp.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "src/base/errors.h"
#include "src/kernels/layer_norm.h"
#include "src/kernels/target_check.h"
#include "src/model/generate.h"
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
    EXPECT_HAS(e.what(), "the model's fused kernels off");
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
  for (const Path& p :
       {Path{"fused kernels", true, false}, Path{"LibTorch's loss", false, false}, Path{"chunked loss", true, true}}) {
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

// ---------------------------------------------------------------------------------------------
// KV-cache decoding against full recomputation (src/model/generate.h), on the GPU

constexpr int64_t kNewTokens = 64;

// A decoding test's shape: GPT-2's vocabulary, 128 positions.
GPT2Config decode_config(int64_t n_layer, int64_t n_head, int64_t n_embd) {
  GPT2Config cfg;
  cfg.n_layer = n_layer;
  cfg.n_head = n_head;
  cfg.n_embd = n_embd;
  cfg.vocab_size = 50257;
  cfg.block_size = 128;
  return cfg;
}

// 4 blocks 256 wide, GPT-2's vocabulary. Random weights that keep greedy decoding lively (with
// embeddings as strong as the blocks, the tied head makes a random model repeat one id, which
// would make the check prove little): every projection of unit gain, N(0, 1/fan_in), LayerNorm
// weights 1 + N(0, 0.1), biases N(0, 0.1), and positions (wpe, N(0, 1)) stronger than tokens (wte,
// N(0, 0.1), also the head: logits of about unit scale). On the CPU in fp32 this decodes 124
// distinct ids in 512 steps. From a private generator, in fp32 on the CPU.
GPT2 lively_model(uint64_t seed) {
  const GPT2Config cfg = decode_config(4, 4, 256);
  GPT2 model(cfg);
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    torch::Tensor& p = item.value();
    auto draw = [&](double mean, double std) {
      p.copy_(torch::empty(p.sizes(), torch::kFloat).normal_(mean, std, gen));
    };
    auto ends = [&](const std::string& s) {
      return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    if (ends("wte.weight")) {
      draw(0.0, 0.1);
    } else if (ends("wpe.weight")) {
      draw(0.0, 1.0);
    } else if (name.find(".ln_") != std::string::npos && ends(".weight")) {
      draw(1.0, 0.1);
    } else if (ends(".bias")) {
      draw(0.0, 0.1);
    } else {
      draw(0.0, 1.0 / std::sqrt(static_cast<double>(p.size(1))));  // Linear (out, in)
    }
  }
  model->named_parameters()["transformer.wte.weight"]
      .narrow(0, cfg.vocab_size, cfg.padded_vocab_size() - cfg.vocab_size)
      .zero_();
  return model;
}

// Eight prompts of 1 to 40 ids: one left-padded batch, ragged as generate() handles it.
std::vector<std::vector<int64_t>> decode_prompts() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t len : {1, 3, 7, 12, 20, 25, 33, 40}) {
    const auto ids = torch::randint(0, 50257, {len}, gen, torch::kLong);
    prompts.emplace_back(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + len);
  }
  return prompts;
}

// Each row's logits at the kNewTokens steps of decoding when row b continues with next[b] (teacher
// forcing, so both ways see the same contexts), (kNewTokens, V) fp32 on the CPU per row:
// with the cache as generate() runs it (the left-padded prompts in one prefill, then one position
// per step) ...
std::vector<torch::Tensor> decoded_logits(GPT2& model, const std::vector<std::vector<int64_t>>& prompts,
                                          const std::vector<std::vector<int64_t>>& next) {
  torch::NoGradGuard no_grad;
  const auto device = model->parameters().front().device();
  const auto B = static_cast<int64_t>(prompts.size());
  int64_t longest = 0;
  for (const auto& p : prompts) longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()));
  std::vector<int64_t> pad(B), ids(B * longest, 0);
  for (int64_t b = 0; b < B; ++b) {
    pad[b] = longest - static_cast<int64_t>(prompts[b].size());
    std::copy(prompts[b].begin(), prompts[b].end(), ids.begin() + b * longest + pad[b]);
  }
  auto cache = model->make_kv_cache(longest + kNewTokens, pad);
  auto logits = model->forward_cached(torch::tensor(ids, torch::kLong).view({B, longest}).to(device), cache);  // (B, V)
  std::vector<std::vector<torch::Tensor>> steps(B);
  for (int64_t s = 0; s < kNewTokens; ++s) {
    const auto rows = logits.to(torch::kCPU, torch::kFloat);
    for (int64_t b = 0; b < B; ++b) steps[b].push_back(rows[b]);
    if (s + 1 == kNewTokens) break;
    std::vector<int64_t> step_ids(B);
    for (int64_t b = 0; b < B; ++b) step_ids[b] = next[b][s];
    logits = model->forward_cached(torch::tensor(step_ids, torch::kLong).view({B, 1}).to(device), cache);
  }
  std::vector<torch::Tensor> out;
  for (auto& s : steps) out.push_back(torch::stack(s));
  return out;
}

// ... and by full recomputation on the training path: one forward per row over its prompt and
// continuation (causal, so position p's logits are those of the prefix that ends at p).
std::vector<torch::Tensor> recomputed_logits(GPT2& model, const std::vector<std::vector<int64_t>>& prompts,
                                             const std::vector<std::vector<int64_t>>& next) {
  torch::NoGradGuard no_grad;
  const auto device = model->parameters().front().device();
  std::vector<torch::Tensor> out;
  for (size_t b = 0; b < prompts.size(); ++b) {
    std::vector<int64_t> seq = prompts[b];
    seq.insert(seq.end(), next[b].begin(), next[b].begin() + kNewTokens - 1);
    const auto logits = model->forward(torch::tensor(seq, torch::kLong).view({1, -1}).to(device))[0];  // (L, V)
    out.push_back(
        logits.narrow(0, static_cast<int64_t>(prompts[b].size()) - 1, kNewTokens).to(torch::kCPU, torch::kFloat));
  }
  return out;
}

// The largest difference between the two ways' logits at any row and step, in units of `unit`
// times that step's logit scale (the recomputed row's largest |logit|); and the mean difference
// in the same units.
std::pair<double, double> logit_differences(const std::vector<torch::Tensor>& decoded,
                                            const std::vector<torch::Tensor>& recomputed, double unit) {
  double worst = 0, sum = 0;
  int64_t n = 0;
  for (size_t b = 0; b < decoded.size(); ++b) {
    const auto scale = recomputed[b].abs().amax(1, /*keepdim=*/true).to(torch::kDouble) * unit;  // (steps, 1)
    const auto d = (decoded[b].to(torch::kDouble) - recomputed[b].to(torch::kDouble)).abs() / scale;
    worst = std::max(worst, d.max().item<double>());
    sum += d.sum().item<double>();
    n += d.numel();
  }
  return {worst, sum / static_cast<double>(n)};
}

// Greedy decoding of `prompts` (kNewTokens each) with the KV cache, and recomputing the whole
// sequence at every step.
std::pair<std::vector<std::vector<int64_t>>, std::vector<std::vector<int64_t>>> greedy_with_and_without_cache(
    GPT2& model, const std::vector<std::vector<int64_t>>& prompts) {
  SamplingOptions o;
  o.max_new_tokens = kNewTokens;
  o.temperature = 0.0;
  auto cached = generate(model, prompts, o);
  o.kv_cache = false;
  return {std::move(cached), generate(model, prompts, o)};
}

// fp32: greedy decoding with the cache (generate()) gives the same ids as generate() recomputing
// the context every step, and as the training path's argmax over the same contexts; the logits of
// the two ways agree to fp32 rounding. fp32 keeps 24 bits (6e-8 relative) and the two ways differ
// only in the order of their sums, so 1e-4 of the logits' scale is far above what rounding can do,
// while a cache off by a position or a mask that lets padding in moves logits by their own scale.
// Greedy may still take either of two ids whose logits tie to within that: such a near tie ends
// the comparison of the row (the rows part ways there), is printed, and may happen once at most.
TEST(ModelGpuDecode, Fp32KvCacheGreedyEqualsFullRecomputation) {
  REQUIRE_CUDA();
  constexpr double kFp32Tolerance = 1e-4;
  GPT2 model = lively_model(7);
  model->to(torch::kCUDA);
  const auto prompts = decode_prompts();
  const auto [cached, recomputed] = greedy_with_and_without_cache(model, prompts);
  const auto full = recomputed_logits(model, prompts, cached);
  const auto decoded = decoded_logits(model, prompts, cached);

  int ties = 0;
  std::set<int64_t> distinct;
  for (size_t b = 0; b < prompts.size(); ++b) {
    ASSERT_EQ(cached[b].size(), static_cast<size_t>(kNewTokens)) << "row " << b;
    ASSERT_EQ(recomputed[b].size(), static_cast<size_t>(kNewTokens)) << "row " << b;
    for (int64_t s = 0; s < kNewTokens; ++s) {
      distinct.insert(cached[b][s]);
      const auto logits = full[b][s];  // (V): the training path's logits for this step's context
      const int64_t argmax = logits.argmax().item<int64_t>();
      if (cached[b][s] == argmax && recomputed[b][s] == argmax) continue;
      const double scale = logits.abs().max().item<double>();
      const double gap = std::max({std::abs(logits[cached[b][s]].item<double>() - logits[argmax].item<double>()),
                                   std::abs(logits[recomputed[b][s]].item<double>() - logits[argmax].item<double>())});
      std::printf(
          "[ measured ] fp32 decode row %zu step %lld: ids cached %lld recomputed %lld argmax %lld, logit gap "
          "%.3g of scale %.3g\n",
          b, static_cast<long long>(s), static_cast<long long>(cached[b][s]), static_cast<long long>(recomputed[b][s]),
          static_cast<long long>(argmax), gap, scale);
      EXPECT_LE(gap, kFp32Tolerance * scale) << "row " << b << " step " << s << ": the ways disagree beyond a tie";
      ++ties;
      break;
    }
  }
  EXPECT_LE(ties, 1) << "near ties should be rare";
  EXPECT_GE(distinct.size(), 32u) << "greedy decoding repeats a few ids: the check would prove little";
  const auto [worst, mean] = logit_differences(decoded, full, 1.0);
  std::printf(
      "[ measured ] fp32 decode: %zu distinct ids of %lld; logits cached vs recomputed: max %.3g, mean %.3g "
      "of the logits' scale (tolerance %.0e)\n",
      distinct.size(), static_cast<long long>(kNewTokens) * static_cast<long long>(prompts.size()), worst, mean,
      kFp32Tolerance);
  EXPECT_LE(worst, kFp32Tolerance);
}

// Slot decoding as gpt2-serve runs it (Note [Slot decoding]): each prompt prefilled into its own
// slot of an S-row cache (every other row left inactive when S holds twice the prompts), then one
// forward_slots a step over all rows, teacher-forced with next[b]. (kNewTokens, V) fp32 CPU logits
// per prompt. `only`: that prompt alone, in the last row (the others inactive): the server gives a
// request any free slot.
std::vector<torch::Tensor> slot_logits(GPT2& model, const std::vector<std::vector<int64_t>>& prompts,
                                       const std::vector<std::vector<int64_t>>& next, int64_t only = -1,
                                       int64_t S = 16) {
  torch::NoGradGuard no_grad;
  const auto device = model->parameters().front().device();
  auto cache = model->make_kv_cache(model->config().block_size, std::vector<int64_t>(S, 0));
  std::vector<int64_t> ids(S, 0), pos(S, 0);
  std::vector<std::vector<torch::Tensor>> steps(prompts.size());
  const int64_t spread = S >= 2 * static_cast<int64_t>(prompts.size()) ? 2 : 1;
  auto row_of = [&](size_t b) { return only >= 0 ? S - 1 : spread * static_cast<int64_t>(b); };
  for (size_t b = 0; b < prompts.size(); ++b) {
    if (only >= 0 && static_cast<int64_t>(b) != only) continue;
    auto view = cache.row_view(row_of(b));
    const auto p = torch::tensor(prompts[b], torch::kLong).view({1, -1}).to(device);
    steps[b].push_back(model->forward_cached(p, view)[0].to(torch::kCPU, torch::kFloat));
    ids[row_of(b)] = next[b][0];
    pos[row_of(b)] = static_cast<int64_t>(prompts[b].size());
  }
  for (int64_t s = 1; s < kNewTokens; ++s) {
    const auto logits = model
                            ->forward_slots(torch::tensor(ids, torch::kLong).view({S, 1}).to(device),
                                            torch::tensor(pos, torch::kLong).to(device), cache)
                            .to(torch::kCPU, torch::kFloat);  // (S, V)
    for (size_t b = 0; b < prompts.size(); ++b) {
      if (only >= 0 && static_cast<int64_t>(b) != only) continue;
      steps[b].push_back(logits[row_of(b)]);
      ids[row_of(b)] = next[b][s];
      ++pos[row_of(b)];
    }
  }
  std::vector<torch::Tensor> out;
  for (auto& s : steps) out.push_back(s.empty() ? torch::Tensor() : torch::stack(s));
  return out;
}

// A continuation of kNewTokens random ids for each of `prompts` prompts, to force (teacher forcing).
std::vector<std::vector<int64_t>> forced_continuations(size_t prompts, uint64_t seed) {
  std::vector<std::vector<int64_t>> next;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (size_t b = 0; b < prompts; ++b) {
    const auto r = torch::randint(0, 50257, {kNewTokens}, gen, torch::kLong);
    next.emplace_back(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + kNewTokens);
  }
  return next;
}

// bf16, as gpt2-serve runs on a GPU: slot decoding within bf16 rounding of full recomputation
// (the tolerance of the test below), and a prompt run alone gives the same bits as in the batch.
TEST(ModelGpuDecode, Bf16SlotDecodingNearRecomputationAndTheSameAloneOrBatched) {
  REQUIRE_CUDA();
  GPT2 model = lively_model(7);
  model->to(torch::kCUDA, torch::kBFloat16);
  const auto prompts = decode_prompts();
  const auto next = forced_continuations(prompts.size(), 12);
  const auto batched = slot_logits(model, prompts, next);
  const double ulp = std::ldexp(1.0, -7);
  const double ulps = 4 * std::sqrt(static_cast<double>(model->config().n_layer));
  const auto [worst, mean] = logit_differences(batched, recomputed_logits(model, prompts, next), ulp);
  std::printf(
      "[ measured ] bf16 slot decoding vs recomputed: max %.3g, mean %.3g bf16 ulps of the logits' scale "
      "(tolerance %.3g, 1)\n",
      worst, mean, ulps);
  EXPECT_LE(worst, ulps);
  EXPECT_LE(mean, 1.0);
  for (int64_t b : {0, 7}) {
    const auto alone = slot_logits(model, prompts, next, b);
    EXPECT_TRUE(torch::equal(alone[b], batched[b])) << "prompt " << b << " alone differs from the batch: max "
                                                    << (alone[b] - batched[b]).abs().max().item<double>();
  }
}

// The fused decode step (Note [Fused decode step]), which forward_slots takes at 8 rows or fewer:
// within the bf16 tolerance of the test below of full recomputation, and of the blocks' ops on the
// same steps (set_fused_decode(false)); a prompt alone in a one-row cache gives the same bits as in
// the 8-row batch (each row's sums are fixed by its own data, whatever the kernels' row count); and
// int8 weights through the same kernels within the same tolerance of the int8 blocks' ops.
TEST(ModelGpuDecode, FusedDecodeStepNearRecomputationAndTheSameAloneOrBatched) {
  REQUIRE_CUDA();
  GPT2 model = lively_model(7);
  model->to(torch::kCUDA, torch::kBFloat16);
  const auto prompts = decode_prompts();  // 8
  const auto next = forced_continuations(prompts.size(), 12);
  const auto on_cuda = torch::dtype(torch::kLong).device(torch::kCUDA);
  for (const int64_t rows : {1, 8, 9}) {
    const auto cache = model->make_kv_cache(16, std::vector<int64_t>(rows, 0));
    EXPECT_EQ(model->fused_decode_applies(cache, torch::zeros({rows}, on_cuda)), rows <= 8) << rows << " rows";
  }
  const int64_t S = static_cast<int64_t>(prompts.size());
  const double ulp = std::ldexp(1.0, -7);
  const double ulps = 4 * std::sqrt(static_cast<double>(model->config().n_layer));
  const auto check = [&](const char* what, const std::vector<torch::Tensor>& got,
                         const std::vector<torch::Tensor>& want) {
    const auto [worst, mean] = logit_differences(got, want, ulp);
    std::printf("[ measured ] %s: max %.3g, mean %.3g bf16 ulps of the logits' scale (tolerance %.3g, 1)\n", what,
                worst, mean, ulps);
    EXPECT_LE(worst, ulps) << what;
    EXPECT_LE(mean, 1.0) << what;
  };
  const auto fused = slot_logits(model, prompts, next, -1, S);
  model->set_fused_decode(false);
  const auto blocks = slot_logits(model, prompts, next, -1, S);
  model->set_fused_decode(true);
  check("bf16 fused decode step vs recomputed", fused, recomputed_logits(model, prompts, next));
  check("bf16 fused decode step vs the blocks' ops", fused, blocks);
  for (int64_t b : {0, 7}) {
    const auto alone = slot_logits(model, prompts, next, b, /*S=*/1);
    EXPECT_TRUE(torch::equal(alone[b], fused[b]))
        << "prompt " << b << " alone differs from the batch: max " << (alone[b] - fused[b]).abs().max().item<double>();
  }
  model->quantize_int8();
  const auto fused8 = slot_logits(model, prompts, next, -1, S);
  model->set_fused_decode(false);
  const auto blocks8 = slot_logits(model, prompts, next, -1, S);
  model->set_fused_decode(true);
  check("int8 fused decode step vs the int8 blocks' ops", fused8, blocks8);
}

// The decode step as one kernel (kernels/decode_step.h, set_one_kernel_decode(true)) against the
// same step as five kernels a block (forward_slots' default): each phase of the
// one kernel is the device code of the kernel it replaces, so the logits must be the same bits, no
// tolerance, at 1, 3 (fewer than the kernel's 4-row template) and 8 rows, in bf16, in fp32 and
// with int8 weights; and at gpt2-124m's width, where 8 rows of the MLP's input fill the default
// 48 KiB of shared memory exactly (the launches must opt in to more: gpt2-serve --max_batch 8). A
// barrier that let a phase read before the last one had written, or a stale cached read of the
// stream, would show here.
TEST(ModelGpuDecode, OneKernelStepIsTheFiveKernelStepBitForBit) {
  REQUIRE_CUDA();
  const auto prompts = decode_prompts();  // 8
  const auto next = forced_continuations(prompts.size(), 13);
  const auto on_cuda = torch::dtype(torch::kLong).device(torch::kCUDA);
  struct Case {
    const char* name;
    torch::Dtype dtype;
    bool int8, wide;
  };
  for (const Case& c :
       {Case{"bf16", torch::kBFloat16, false, false}, Case{"fp32", torch::kFloat, false, false},
        Case{"bf16 int8", torch::kBFloat16, true, false}, Case{"bf16 C=768", torch::kBFloat16, false, true}}) {
    GPT2 model = c.wide ? GPT2(decode_config(2, 12, 768)) : lively_model(7);
    model->to(torch::kCUDA, c.dtype);
    if (c.int8) model->quantize_int8();
    model->set_one_kernel_decode(true);
    for (const int64_t rows : {1, 3, 8}) {
      if (c.wide && rows != 8) continue;
      const auto cache = model->make_kv_cache(16, std::vector<int64_t>(rows, 0));
      ASSERT_TRUE(model->one_kernel_decode_applies(cache, torch::zeros({rows}, on_cuda))) << c.name << " " << rows;
      const int64_t only = rows == 8 ? -1 : (rows == 1 ? 0 : 5);  // 8 rows: every prompt; else one, last row
      const auto one = slot_logits(model, prompts, next, only, rows);
      model->set_one_kernel_decode(false);
      EXPECT_FALSE(model->one_kernel_decode_applies(cache, torch::zeros({rows}, on_cuda)));
      const auto five = slot_logits(model, prompts, next, only, rows);
      model->set_one_kernel_decode(true);
      int64_t compared = 0;
      for (size_t b = 0; b < prompts.size(); ++b) {
        if (!one[b].defined()) continue;
        ++compared;
        EXPECT_TRUE(torch::equal(one[b], five[b]))
            << c.name << ", " << rows << " rows, prompt " << b << ": max difference "
            << (one[b] - five[b]).abs().max().item<double>();
      }
      EXPECT_EQ(compared, only >= 0 ? 1 : 8);
      std::printf("[ measured ] %s one-kernel decode step, %lld rows: %lld prompts x %lld steps bit for bit\n", c.name,
                  static_cast<long long>(rows), static_cast<long long>(compared), static_cast<long long>(kNewTokens));
    }
  }
}

// bf16: the logits of decoding with the cache within bf16 rounding of full recomputation at every
// step, both taking the same fused kernels (the residual LayerNorm included: asserted below).
// Tolerance: both ways compute the same function in bf16 with fp32 sums, and differ in how the
// work is cut (one-row GEMMs and a decoding attention kernel against whole-sequence GEMMs and
// flash attention). An intermediate then rounds differently only where its fp32 value lands near
// a bf16 rounding boundary, by one ulp, and the next layers spread such differences below an ulp
// per element; the final logits round once more. We allow 4 ulps for that, growing as a random
// walk over the blocks: 4 * sqrt(n_layer) = 8 ulps of the step's largest logit, where a bf16 ulp
// is at most 2^-7 of the value; the mean difference must stay below 1 such ulp. A cache off by a
// position or a mask that lets padding in moves logits by their own scale, some 100 such ulps.
TEST(ModelGpuDecode, Bf16KvCacheLogitsWithinBf16RoundingOfFullRecomputation) {
  REQUIRE_CUDA();
  GPT2 model = lively_model(7);
  model->to(torch::kCUDA, torch::kBFloat16);
  const auto& cfg = model->config();
  {
    const auto step_input = torch::zeros({8, 1, cfg.n_embd}, torch::dtype(torch::kBFloat16).device(torch::kCUDA));
    const auto& ln = model->named_parameters();
    EXPECT_TRUE(kernels::residual_layer_norm_applies(step_input, step_input, ln["transformer.h.0.ln_1.weight"],
                                                     ln["transformer.h.0.ln_1.bias"]))
        << "a decoding step would not take the fused LayerNorm that training takes";
  }
  const auto prompts = decode_prompts();
  const auto [cached, recomputed] = greedy_with_and_without_cache(model, prompts);
  int64_t same = 0;
  for (size_t b = 0; b < prompts.size(); ++b) {
    for (int64_t s = 0; s < kNewTokens && cached[b][s] == recomputed[b][s]; ++s) ++same;
  }
  const double ulp = std::ldexp(1.0, -7);
  const double ulps = 4 * std::sqrt(static_cast<double>(cfg.n_layer));
  const auto [worst, mean] =
      logit_differences(decoded_logits(model, prompts, cached), recomputed_logits(model, prompts, cached), ulp);
  std::printf(
      "[ measured ] bf16 decode: greedy ids agree for %lld of %lld steps (up to each row's first difference); "
      "logits cached vs recomputed: max %.3g, mean %.3g bf16 ulps of the logits' scale (tolerance %.3g, 1)\n",
      static_cast<long long>(same), static_cast<long long>(kNewTokens) * static_cast<long long>(prompts.size()), worst,
      mean, ulps);
  EXPECT_LE(worst, ulps);
  EXPECT_LE(mean, 1.0);
}

}  // namespace
}  // namespace gpt2
