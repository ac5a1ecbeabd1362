// Sampling loop with a key/value cache (see generate.h).
#include "src/model/generate.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include <algorithm>
#include <limits>
#include <string>

#include "src/base/clock.h"
#include "src/base/errors.h"

namespace gpt2 {
void validate_generation(const GPT2Config& cfg, const std::vector<std::vector<int64_t>>& prompts,
                         const SamplingOptions& o) {
  if (prompts.empty()) throw UserError("generate: no prompts given");
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) throw UserError("generate: prompt " + std::to_string(i) + " holds no tokens");
    for (int64_t id : prompts[i]) {
      if (id < 0 || id >= cfg.vocab_size) {
        throw UserError("generate: prompt " + std::to_string(i) + " has token " + std::to_string(id) +
                        ", outside [0, " + std::to_string(cfg.vocab_size) + ")");
      }
    }
  }
  if (o.max_new_tokens < 0)
    throw UserError("generate: max_new_tokens must be >= 0, got " + std::to_string(o.max_new_tokens));
  if (!(o.temperature >= 0.0))
    throw UserError("generate: temperature must be >= 0 (0 = greedy), got " + std::to_string(o.temperature));
  if (o.top_k < 0)
    throw UserError("generate: top_k must be >= 0 (0 = whole vocabulary), got " + std::to_string(o.top_k));
  if (!(o.top_p > 0.0 && o.top_p <= 1.0))
    throw UserError("generate: top_p must be in (0, 1], got " + std::to_string(o.top_p));
}

int64_t sample_next(torch::Tensor logits, const SamplingOptions& o, at::Generator& gen) {
  if (o.temperature == 0.0) return logits.argmax().item<int64_t>();
  logits = logits / o.temperature;
  const int64_t V = logits.size(0);
  if (o.top_k > 0 && o.top_k < V) {
    auto kth = std::get<0>(logits.topk(o.top_k)).select(0, o.top_k - 1);  // k-th largest logit
    logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
  }
  auto probs = torch::softmax(logits, 0);  // (V)
  if (o.top_p < 1.0) {
    // Keep ids while the mass of the more likely ones is below top_p: the most likely always stays.
    auto [sorted, order] = probs.sort(0, /*descending=*/true);
    auto mass_before = sorted.cumsum(0) - sorted;
    probs = torch::zeros_like(probs).scatter(0, order, sorted.masked_fill(mass_before >= o.top_p, 0.0));
  }
  return probs.multinomial(1, /*replacement=*/false, gen).item<int64_t>();  // multinomial renormalises
}

at::Generator make_sampling_generator(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

NoCudnnAttention::NoCudnnAttention() : was_(at::globalContext().userEnabledCuDNNSDP()) {
  at::globalContext().setSDPUseCuDNN(false);
}
NoCudnnAttention::~NoCudnnAttention() { at::globalContext().setSDPUseCuDNN(was_); }

std::vector<std::vector<int64_t>> generate(GPT2& model, const std::vector<std::vector<int64_t>>& prompts,
                                           const SamplingOptions& options, const TokenCallback& on_tokens,
                                           GenerationStats* stats) {
  const GPT2Config& cfg = model->config();
  validate_generation(cfg, prompts, options);
  GenerationStats local;
  GenerationStats& st = stats ? *stats : local;
  st = {};
  const int64_t B = static_cast<int64_t>(prompts.size());
  std::vector<std::vector<int64_t>> outputs(B);
  if (options.max_new_tokens == 0) return outputs;

  torch::NoGradGuard no_grad;
  NoCudnnAttention no_cudnn_attention;
  const torch::Device device = model->parameters().front().device();
  auto gen = make_sampling_generator(options.seed);
  const int64_t window = cfg.block_size, restart = std::max<int64_t>(1, cfg.block_size / 2);

  std::vector<std::vector<int64_t>> tokens = prompts;  // every row's whole sequence so far
  std::vector<int64_t> start(B, 0);                    // a row's context is tokens[start:]
  // Moves a row's start when its context no longer fits; true when it moved.
  auto fit = [&](int64_t b) {
    const int64_t n = static_cast<int64_t>(tokens[b].size());
    if (n - start[b] <= window) return false;
    start[b] = n - restart;
    return true;
  };
  // A fresh cache filled with every row's context, left-padded; the last position's logits.
  KVCache cache;
  auto prefill = [&]() {
    int64_t longest = 0;
    for (int64_t b = 0; b < B; ++b) longest = std::max<int64_t>(longest, tokens[b].size() - start[b]);
    std::vector<int64_t> pad(B), ids(B * longest, 0);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t len = static_cast<int64_t>(tokens[b].size()) - start[b];
      pad[b] = longest - len;
      std::copy(tokens[b].begin() + start[b], tokens[b].end(), ids.begin() + b * longest + pad[b]);
    }
    cache = model->make_kv_cache(options.kv_cache ? window : longest, pad);
    return model->forward_cached(torch::tensor(ids, torch::kLong).view({B, longest}).to(device), cache);  // (B, V)
  };

  for (int64_t b = 0; b < B; ++b) {
    fit(b);  // a prompt longer than the window keeps its last `restart` tokens
    st.prompt_tokens += static_cast<int64_t>(tokens[b].size()) - start[b];
  }
  auto t0 = SteadyClock::now();
  torch::Tensor logits = prefill();
  std::vector<bool> done(B, false);
  std::vector<int64_t> last(B);
  for (int64_t step = 0;; ++step) {
    const auto rows = logits.to(torch::kCPU, torch::kFloat);  // (B, V); the wait for the GPU is here
    if (step == 0) {
      st.prefill_s = seconds_since(t0);
      t0 = SteadyClock::now();
    }
    if (step == 1) st.first_step_s = seconds_since(t0);
    std::vector<int64_t> emitted(B, -1);
    for (int64_t b = 0; b < B; ++b) {
      last[b] = sample_next(rows[b], options, gen);
      tokens[b].push_back(last[b]);
      if (done[b]) continue;
      outputs[b].push_back(last[b]);
      emitted[b] = last[b];
      ++st.new_tokens;
      done[b] = last[b] == options.stop_token;
    }
    if (on_tokens) on_tokens(emitted);
    if (step + 1 == options.max_new_tokens || std::all_of(done.begin(), done.end(), [](bool d) { return d; })) break;

    bool moved = false;
    for (int64_t b = 0; b < B; ++b) moved = fit(b) || moved;  // every row, no short cut
    st.rebuilds += moved ? 1 : 0;
    ++st.steps;
    if (moved || !options.kv_cache) {
      logits = prefill();
    } else {
      logits = model->forward_cached(torch::tensor(last, torch::kLong).view({B, 1}).to(device), cache);
    }
  }
  st.decode_s = seconds_since(t0);
  return outputs;
}

std::vector<int64_t> sample_tokens(GPT2& model, const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                                   double temperature, int64_t top_k, uint64_t seed) {
  SamplingOptions o;
  o.max_new_tokens = max_new_tokens;
  o.temperature = temperature;
  o.top_k = top_k;
  o.seed = seed;
  const auto sampled = generate(model, {prompt}, o);
  std::vector<int64_t> out = prompt;
  out.insert(out.end(), sampled.front().begin(), sampled.front().end());
  return out;
}

}  // namespace gpt2
