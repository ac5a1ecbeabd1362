#pragma once
// A GPT-2 decode step over its blocks and head for up to kDecodeRows rows (Note [Fused decode step]
// in src/model/fused_decode.cpp): x (rows, C), the embedded stream, goes through every layer
//   q = decode_qkv(x, ln_1, c_attn)       k and v into the layer's cache at positions[r]
//   y = slot_attention(q, keys, values)   (slot_attention.h)
//   x += decode_linear(y, attn_proj)
//   h = gelu(decode_linear(x, ln_2, c_fc))
//   x += decode_linear(h, mlp_proj)
// and decode_step returns decode_linear(x, ln_f, head): the logits (rows, N) of the head's N rows.
// x is updated in place. OneKernel::kYes on CUDA, where decode_step_in_one_kernel holds, runs all of
// it as one cooperative kernel (decode_step.cu): the same device code as the kernels above, phase by
// phase, so the same bits, without a launch and a drain per phase (about 60 a step at gpt2-124m).
// Otherwise, and on the CPU, the calls above one by one. Contract: decode_linear.h's and
// slot_attention.h's for each call; every LayerNorm's eps the same for the one kernel.
#include <torch/types.h>

#include <vector>

#include "src/kernels/decode_linear.h"

namespace gpt2::kernels {

struct DecodeLayer {
  DecodeNorm ln_1;
  DecodeWeight c_attn, attn_proj;
  DecodeNorm ln_2;
  DecodeWeight c_fc, mlp_proj;
  torch::Tensor keys, values;  // (rows, heads, capacity, C / heads)
};

enum class OneKernel { kNo, kYes };

// Whether decode_step with OneKernel::kYes runs one kernel for these: CUDA with cooperative launch,
// rows <= kDecodeRows, at most 64 layers, every weight int8 (blocks and head) or none, one eps, the
// head size a multiple of 16 bytes and at most 128, the MLP's input rows within shared memory, every
// weight and cache 16-byte aligned.
bool decode_step_in_one_kernel(const torch::Tensor& x, const std::vector<DecodeLayer>& layers, const DecodeNorm& ln_f,
                               const DecodeWeight& head);

// trace (kernel_bench): where the one kernel runs, set to its blocks' global timer readings (ns),
// (layers * 5 + 1 phases, 3: begin, input staged, done, blocks) int64 on x's device.
torch::Tensor decode_step(torch::Tensor& x, const std::vector<DecodeLayer>& layers, const DecodeNorm& ln_f,
                          const DecodeWeight& head, const torch::Tensor& positions, OneKernel one_kernel,
                          torch::Tensor* trace = nullptr);

}  // namespace gpt2::kernels
