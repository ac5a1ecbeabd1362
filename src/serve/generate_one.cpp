// One prompt on the server's prefill and decode step (see generate_one.h).
#include "src/serve/generate_one.h"

#include <algorithm>

#include "src/base/clock.h"
#include "src/serve/decode_graphs.h"
#include "src/serve/prompt_prefill.h"

namespace gpt2::serve {

std::vector<int64_t> generate_one(GPT2& model, const std::vector<int64_t>& prompt, const SamplingOptions& options,
                                  bool use_graphs, const TokenCallback& on_tokens, GenerationStats* stats) {
  const GPT2Config& cfg = model->config();
  validate_generation(cfg, {prompt}, options);
  GenerationStats local;
  GenerationStats& st = stats ? *stats : local;
  st = {};
  std::vector<int64_t> output;
  if (options.max_new_tokens == 0) return output;

  torch::NoGradGuard no_grad;
  NoCudnnAttention no_cudnn_attention;
  const int64_t window = cfg.block_size, restart = std::max<int64_t>(1, cfg.block_size / 2);
  KVCache cache = model->make_kv_cache(window, {0});
  const bool cuda = cache.keys.front().is_cuda(), graphs = use_graphs && cuda;
  DecodeGraphs decode(model, cache, graphs);
  PromptPrefill prefill(model, cache, graphs);
  auto gen = make_sampling_generator(options.seed);

  std::vector<int64_t> tokens = prompt;  // the whole sequence so far; the context is tokens[start:]
  const auto length = [&] { return static_cast<int64_t>(tokens.size()); };
  int64_t start = length() > window ? length() - restart : 0;  // as generate(): a long prompt keeps its tail
  st.prompt_tokens = length() - start;
  auto t0 = SteadyClock::now();
  PromptPrefill::Result first = prefill.run({tokens.begin() + start, tokens.end()}, 0);
  torch::Tensor logits = first.logits;  // (1, V) on the model's device
  int64_t greedy = first.greedy;
  const bool sampled = options.temperature != 0.0;
  bool queued = false;  // greedy: the decode step of the id taken next is queued already
  for (int64_t step = 0;; ++step) {
    const int64_t id = sampled ? sample_next(logits[0].to(torch::kCPU, torch::kFloat), options, gen) : greedy;
    if (step == 0) {
      st.prefill_s = seconds_since(t0);
      t0 = SteadyClock::now();
    }
    if (step == 1) st.first_step_s = seconds_since(t0);  // the decode graphs' capture is in it
    tokens.push_back(id);
    output.push_back(id);
    ++st.new_tokens;
    if (on_tokens) on_tokens({id});
    // A step still queued here (after a stop token) is waited for by ~DecodeGraphs.
    if (step + 1 == options.max_new_tokens || id == options.stop_token) break;

    ++st.steps;
    if (length() - start > window) {  // the window is full: start again on its last `restart` tokens
      start = length() - restart;
      ++st.rebuilds;
      const PromptPrefill::Result again = prefill.run({tokens.begin() + start, tokens.end()}, 0);
      logits = again.logits;
      greedy = again.greedy;
      continue;
    }
    // `id` goes to the context's last position. On CUDA the slot attention reads the row's own
    // positions whatever `attend` is (0: one shape, one graph, with or without graphs); on the
    // CPU, attend to what is written.
    const int64_t position = length() - start - 1;
    const auto attend = [&](int64_t at) { return cuda ? 0 : at + 1; };
    if (sampled) {
      const DecodeOutputs out = decode.step({id}, {position}, attend(position));
      logits = out.logits;
      greedy = out.greedy.data_ptr<int64_t>()[0];
      continue;
    }
    // Greedy: queue the step after this one too, on this one's argmax, before reading it (Note
    // [Greedy one step ahead] in decode_graphs.cpp), where that step is a decode step that is
    // wanted: the id it feeds is not the last one and leaves the window room.
    if (!queued) decode.start({id}, {position}, attend(position));
    queued = step + 2 < options.max_new_tokens && length() + 1 - start <= window;
    if (queued) decode.start_greedy(attend(position + 1));
    greedy = decode.finish().data_ptr<int64_t>()[0];
  }
  st.decode_s = seconds_since(t0);
  return output;
}

}  // namespace gpt2::serve
