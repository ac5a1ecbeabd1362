#pragma once
// gpt2-generate's path for one prompt with the KV cache: the server's machinery on a one-row slot
// cache, PromptPrefill for the prompt and DecodeGraphs for every new token, so that on CUDA a
// decode step replays one CUDA graph instead of launching each of its kernels from the host.
// The contract, checks and stats are gpt2::generate's for one prompt (src/model/generate.h): the
// context window restarts on its last block_size / 2 tokens when it fills (a prefill again),
// greedy takes the step's argmax (the next step queued on it before the host reads it: Note [Greedy
// one step ahead] in decode_graphs.cpp), sampling brings the logits to the host (sample_next, the same
// draws from the same seed). On the CPU (no graphs; each step attends to the positions written so
// far) the ids are gpt2::generate's; on CUDA the padded prefill may differ from its unpadded one in
// the last bits (prompt_prefill.h), so a near-tie may pick another id.
#include <cstdint>
#include <vector>

#include "src/model/generate.h"
#include "src/model/gpt2_model.h"

namespace gpt2::serve {

// `use_graphs`: replay CUDA graphs when the model is on CUDA (ignored on the CPU).
std::vector<int64_t> generate_one(GPT2& model, const std::vector<int64_t>& prompt, const SamplingOptions& options,
                                  bool use_graphs, const TokenCallback& on_tokens = {},
                                  GenerationStats* stats = nullptr);

}  // namespace gpt2::serve
