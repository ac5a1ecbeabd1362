#pragma once
// One prompt's prefill into its row of the server's slot cache (what Scheduler runs for each new
// sequence): the prompt's keys and values into the row, and the logits of its last position.
// - CPU model: forward_cached on a one-row view of the slot, exactly gpt2-generate's prefill.
// - CUDA model (Note [Prefill graphs] in prompt_prefill.cpp): the prompt padded on the right to a
//   multiple of kPrefillBucket positions, prefilled into a one-row staging cache, its keys and
//   values copied into the slot's row and the logits taken at its last real position; with
//   use_graphs, replayed from one CUDA graph per padded length (StepGraphs).
// Either way a prompt's bits depend on the prompt alone (one row, a shape fixed by its length),
// so a request's first token is the same alone or in any company; on CUDA it may differ from
// gpt2-generate's unpadded prefill in the last bits (a near-tie may then pick another id).
// Contract: one thread at a time; the model and the cache outlive this object and the cache keeps
// its storage. Positions past the prompt in the row may hold the padding's keys and values: the
// decode steps write each position before any query reads it.
#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "src/model/gpt2_model.h"
#include "src/serve/step_graphs.h"

namespace gpt2::serve {

constexpr int64_t kPrefillBucket = 64;  // CUDA: prompts padded to a multiple of this many positions

class PromptPrefill {
 public:
  PromptPrefill(GPT2 model, KVCache& cache, bool use_graphs);

  struct Result {
    torch::Tensor logits;  // (1, V) on the model's device; overwritten by the next run
    int64_t greedy = 0;    // its argmax
  };
  // Prefills `prompt` (1 <= size <= the cache's capacity, ids < vocab_size) into row `row`. Runs
  // without grad; waits for the device once (the greedy id's copy back).
  Result run(const std::vector<int64_t>& prompt, int64_t row);

  bool graphs_on() const { return graphs_.on(); }
  int64_t graphs_captured() const { return graphs_.captured(); }
  // The positions a prompt of `length` tokens is prefilled over (its own length on CPU).
  int64_t padded_length(int64_t length) const;

 private:
  // The CUDA prefill over `padded` positions from the static inputs, ending in logits_/greedy_:
  // what a graph captures.
  void forward_padded(int64_t padded);

  GPT2 model_;
  KVCache& cache_;
  const bool padded_;                              // a CUDA model: the padded path
  KVCache staging_;                                // padded path: one row x the capacity
  torch::Tensor ids_host_, last_host_, row_host_;  // (1, capacity), (1), (1) int64, pinned
  torch::Tensor ids_, last_, row_;                 // the same on the device: the graphs' inputs
  torch::Tensor logits_, greedy_, greedy_host_;    // (1, V), (1) device; (1) pinned host
  StepGraphs graphs_;
};

}  // namespace gpt2::serve
