#pragma once
// Continuous batching: one thread owns the model and a slot KV cache of max_batch rows x
// block_size (Note [Slot decoding] in src/model/gpt2_model.h). Each iteration admits waiting
// sequences into free slots (a one-row prefill each, prompt_prefill.h, or prefill_batch prompts of
// one length together; the prefill samples their first token), then decodes one token for every
// active slot in one forward over all max_batch rows, or with the fused step up to the last busy
// slot (replayed from a CUDA graph on a GPU: decode_graphs.h). A sequence that finishes or is cancelled frees its slot
// before the next iteration. Contract: submit(), cancel() and the getters are thread safe and never wait for the model.
// A sequence's events come on the scheduler thread, in order, the last with `finished` set (also for a cancelled one).
// Greedy ids equal gpt2-generate's for the same prompt up to near-ties (on CPU the same prefill, on CUDA a padded one;
// decode steps of other shapes), and are the same alone or in a full batch (with slot attention or attend_block 0, bit
// for bit: a row's arithmetic does not depend on the other rows).
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "src/base/choices.h"
#include "src/model/generate.h"
#include "src/model/gpt2_model.h"

namespace gpt2::data {
class Gpt2Tokenizer;
}

namespace gpt2::serve {

class DecodeGraphs;
class Metrics;
class PromptPrefill;

// kCancelled: the client left, or a drain ran out of time; kError: the model failed (logged).
enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"

struct SequenceEvent {
  std::string text;                // new text: whole characters, stop strings held back (TextStream)
  std::vector<int64_t> token_ids;  // the new ids (the stop token included, as gpt2-generate --ids shows it)
  FinishReason finished = FinishReason::kNone;
  int64_t completion_tokens = 0;  // ids so far
};

using Clock = std::chrono::steady_clock;

// One prompt to continue (one choice of a request).
struct SequenceSpec {
  std::vector<int64_t> prompt;    // non-empty, ids < vocab_size, prompt + max_new_tokens <= block_size
  SamplingOptions sampling;       // max_new_tokens, temperature, top_k, top_p, seed, stop_token
  std::vector<std::string> stop;  // stop strings
  Clock::time_point arrived = Clock::now();
  std::function<void(SequenceEvent)> on_event;  // runs on the scheduler thread: hand off, never block
};

class Sequence;

struct SchedulerOptions {
  int64_t max_batch = 32;   // slots: sequences decoded together
  int64_t max_queue = 256;  // sequences waiting for a slot before submit() refuses
  // 0: decode steps attend over the whole context, and a sequence's logits are the same bits in
  // any company; N: over the longest active sequence rounded up to N positions (less to read for
  // short sequences; last-bit differences with the company). Note [Slot decoding].
  int64_t attend_block = 0;
  // 1: each prompt prefilled alone (PromptPrefill: gpt2-generate's prefill on CPU, padded on CUDA;
  // its bits independent of the company either way); N: prompts of equal length
  // that arrive together are prefilled N at a time in one forward (a burst's time to first token
  // falls; the first token's logits may then differ in the last bits with the company).
  int64_t prefill_batch = 1;
  // Decode steps' attention (Note [Slot decoding]): on: kernels::slot_attention, each row reading
  // only its own context (the same bits in any company, and attend_block no longer matters);
  // off: SDPA over attend positions under a mask; auto: on (where the fused kernels are).
  enum class SlotAttention { kAuto, kOn, kOff };
  SlotAttention slot_attention = SlotAttention::kAuto;
  // true: on CUDA, decode steps replay CUDA graphs (one per attend value; decode_graphs.h) and
  // one-prompt prefills too (one per padded length; prompt_prefill.h), the same bits as without;
  // ignored (logged) on CPU. false: every step and prefill dispatches its kernels.
  bool cuda_graphs = true;
};

class Scheduler {
 public:
  // Starts the scheduler thread. The model must stay alive (and unused elsewhere) until stop().
  Scheduler(GPT2 model, const data::Gpt2Tokenizer& tokenizer, SchedulerOptions options, Metrics& metrics);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues the sequences of one request, all or none: an empty result when the queue is full.
  std::vector<std::shared_ptr<Sequence>> submit(std::vector<SequenceSpec> specs);
  // Ends a sequence at the next iteration (its slot freed, a last event with kCancelled).
  static void cancel(const std::shared_ptr<Sequence>& sequence);
  // Cancels everything queued or active (the end of a drain that ran out of time).
  void cancel_all();
  // Finishes what is active and queued, then the thread ends; joins it.
  void stop();

  int64_t queued() const;
  int64_t active() const;
  const SchedulerOptions& options() const { return options_; }
  // Whether decode steps attend through kernels::slot_attention (options().slot_attention resolved).
  bool slot_attention_on() const { return slot_attention_; }
  bool cuda_graphs_on() const { return cuda_graphs_; }  // --cuda_graphs, and the model on CUDA
  // Whether decode steps take the model's fused step (GPT2::fused_decode_applies: on CUDA with
  // max_batch <= 8; every step, so a row's bits still do not depend on the other rows). Its steps
  // run the slots up to the last busy one only: a client alone gets a one-row step.
  bool fused_decode_on() const { return fused_decode_; }

 private:
  struct Slot;
  void run();
  // The prompts of newly taken slots, grouped by length, up to prefill_batch per forward; each
  // gets its first token. A group whose forward fails ends with kError.
  void prefill(const std::vector<Slot*>& taken);
  void prefill_group(const std::vector<Slot*>& group);
  void decode_step();
  // Appends one sampled id to the slot's sequence, sends its event, frees the slot when done.
  void accept_token(Slot& slot, int64_t id);
  void finish(Slot& slot, FinishReason reason);
  void publish_counts();

  GPT2 model_;
  const data::Gpt2Tokenizer& tokenizer_;
  const SchedulerOptions options_;
  Metrics& metrics_;
  torch::Device device_{torch::kCPU};
  bool fused_decode_ = false;    // see fused_decode_on
  bool slot_attention_ = false;  // the model's decode steps use kernels::slot_attention: attend is moot
  bool cuda_graphs_ = false;     // --cuda_graphs and the model on CUDA

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Sequence>> queue_;  // guarded by mu_
  bool stopping_ = false;                        // guarded by mu_
  std::atomic<int64_t> active_{0};               // written by the scheduler thread only
  std::atomic<bool> cancel_all_{false};

  // Owned by the scheduler thread.
  std::vector<Slot> slots_;
  KVCache cache_;                           // max_batch rows x block_size
  std::unique_ptr<DecodeGraphs> decode_;    // the decode step's device work, over cache_
  std::unique_ptr<PromptPrefill> prefill_;  // a prompt alone into its slot of cache_
  std::thread thread_;
};

}  // namespace gpt2::serve

namespace gpt2 {
template <>
struct ChoiceNames<serve::SchedulerOptions::SlotAttention> {
  using S = serve::SchedulerOptions::SlotAttention;
  static constexpr std::array<std::pair<S, const char*>, 3> names{
      {{S::kAuto, "auto"}, {S::kOn, "on"}, {S::kOff, "off"}}};
};
}  // namespace gpt2
