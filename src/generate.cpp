// Sampling loop (see generate.h). The KV cache is future work; this recomputes the whole context.
#include "src/generate.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <limits>
#include <string>

#include "src/base/errors.h"

namespace gpt2 {

std::vector<int64_t> sample_tokens(GPT2& model, const std::vector<int64_t>& prompt,
                                   int64_t max_new_tokens, double temperature, int64_t top_k,
                                   uint64_t seed) {
  const GPT2Config& cfg = model->config();
  if (prompt.empty()) throw UserError("sample_tokens: the prompt must hold at least one token");
  if (max_new_tokens < 0) throw UserError("sample_tokens: max_new_tokens must be >= 0");
  if (!(temperature >= 0.0)) throw UserError("sample_tokens: temperature must be >= 0 (0 = greedy)");
  if (top_k < 0) throw UserError("sample_tokens: top_k must be >= 0 (0 = whole vocabulary)");
  for (int64_t id : prompt) {
    if (id < 0 || id >= cfg.vocab_size) {
      throw UserError("sample_tokens: prompt token " + std::to_string(id) + " is outside [0, " +
                      std::to_string(cfg.vocab_size) + ")");
    }
  }

  torch::NoGradGuard no_grad;
  const torch::Device device = model->parameters().front().device();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t k = top_k > 0 ? std::min(top_k, cfg.vocab_size) : 0;

  std::vector<int64_t> tokens = prompt;
  tokens.reserve(prompt.size() + static_cast<size_t>(max_new_tokens));
  for (int64_t step = 0; step < max_new_tokens; ++step) {
    const int64_t n = static_cast<int64_t>(tokens.size());
    const int64_t t = std::min(n, cfg.block_size);
    auto idx = torch::from_blob(tokens.data() + (n - t), {1, t}, torch::kLong).to(device);  // (1, t)
    // Only the last position's logits come back to the CPU, in fp32.
    auto logits = model->forward(idx).select(1, t - 1).squeeze(0).to(torch::kCPU, torch::kFloat);  // (V)
    int64_t next;
    if (temperature == 0.0) {
      next = logits.argmax().item<int64_t>();
    } else {
      logits = logits / temperature;
      if (k > 0 && k < cfg.vocab_size) {
        auto kth = std::get<0>(logits.topk(k)).select(0, k - 1);  // k-th largest logit
        logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
      }
      auto probs = torch::softmax(logits, 0);                     // (V)
      next = probs.multinomial(1, /*replacement=*/false, gen).item<int64_t>();
    }
    tokens.push_back(next);
  }
  return tokens;
}

}  // namespace gpt2
