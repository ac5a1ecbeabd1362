#pragma once
// GPT-2 language model, architecturally identical to Hugging Face's GPT2LMHeadModel (pre-LN blocks,
// learned positions, tanh GELU, LayerNorm eps 1e-5, lm head tied to wte, no dropout).
// Contract: named_parameters() are exactly HF's names ("transformer.h.0.attn.c_attn.weight", ...),
// forward() returns logits over the real vocab only, loss() is mean cross-entropy in >= fp32.
// Works in fp32 and fp64, and in bf16/fp16 with the parameters cast to it (no autocast). One Block
// serves training, evaluation and KV-cache decoding. See Note [Weight layout] for import.
#include <torch/nn.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "src/kernels/fp8_gemm.h"
#include "src/kernels/int8_linear.h"
#include "src/model/model_config.h"

namespace gpt2 {

// Note [Weight layout]
// Our projections are torch::nn::Linear, whose weight is (out_features, in_features). HF GPT-2 uses
// Conv1D, whose weight is (in_features, out_features): c_attn, c_proj and c_fc weights are therefore
// TRANSPOSED relative to HF checkpoints (hf_import.h transposes both ways). wte has
// padded_vocab_size() rows so the lm-head matmul has a GPU-friendly shape; rows >= vocab_size are
// kept at zero, never looked up (ids must be < vocab_size) and never predicted (logits are narrowed).

// GPT2Config (the [model] section: n_layer, n_head, n_embd, vocab_size, block_size) is declared
// in model_config.h so config code needs no torch; its methods are defined in gpt2_model.cpp.

// Note [Pending residual]
// With fused kernels every residual add runs inside the LayerNorm that reads its sum
// (src/kernels/layer_norm.h: one kernel each way, and the two gradients of the stream are never
// summed by autograd). So between blocks the residual stream is carried as a pair (x, pending):
// - the true stream is x + pending; pending is the last branch output (an MLP's) not yet added,
//   or undefined (then the stream is x alone, as after the embeddings);
// - every add happens inside the LayerNorm that reads the sum: a block's ln_1 adds the pending it
//   is given, its ln_2 adds the attention output, and it hands its MLP output on as the next pending;
// - a recomputed block (recompute.h) takes one tensor, so pending is folded into x before it and
//   the block's output comes back whole (pending undefined);
// - ln_f consumes the last pending, so the final hidden states are LayerNorm(x + pending).
// Without the kernels (CPU, fp64, fused_kernels off) the pair is summed by a plain x + pending in
// the same place: the same adds, in the same order, as the textbook x = x + f(ln(x)) chain.

// Decoding with a cache. Keys and values of every layer for a batch being generated (generate.h),
// so each new token costs one position of compute instead of the whole context. Sequences of
// different lengths are left-padded: row b's first pad[b] positions are padding, never attended to
// (except by themselves, which keeps their values finite), and its positions count from the first
// real token.
struct KVCache {
  std::vector<torch::Tensor> keys, values;  // per layer, (B, n_head, capacity, head_size)
  std::vector<int64_t> pad;                 // left padding per row
  torch::Tensor pad_tensor;                 // the same, (B) int64 on the model's device
  int64_t length = 0;                       // positions filled, padding included
  int64_t capacity() const { return keys.empty() ? 0 : keys.front().size(2); }
  // Row `row` alone, unpadded and empty, sharing this cache's storage: where the server prefills
  // one sequence into its slot with forward_cached (Note [Slot decoding]).
  KVCache row_view(int64_t row) const;
  // Rows [0, rows) as they are (padding and length kept), sharing this cache's storage: where the
  // server decodes only its first `rows` slots (serve/decode_graphs.h).
  KVCache first_rows(int64_t rows) const;
};

// One layer's part of a KVCache for one decoding step of t positions [start, start + t): the
// attention writes their keys and values into `keys`/`values` (that layer's cache tensors) at
// [start, start + t) and its queries attend to [0, start + t) under `mask`.
// Slot decoding (forward_slots) sets `rows_at` instead: row b's one new position is rows_at[b],
// written there, and the query attends to row b's positions <= rows_at[b] (kernels::slot_attention),
// or to the first L positions under `mask` (B, 1, 1, L) (SDPA; Note [Slot decoding]).
struct KVSlot {
  torch::Tensor keys, values;  // (B, n_head, capacity, head_size)
  int64_t start = 0;
  torch::Tensor mask;     // (B, 1, t, start + t) bool, true = attend; undefined = causal
  torch::Tensor rows_at;  // slot decoding: (B) int64 position of each row's new token; else undefined
};

// Causal multi-head self-attention with one fused qkv projection.
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GPT2Config& cfg);
  // x (B, T, C) -> (B, T, C), causal over x's own positions. With a cache slot (decoding), x holds
  // the positions [slot->start, slot->start + T), which also attend to the cached ones (KVSlot).
  torch::Tensor forward(const torch::Tensor& x, const KVSlot* slot = nullptr);

  torch::nn::Linear c_attn{nullptr};  // C -> 3C (q, k, v concatenated along the output)
  torch::nn::Linear c_proj{nullptr};  // C -> C, residual projection
  // Set by GPT2Impl::quantize_int8: these replace the Linears' weights (emptied then).
  std::optional<kernels::Int8Weight> c_attn_int8, c_proj_int8;
  bool fused_kernels = true;                  // CUDA: projections through src/kernels/linear.h
  bool fp8 = false;                           // c_attn and c_proj through kernels::fp8_linear (GPT2Impl::set_fp8)
  kernels::Fp8DelayedScaling fp8_scaling[2];  // c_attn's, c_proj's; amax undefined: current scaling
  // Slot decoding through kernels::slot_attention (with fused_kernels; GPT2Impl::set_slot_attention).
  bool slot_attention = true;

 private:
  int64_t n_head_;
};
TORCH_MODULE(CausalSelfAttention);

class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const GPT2Config& cfg);
  torch::Tensor forward(const torch::Tensor& x);  // (B, T, C) -> (B, T, C)

  torch::nn::Linear c_fc{nullptr};                            // C -> 4C
  torch::nn::Linear c_proj{nullptr};                          // 4C -> C, residual projection
  std::optional<kernels::Int8Weight> c_fc_int8, c_proj_int8;  // as the attention's
  bool fused_kernels = true;                  // CUDA: c_fc + GELU and c_proj through src/kernels/linear.h
  bool keep_gelu_output = true;               // false recomputes it in backward (kernels::mlp, kernels::fp8_mlp)
  bool fp8 = false;                           // c_fc through kernels::fp8_linear, GELU + c_proj through fp8_gelu_linear
  kernels::Fp8DelayedScaling fp8_scaling[2];  // c_fc's, c_proj's; amax undefined: current scaling
};
TORCH_MODULE(MLP);

// Pre-LN transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x)). The one block of the model:
// training, evaluation and decoding (with a KV slot) all run forward_pair.
class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GPT2Config& cfg);
  // The block with its residual adds left to the LayerNorms (Note [Pending residual]): the input
  // stream is x + pending (pending may be undefined: just x), the output is (h, m) with h + m the
  // block's output stream, m the pending of the next block. x, pending: (B, T, C). `slot`: decoding
  // (the attention's KV slot), else nullptr.
  std::pair<torch::Tensor, torch::Tensor> forward_pair(const torch::Tensor& x, const torch::Tensor& pending,
                                                       const KVSlot* slot = nullptr);
  // The whole output stream, (B, T, C) -> (B, T, C): what a recomputed block runs (one tensor in,
  // one out).
  torch::Tensor forward(const torch::Tensor& x);
  bool fused_kernels = true;  // CUDA: add + LayerNorm through src/kernels/layer_norm.h

  torch::nn::LayerNorm ln_1{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::LayerNorm ln_2{nullptr};
  MLP mlp{nullptr};
};
TORCH_MODULE(Block);

// The "transformer" submodule: exists so parameter names carry HF's "transformer." prefix.
class TransformerImpl : public torch::nn::Module {
 public:
  explicit TransformerImpl(const GPT2Config& cfg);

  torch::nn::Embedding wte{nullptr};  // (padded_vocab_size, C); also the lm head (tied)
  torch::nn::Embedding wpe{nullptr};  // (block_size, C)
  torch::nn::ModuleList h{nullptr};   // n_layer Blocks
  torch::nn::LayerNorm ln_f{nullptr};
  std::vector<Block> blocks;  // the same modules as h, typed
};
TORCH_MODULE(Transformer);

class GPT2Impl : public torch::nn::Module {
 public:
  // Validates cfg. Parameters start with LibTorch's default init: call init_weights() for GPT-2's
  // init, or load weights (hf_import.h). Allocates on CPU in fp32; move with ->to(device, dtype).
  explicit GPT2Impl(const GPT2Config& cfg);

  // Three entry points, one walk (hidden: embeddings, blocks, ln_f) and one tied head.
  // idx: (B, T) int64 token ids in [0, vocab_size), T <= block_size.
  // Returns logits (B, T, vocab_size): a view narrowed from the padded (B, T, padded_vocab) product,
  // so it is not contiguous; call .contiguous() if needed.
  torch::Tensor forward(const torch::Tensor& idx);
  // Mean cross-entropy over the real vocab; targets (B, T) int64, -1 = ignored position. The
  // softmax is fp32 for bf16/fp16/fp32 models and fp64 for fp64 ones. Any other id outside
  // [0, vocab_size) is a gpt2::UserError naming it and its (row, position): thrown here on CPU;
  // on CUDA the loss is NaN and kernels::raise_noted_bad_target() throws it, without a host sync
  // in the step (Note [Target check] in src/kernels/target_check.h).
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets);
  // Inference step with a cache: idx (B, t) are the next t positions of every row; appends their
  // keys/values at cache.length, advances it, and returns the logits of the last position,
  // (B, vocab_size). Throws gpt2::UserError when cache.length + t exceeds the cache's capacity.
  torch::Tensor forward_cached(const torch::Tensor& idx, KVCache& cache);
  // The same, returning the logits of position last[b] (of idx's t) for row b: prompts padded on
  // the right to one length (the server's padded prefill; the padding comes after every real
  // position, so causal attention keeps it out of theirs). last: (B) int64 on the model's device.
  torch::Tensor forward_cached(const torch::Tensor& idx, KVCache& cache, const torch::Tensor& last);
  // An empty cache for `batch` rows of up to `capacity` (<= block_size) positions, left padding
  // `pad` (size batch), on the model's device and dtype.
  KVCache make_kv_cache(int64_t capacity, const std::vector<int64_t>& pad);
  // Continuous batching (src/serve, Note [Slot decoding]): every row of `cache` is its own
  // sequence, unpadded, at its own length. ids (B, 1) are each row's next token, positions (B)
  // int64 on the model's device its position (the row's length so far, < attend); writes their
  // keys/values there and returns the logits (B, vocab_size), each row attending to its cached
  // positions among the first `attend` (<= capacity; 0 = all; not used by kernels::slot_attention,
  // set_slot_attention). cache.length is not used.
  // On CUDA, where fused_decode_applies, it runs forward_slots_fused.
  torch::Tensor forward_slots(const torch::Tensor& ids, const torch::Tensor& positions, KVCache& cache,
                              int64_t attend = 0);
  // forward_slots' step for few rows (Note [Fused decode step] in fused_decode.cpp,
  // kernels/decode_step.h): the same sums in the same order, each projection with its LayerNorm,
  // bias, GELU, residual add or cache write fused in (kernels/decode_linear.h), the attention
  // kernels::slot_attention; on CUDA five kernels a block, or one kernel for the whole step
  // (set_one_kernel_decode), the same bits either way. On any device (the
  // CPU runs the reference ops: what the tests compare the CUDA kernels against); throws where a
  // kernel does not apply.
  torch::Tensor forward_slots_fused(const torch::Tensor& ids, const torch::Tensor& positions, KVCache& cache);
  // Whether forward_slots takes forward_slots_fused for `rows` rows: on CUDA, with the fused kernels
  // and the slot attention on, set_fused_decode not off, and every kernel taking the shapes.
  bool fused_decode_applies(const KVCache& cache, const torch::Tensor& positions) const;
  // Not called: on. Off: forward_slots runs the blocks' ops (what gpt2-generate --fused_decode false
  // measures against).
  void set_fused_decode(bool on) { fused_decode_ = on; }
  // Not called: off, the fused step launches five kernels a block. On: one kernel for the whole step
  // where it applies (gpt2-generate --one_kernel_decode true): the same bits, not yet faster at
  // every size (README, Deployment).
  void set_one_kernel_decode(bool on) { one_kernel_decode_ = on; }
  // Whether forward_slots runs its fused step as one kernel (kernels::decode_step_in_one_kernel).
  bool one_kernel_decode_applies(const KVCache& cache, const torch::Tensor& positions) const;

  // true: loss() runs the head and the loss chunk by chunk without the batch's logits
  // (memory.chunked_loss, chunked_loss.h); false: logits, then cross_entropy (faster today).
  void set_chunked_loss(bool on) { chunked_loss_ = on; }
  // true (default): on CPU and CUDA, the head and the loss run as one node whose loss kernel writes
  // the logits' gradient (src/kernels/cross_entropy.h) instead of a cast to fp32, log_softmax and
  // nll; on CUDA also every residual add runs fused with the LayerNorm after it (layer_norm.h, Note
  // [Pending residual]); the linear layers take their bias gradients, and c_fc its GELU backward,
  // from src/kernels/linear.h. Decoding runs the same blocks, so the same kernels.
  void set_fused_kernels(bool on);
  // Slot decoding's attention (forward_slots, Note [Slot decoding]): true: kernels::slot_attention
  // where it applies (with the fused kernels on), which reads each row's own positions only; false:
  // SDPA over `attend` positions under a mask. Not called: on (on an H200 it more than doubles
  // gpt2-serve's throughput at 32 clients). slot_attention_on(): whether decoding uses it.
  void set_slot_attention(bool on);
  bool slot_attention_on() const;
  // precision.fp8 (issue 40): the blocks' four linear layers (c_attn, attn.c_proj, c_fc,
  // mlp.c_proj) through kernels::fp8_linear, forward and backward (e4m3 activations and weights,
  // e5m2 output gradients, per-tensor scales); a product whose rows are not a multiple of 16 (a
  // decoding step) stays in the model's dtype. The embeddings, attention, LayerNorms, the head and
  // the loss are unchanged. Off when not called. amax_history 0: current scaling (each cast its own
  // amax); L >= 2: delayed scaling over L steps (kernels::Fp8DelayedScaling), the histories
  // allocated zeroed on the model's device (call it after moving the model), the first step current.
  // Throws std::invalid_argument for an amax_history of 1 or less than 0.
  void set_fp8(bool on, int64_t amax_history = 0);
  // Delayed scaling's histories: (n_layer, 4, 3, L) fp32 for c_attn, attn.c_proj, c_fc and
  // mlp.c_proj, each for x, w and gy (undefined without delayed scaling); the steps recorded so far.
  // A data-parallel trainer makes them equal on every rank (an all-reduce max) before each step's
  // fp8_step_done, which rolls them (kernels::fp8_amax_roll): later casts scale from the history.
  // load_fp8_amax_history restores both (a resume); std::invalid_argument if the shape differs.
  const torch::Tensor& fp8_amax_history() const { return fp8_amax_; }
  int64_t fp8_steps_recorded() const { return fp8_steps_; }
  void fp8_step_done();
  void load_fp8_amax_history(const torch::Tensor& history, int64_t steps);
  // memory.recompute_gelu: the fused MLP keeps only its GELU input for backward and recomputes the
  // output there (B x T x 4C fewer activations per block: bf16, or under precision.fp8 the output's
  // FP8 transpose; no effect without the fused kernels or fp8).
  void set_recompute_gelu(bool on);
  // Activation recomputation (memory.activation_checkpointing; recompute.h): 0 = none,
  // 1 = every block (full), K = blocks 0, K, 2K, ... A recomputed block keeps only its input for
  // backward and runs again there. Applies only when forward runs with grad enabled; the values
  // and gradients are the same as without. Throws std::invalid_argument for every_k < 0.
  void set_recompute_every(int64_t every_k);

  // Weight-only int8 (kernels/int8_linear.h, Note [int8 weights]) for the blocks' projections
  // (c_attn, c_proj, c_fc) and the tied wte: each weight quantized on its device (group 0: one
  // scale a row, else scales per `group` columns) and its parameter emptied, so the model holds
  // int8 weights only and runs forward only (generation, evaluation, serving). The embedding reads
  // its rows dequantized (bitwise dequantize_int8's rows); the head is int8_linear. wpe,
  // LayerNorms and biases stay as they are. Quantizing twice is a gpt2::Error.
  void quantize_int8(int64_t group = 0);
  // The same shape with zero weights and unit scales, on the model's device: what an int8 model
  // file's datasets are read into (model_file.h).
  void empty_int8(int64_t group);
  // The int8 weights under their parameter names ("transformer.wte.weight", then
  // "transformer.h.0.attn.c_attn.weight", ...), in registration order; empty before quantize_int8. Pointers into the
  // model (model files fill them).
  std::vector<std::pair<std::string, kernels::Int8Weight*>> int8_weights();
  std::vector<std::pair<std::string, const kernels::Int8Weight*>> int8_weights() const;
  bool quantized() const { return quantized_; }

  // GPT-2 init: Linear/Embedding weights N(0, 0.02); residual projections (attn.c_proj, mlp.c_proj)
  // N(0, 0.02/sqrt(2*n_layer)); biases 0; LayerNorm weight 1, bias 0; padded wte rows 0.
  // Draws from a private CPU generator seeded with `seed` (fp32, then copied to each parameter's
  // device and dtype): same values on any device, and the global torch RNG is neither read nor
  // advanced.
  void init_weights(uint64_t seed);

  // Number of parameter elements; without padding it equals HF's count at the same vocab_size.
  int64_t num_parameters(bool count_padding = false) const;

  const GPT2Config& config() const { return cfg_; }

 private:
  // The walk every entry point takes: wte(idx) + wpe(positions), the blocks, ln_f, the stream
  // carried as Note [Pending residual] says. Without a cache the positions are 0..T-1 and blocks
  // are recomputed per recompute_every_; with one (decoding) the positions follow cache->length
  // and the padding, and each block's attention uses its KVSlot.
  // idx (B, T) -> the final hidden states (B, T, C), what the tied head multiplies.
  // `slot_positions` (B), `attend`: forward_slots' (then the cache's length is not used).
  torch::Tensor hidden(const torch::Tensor& idx, KVCache* cache = nullptr, const torch::Tensor& slot_positions = {},
                       int64_t attend = 0);
  // forward_cached's checks and walk: the hidden states (B, t, C) of idx, the cache advanced.
  torch::Tensor cached_hidden(const torch::Tensor& idx, KVCache& cache);
  // The tied lm head: h (..., C) -> logits (..., vocab_size), narrowed from the padded product.
  torch::Tensor head(const torch::Tensor& h);
  // The head and the mean cross-entropy, h (B, T, C), targets (B, T): the one place that chooses
  // between the chunked node, the fused-kernel node and logits + cross_entropy.
  torch::Tensor head_loss(const torch::Tensor& h, const torch::Tensor& targets);
  // quantize_int8 (values) and empty_int8 (zeros).
  void to_int8(int64_t group, bool values);
  // Whether the blocks' FP8 casts scale from the amax histories (after the first step).
  void set_fp8_use_history(bool on);

  GPT2Config cfg_;
  Transformer transformer_{nullptr};
  int64_t recompute_every_ = 0;                  // see set_recompute_every
  bool chunked_loss_ = false;                    // see set_chunked_loss
  bool fused_kernels_ = true;                    // see set_fused_kernels
  bool slot_attention_ = true;                   // see set_slot_attention
  bool fused_decode_ = true;                     // see set_fused_decode
  bool one_kernel_decode_ = false;               // see set_one_kernel_decode
  bool quantized_ = false;                       // see quantize_int8
  std::optional<kernels::Int8Weight> wte_int8_;  // the tied wte once quantized (its parameter emptied)
  torch::Tensor fp8_amax_;                       // see fp8_amax_history
  int64_t fp8_steps_ = 0;
};
TORCH_MODULE(GPT2);

}  // namespace gpt2
