// The decode step from CUDA graphs (decode_graphs.h).
#include "src/serve/decode_graphs.h"

#include <algorithm>
#include <string>
#include <tuple>

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
  greedy_host_ = torch::zeros({rows_}, host);
  ids_ = torch::zeros({rows_, 1}, torch::dtype(torch::kLong).device(device));
  positions_ = torch::zeros({rows_}, torch::dtype(torch::kLong).device(device));
  if (graphs_.on()) {
    logits_ = torch::empty({rows_, model_->config().vocab_size}, cache_.keys.front().options());
    greedy_ = torch::empty({rows_}, torch::dtype(torch::kLong).device(device));
  }
}

DecodeGraphs::~DecodeGraphs() = default;

DecodeOutputs DecodeGraphs::step(const std::vector<int64_t>& ids, const std::vector<int64_t>& positions, int64_t attend,
                                 int64_t live) {
  TORCH_CHECK(static_cast<int64_t>(ids.size()) == rows_ && static_cast<int64_t>(positions.size()) == rows_,
              "DecodeGraphs::step expects ", rows_, " ids and positions, got ", ids.size(), " and ", positions.size());
  TORCH_CHECK(live >= 0 && live <= rows_, "DecodeGraphs::step: live rows ", live, " not in [0, ", rows_, "]");
  torch::NoGradGuard no_grad;
  if (attend <= 0) attend = cache_.capacity();  // one graph for 0 and the capacity
  if (live == 0) live = rows_;
  std::copy(ids.begin(), ids.end(), ids_host_.data_ptr<int64_t>());
  std::copy(positions.begin(), positions.end(), positions_host_.data_ptr<int64_t>());
  // Asynchronous from pinned memory: the previous step's copy back waited for these copies too.
  ids_.copy_(ids_host_, /*non_blocking=*/true);
  positions_.copy_(positions_host_, /*non_blocking=*/true);
  torch::Tensor logits, greedy;  // (live, V), (live) on the device
  // One key per (attend, live): attend <= capacity, live <= rows.
  const int64_t key = attend * (rows_ + 1) + live;
  const bool replayed = graphs_.replay(key, [this, attend, live](int64_t) {
    const auto [l, g] = forward(attend, live);
    logits_.narrow(0, 0, live).copy_(l);  // every graph ends in the same static outputs
    greedy_.narrow(0, 0, live).copy_(g);
  });
  if (replayed) {
    logits = logits_.narrow(0, 0, live), greedy = greedy_.narrow(0, 0, live);
  } else {
    std::tie(logits, greedy) = forward(attend, live);
  }
  const auto greedy_host = greedy_host_.narrow(0, 0, live);
  greedy_host.copy_(greedy);  // the step's one wait for the device
  return {logits, greedy_host};
}

std::pair<torch::Tensor, torch::Tensor> DecodeGraphs::forward(int64_t attend, int64_t live) {
  torch::Tensor logits;  // (live, V)
  if (live == rows_) {
    logits = model_->forward_slots(ids_, positions_, cache_, attend);
  } else {
    KVCache first = cache_.first_rows(live);
    logits = model_->forward_slots(ids_.narrow(0, 0, live), positions_.narrow(0, 0, live), first, attend);
  }
  auto greedy = logits.argmax(1);  // (live)
  return {logits, greedy};
}

}  // namespace gpt2::serve
