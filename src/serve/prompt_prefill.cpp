// A prompt's prefill into its slot (prompt_prefill.h).
#include "src/serve/prompt_prefill.h"

#include <algorithm>
#include <string>

#include "src/base/errors.h"

namespace gpt2::serve {

// Note [Prefill graphs]
// A prefill of one 128-token prompt is ~250 kernels for gpt2-124m (~1000 for gpt2-1558m) that the
// host dispatches one by one through LibTorch; with 32 clients arriving together the last one
// waits for all 32 prefills, so the launches set the time to first token (on an H200, ~3.6 ms a
// prefill at 124m, 58 ms p50 over 32 clients: bench/results/2026-12-03-serve-h200.log). A CUDA
// graph replays them in one launch, but it needs fixed shapes and addresses:
// - Shapes: the prompt is padded on the right (id 0) to a multiple of kPrefillBucket positions, so
//   at most capacity / kPrefillBucket graphs serve every length. Causal attention keeps the
//   padding out of every real position, and the logits are gathered at the last real one (a device
//   index); each graph has one row, so a prompt's arithmetic depends on itself alone.
// - Addresses: ids, the last position and the slot's row are static device tensors filled from
//   pinned host buffers before the replay; the graph prefills a one-row staging cache of the full
//   capacity (allocated once) and ends by copying the padded length's keys and values into the
//   slot's row (index_copy_ at the device row index) and the logits and argmax into static outputs.
// The same padded path runs eagerly when graphs are off or a capture failed, so graphs change
// no bits; capture, warm-up and failure handling are StepGraphs' (Note [Decode graphs]).

PromptPrefill::PromptPrefill(GPT2 model, KVCache& cache, bool use_graphs)
    : model_(std::move(model)),
      cache_(cache),
      padded_(cache.keys.front().is_cuda()),
      graphs_(cache.keys.front().device(), use_graphs && cache.keys.front().is_cuda(), "prefill",
              [](int64_t length) { return "padded length " + std::to_string(length); }) {
  if (!padded_) return;
  torch::NoGradGuard no_grad;
  const torch::Device device = cache_.keys.front().device();
  staging_ = model_->make_kv_cache(cache_.capacity(), {0});
  const auto host = torch::dtype(torch::kLong).pinned_memory(true);
  ids_host_ = torch::zeros({1, cache_.capacity()}, host);
  last_host_ = torch::zeros({1}, host);
  row_host_ = torch::zeros({1}, host);
  greedy_host_ = torch::zeros({1}, host);
  ids_ = torch::zeros({1, cache_.capacity()}, torch::dtype(torch::kLong).device(device));
  last_ = torch::zeros({1}, torch::dtype(torch::kLong).device(device));
  row_ = torch::zeros({1}, torch::dtype(torch::kLong).device(device));
  logits_ = torch::empty({1, model_->config().vocab_size}, cache_.keys.front().options());
  greedy_ = torch::empty({1}, torch::dtype(torch::kLong).device(device));
}

int64_t PromptPrefill::padded_length(int64_t length) const {
  if (!padded_) return length;
  return std::min(cache_.capacity(), (length + kPrefillBucket - 1) / kPrefillBucket * kPrefillBucket);
}

PromptPrefill::Result PromptPrefill::run(const std::vector<int64_t>& prompt, int64_t row) {
  torch::NoGradGuard no_grad;
  const auto length = static_cast<int64_t>(prompt.size());
  GPT2_ASSERT(length >= 1 && length <= cache_.capacity(), "prefill: prompt length out of the cache's range");
  if (!padded_) {  // gpt2-generate's prefill, straight into a one-row view of the slot
    KVCache view = cache_.row_view(row);
    const auto ids = torch::tensor(prompt, torch::kLong).view({1, length}).to(cache_.keys.front().device());
    auto logits = model_->forward_cached(ids, view);  // (1, V)
    return {logits, logits.argmax(1).item<int64_t>()};
  }
  const int64_t padded = padded_length(length);
  auto* ids = ids_host_.data_ptr<int64_t>();
  std::copy(prompt.begin(), prompt.end(), ids);
  std::fill(ids + length, ids + padded, int64_t{0});
  last_host_.data_ptr<int64_t>()[0] = length - 1;
  row_host_.data_ptr<int64_t>()[0] = row;
  // Asynchronous from pinned memory: the previous run's copy back waited for these buffers' last use.
  ids_.copy_(ids_host_, /*non_blocking=*/true);
  last_.copy_(last_host_, /*non_blocking=*/true);
  row_.copy_(row_host_, /*non_blocking=*/true);
  if (!graphs_.replay(padded, [this](int64_t p) { forward_padded(p); })) forward_padded(padded);
  greedy_host_.copy_(greedy_);  // the one wait for the device
  return {logits_, greedy_host_.data_ptr<int64_t>()[0]};
}

void PromptPrefill::forward_padded(int64_t padded) {
  staging_.length = 0;
  const auto logits = model_->forward_cached(ids_.narrow(1, 0, padded), staging_, last_);  // (1, V)
  for (size_t l = 0; l < cache_.keys.size(); ++l) {
    cache_.keys[l].narrow(2, 0, padded).index_copy_(0, row_, staging_.keys[l].narrow(2, 0, padded));
    cache_.values[l].narrow(2, 0, padded).index_copy_(0, row_, staging_.values[l].narrow(2, 0, padded));
  }
  logits_.copy_(logits);
  greedy_.copy_(logits.argmax(1));
}

}  // namespace gpt2::serve
