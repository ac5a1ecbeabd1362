#pragma once
// The language-model head and its cross-entropy in one autograd function that never holds the
// logits of the whole batch: rows are processed in chunks, forward keeps only each row's
// log-sum-exp (fp32), and backward recomputes a chunk's logits, turns them into
// softmax - one_hot in fp32, and accumulates dh and dW chunk by chunk. For GPT-2 124M at
// B=32, T=1024 the full fp32 logits and their gradient are ~13 GB; here they are one chunk.
// Contract: h (N, C) and W (Vp, C) in the same floating dtype; only the first `vocab` columns of
// h Wᵀ are classes (the rest is padding); targets int64, N of them in any shape (e.g. (B, T)),
// rows equal to ignore_index do not count, an id outside [0, vocab) is a gpt2::UserError naming
// its (row, position): at once on CPU, at raise_noted_bad_target() on CUDA, where the loss is NaN
// (Note [Target check], src/kernels/target_check.h). Returns the mean loss over counted rows as an
// fp32 (or fp64) scalar.
#include <torch/types.h>

#include <cstdint>

namespace gpt2 {

// The loss GPT2::loss() computes under memory.chunked_loss: mean cross-entropy of h Wᵀ[:, :vocab]
// against targets, `chunk_rows` rows at a time.
torch::Tensor chunked_cross_entropy(const torch::Tensor& h, const torch::Tensor& W, const torch::Tensor& targets,
                                    int64_t vocab, int64_t ignore_index, int64_t chunk_rows = 4096);

}  // namespace gpt2
