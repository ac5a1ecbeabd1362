#include "src/train/memory_estimate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#ifdef GPT2_WITH_CUDA
#include "src/base/cuda_check.h"
#endif

#include "optim/adamw_updates.h"
#include "parallel/flat_layout.h"
#include "src/base/errors.h"
#include "src/base/log.h"

namespace gpt2 {
namespace {

constexpr double kGiB = 1073741824.0;

// Note [Memory estimate]
// The state is what train() allocates: weights in the compute dtype; the gradient in the gradient
// dtype (Note [bf16 gradients on one rank]): the flat buffer of FlatLayout's padded size, or with
// ZeRO 2 on several ranks only the rank's shard (its staging buffers, a few buckets, come on top)
// plus, when the shard is more than one piece, its own copy of its parameters (Note [Interleaved
// shards]); the optimizer's shard of fp32 moments (8
// bytes an element), or of 8-bit codes (2 bytes; the absmax per block and the fp32 moments of small
// parameters come on top, hence "at least"), fp32 masters when the parameters are not fp32, and an
// fp32 copy of fp16 gradients. Offload keeps masters, moments and a gradient and a parameter copy
// in pinned host memory instead (optim::offload_host_bytes). fp32 moments cover the parameters
// AdamW updates only: the fullest shard's. Muon (optim.name) adds an fp32 momentum, and fp32 masters
// for offloaded or sharded 16-bit parameters (unsharded ones share AdamW's), of the blocks'
// matrices a rank owns (all of them at ZeRO 0),
// and takes those matrices from AdamW's moments; as owners hold different shares under ZeRO 1/2,
// the estimate takes the mean there, a floor for the rank that holds the most. Activations count only what
// backward certainly keeps per block for B x T tokens of width C, whichever kernels run: without
// recomputation q, k and v (3 BTC, attention's saved inputs), the attention output (BTC, c_proj's
// input) and the MLP's pre-GELU values (4 BTC, GELU's backward needs them); a recomputed block keeps
// its input (BTC). LayerNorm outputs, the post-GELU values (unless memory.recompute_gelu), logits,
// workspace and the allocator's slack come on top, so the estimate is a floor: a run refused by it
// cannot fit. (gpt2-1558m at B = 8, T = 1024 in bf16 on one H200: 23.2 GiB of state and 9.4 GiB
// of activations by this count, against a measured peak of 38.6 GiB.)

// a * b, or a UserError naming `what` when it does not fit in int64.
int64_t times(int64_t a, int64_t b, const std::string& what) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) throw UserError(what + ": the sizes overflow a 64-bit count");
  return r;
}

int64_t plus(int64_t a, int64_t b, const std::string& what) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) throw UserError(what + ": the sizes overflow a 64-bit count");
  return r;
}

std::string shape_keys(const GPT2Config& m) {
  return log::format("model.n_layer = %lld, model.n_embd = %lld, model.vocab_size = %lld, model.block_size = %lld",
                     (long long)m.n_layer, (long long)m.n_embd, (long long)m.vocab_size, (long long)m.block_size);
}

// GPT2Config::num_parameters with every product checked.
int64_t checked_parameters(const GPT2Config& m) {
  const std::string what = shape_keys(m);
  const int64_t c = m.n_embd;
  const int64_t per_block = plus(times(times(c, c, what), 12, what), times(c, 13, what), what);
  const int64_t padded_vocab = plus(m.vocab_size, GPT2Config::kVocabPadMultiple, what);  // an upper bound, checked
  const int64_t embeddings = plus(times(padded_vocab, c, what), times(m.block_size, c, what), what);
  plus(embeddings, plus(times(m.n_layer, per_block, what), times(c, 2, what), what), what);
  return m.num_parameters(/*count_padding=*/true);  // now known to fit
}

double bytes(at::ScalarType t) { return static_cast<double>(c10::elementSize(t)); }

// The parameters of the blocks' matrices, which Muon updates (optim.name = muon): 12 C² a block.
double muon_parameters(const Config& cfg) {
  if (cfg.optim.name != optim::UpdateRule::kMuon) return 0;
  const auto c = static_cast<double>(cfg.model.n_embd);
  return 12 * c * c * static_cast<double>(cfg.model.n_layer);
}

}  // namespace

MemoryEstimate estimate_memory(const Config& cfg, int world, at::ScalarType compute, at::ScalarType grads) {
  MemoryEstimate e;
  e.parameters = checked_parameters(cfg.model);
  const int64_t cell = static_cast<int64_t>(world) * parallel::FlatLayout::kGrid;
  e.flat_padded = (e.parameters + cell - 1) / cell * cell;
  e.shard = cfg.parallel.zero_stage >= 1 ? e.flat_padded / world : e.flat_padded;
  const double n = static_cast<double>(e.shard);
  const bool moments_8bit = cfg.memory.optimizer_moments == optim::MomentFormat::k8bit;

  e.weights = static_cast<double>(e.parameters) * bytes(compute);
  const bool interleaved = cfg.parallel.zero_stage == 2 && world > 1;
  e.gradients = (interleaved ? n : static_cast<double>(e.flat_padded)) * bytes(grads);
  // fp32 moments cover AdamW's parameters only (optim::dense_fp32_blocks): no padding (the fullest
  // shard holds none), no Muon matrix. With Muon, the mean over the ranks (a floor for the fullest).
  const double owners = cfg.parallel.zero_stage >= 1 ? world : 1;
  const double muon = muon_parameters(cfg);
  const double adamw_elements =
      muon > 0 ? (static_cast<double>(e.parameters) - muon) / owners : std::min(n, static_cast<double>(e.parameters));
  const double moments = moments_8bit ? 2 * n : 8 * adamw_elements;  // on the device
  const int64_t block = parallel::FlatLayout::interleave_block(
      world, static_cast<int64_t>(cfg.parallel.bucket_mb * (1 << 20)) / static_cast<int64_t>(bytes(grads)));
  const double own_params = interleaved && e.flat_padded > block ? n * bytes(compute) : 0;
  if (cfg.parallel.offload == Offload::kOptimizer) {
    e.optimizer_host = static_cast<double>(
        optim::offload_host_bytes(e.shard, static_cast<int64_t>(adamw_elements), compute, grads, moments_8bit));
    e.optimizer_device = own_params;
  } else {
    e.optimizer_device = own_params + moments + (compute != at::kFloat ? 4 * n : 0) +
                         (grads != at::kFloat && grads != at::kBFloat16 ? 4 * n : 0);
  }
  if (muon > 0) {  // fp32 momentum, and fp32 masters of the owned matrices where AdamW's are not shared
    const bool sharded = cfg.parallel.zero_stage >= 1 && world > 1;
    const bool own_masters = cfg.parallel.offload == Offload::kOptimizer || (compute != at::kFloat && sharded);
    e.optimizer_device += muon / owners * (own_masters ? 8 : 4);
  }

  const double btc = static_cast<double>(cfg.train.micro_batch) * static_cast<double>(cfg.train.seq_len) *
                     static_cast<double>(cfg.model.n_embd);
  const double full_block = 8 * btc;
  const int64_t every = cfg.recompute_every();  // 0 = none, K = every K-th block recomputed
  const double layers = static_cast<double>(cfg.model.n_layer);
  const double recomputed = every == 0 ? 0 : std::floor(layers / static_cast<double>(every));
  e.activations = ((layers - recomputed) * full_block + recomputed * btc) * bytes(compute);
  return e;
}

std::string MemoryEstimate::describe() const {
  return log::format(
      "%.2f GiB on the device (weights %.2f, gradients %.2f, optimizer %.2f, activations >= %.2f)"
      " + %.2f GiB in pinned host memory",
      device_total() / kGiB, weights / kGiB, gradients / kGiB, optimizer_device / kGiB, activations / kGiB,
      optimizer_host / kGiB);
}

double available_host_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return -1;
  long long available_kib = -1;
  char line[256];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "MemAvailable: %lld kB", &available_kib) == 1) break;
  }
  std::fclose(f);
  return available_kib < 0 ? -1 : static_cast<double>(available_kib) * 1024.0;
}

void check_memory_fits(const MemoryEstimate& need, torch::Device device, int ranks_per_device, int local_ranks) {
  const std::string keys =
      "model.n_layer, model.n_embd and model.vocab_size set the state; train.micro_batch, train.seq_len and "
      "memory.activation_checkpointing the activations; parallel.zero_stage, parallel.offload and "
      "memory.optimizer_moments shrink the optimizer's part";
  const double host = available_host_bytes();  // read once: the device check on CPU and the pinned check
  double have_device = -1;
  std::string where;
  if (device.is_cuda()) {
#ifdef GPT2_WITH_CUDA
    size_t free = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free, &total));
    have_device = static_cast<double>(free) / std::max(ranks_per_device, 1);
    where = log::format("%s (free memory / %d rank(s) on it)", device.str().c_str(), ranks_per_device);
#endif
  } else {
    have_device = host < 0 ? -1 : host / std::max(local_ranks, 1);
    where = log::format("host memory (MemAvailable / %d rank(s) on the node)", local_ranks);
  }
  if (have_device >= 0 && need.device_total() > have_device) {
    throw UserError(log::format("this run needs at least %.2f GiB per rank but %s has %.2f GiB: %s. %s",
                                need.device_total() / kGiB, where.c_str(), have_device / kGiB, need.describe().c_str(),
                                keys.c_str()));
  }
  const double pinned = need.optimizer_host * local_ranks;
  if (pinned > 0 && host >= 0 && pinned > 0.9 * host) {  // pinned pages cannot be swapped
    throw UserError(
        log::format("parallel.offload = optimizer needs %.1f GiB of pinned host memory on this node "
                    "(%d rank(s) x %.1f GiB) but only %.1f GiB is available; use ZeRO across more "
                    "ranks (parallel.zero_stage) or more nodes",
                    pinned / kGiB, local_ranks, need.optimizer_host / kGiB, host / kGiB));
  }
}

}  // namespace gpt2
