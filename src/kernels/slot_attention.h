#pragma once
// The attention of slot decoding (Note [Slot decoding] in src/model/gpt2_model.cpp): one query per
// row, attending to positions 0..positions[b] of that row's own cache and nothing else. Row b's work
// (which positions, in which order, how the partial softmaxes merge) is fixed by positions[b] alone,
// so its output is the same bits whatever the other rows hold and whatever the cache's capacity:
// batch invariance without reading every row's whole cache, as SDPA under a mask does.
// Contract: q (B, nh, 1, hs), any strides with the last dim contiguous (a view of the qkv
// projection); keys, values (B, nh, capacity, hs) contiguous; positions (B) int64, each in
// [0, capacity); one device (CPU or CUDA) and one dtype of fp32/bf16/fp16; no gradient. Returns y
// (B, nh, 1, hs) contiguous: softmax_j(q . k_j / sqrt(hs)) weighted sum of v_j over j = 0..positions[b],
// accumulated in fp32 and rounded to the dtype. CUDA: one block of 16 warps per (row, head); a warp
// takes every 16th tile of 32 positions, in increasing order, with an online softmax, and the warps'
// states merge in warp order; no host sync, no allocation but y (it runs inside CUDA graphs); a
// position outside [0, capacity) gives NaN (the launch cannot throw). CPU: a plain loop per (row,
// head), in parallel; an out-of-range position throws. The two need not agree to the bit.
#include <torch/types.h>

namespace gpt2::kernels {

// Whether slot_attention takes these tensors: the contract above, and on CUDA a build with the
// kernels, hs even and <= 128 (every GPT-2 size has 64), keys/values aligned to two elements.
bool slot_attention_applies(const torch::Tensor& q, const torch::Tensor& keys, const torch::Tensor& values,
                            const torch::Tensor& positions);
// Throws std::invalid_argument outside slot_attention_applies.
torch::Tensor slot_attention(const torch::Tensor& q, const torch::Tensor& keys, const torch::Tensor& values,
                             const torch::Tensor& positions);

}  // namespace gpt2::kernels
