#pragma once
// Autoregressive sampling from a GPT2 model, a batch of prompts at a time, with a key/value cache.
// Contract: runs without grad on the model's device and dtype. Prompts of different lengths are
// left-padded (KVCache in gpt2_model.h). A row's context is its tokens from `start` on; when the
// context would exceed block_size, start jumps to the last block_size/2 tokens and the cache is
// rebuilt from them (positions are absolute, so a sliding window cannot reuse cached keys).
// Sampling draws from a private CPU generator seeded with `seed` (rows in order), so the same
// seed gives the same tokens on CPU and GPU up to logits rounding. Every id is < vocab_size.
#include <ATen/core/Generator.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "src/model/gpt2_model.h"

namespace gpt2 {

struct SamplingOptions {
  int64_t max_new_tokens = 64;
  double temperature = 1.0;  // 0 = greedy (argmax); > 0 divides the logits
  int64_t top_k = 0;         // 0 = whole vocabulary; > 0 keeps the k most likely ids
  double top_p = 1.0;        // 1 = off; < 1 keeps the most likely ids until their mass reaches top_p
  uint64_t seed = 0;
  int64_t stop_token = -1;  // a row ends once it samples this id (kept in its output); -1 = never
  bool kv_cache = true;     // false: recompute the whole context for every token (the reference)
};

struct GenerationStats {
  int64_t prompt_tokens = 0;  // prompt tokens prefilled (no padding; a prompt longer than the window is cropped)
  int64_t new_tokens = 0;     // sampled tokens kept in the outputs
  int64_t steps = 0;          // forward passes after the first
  int64_t rebuilds = 0;       // times the context window restarted (cache rebuilt)
  double prefill_s = 0, decode_s = 0;
  double first_step_s = 0;  // of decode_s, the first step's (with CUDA graphs, their capture included)
};

// Called after every step with the id each row just sampled, -1 for rows already finished.
using TokenCallback = std::function<void(const std::vector<int64_t>& ids)>;

// The checks generate() makes first (the UserErrors below), for a caller that prints before it.
void validate_generation(const GPT2Config& cfg, const std::vector<std::vector<int64_t>>& prompts,
                         const SamplingOptions& options);

// Returns each prompt's sampled ids (without the prompt): max_new_tokens of them, or fewer when the
// row sampled stop_token. Throws gpt2::UserError on no prompts, an empty prompt, an id outside
// [0, vocab_size), a negative temperature/top_k/max_new_tokens or top_p outside (0, 1].
std::vector<std::vector<int64_t>> generate(GPT2& model, const std::vector<std::vector<int64_t>>& prompts,
                                           const SamplingOptions& options, const TokenCallback& on_tokens = {},
                                           GenerationStats* stats = nullptr);

// One id from a row of fp32 CPU logits (V) as `options` says (temperature, top_k, top_p), drawn
// from `gen`: each row's step in generate(), and each sequence's in the server (src/serve).
int64_t sample_next(torch::Tensor logits, const SamplingOptions& options, at::Generator& gen);

// A private CPU generator seeded with `seed`, as generate() draws from.
at::Generator make_sampling_generator(uint64_t seed);

// cuDNN's attention builds an execution plan for every new sequence length, and decoding meets a
// new length every token, and building it costs many times a decode step. The flash and
// memory-efficient kernels need no plan. Restores the setting (training uses cuDNN).
class NoCudnnAttention {
 public:
  NoCudnnAttention();
  ~NoCudnnAttention();
  NoCudnnAttention(const NoCudnnAttention&) = delete;
  NoCudnnAttention& operator=(const NoCudnnAttention&) = delete;

 private:
  bool was_;
};

// One prompt: the prompt followed by its sampled ids (the trainer's samples).
std::vector<int64_t> sample_tokens(GPT2& model, const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                                   double temperature, int64_t top_k, uint64_t seed);

}  // namespace gpt2
