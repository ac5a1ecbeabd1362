#pragma once
// Test hook for the failure paths (tests/python/test_parallel_faults.py, test_checkpoint_faults.py,
// test_slurm.py): GPT2_FAULT_AT=RANK:STEP makes that rank throw at the start of that step,
// RANK:STEP:kill kill itself with SIGKILL there, and RANK:STEP:hang sleep forever, so a test can
// check that one failing, vanished or hung rank ends the whole job. RANK:STEP:inf makes that rank's
// gradients of that step non-finite (an fp16 overflow), so a test can check that every rank skips
// the step. RANK:STEP:stall is no fault: that rank's sample at STEP takes kStallSeconds longer
// (only rank 0 samples), standing in for any slow rank-0-only work (a long sample, a slow metrics
// disk, a checkpoint's extra files) that the other ranks must not mistake for a dead peer. Unset,
// it does nothing.
#include <cstdint>

namespace gpt2 {

class StepFault {
 public:
  static constexpr int kStallSeconds = 4;

  static StepFault from_environment(int rank);  // GPT2_FAULT_AT, for this rank
  void at_step_start(int64_t step) const;       // throws, kills or hangs when `step` is the one
  bool overflows_at(int64_t step) const { return mode_ == Mode::kInf && step == step_; }
  void before_sample(int64_t step) const;  // stalls when `step` is the one

 private:
  enum class Mode { kThrow, kKill, kHang, kInf, kStall };
  int64_t step_ = -1;
  Mode mode_ = Mode::kThrow;
};

}  // namespace gpt2
