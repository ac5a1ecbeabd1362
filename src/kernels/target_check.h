#pragma once
// Target ids outside the vocabulary, for every loss: one gpt2::UserError that names the id and
// where it is, on CPU and on CUDA, without a host-device synchronisation inside a training step
// (Note [Target check]). Contract: targets int64 of any shape, row-major; an id counts when it is in
// [0, vocab) and is ignored when it equals ignore_index; any other id is an error named by its
// (row, position), the position being the index along the last dimension.
#include <torch/types.h>

#include <cstdint>
#include <string>

namespace gpt2::kernels {

// Note [Target check]
// A target id outside [0, vocab) comes from the user's data (or a vocab_size that does not match
// it), so every loss names it the same way, as gpt2::UserError:
//   target id 50300 at (row 1, position 7) is outside the vocabulary [0, 50257)
// On CPU a loss checks its targets before it computes. On CUDA a check that throws at once would
// wait for the device in every micro-step, which the trainer never does. So there the device notes
// the first bad id it meets in a small record (int64 x 4 per device) and the loss comes out NaN:
// the fused cross-entropy kernel notes the id as it reads the target; the other losses (chunked,
// LibTorch's) first run check_targets, one small kernel that notes the id, puts ignore_index in its
// place (ATen's kernels would end the process with a device-side assert) and gives the NaN to add
// to the loss. raise_noted_bad_target() reads the record and throws. The host reads it where it
// reads the loss anyway: the trainer's ProgressLog::step_done, every log.every steps, so a run
// stops there naming the id instead of "loss is not finite". In training this is the second line:
// the batch loader checks every id on the host as it fills a batch (data/batch_loader.cpp) and
// names the token file and position, at no cost to the GPU.

// The message of the error: "target id ID at (row R, position P) is outside the vocabulary [0, V)".
std::string bad_target_message(int64_t row, int64_t position, int64_t id, int64_t vocab);

struct CheckedTargets {
  torch::Tensor targets;  // what the loss should use: on CUDA, bad ids replaced by ignore_index
  torch::Tensor poison;   // CUDA: () fp32, NaN when an id was bad, else 0, to add to the loss; CPU: undefined
};

// CPU: throws UserError for the first bad id (row-major order) and returns the targets as they
// are. CUDA: notes the first bad id for raise_noted_bad_target() and returns checked targets of
// the same shape, without waiting for the device. Throws std::invalid_argument for non-int64
// targets.
CheckedTargets check_targets(const torch::Tensor& targets, int64_t vocab, int64_t ignore_index);

// Throws UserError for the bad id a CUDA loss noted since the last call, and clears the note.
// Waits for the work queued on the current stream of each device that has a record; does nothing
// (and waits for nothing) when no CUDA loss has run.
void raise_noted_bad_target();

#ifdef GPT2_WITH_CUDA
// The note of `device` (created on first use, which waits for the device once): int64 x 4 =
// {row, position, id, vocab}, row -1 while nothing is noted. For the launchers (launch.h).
int64_t* bad_target_record(const torch::Device& device);
#endif

}  // namespace gpt2::kernels
