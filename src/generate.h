#pragma once
// Autoregressive sampling from a GPT2 model by full recomputation of the (cropped) context.
// Contract: runs without grad on the model's device; the last block_size tokens are the context;
// sampling draws from a private CPU generator seeded with `seed`, so the same seed gives the same
// tokens on CPU and GPU (up to logits rounding). Every returned id is < vocab_size.
#include <cstdint>
#include <vector>

#include "src/gpt2_model.h"

namespace gpt2 {

// Returns the prompt followed by max_new_tokens sampled ids.
// temperature 0 = greedy (argmax); > 0 divides the logits. top_k 0 = whole vocab; > 0 keeps the k
// most likely ids. Throws gpt2::UserError on an empty prompt, an id outside [0, vocab_size),
// negative temperature/top_k/max_new_tokens.
std::vector<int64_t> sample_tokens(GPT2& model, const std::vector<int64_t>& prompt,
                                   int64_t max_new_tokens, double temperature, int64_t top_k,
                                   uint64_t seed);

}  // namespace gpt2
