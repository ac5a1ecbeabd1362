#pragma once
// Fused cross-entropy of the language-model head, on CUDA and on CPU (Note [CPU cross-entropy] in
// cross_entropy.cpp: row chunks of ATen's ops that stay in cache). The plain path (cast the batch's bf16
// logits to fp32, log_softmax, nll, and back) moves ~50 GB a step for gpt2-124m at B=32 and holds
// two fp32 copies of the logits; this one reads the logits once forward (fp32 math, an online
// softmax that keeps only each row's log-sum-exp) and once backward, writing the gradient
// (softmax - one_hot) * dloss / count straight in the logits' dtype.
// Contract: logits (N, Vp) contiguous CPU or CUDA fp32/bf16/fp16; only the first `vocab` columns
// are classes (padding columns get zero gradient); targets int64, N of them in any shape (e.g.
// (B, T)), in [0, vocab) or ignore_index (ignored rows count for nothing). Any other id is a
// gpt2::UserError naming its (row, position) (Note [Target check], target_check.h): at once on CPU;
// on CUDA the loss is NaN, the id is noted for raise_noted_bad_target() and its row gets no gradient. Returns the mean
// over counted rows as an fp32 scalar, differentiable with respect to the logits.
//
// head_cross_entropy(h, W, ...) is the language-model head and this loss in one autograd node:
// logits = h W^T exist only inside it, backward overwrites them with their gradient and runs the
// two GEMMs on that, so no other logits-sized buffer exists. h (N, C) and W (Vp, C) of one
// device and dtype; targets as above. Its backward runs once per forward: a second one through the same graph
// (retain_graph) throws gpt2::Error (the model's LibTorch and chunked losses allow it).
#include <torch/types.h>

#include <cstdint>

namespace gpt2::kernels {

// True when this build has the CUDA kernels (GPT2_WITH_CUDA).
bool have_cuda_kernels();

// Throws std::invalid_argument for tensors outside the contract, std::logic_error for CUDA tensors
// in a build without CUDA.
torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets, int64_t vocab,
                            int64_t ignore_index);
torch::Tensor head_cross_entropy(const torch::Tensor& h, const torch::Tensor& weight, const torch::Tensor& targets,
                                 int64_t vocab, int64_t ignore_index);

}  // namespace gpt2::kernels
