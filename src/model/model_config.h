#pragma once
// The GPT-2 shape (the `[model]` config section). No torch here, so config code stays light.
#include <cstdint>

namespace gpt2 {

struct GPT2Config {
  int64_t n_layer = 12;        // transformer blocks
  int64_t n_head = 12;         // attention heads; n_embd % n_head == 0
  int64_t n_embd = 768;        // residual stream width
  int64_t vocab_size = 50257;  // real vocabulary (GPT-2 BPE: 50,000 merges + 256 bytes + <|endoftext|>)
  int64_t block_size = 1024;   // max context length (HF n_positions)

  // vocab_size rounded up to a multiple of kVocabPadMultiple (50257 -> 50304): wte's row count.
  int64_t padded_vocab_size() const;
  // Parameter count computed from the shape alone (no allocation); equals GPT2::num_parameters().
  // Without padding it is what HF reports (124,439,808 for the default config).
  int64_t num_parameters(bool count_padding = false) const;
  // Throws gpt2::UserError naming the offending key ("model.n_embd", ...) with a hint.
  void validate() const;

  static constexpr int64_t kVocabPadMultiple = 64;  // tensor-core friendly; 50257 -> 50304
};

// The five sizes by name: the [model] keys without "model.", and the attribute names of model
// files (model_weights.h). One table for every place that reads, writes or compares them.
struct GPT2ConfigKey {
  const char* name;
  int64_t GPT2Config::*field;
};
inline constexpr GPT2ConfigKey kGPT2ConfigKeys[] = {{"n_layer", &GPT2Config::n_layer},
                                                    {"n_head", &GPT2Config::n_head},
                                                    {"n_embd", &GPT2Config::n_embd},
                                                    {"vocab_size", &GPT2Config::vocab_size},
                                                    {"block_size", &GPT2Config::block_size}};

}  // namespace gpt2
