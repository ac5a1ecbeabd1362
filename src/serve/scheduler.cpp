// Continuous batching over a slot KV cache (see scheduler.h and Note [Slot decoding]).
#include "src/serve/scheduler.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>

#include "data/bpe_tokenizer.h"
#include "src/base/clock.h"
#include "src/base/errors.h"
#include "src/base/log.h"
#include "src/base/threads.h"
#include "src/serve/decode_graphs.h"
#include "src/serve/metrics.h"
#include "src/serve/prompt_prefill.h"
#include "src/serve/text_stream.h"

namespace gpt2::serve {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
    case FinishReason::kNone:
      break;
  }
  return "";
}

// A submitted sequence: its spec, its text so far and its private sampling generator (seeded as
// gpt2-generate seeds its one, so one prompt samples the same ids up to logits rounding).
class Sequence {
 public:
  Sequence(SequenceSpec s, const data::Gpt2Tokenizer& tokenizer)
      : spec(std::move(s)), text(tokenizer, spec.stop), generator(make_sampling_generator(spec.sampling.seed)) {}
  SequenceSpec spec;
  TextStream text;
  at::Generator generator;
  std::atomic<bool> cancelled{false};
  int64_t generated = 0;
};

struct Scheduler::Slot {
  std::shared_ptr<Sequence> sequence;  // null: free
  int64_t position = 0;                // tokens in the cache row = where the next fed token goes
  int64_t last = 0;                    // the last sampled id, fed at `position` by the next step
};

Scheduler::Scheduler(GPT2 model, const data::Gpt2Tokenizer& tokenizer, SchedulerOptions options, Metrics& metrics)
    : model_(std::move(model)), tokenizer_(tokenizer), options_(options), metrics_(metrics) {
  if (options_.max_batch < 1) throw UserError("--max_batch must be >= 1, got " + std::to_string(options_.max_batch));
  if (options_.max_queue < 0) throw UserError("--max_queue must be >= 0, got " + std::to_string(options_.max_queue));
  if (options_.attend_block < 0)
    throw UserError("--attend_block must be >= 0, got " + std::to_string(options_.attend_block));
  if (options_.prefill_batch < 1)
    throw UserError("--prefill_batch must be >= 1, got " + std::to_string(options_.prefill_batch));
  if (options_.slot_attention != SchedulerOptions::SlotAttention::kAuto) {
    model_->set_slot_attention(options_.slot_attention == SchedulerOptions::SlotAttention::kOn);
  }
  slot_attention_ = model_->slot_attention_on();
  if (slot_attention_ && options_.attend_block > 0) {
    log::info("gpt2-serve: --attend_block ignored: with slot attention each row reads only its own context");
  }
  device_ = model_->parameters().front().device();
  slots_.resize(options_.max_batch);
  {
    torch::NoGradGuard no_grad;
    cache_ = model_->make_kv_cache(model_->config().block_size, std::vector<int64_t>(options_.max_batch, 0));
  }
  fused_decode_ = model_->fused_decode_applies(
      cache_, torch::zeros({options_.max_batch}, torch::dtype(torch::kLong).device(device_)));
  cuda_graphs_ = options_.cuda_graphs && device_.is_cuda();
  if (options_.cuda_graphs && !cuda_graphs_) {
    log::info("gpt2-serve: --cuda_graphs ignored: the model is on ", device_.str(), " (graphs need CUDA)");
  }
  decode_ = std::make_unique<DecodeGraphs>(model_, cache_, cuda_graphs_);
  prefill_ = std::make_unique<PromptPrefill>(model_, cache_, cuda_graphs_);
  thread_ = start_helper_thread([this] { run(); });
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::vector<std::shared_ptr<Sequence>> Scheduler::submit(std::vector<SequenceSpec> specs) {
  std::vector<std::shared_ptr<Sequence>> sequences;
  for (auto& spec : specs) sequences.push_back(std::make_shared<Sequence>(std::move(spec), tokenizer_));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || static_cast<int64_t>(queue_.size() + sequences.size()) > options_.max_queue) return {};
    for (auto& s : sequences) queue_.push_back(s);
  }
  wake_.notify_one();
  publish_counts();
  return sequences;
}

void Scheduler::cancel(const std::shared_ptr<Sequence>& sequence) {
  if (sequence) sequence->cancelled = true;  // read by the scheduler thread at its next iteration
}

void Scheduler::cancel_all() {
  cancel_all_ = true;
  wake_.notify_all();
}

int64_t Scheduler::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(queue_.size());
}

int64_t Scheduler::active() const { return active_.load(); }

void Scheduler::publish_counts() { metrics_.set_queue(queued(), active()); }

void Scheduler::run() {
  torch::NoGradGuard no_grad;
  NoCudnnAttention no_cudnn_attention;  // prefills meet a new length every request
  for (;;) {
    std::vector<std::shared_ptr<Sequence>> admitted;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return active_ > 0 || !queue_.empty() || stopping_; });
      if (stopping_ && queue_.empty() && active_ == 0) break;
      for (int64_t free = options_.max_batch - active_; free > 0 && !queue_.empty(); --free) {
        admitted.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    if (cancel_all_) {
      for (auto& s : admitted) s->cancelled = true;
      for (auto& slot : slots_) {
        if (slot.sequence) slot.sequence->cancelled = true;
      }
    }
    // Each admitted sequence takes a free slot, then the prompts are prefilled (prefill()).
    std::vector<Slot*> taken;
    size_t next_free = 0;
    for (const auto& sequence : admitted) {
      if (sequence->cancelled) {  // its client left while it waited
        SequenceEvent event;
        event.finished = FinishReason::kCancelled;
        sequence->spec.on_event(std::move(event));
        continue;
      }
      while (slots_[next_free].sequence) ++next_free;
      slots_[next_free].sequence = sequence;
      ++active_;
      taken.push_back(&slots_[next_free]);
    }
    prefill(taken);
    for (auto& slot : slots_) {
      if (slot.sequence && slot.sequence->cancelled) finish(slot, FinishReason::kCancelled);
    }
    publish_counts();
    if (active_ > 0) {
      try {
        decode_step();
      } catch (const std::exception& e) {
        log::error("gpt2-serve: decoding failed, ending ", active_.load(), " active sequence(s): ", e.what());
        for (auto& slot : slots_) {
          if (slot.sequence) finish(slot, FinishReason::kError);
        }
      }
    }
    publish_counts();
  }
}

void Scheduler::prefill(const std::vector<Slot*>& taken) {
  // Prompts of one length go together (no padding), up to prefill_batch per forward.
  std::map<int64_t, std::vector<Slot*>> by_length;
  for (Slot* slot : taken) by_length[static_cast<int64_t>(slot->sequence->spec.prompt.size())].push_back(slot);
  for (const auto& [length, slots] : by_length) {
    for (size_t begin = 0; begin < slots.size(); begin += static_cast<size_t>(options_.prefill_batch)) {
      const size_t end = std::min(slots.size(), begin + static_cast<size_t>(options_.prefill_batch));
      const std::vector<Slot*> group(slots.begin() + static_cast<std::ptrdiff_t>(begin),
                                     slots.begin() + static_cast<std::ptrdiff_t>(end));
      // A failing forward (e.g. out of device memory) ends the sequences it held, not the server.
      try {
        prefill_group(group);
      } catch (const std::exception& e) {
        log::error("gpt2-serve: prefill failed: ", e.what());
        for (Slot* slot : group) {
          if (slot->sequence) finish(*slot, FinishReason::kError);
        }
      }
    }
  }
}

void Scheduler::prefill_group(const std::vector<Slot*>& group) {
  const auto t0 = Clock::now();
  const auto n = static_cast<int64_t>(group.size());
  const auto T = static_cast<int64_t>(group.front()->sequence->spec.prompt.size());
  std::vector<int64_t> rows;
  for (const Slot* slot : group) rows.push_back(slot - slots_.data());
  torch::Tensor logits;  // (n, V)
  std::vector<int64_t> greedy;
  if (n == 1) {
    // One prompt alone (PromptPrefill: on CUDA padded and from a graph; the same bits in any company).
    const PromptPrefill::Result r = prefill_->run(group.front()->sequence->spec.prompt, rows[0]);
    logits = r.logits;
    greedy = {r.greedy};
  } else {
    // n prompts in one forward into a cache of their own, then their keys and values into the slots.
    std::vector<int64_t> ids;
    for (const Slot* slot : group)
      ids.insert(ids.end(), slot->sequence->spec.prompt.begin(), slot->sequence->spec.prompt.end());
    const auto ids_t = torch::tensor(ids, torch::kLong).view({n, T}).to(device_);
    KVCache fresh = model_->make_kv_cache(T, std::vector<int64_t>(n, 0));
    logits = model_->forward_cached(ids_t, fresh);
    const auto rows_t = torch::tensor(rows, torch::kLong).to(device_);
    for (size_t l = 0; l < cache_.keys.size(); ++l) {
      cache_.keys[l].narrow(2, 0, T).index_copy_(0, rows_t, fresh.keys[l]);  // (n, nh, T, hs) into their rows
      cache_.values[l].narrow(2, 0, T).index_copy_(0, rows_t, fresh.values[l]);
    }
    const auto argmax = logits.argmax(1).to(torch::kCPU);  // (n)
    greedy.assign(argmax.data_ptr<int64_t>(), argmax.data_ptr<int64_t>() + n);
  }
  std::vector<int64_t> next(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    Sequence& seq = *group[i]->sequence;
    const auto& o = seq.spec.sampling;
    next[i] =
        o.temperature == 0.0 ? greedy[i] : sample_next(logits[i].to(torch::kCPU, torch::kFloat), o, seq.generator);
  }
  metrics_.prefill(n * T, seconds_since(t0));  // before the tokens go out, as in decode_step
  for (int64_t i = 0; i < n; ++i) {
    group[i]->position = T;
    accept_token(*group[i], next[i]);
  }
}

void Scheduler::decode_step() {
  const auto t0 = Clock::now();
  const int64_t S = options_.max_batch;
  std::vector<int64_t> ids(S, 0), positions(S, 0), sampled_rows;
  int64_t longest = 0, last_active = -1;
  for (int64_t s = 0; s < S; ++s) {
    const Slot& slot = slots_[s];
    if (!slot.sequence) continue;  // inactive rows run too (fixed shapes), at position 0
    ids[s] = slot.last;
    positions[s] = slot.position;
    longest = std::max(longest, slot.position + 1);
    last_active = s;
    if (slot.sequence->spec.sampling.temperature != 0.0) sampled_rows.push_back(s);
  }
  // The fused step's row bits do not depend on its row count (Note [Fused decode step]), so it
  // runs only up to the last busy slot: one client alone costs a one-row step (slots fill from 0).
  const int64_t live = fused_decode_ ? last_active + 1 : S;
  // Note [Slot decoding]: the whole context (exact batch invariance), or the longest row rounded up;
  // with slot attention each row reads its own context whatever attend is: one value, one graph.
  const int64_t block = slot_attention_ ? 0 : options_.attend_block;
  const int64_t attend =
      block > 0 ? std::min(cache_.capacity(), (longest + block - 1) / block * block) : cache_.capacity();
  // forward_slots + argmax, from a CUDA graph on a GPU; greedy rows need one id each (`live` ids come
  // back, the wait for the device). Rows that sample bring their logits to the host (sample_next,
  // as gpt2-generate does).
  const DecodeOutputs out = decode_->step(ids, positions, attend, live);  // logits (live, V) on the device, greedy host
  torch::Tensor sampled;
  if (!sampled_rows.empty()) {
    const auto rows = torch::tensor(sampled_rows, torch::kLong).to(device_);
    sampled = out.logits.index_select(0, rows).to(torch::kCPU, torch::kFloat);  // (R, V)
  }
  const auto* greedy_ids = out.greedy.data_ptr<int64_t>();
  std::vector<int64_t> next(S, 0);
  size_t r = 0;
  for (int64_t s = 0; s < S; ++s) {
    Sequence* seq = slots_[s].sequence.get();
    if (!seq) continue;
    const bool sample = seq->spec.sampling.temperature != 0.0;
    next[s] =
        sample ? sample_next(sampled[static_cast<int64_t>(r++)], seq->spec.sampling, seq->generator) : greedy_ids[s];
  }
  // Counted before the tokens go out: a client that has its last token finds its steps in /metrics.
  metrics_.decode_step(active_, seconds_since(t0));
  for (int64_t s = 0; s < S; ++s) {
    Slot& slot = slots_[s];
    if (!slot.sequence) continue;
    ++slot.position;
    accept_token(slot, next[s]);
  }
}

void Scheduler::accept_token(Slot& slot, int64_t id) {
  Sequence& seq = *slot.sequence;
  const auto& o = seq.spec.sampling;
  if (++seq.generated == 1) metrics_.first_token(seconds_since(seq.spec.arrived));
  SequenceEvent event;
  event.token_ids = {id};
  event.completion_tokens = seq.generated;
  if (id == o.stop_token) {
    event.finished = FinishReason::kStop;  // <|endoftext|>: its text is not part of the answer
  } else {
    event.text = seq.text.push(id);
    if (seq.text.stopped()) event.finished = FinishReason::kStop;
  }
  if (event.finished == FinishReason::kNone && seq.generated >= o.max_new_tokens)
    event.finished = FinishReason::kLength;
  if (event.finished == FinishReason::kNone && seq.cancelled) event.finished = FinishReason::kCancelled;
  slot.last = id;
  if (event.finished == FinishReason::kNone) {
    seq.spec.on_event(std::move(event));
    return;
  }
  event.text += seq.text.finish();
  if (event.finished == FinishReason::kStop || event.finished == FinishReason::kLength) {
    metrics_.completion_done(static_cast<int64_t>(seq.spec.prompt.size()), seq.generated,
                             seconds_since(seq.spec.arrived));
  }
  seq.spec.on_event(std::move(event));
  slot.sequence.reset();
  --active_;
}

void Scheduler::finish(Slot& slot, FinishReason reason) {
  SequenceEvent event;
  event.finished = reason;
  event.completion_tokens = slot.sequence->generated;
  slot.sequence->spec.on_event(std::move(event));
  slot.sequence.reset();
  --active_;
}

}  // namespace gpt2::serve
