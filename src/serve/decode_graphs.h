#pragma once
// The device side of gpt2-serve's decode step (Scheduler::decode_step): forward_slots over the
// slot cache's rows (every row, or the first `live`), then the greedy argmax, replayed from CUDA
// graphs when the model is on CUDA (Note [Decode graphs] in decode_graphs.cpp). One graph per
// (`attend`, live rows) pair, captured the first time that pair comes, all in one memory pool: the
// default mode has one, --attend_block N up to capacity / N, the fused step (8 rows or fewer) one
// per live row count. A graph runs the kernels the eager step runs, on the same shapes, so its
// logits are the same bits (tests/serve/gpu_test.cpp).
// Greedy decoding can keep the host one step behind the device (gpt2-generate): start() queues a
// step and start_greedy() the next one on the device's argmax, before finish() waits for the first.
// Contract: one thread at a time calls step(). The model and the cache outlive this object and the
// cache's tensors keep their storage (graphs hold their addresses); between steps the caller may
// write the cache (prefill) on the current stream. A failed capture logs one warning naming the
// reason and every later step runs eagerly: no capture error leaves step(). Without a CUDA model
// (or a CUDA build), or with use_graphs false, every step runs eagerly. The graphs themselves are
// a StepGraphs keyed by both (step_graphs.h).
#include <torch/torch.h>

#include <c10/core/Event.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "src/model/gpt2_model.h"
#include "src/serve/step_graphs.h"

namespace gpt2::serve {

// One step's results; both are overwritten by later steps.
struct DecodeOutputs {
  torch::Tensor logits;  // (rows, V) on the model's device (contiguous or not): what sampled rows read
  torch::Tensor greedy;  // (rows) int64 on the host: each row's argmax
};

class DecodeGraphs {
 public:
  // `cache`: the scheduler's slot cache, rows = its rows.
  DecodeGraphs(GPT2 model, KVCache& cache, bool use_graphs);
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  // One token for each of the first `live` rows (0 = every row): ids[r] fed at positions[r] (one
  // per row of the cache, host; those past `live` are not read), attending to the first `attend`
  // cached positions (forward_slots; 0 = the capacity). Rows past `live` are left as they are:
  // the caller passes fewer rows only where a row's bits do not depend on the row count (the
  // fused decode step's). The outputs hold the `live` rows. Runs without grad. The one host sync
  // of the step is here: the greedy ids' copy back. One graph per (attend, live) pair met.
  DecodeOutputs step(const std::vector<int64_t>& ids, const std::vector<int64_t>& positions, int64_t attend,
                     int64_t live = 0);

  // The step split so that the device runs while the host reads ids (Note [Greedy one step
  // ahead]). start(): step()'s arguments, queued without waiting; nothing may be queued.
  // start_greedy(): the next step of the same rows, queued on the device alone: each row is fed
  // the argmax of the step queued last, at its position + 1, attending to `attend` positions (0 =
  // the capacity); at most two steps are queued. finish(): waits for the oldest queued step and
  // returns its greedy ids (live, host), valid until the step after next is queued. A destroyed
  // DecodeGraphs first waits for what is queued.
  void start(const std::vector<int64_t>& ids, const std::vector<int64_t>& positions, int64_t attend, int64_t live = 0);
  void start_greedy(int64_t attend);
  torch::Tensor finish();

  // Whether steps replay graphs: asked for, a CUDA model, and no capture has failed.
  bool graphs_on() const { return graphs_.on(); }
  // Graphs captured so far (one per attend and live value met); 0 when graphs are off.
  int64_t graphs_captured() const { return graphs_.captured(); }

 private:
  // The step's device work on the static inputs' first `live` rows, eagerly on the current
  // stream: what a graph captures, but the argmax. Returns the logits (live, V) on the device.
  torch::Tensor forward(int64_t attend, int64_t live);
  // Queues the step on the device inputs (replayed or eager) and its greedy ids' copy to a host slot.
  void launch(int64_t attend, int64_t live);

  GPT2 model_;
  KVCache& cache_;
  const int64_t rows_;
  torch::Tensor ids_host_, positions_host_;  // (rows, 1), (rows) int64 host, pinned on CUDA
  torch::Tensor ids_, positions_;            // the same on the model's device: the graphs' inputs
  torch::Tensor greedy_host_;                // (2, rows) int64 host, pinned on CUDA: a slot per queued step
  torch::Tensor logits_, greedy_;            // (rows, V), (rows) on the device: what every graph writes
  torch::Tensor last_logits_, last_greedy_;  // the last queued step's (live, V) and (live) on the device
  struct Queued {
    int slot;      // its row of greedy_host_
    int64_t live;  // its rows
  };
  std::deque<Queued> queued_;  // oldest first, at most two
  int next_slot_ = 0;
  std::vector<c10::Event> copied_;  // CUDA: per slot, recorded after its greedy ids' copy to the host
  StepGraphs graphs_;
};

}  // namespace gpt2::serve
