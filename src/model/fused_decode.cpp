// forward_slots' fused step for few rows (gpt2_model.h, Note [Fused decode step]).
#include <torch/torch.h>

#include "src/kernels/decode_linear.h"
#include "src/kernels/decode_step.h"
#include "src/kernels/slot_attention.h"
#include "src/model/gpt2_model.h"

namespace gpt2 {

// Note [Fused decode step]
// At batch 1 a decode step reads every weight once and computes little with it, so its floor is
// the weights' bytes over the memory bandwidth (gpt2-124m in bf16: 250 MB, about 50 µs on an
// H200). Through the blocks' ops (forward_pair) a layer launched nine kernels: the LayerNorms, a
// cuBLASLt GEMM per projection (shaped for many rows, slow at one), two scatters into the cache,
// the attention. Replayed from a CUDA graph that was 1.1 ms a step at gpt2-124m, ~65 µs a layer
// against the 3 µs its weights take to read (issue 41). The fused step runs five a layer, each
// reading its weight once with the work around it folded in (kernels/decode_linear.h):
//   q = decode_qkv(x, ln_1, c_attn)          ln_1, the projection and bias; k and v into the cache
//   y = slot_attention(q, keys, values)      the row's own positions (kernels/slot_attention.h)
//   x += decode_linear(y, attn.c_proj)       the residual add in the projection's epilogue
//   h = gelu(decode_linear(x, ln_2, c_fc))   ln_2, the bias and the GELU
//   x += decode_linear(h, mlp.c_proj)
// then the head with ln_f in front. These are the sums of forward_pair (Note [Pending residual]) in
// the same order, each rounded where the unfused step stores: x + attn, then + mlp. Only the dot
// products' summation order differs (and the GELU is computed on the fp32 sum), so the logits agree
// to the dtype's rounding, not to the bit (tests/model/fused_decode_test.cpp on the CPU reference,
// tests/serve/gpu_test.cpp for the kernels). int8 weights read q and scale in the same kernels.
//
// Five kernels a layer still cost a launch and a drain each, ~6 µs apiece against the ~1 µs their
// weights take to read at gpt2-124m (0.39 ms a step, 60 kernels, on an H100). So on CUDA the whole
// step, every layer and the head, can also run as one cooperative kernel (kernels/decode_step.h,
// set_one_kernel_decode): a block an SM, a grid barrier where the next phase reads what the last
// wrote (five a layer), each phase the same device code as the kernel it replaces, so the same
// bits. A warp requests the next phase's first weights before it waits at a barrier. Measured, the
// barriers (~1.4 µs each) cost about what the launches did, so it is off by default (README).

namespace {

kernels::DecodeNorm norm_of(const torch::nn::LayerNorm& ln) { return {ln->weight, ln->bias, ln->options.eps()}; }

kernels::DecodeWeight weight_of(const torch::nn::Linear& linear, const std::optional<kernels::Int8Weight>& int8) {
  if (int8) return {torch::Tensor(), &*int8, linear->bias};
  return {linear->weight, nullptr, linear->bias};
}

// The tied head: wte, or its int8 copy once quantized.
kernels::DecodeWeight head_of(const TransformerImpl& tr, const std::optional<kernels::Int8Weight>& wte_int8) {
  return {wte_int8 ? torch::Tensor() : tr.wte->weight, wte_int8 ? &*wte_int8 : nullptr, {}};
}

// The blocks' weights and the cache's layers as kernels::decode_step takes them.
std::vector<kernels::DecodeLayer> decode_layers(const TransformerImpl& tr, const KVCache& cache) {
  std::vector<kernels::DecodeLayer> layers;
  layers.reserve(tr.blocks.size());
  for (size_t i = 0; i < tr.blocks.size(); ++i) {
    const auto& block = *tr.blocks[i];
    const auto& attn = *block.attn;
    const auto& mlp = *block.mlp;
    layers.push_back({norm_of(block.ln_1), weight_of(attn.c_attn, attn.c_attn_int8),
                      weight_of(attn.c_proj, attn.c_proj_int8), norm_of(block.ln_2), weight_of(mlp.c_fc, mlp.c_fc_int8),
                      weight_of(mlp.c_proj, mlp.c_proj_int8), cache.keys[i], cache.values[i]});
  }
  return layers;
}

}  // namespace

bool GPT2Impl::fused_decode_applies(const KVCache& cache, const torch::Tensor& positions) const {
  if (!fused_decode_ || !fused_kernels_ || !slot_attention_ || cache.keys.empty()) return false;
  const torch::Tensor& keys = cache.keys.front();
  const int64_t rows = keys.size(0), C = cfg_.n_embd;
  if (!keys.is_cuda() || rows > kernels::kDecodeRows) return false;
  // A query-shaped view of the cache stands in for the step's queries: (B, nh, 1, hs), last dim contiguous.
  if (!kernels::slot_attention_applies(keys.narrow(2, 0, 1), keys, cache.values.front(), positions)) return false;
  const auto d = keys.device();
  const auto t = keys.scalar_type();
  for (const auto& block : transformer_->blocks) {
    const auto& attn = *block->attn;
    const auto& mlp = *block->mlp;
    if (!kernels::decode_linear_applies(d, t, rows, C, weight_of(attn.c_attn, attn.c_attn_int8)) ||
        !kernels::decode_linear_applies(d, t, rows, C, weight_of(attn.c_proj, attn.c_proj_int8)) ||
        !kernels::decode_linear_applies(d, t, rows, C, weight_of(mlp.c_fc, mlp.c_fc_int8)) ||
        !kernels::decode_linear_applies(d, t, rows, 4 * C, weight_of(mlp.c_proj, mlp.c_proj_int8)))
      return false;
  }
  return kernels::decode_linear_applies(d, t, rows, C, head_of(*transformer_, wte_int8_));
}

bool GPT2Impl::one_kernel_decode_applies(const KVCache& cache, const torch::Tensor& positions) const {
  if (!one_kernel_decode_ || !fused_decode_applies(cache, positions)) return false;
  const auto& tr = *transformer_;
  const auto& keys = cache.keys.front();
  const auto x = torch::empty({keys.size(0), cfg_.n_embd}, keys.options());  // the stream's shape, dtype and device
  return kernels::decode_step_in_one_kernel(x, decode_layers(tr, cache), norm_of(tr.ln_f), head_of(tr, wte_int8_));
}

torch::Tensor GPT2Impl::forward_slots_fused(const torch::Tensor& ids, const torch::Tensor& positions, KVCache& cache) {
  TORCH_CHECK(ids.dim() == 2 && ids.size(1) == 1 && ids.scalar_type() == torch::kLong &&
                  ids.size(0) == static_cast<int64_t>(cache.keys.empty() ? 0 : cache.keys.front().size(0)),
              "GPT2::forward_slots_fused expects (B, 1) int64 ids with B = the cache's rows, got ", ids.sizes());
  TORCH_CHECK(positions.dim() == 1 && positions.size(0) == ids.size(0) && positions.scalar_type() == torch::kLong,
              "GPT2::forward_slots_fused expects (B) int64 positions, got ", positions.sizes());
  torch::NoGradGuard no_grad;
  auto& tr = *transformer_;
  const int64_t B = ids.size(0);
  const kernels::DecodeWeight wte = head_of(tr, wte_int8_);  // the embedding's table and the tied head
  // (B, C): the stream, updated in place; one kernel for the gathers and the add
  torch::Tensor x = kernels::decode_embedding(ids.view({B}), positions, wte, tr.wpe->weight);
  const auto one_kernel = one_kernel_decode_ ? kernels::OneKernel::kYes : kernels::OneKernel::kNo;
  return kernels::decode_step(x, decode_layers(tr, cache), norm_of(tr.ln_f), wte, positions, one_kernel)
      .narrow(1, 0, cfg_.vocab_size);  // (B, V)
}

}  // namespace gpt2
