// The decode step from CUDA graphs (decode_graphs.h).
#include "src/serve/decode_graphs.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <string>

namespace gpt2::serve {

// Note [Decode graphs]
// A decode step launches ~250 small kernels (forward_slots: embeddings, per block the fused
// LayerNorms, the qkv projection, the scatter of each row's key and value into the slot cache,
// SDPA under a mask, the projection, the fused MLP; then ln_f, the tied head and the argmax),
// each dispatched by the host through LibTorch. A CUDA graph replays them in one launch: on an
// H200, gpt2-124m at 32 rows x 1024 positions, 1.98 ms a step eager, 1.52 from the graph
// (tests/serve/gpu_test.cpp, StepTime...). What makes the step capturable:
// - Fixed addresses: the ids and positions are static device tensors that each step fills from
//   pinned host buffers (copies on the step's stream, before the replay); the KV cache and the
//   parameters are allocated once; every graph ends by copying its logits and greedy ids into
//   the same two static output tensors (a copy of a few MiB, exact).
// - Nothing in the captured path syncs, reads a device value on the host, copies between host
//   and device or allocates pinned memory: the shapes depend only on the rows and `attend`; the
//   masks come from device aranges; the fused kernels' wrappers choose on host facts (dtypes,
//   sizes, alignment of addresses that replays keep); device memory comes from the caching
//   allocator, which serves a capture from the graphs' private pool.
// - Warm-up: the step runs twice eagerly on the capture stream before the capture, so what is
//   made on first use happens outside it: cuBLAS/cuBLASLt handles and their workspace for that
//   stream, the cuBLASLt algorithm cache of src/kernels/gemm_epilogue.cpp (its heuristic query).
//   Warm-up and replay write the same keys and values to the cache as the eager step would.
// - One pool for every graph, though replays come in any order of `attend`: the outputs live
//   outside it, so all a graph keeps in the pool are buffers that are dead once it has run, and
//   graphs run one at a time. The pool holds what the largest step needs, not the sum over graphs:
//   a new attend value costs its capture (two eager steps, the capture, the instantiation: tens
//   of milliseconds), and little memory.
// - Capture in cudaStreamCaptureModeThreadLocal: a forbidden call on this thread (a sync, say)
//   fails the capture; the HTTP threads never touch CUDA and are left alone.
// A capture that fails anyway (a c10::Error or gpt2::Error from a call made during it) is ended,
// the allocator stops routing to the pool, one warning names the reason, and the rest of the run
// decodes eagerly. The pool's memory is then kept until exit (its use count is not lowered for the
// failed capture) rather than risk freeing memory a graph still holds.

DecodeGraphs::DecodeGraphs(GPT2 model, KVCache& cache, bool use_graphs)
    : model_(std::move(model)),
      cache_(cache),
      rows_(static_cast<int64_t>(cache.pad.size())),
      graphs_(cache.keys.front().device(), use_graphs, "decode step", [rows = rows_](int64_t key) {
        return "attend " + std::to_string(key / (rows + 1)) + ", " + std::to_string(key % (rows + 1)) + " rows";
      }) {
  const torch::Device device = cache_.keys.front().device();
  const auto host = torch::dtype(torch::kLong).pinned_memory(device.is_cuda());
  ids_host_ = torch::zeros({rows_, 1}, host);
  positions_host_ = torch::zeros({rows_}, host);
  greedy_host_ = torch::zeros({2, rows_}, host);
  ids_ = torch::zeros({rows_, 1}, torch::dtype(torch::kLong).device(device));
  positions_ = torch::zeros({rows_}, torch::dtype(torch::kLong).device(device));
  if (device.is_cuda()) {
    copied_.emplace_back(device.type());
    copied_.emplace_back(device.type());
  }
  if (graphs_.on()) {
    logits_ = torch::empty({rows_, model_->config().vocab_size}, cache_.keys.front().options());
    greedy_ = torch::empty({rows_}, torch::dtype(torch::kLong).device(device));
  }
}

// Note [Greedy one step ahead]
// step() waits for the device at its end, so the device then idles while the host takes the id,
// hands it on and queues the next step: tens of microseconds a token at batch 1, a tenth of a
// gpt2-124m step. A greedy decoder knows the next step's input before the host sees it: the
// argmax is on the device and the position is the last one + 1. start_greedy() feeds them there
// (a copy and an add on the step's stream, outside the graph: a graph that wrote its own inputs
// would not survive the warm-ups before its capture), so the next step is queued before the host
// waits for this one. Each queued step copies its ids to its own pinned host slot and records an
// event there; finish() waits for the oldest event only. Two slots suffice: a third step is
// queued only after the first is finished. The sums are the ones step() makes, on the same graphs.

DecodeGraphs::~DecodeGraphs() {
  try {
    while (!queued_.empty()) finish();  // the copies to host slots freed with this object
  } catch (const std::exception&) {     // a device error: nothing left to wait for
  }
}

DecodeOutputs DecodeGraphs::step(const std::vector<int64_t>& ids, const std::vector<int64_t>& positions, int64_t attend,
                                 int64_t live) {
  start(ids, positions, attend, live);
  torch::Tensor greedy = finish();  // the step's one wait for the device
  return {last_logits_, greedy};
}

void DecodeGraphs::start(const std::vector<int64_t>& ids, const std::vector<int64_t>& positions, int64_t attend,
                         int64_t live) {
  TORCH_CHECK(static_cast<int64_t>(ids.size()) == rows_ && static_cast<int64_t>(positions.size()) == rows_,
              "DecodeGraphs::step expects ", rows_, " ids and positions, got ", ids.size(), " and ", positions.size());
  TORCH_CHECK(live >= 0 && live <= rows_, "DecodeGraphs::step: live rows ", live, " not in [0, ", rows_, "]");
  TORCH_CHECK(queued_.empty(), "DecodeGraphs::start: ", queued_.size(), " step(s) still queued; finish() them first");
  std::copy(ids.begin(), ids.end(), ids_host_.data_ptr<int64_t>());
  std::copy(positions.begin(), positions.end(), positions_host_.data_ptr<int64_t>());
  // Asynchronous from pinned memory: nothing queued, so no earlier copy still reads these buffers.
  ids_.copy_(ids_host_, /*non_blocking=*/true);
  positions_.copy_(positions_host_, /*non_blocking=*/true);
  launch(attend, live == 0 ? rows_ : live);
}

void DecodeGraphs::start_greedy(int64_t attend) {
  TORCH_CHECK(last_greedy_.defined(), "DecodeGraphs::start_greedy: no step before it to take the ids of");
  TORCH_CHECK(queued_.size() < 2, "DecodeGraphs::start_greedy: two steps queued already; finish() one first");
  const int64_t live = last_greedy_.size(0);
  torch::NoGradGuard no_grad;
  ids_.narrow(0, 0, live).copy_(last_greedy_.view({live, 1}));
  positions_.narrow(0, 0, live).add_(1);
  launch(attend, live);
}

torch::Tensor DecodeGraphs::finish() {
  TORCH_CHECK(!queued_.empty(), "DecodeGraphs::finish: no step queued");
  const Queued oldest = queued_.front();
  queued_.pop_front();
  if (!copied_.empty()) copied_[oldest.slot].synchronize();
  return greedy_host_[oldest.slot].narrow(0, 0, oldest.live);
}

void DecodeGraphs::launch(int64_t attend, int64_t live) {
  torch::NoGradGuard no_grad;
  if (attend <= 0) attend = cache_.capacity();  // one graph for 0 and the capacity
  // One key per (attend, live): attend <= capacity, live <= rows.
  const int64_t key = attend * (rows_ + 1) + live;
  const bool replayed = graphs_.replay(key, [this, attend, live](int64_t) {
    const torch::Tensor logits = forward(attend, live);
    logits_.narrow(0, 0, live).copy_(logits);  // every graph ends in the same static outputs
    auto greedy = greedy_.narrow(0, 0, live);
    at::argmax_out(greedy, logits, 1);
  });
  if (replayed) {
    last_logits_ = logits_.narrow(0, 0, live), last_greedy_ = greedy_.narrow(0, 0, live);
  } else {
    last_logits_ = forward(attend, live);
    last_greedy_ = last_logits_.argmax(1);
  }
  const int slot = next_slot_;
  next_slot_ = 1 - next_slot_;
  greedy_host_[slot].narrow(0, 0, live).copy_(last_greedy_, /*non_blocking=*/true);
  if (!copied_.empty()) {
    const torch::Device device = cache_.keys.front().device();
    copied_[slot].record(c10::impl::VirtualGuardImpl(device.type()).getStream(device));
  }
  queued_.push_back({slot, live});
}

torch::Tensor DecodeGraphs::forward(int64_t attend, int64_t live) {
  if (live == rows_) return model_->forward_slots(ids_, positions_, cache_, attend);
  KVCache first = cache_.first_rows(live);
  return model_->forward_slots(ids_.narrow(0, 0, live), positions_.narrow(0, 0, live), first, attend);
}

}  // namespace gpt2::serve
