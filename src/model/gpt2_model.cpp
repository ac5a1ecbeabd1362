// GPT-2 model (see gpt2_model.h). HF GPT2LMHeadModel is the behavioural reference.
#include "src/model/gpt2_model.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "src/base/errors.h"
#include "src/kernels/cross_entropy.h"
#include "src/kernels/fp8_gemm.h"
#include "src/kernels/layer_norm.h"
#include "src/kernels/linear.h"
#include "src/kernels/slot_attention.h"
#include "src/kernels/target_check.h"
#include "src/model/chunked_loss.h"
#include "src/model/recompute.h"

namespace gpt2 {
namespace {

constexpr double kLayerNormEps = 1e-5;  // HF layer_norm_epsilon
constexpr double kInitStd = 0.02;       // HF initializer_range
constexpr int64_t kIgnoreIndex = -1;    // targets equal to this do not count in the loss

torch::nn::LayerNorm make_layer_norm(int64_t n_embd) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({n_embd}).eps(kLayerNormEps));
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// x W^T + b through ATen's linear, not torch::nn::Linear::forward: the C++ module runs a 3-D input
// as matmul and then `+= bias`, a broadcast add in an unvectorised kernel per projection (6.8 ms of
// a 72 ms gpt2-124m step on an H200), while at::linear folds the bias into the GEMM. On CUDA (when
// asked) the bias gradient comes from src/kernels/linear.h.
// With int8 weights (GPT2Impl::quantize_int8) the layer's own weight is empty: int8_linear. With
// fp8 (GPT2Impl::set_fp8) the product runs in FP8 where its rows are a multiple of 16.
// Whether precision.fp8 runs a product of x in FP8: its rows a multiple of 16 (a decoding step's
// are not); and a layer's delayed scaling, or nullptr for current scaling.
bool fp8_takes(const torch::Tensor& x) { return (x.numel() / x.size(-1)) % 16 == 0; }
const kernels::Fp8DelayedScaling* delayed(const kernels::Fp8DelayedScaling& s) {
  return s.amax.defined() ? &s : nullptr;
}

torch::Tensor project(const torch::nn::Linear& layer, const torch::Tensor& x, bool fused,
                      const std::optional<kernels::Int8Weight>& int8 = std::nullopt, bool fp8 = false,
                      const kernels::Fp8DelayedScaling& scaling = {}) {
  if (int8) return kernels::int8_linear(x.contiguous(), *int8, layer->bias);
  if (fp8 && fp8_takes(x)) return kernels::fp8_linear(x, layer->weight, layer->bias, delayed(scaling));
  if (fused && kernels::linear_applies(x, layer->weight, layer->bias)) {
    return kernels::linear(x, layer->weight, layer->bias);
  }
  return at::linear(x, layer->weight, layer->bias);
}

// (s, ln(s)) for s = x + y, or s = x when y is undefined: on CUDA (when asked) one fused kernel
// each way (src/kernels/layer_norm.h). Every residual add of the model is one of these (Note
// [Pending residual] in gpt2_model.h).
std::pair<torch::Tensor, torch::Tensor> add_and_normalize(torch::nn::LayerNorm& ln, const torch::Tensor& x,
                                                          const torch::Tensor& y, bool fused) {
  if (fused && kernels::residual_layer_norm_applies(x, y, ln->weight, ln->bias)) {
    return kernels::residual_layer_norm(x, y, ln->weight, ln->bias, kLayerNormEps);
  }
  auto s = y.defined() ? x + y : x;
  return {s, ln(s)};
}

// Where the t new positions of a cached step sit: their embedding positions (B, t) and the
// attention mask (B, 1, t, start + t), undefined when plain causal attention is right.
std::pair<torch::Tensor, torch::Tensor> cached_positions(const KVCache& cache, int64_t t,
                                                         const torch::TensorOptions& opts) {
  const int64_t start = cache.length, end = start + t;
  // Position of query i in row b: start + i - pad[b], clamped at 0 for padding.
  auto q_abs = torch::arange(start, end, opts);                                  // (t)
  auto pos = (q_abs.unsqueeze(0) - cache.pad_tensor.unsqueeze(1)).clamp_min(0);  // (B, t)
  torch::Tensor mask;                                                            // (B, 1, t, end); undefined = causal
  const bool padded = std::any_of(cache.pad.begin(), cache.pad.end(), [](int64_t p) { return p > 0; });
  if (padded || (start > 0 && t > 1)) {
    auto k_abs = torch::arange(end, opts);                                               // (end)
    auto causal = k_abs.view({1, 1, 1, end}) <= q_abs.view({1, 1, t, 1});                // (1, 1, t, end)
    auto real_key = k_abs.view({1, 1, 1, end}) >= cache.pad_tensor.view({-1, 1, 1, 1});  // (B, 1, 1, end)
    auto self = k_abs.view({1, 1, 1, end}) == q_abs.view({1, 1, t, 1});                  // padding sees itself
    mask = causal & (real_key | self);
  }
  return {pos, mask};
}

void require_positive(int64_t value, const char* key) {
  if (value <= 0) {
    throw UserError(std::string(key) + " must be positive, got " + std::to_string(value));
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// GPT2Config

int64_t GPT2Config::padded_vocab_size() const {
  return (vocab_size + kVocabPadMultiple - 1) / kVocabPadMultiple * kVocabPadMultiple;
}

int64_t GPT2Config::num_parameters(bool count_padding) const {
  const int64_t c = n_embd;
  const int64_t per_block = 2 * c                // ln_1
                            + c * 3 * c + 3 * c  // attn.c_attn
                            + c * c + c          // attn.c_proj
                            + 2 * c              // ln_2
                            + c * 4 * c + 4 * c  // mlp.c_fc
                            + 4 * c * c + c;     // mlp.c_proj
  const int64_t vocab_rows = count_padding ? padded_vocab_size() : vocab_size;
  return vocab_rows * c + block_size * c + n_layer * per_block + 2 * c;
}

void GPT2Config::validate() const {
  require_positive(n_layer, "model.n_layer");
  require_positive(n_head, "model.n_head");
  require_positive(n_embd, "model.n_embd");
  require_positive(vocab_size, "model.vocab_size");
  require_positive(block_size, "model.block_size");
  if (n_embd % n_head != 0) {
    throw UserError("model.n_embd (" + std::to_string(n_embd) + ") must be divisible by model.n_head (" +
                    std::to_string(n_head) + "); e.g. n_embd = 64 * n_head");
  }
}

// ---------------------------------------------------------------------------------------------
// Modules

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GPT2Config& cfg) : n_head_(cfg.n_head) {
  c_attn = register_module("c_attn", torch::nn::Linear(cfg.n_embd, 3 * cfg.n_embd));
  c_proj = register_module("c_proj", torch::nn::Linear(cfg.n_embd, cfg.n_embd));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x, const KVSlot* slot) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
  const int64_t hs = C / n_head_;
  // One fused matmul for q, k and v; the splits below are views, no copies. Under fp8, one node
  // whose backward takes q, k and v's gradients apart (no concatenation).
  const auto qkv = fp8 && !c_attn_int8 && fp8_takes(x)
                       ? kernels::fp8_qkv_linear(x, c_attn->weight, c_attn->bias, delayed(fp8_scaling[0]))
                       : project(c_attn, x, fused_kernels, c_attn_int8).split(C, 2);  // 3 x (B, T, C)
  auto q = qkv[0].view({B, T, n_head_, hs}).transpose(1, 2);                          // (B, nh, T, hs)
  auto k = qkv[1].view({B, T, n_head_, hs}).transpose(1, 2);                          // (B, nh, T, hs)
  auto v = qkv[2].view({B, T, n_head_, hs}).transpose(1, 2);                          // (B, nh, T, hs)
  bool causal = true;
  std::optional<at::Tensor> mask;
  if (slot != nullptr && slot->rows_at.defined()) {
    // Slot decoding (Note [Slot decoding]): row b's one key/value goes to its own position; the
    // query attends to that row's positions <= rows_at[b]: through kernels::slot_attention, which
    // reads only those, or SDPA over the first L cached positions under the mask (B, 1, 1, L).
    const auto at = slot->rows_at.view({B, 1, 1, 1}).expand({B, n_head_, 1, hs});  // (B, nh, 1, hs)
    slot->keys.scatter_(2, at, k);
    slot->values.scatter_(2, at, v);
    if (fused_kernels && slot_attention &&
        kernels::slot_attention_applies(q, slot->keys, slot->values, slot->rows_at)) {
      const auto y = kernels::slot_attention(q, slot->keys, slot->values, slot->rows_at);  // (B, nh, 1, hs)
      return project(c_proj, y.view({B, T, C}), fused_kernels,
                     c_proj_int8);  // T = 1: (B, nh, 1, hs) is (B, 1, C) in memory
    }
    const int64_t L = slot->mask.size(3);
    k = slot->keys.narrow(2, 0, L);  // (B, nh, L, hs)
    v = slot->values.narrow(2, 0, L);
    mask = slot->mask;
    causal = false;
  } else if (slot != nullptr) {
    // Decoding: store this step's keys and values, attend over everything cached so far.
    const int64_t end = slot->start + T;
    slot->keys.narrow(2, slot->start, T).copy_(k);
    slot->values.narrow(2, slot->start, T).copy_(v);
    k = slot->keys.narrow(2, 0, end);    // (B, nh, end, hs)
    v = slot->values.narrow(2, 0, end);  // (B, nh, end, hs)
    if (slot->mask.defined()) mask = slot->mask;
    // Without a mask: one new position sees everything before it; a first chunk is plain causal.
    causal = !mask && slot->start == 0 && T > 1;
  }
  // Scale defaults to 1/sqrt(hs), as HF (scale_attn_weights=True). SDPA picks flash/efficient
  // kernels on GPU; the strided q/k/v (last dim contiguous) are accepted without a copy.
  auto y = torch::scaled_dot_product_attention(q, k, v, mask, /*dropout_p=*/0.0, causal);  // (B, nh, T, hs)
  y = y.transpose(1, 2).contiguous().view({B, T, C});                                      // (B, T, C)
  return project(c_proj, y, fused_kernels, c_proj_int8, fp8, fp8_scaling[1]);
}

MLPImpl::MLPImpl(const GPT2Config& cfg) {
  c_fc = register_module("c_fc", torch::nn::Linear(cfg.n_embd, 4 * cfg.n_embd));
  c_proj = register_module("c_proj", torch::nn::Linear(4 * cfg.n_embd, cfg.n_embd));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
  // HF "gelu_new" is the tanh approximation.
  if (!c_fc_int8 && !fp8 && fused_kernels &&
      kernels::mlp_applies(x, c_fc->weight, c_fc->bias, c_proj->weight, c_proj->bias)) {
    return kernels::mlp(x, c_fc->weight, c_fc->bias, c_proj->weight, c_proj->bias, keep_gelu_output);  // (B, T, C)
  }
  if (fp8 && !c_fc_int8 && fp8_takes(x)) {
    // One FP8 node: the GELU's output goes to FP8 as it is computed, its backward is one pass.
    return kernels::fp8_mlp(x, c_fc->weight, c_fc->bias, c_proj->weight, c_proj->bias, delayed(fp8_scaling[0]),
                            delayed(fp8_scaling[1]), keep_gelu_output);  // (B, T, C)
  }
  const auto h = torch::gelu(project(c_fc, x, false, c_fc_int8, fp8, fp8_scaling[0]), "tanh");  // (B, T, 4C)
  return project(c_proj, h, false, c_proj_int8, fp8, fp8_scaling[1]);                           // (B, T, C)
}

BlockImpl::BlockImpl(const GPT2Config& cfg) {
  ln_1 = register_module("ln_1", make_layer_norm(cfg.n_embd));
  attn = register_module("attn", CausalSelfAttention(cfg));
  ln_2 = register_module("ln_2", make_layer_norm(cfg.n_embd));
  mlp = register_module("mlp", MLP(cfg));
}

// Note [Pending residual]: both adds run inside the LayerNorm after them; the MLP's output is
// handed on unadded.
std::pair<torch::Tensor, torch::Tensor> BlockImpl::forward_pair(const torch::Tensor& x, const torch::Tensor& pending,
                                                                const KVSlot* slot) {
  auto [r, n1] = add_and_normalize(ln_1, x, pending, fused_kernels);                  // r = x + pending, (B, T, C)
  auto [h, n2] = add_and_normalize(ln_2, r, attn->forward(n1, slot), fused_kernels);  // h = r + attn(ln_1(r))
  return {h, mlp(n2)};                                                                // the output is h + mlp(ln_2(h))
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  auto [h, m] = forward_pair(x, torch::Tensor());
  return h + m;  // (B, T, C)
}

TransformerImpl::TransformerImpl(const GPT2Config& cfg) {
  wte = register_module("wte", torch::nn::Embedding(cfg.padded_vocab_size(), cfg.n_embd));
  wpe = register_module("wpe", torch::nn::Embedding(cfg.block_size, cfg.n_embd));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    blocks.emplace_back(cfg);
    h->push_back(blocks.back());
  }
  ln_f = register_module("ln_f", make_layer_norm(cfg.n_embd));
}

// ---------------------------------------------------------------------------------------------
// GPT2

GPT2Impl::GPT2Impl(const GPT2Config& cfg) : cfg_(cfg) {
  cfg_.validate();
  transformer_ = register_module("transformer", Transformer(cfg_));
  // Keep the padding rows at zero from the start, whatever init follows.
  torch::NoGradGuard no_grad;
  transformer_->wte->weight.narrow(0, cfg_.vocab_size, cfg_.padded_vocab_size() - cfg_.vocab_size).zero_();
}

torch::Tensor GPT2Impl::forward(const torch::Tensor& idx) {
  return head(hidden(idx));  // (B, T, V) view
}

torch::Tensor GPT2Impl::loss(const torch::Tensor& idx, const torch::Tensor& targets) {
  TORCH_CHECK(targets.sizes() == idx.sizes(), "GPT2::loss: targets ", targets.sizes(), " must match idx ", idx.sizes());
  return head_loss(hidden(idx), targets);  // () fp32, or fp64 for fp64 models
}

torch::Tensor GPT2Impl::cached_hidden(const torch::Tensor& idx, KVCache& cache) {
  TORCH_CHECK(
      idx.dim() == 2 && idx.scalar_type() == torch::kLong && idx.size(0) == static_cast<int64_t>(cache.pad.size()),
      "GPT2::forward_cached expects (B, t) int64 ids with B = the cache's rows, got ", idx.sizes());
  const int64_t end = cache.length + idx.size(1);
  if (end > cache.capacity()) {
    throw UserError("KV cache overflow: " + std::to_string(end) + " positions, capacity " +
                    std::to_string(cache.capacity()));
  }
  auto h = hidden(idx, &cache);  // (B, t, C)
  cache.length = end;
  return h;
}

torch::Tensor GPT2Impl::forward_cached(const torch::Tensor& idx, KVCache& cache) {
  const auto h = cached_hidden(idx, cache);  // (B, t, C)
  return head(h.select(1, h.size(1) - 1));   // (B, V)
}

torch::Tensor GPT2Impl::forward_cached(const torch::Tensor& idx, KVCache& cache, const torch::Tensor& last) {
  TORCH_CHECK(last.dim() == 1 && last.size(0) == idx.size(0) && last.scalar_type() == torch::kLong,
              "GPT2::forward_cached expects (B) int64 last positions, got ", last.sizes());
  const auto h = cached_hidden(idx, cache);  // (B, t, C)
  const auto at = last.view({-1, 1, 1}).expand({h.size(0), 1, h.size(2)});
  return head(h.gather(1, at).squeeze(1));  // (B, V)
}

// Note [Slot decoding]
// The server (src/serve/scheduler.h) keeps one KVCache of max_batch rows ("slots") x block_size and
// runs every active sequence one token a step in one forward. Rows join and leave between steps, so
// each row has its own length: its new token's key/value is scattered to its own position and its
// query attends to that row's positions <= its own. Inactive rows run too (any id at position 0;
// their logits are ignored and their position 0 is rewritten by the next prefill). The rows are
// always max_batch, so no matrix product changes shape with the number of active sequences, and a
// row's logits are the same bits whatever the other rows hold (tests/model/model_test.cpp,
// SlotDecoding...): a request's greedy ids do not depend on its company. The attention is one of:
// - kernels::slot_attention (src/kernels/slot_attention.h), with the fused kernels on and
//   set_slot_attention (default: on for CPU, off for CUDA until measured there; gpt2-serve
//   --slot_attention): row b reads only its own positions 0..rows_at[b], in an order fixed by
//   rows_at[b] alone, so its bits depend neither on the other rows nor on `attend` (ignored).
// - otherwise SDPA over the first `attend` cached positions of every row under a mask of positions
//   <= rows_at[b]. `attend` is the caller's: the whole capacity by default (one shape: one CUDA
//   graph in the server, src/serve/decode_graphs.h; every step reads every row's whole cache), or
//   (gpt2-serve --attend_block) the longest active row rounded up, which spares short sequences
//   reading every row's whole cache but makes the softmax reduce over another length when a longer
//   row is present (1e-7 relative on CPU in fp32). For one `attend`, a row's bits do not depend on
//   the other rows.
// Prefill is forward_cached on a one-row view of the slot's rows.
torch::Tensor GPT2Impl::forward_slots(const torch::Tensor& ids, const torch::Tensor& positions, KVCache& cache,
                                      int64_t attend) {
  TORCH_CHECK(ids.dim() == 2 && ids.size(1) == 1 && ids.scalar_type() == torch::kLong &&
                  ids.size(0) == static_cast<int64_t>(cache.pad.size()),
              "GPT2::forward_slots expects (B, 1) int64 ids with B = the cache's rows, got ", ids.sizes());
  TORCH_CHECK(positions.dim() == 1 && positions.size(0) == ids.size(0) && positions.scalar_type() == torch::kLong,
              "GPT2::forward_slots expects (B) int64 positions, got ", positions.sizes());
  if (attend <= 0) attend = cache.capacity();
  TORCH_CHECK(attend <= cache.capacity(), "GPT2::forward_slots: attend ", attend, " exceeds the capacity ",
              cache.capacity());
  if (fused_decode_applies(cache, positions)) return forward_slots_fused(ids, positions, cache);  // (B, V)
  return head(hidden(ids, &cache, positions, attend).select(1, 0));                               // (B, V)
}

namespace {
// Rows [first, first + count) of every layer's keys and values, sharing the cache's storage.
KVCache rows_of(const KVCache& cache, int64_t first, int64_t count) {
  KVCache view;
  for (size_t l = 0; l < cache.keys.size(); ++l) {
    view.keys.push_back(cache.keys[l].narrow(0, first, count));  // (count, n_head, capacity, head_size)
    view.values.push_back(cache.values[l].narrow(0, first, count));
  }
  return view;
}
}  // namespace

KVCache KVCache::row_view(int64_t row) const {
  KVCache view = rows_of(*this, row, 1);
  view.pad = {0};
  view.pad_tensor = torch::zeros({1}, pad_tensor.options());
  return view;
}

KVCache KVCache::first_rows(int64_t rows) const {
  TORCH_CHECK(rows >= 1 && rows <= static_cast<int64_t>(pad.size()), "KVCache::first_rows: ", rows,
              " rows of a cache of ", pad.size());
  KVCache view = rows_of(*this, 0, rows);
  view.pad.assign(pad.begin(), pad.begin() + rows);
  view.pad_tensor = pad_tensor.narrow(0, 0, rows);
  view.length = length;
  return view;
}

KVCache GPT2Impl::make_kv_cache(int64_t capacity, const std::vector<int64_t>& pad) {
  if (capacity < 1 || capacity > cfg_.block_size) {
    throw UserError("KV cache capacity " + std::to_string(capacity) +
                    " must be in [1, model.block_size = " + std::to_string(cfg_.block_size) + "]");
  }
  const auto& w = transformer_->wte->weight;
  const int64_t B = static_cast<int64_t>(pad.size());
  KVCache cache;
  for (int64_t i = 0; i < cfg_.n_layer; ++i) {
    cache.keys.push_back(torch::zeros({B, cfg_.n_head, capacity, cfg_.n_embd / cfg_.n_head}, w.options()));
    cache.values.push_back(torch::zeros_like(cache.keys.back()));
  }
  cache.pad = pad;
  cache.pad_tensor = torch::tensor(pad, torch::kLong).to(w.device());
  return cache;
}

torch::Tensor GPT2Impl::hidden(const torch::Tensor& idx, KVCache* cache, const torch::Tensor& slot_positions,
                               int64_t attend) {
  torch::Tensor pos, mask;  // (T), or (B, T) and the attention mask when decoding (cached_positions)
  if (slot_positions.defined()) {
    pos = slot_positions.view({-1, 1});                                     // (B, 1)
    const auto keys = torch::arange(attend, slot_positions.options());      // (L)
    mask = keys.view({1, 1, 1, -1}) <= slot_positions.view({-1, 1, 1, 1});  // (B, 1, 1, L)
  } else if (cache == nullptr) {
    TORCH_CHECK(idx.dim() == 2 && idx.scalar_type() == torch::kLong,
                "GPT2::forward expects (B, T) int64 token ids, got ", idx.sizes(), " ", idx.scalar_type());
    const int64_t T = idx.size(1);
    if (T > cfg_.block_size) {
      throw UserError("sequence length " + std::to_string(T) + " exceeds model.block_size (" +
                      std::to_string(cfg_.block_size) + ")");
    }
    pos = torch::arange(T, idx.options());
  } else {
    std::tie(pos, mask) = cached_positions(*cache, idx.size(1), idx.options());  // forward_cached checked idx
  }
  auto& tr = *transformer_;
  const auto embedded =
      wte_int8_ ? kernels::int8_embedding(idx, *wte_int8_, tr.wpe->weight.scalar_type()) : tr.wte(idx);
  auto x = embedded + tr.wpe(pos);  // (B, T, C)
  torch::Tensor pending;            // Note [Pending residual]: the stream is x + pending
  for (size_t i = 0; i < tr.blocks.size(); ++i) {
    std::shared_ptr<BlockImpl> block = tr.blocks[i].ptr();  // the lambda keeps it for the recompute
    if (cache != nullptr) {
      const KVSlot slot{cache->keys[i], cache->values[i], cache->length, mask, slot_positions};
      std::tie(x, pending) = block->forward_pair(x, pending, &slot);
    } else if (recompute_every_ > 0 && static_cast<int64_t>(i) % recompute_every_ == 0) {
      // A recomputed block takes one tensor: fold pending in first (Note [Pending residual]).
      if (pending.defined()) x = x + pending;
      pending = torch::Tensor();
      x = recomputed([block](const torch::Tensor& in) { return block->forward(in); }, x);  // (B, T, C)
    } else {
      std::tie(x, pending) = block->forward_pair(x, pending);
    }
  }
  return add_and_normalize(tr.ln_f, x, pending, fused_kernels_).second;  // ln_f adds the last pending
}

torch::Tensor GPT2Impl::head(const torch::Tensor& h) {
  // Full padded matrix for a GEMM-friendly N; padding columns are dropped by a free view.
  auto logits = wte_int8_ ? kernels::int8_linear(h.contiguous(), *wte_int8_, {})
                          : torch::nn::functional::linear(h, transformer_->wte->weight);  // (..., Vp)
  return logits.narrow(-1, 0, cfg_.vocab_size);                                           // (..., V) view
}

torch::Tensor GPT2Impl::head_loss(const torch::Tensor& h, const torch::Tensor& targets) {
  // Every path takes the targets (B, T) as they are, so a bad id is named by its (row, position)
  // (Note [Target check] in src/kernels/target_check.h).
  const auto& W = transformer_->wte->weight;  // (Vp, C), the tied head
  if (chunked_loss_ && !wte_int8_) {
    // memory.chunked_loss: the head and the loss together, chunk by chunk (chunked_loss.h); the
    // logits of the whole batch never exist, in any precision.
    return chunked_cross_entropy(h.reshape({-1, h.size(-1)}), W, targets, cfg_.vocab_size, kIgnoreIndex);
  }
  if (fused_kernels_ && !wte_int8_ && (h.is_cpu() || (h.is_cuda() && kernels::have_cuda_kernels())) &&
      W.scalar_type() != torch::kDouble) {
    // The head and the loss as one node: the padded (B*T, Vp) logits are the only logits-sized
    // buffer, and the loss kernel turns them into their gradient (src/kernels/cross_entropy.h).
    // On CPU too, where it is several times faster than the plain path (Note [CPU cross-entropy]).
    return kernels::head_cross_entropy(h.reshape({-1, h.size(-1)}), W, targets, cfg_.vocab_size, kIgnoreIndex);
  }
  // Logits, then cross_entropy. (B*T, V): still a view (row stride Vp). Low precision is upcast;
  // the cast also compacts rows.
  const auto checked = kernels::check_targets(targets, cfg_.vocab_size, kIgnoreIndex);
  auto flat = head(h).reshape({-1, cfg_.vocab_size});
  if (flat.scalar_type() == torch::kBFloat16 || flat.scalar_type() == torch::kHalf) flat = flat.to(torch::kFloat);
  auto loss = torch::nn::functional::cross_entropy(
      flat, checked.targets.reshape({-1}), torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex));
  return checked.poison.defined() ? loss + checked.poison : loss;
}

void GPT2Impl::init_weights(uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const double residual_std = kInitStd / std::sqrt(2.0 * static_cast<double>(cfg_.n_layer));
  for (auto& item : named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    torch::Tensor& p = item.value();
    if (ends_with(name, ".bias")) {
      p.zero_();
    } else if (name.find(".ln_") != std::string::npos) {
      p.fill_(1.0);  // LayerNorm weight (ln_1, ln_2, ln_f)
    } else {
      const bool residual = ends_with(name, "attn.c_proj.weight") || ends_with(name, "mlp.c_proj.weight");
      auto draw = torch::empty(p.sizes(), torch::kFloat);
      draw.normal_(0.0, residual ? residual_std : kInitStd, gen);
      p.copy_(draw);
    }
  }
  auto& wte = transformer_->wte->weight;
  wte.narrow(0, cfg_.vocab_size, cfg_.padded_vocab_size() - cfg_.vocab_size).zero_();
}

void GPT2Impl::set_fused_kernels(bool on) {
  fused_kernels_ = on;
  for (auto& block : transformer_->blocks) {
    block->fused_kernels = on;
    block->attn->fused_kernels = on;
    block->mlp->fused_kernels = on;
  }
}

void GPT2Impl::set_slot_attention(bool on) {
  slot_attention_ = on;
  for (auto& block : transformer_->blocks) block->attn->slot_attention = on;
}

bool GPT2Impl::slot_attention_on() const { return fused_kernels_ && slot_attention_; }

namespace {

// A block's four delayed-scaling states: c_attn, attn.c_proj, c_fc, mlp.c_proj.
std::array<kernels::Fp8DelayedScaling*, 4> fp8_scalings(BlockImpl& block) {
  auto& attn = block.attn;
  auto& mlp = block.mlp;
  return {&attn->fp8_scaling[0], &attn->fp8_scaling[1], &mlp->fp8_scaling[0], &mlp->fp8_scaling[1]};
}

}  // namespace

void GPT2Impl::set_fp8(bool on, int64_t amax_history) {
  if (on && amax_history != 0 && amax_history < 2) {
    throw std::invalid_argument("set_fp8: an amax history holds at least 2 steps (0: current scaling)");
  }
  fp8_amax_ = on && amax_history > 0
                  ? torch::zeros({cfg_.n_layer, 4, 3, amax_history},
                                 torch::dtype(torch::kFloat).device(transformer_->wte->weight.device()))
                  : torch::Tensor();
  fp8_steps_ = 0;
  for (int64_t l = 0; l < static_cast<int64_t>(transformer_->blocks.size()); ++l) {
    transformer_->blocks[l]->attn->fp8 = transformer_->blocks[l]->mlp->fp8 = on;
    const auto layers = fp8_scalings(*transformer_->blocks[l]);
    for (int64_t i = 0; i < 4; ++i) *layers[i] = {fp8_amax_.defined() ? fp8_amax_[l][i] : torch::Tensor(), false};
  }
}

void GPT2Impl::fp8_step_done() {
  if (!fp8_amax_.defined()) return;
  kernels::fp8_amax_roll(fp8_amax_);
  ++fp8_steps_;
  set_fp8_use_history(true);
}

void GPT2Impl::load_fp8_amax_history(const torch::Tensor& history, int64_t steps) {
  if (!fp8_amax_.defined() || history.sizes() != fp8_amax_.sizes() || steps < 0) {
    std::ostringstream what;
    what << "load_fp8_amax_history: a history of shape " << history.sizes() << " and " << steps
         << " steps does not fit this model's ";
    if (fp8_amax_.defined()) {
      what << fp8_amax_.sizes();
    } else {
      what << "(no delayed scaling)";
    }
    throw std::invalid_argument(what.str());
  }
  torch::NoGradGuard no_grad;
  fp8_amax_.copy_(history);
  fp8_steps_ = steps;
  set_fp8_use_history(steps > 0);
}

void GPT2Impl::set_fp8_use_history(bool on) {
  for (auto& block : transformer_->blocks) {
    for (auto* s : fp8_scalings(*block)) s->use_history = on;
  }
}

void GPT2Impl::quantize_int8(int64_t group) { to_int8(group, /*values=*/true); }

void GPT2Impl::empty_int8(int64_t group) { to_int8(group, /*values=*/false); }

void GPT2Impl::to_int8(int64_t group, bool values) {
  GPT2_ASSERT(!quantized_, "GPT2::quantize_int8: the model is int8 already");
  at::NoGradGuard no_grad;
  auto convert = [&](torch::Tensor& weight, std::optional<kernels::Int8Weight>& out) {
    if (values) {
      out = kernels::quantize_int8(weight, group);
    } else {
      const int64_t groups = group == 0 ? 1 : weight.size(1) / group;
      out = kernels::Int8Weight{at::zeros(weight.sizes(), weight.options().dtype(at::kChar)),
                                at::ones({weight.size(0), groups}, weight.options().dtype(at::kFloat))};
    }
    weight.set_data(at::empty({0}, weight.options()));  // frees the weight
  };
  convert(transformer_->wte->weight, wte_int8_);
  for (auto& block : transformer_->blocks) {
    convert(block->attn->c_attn->weight, block->attn->c_attn_int8);
    convert(block->attn->c_proj->weight, block->attn->c_proj_int8);
    convert(block->mlp->c_fc->weight, block->mlp->c_fc_int8);
    convert(block->mlp->c_proj->weight, block->mlp->c_proj_int8);
  }
  quantized_ = true;
}

std::vector<std::pair<std::string, kernels::Int8Weight*>> GPT2Impl::int8_weights() {
  std::vector<std::pair<std::string, kernels::Int8Weight*>> out;
  for (const auto& [name, w] : std::as_const(*this).int8_weights())
    out.emplace_back(name, const_cast<kernels::Int8Weight*>(w));  // this model is not const
  return out;
}

std::vector<std::pair<std::string, const kernels::Int8Weight*>> GPT2Impl::int8_weights() const {
  std::vector<std::pair<std::string, const kernels::Int8Weight*>> out;
  if (!quantized_) return out;
  out.push_back({"transformer.wte.weight", &*wte_int8_});
  for (size_t i = 0; i < transformer_->blocks.size(); ++i) {
    auto& b = transformer_->blocks[i];
    const std::string p = "transformer.h." + std::to_string(i);
    out.push_back({p + ".attn.c_attn.weight", &*b->attn->c_attn_int8});
    out.push_back({p + ".attn.c_proj.weight", &*b->attn->c_proj_int8});
    out.push_back({p + ".mlp.c_fc.weight", &*b->mlp->c_fc_int8});
    out.push_back({p + ".mlp.c_proj.weight", &*b->mlp->c_proj_int8});
  }
  return out;
}

void GPT2Impl::set_recompute_gelu(bool on) {
  for (auto& block : transformer_->blocks) block->mlp->keep_gelu_output = !on;
}

void GPT2Impl::set_recompute_every(int64_t every_k) {
  if (every_k < 0) {
    throw std::invalid_argument("GPT2::set_recompute_every: every_k must be >= 0, got " + std::to_string(every_k));
  }
  recompute_every_ = every_k;
}

int64_t GPT2Impl::num_parameters(bool count_padding) const {
  int64_t n = 0;
  for (const auto& p : parameters(/*recurse=*/true)) n += p.numel();
  // Quantized, wte and the projections are int8 (their parameters emptied, wte's padding rows kept).
  for (const auto& [name, w] : int8_weights()) n += w->q.numel();
  if (!count_padding) n -= (cfg_.padded_vocab_size() - cfg_.vocab_size) * cfg_.n_embd;
  return n;
}

}  // namespace gpt2
