#pragma once
// Test hook for the failure paths (tests/python/test_parallel_faults.py, test_checkpoint_faults.py,
// test_slurm.py): GPT2_FAULT_AT=RANK:STEP makes that rank throw at the start of that step,
// RANK:STEP:kill kill itself with SIGKILL there, and RANK:STEP:hang sleep forever, so a test can
// check that one failing, vanished or hung rank ends the whole job. RANK:STEP:inf makes that rank's
// gradients of that step non-finite (an fp16 overflow), so a test can check that every rank skips
// the step. Unset, it does nothing.
#include <cstdint>

namespace gpt2 {

class StepFault {
 public:
  static StepFault from_environment(int rank);  // GPT2_FAULT_AT, for this rank
  void at_step_start(int64_t step) const;       // throws, kills or hangs when `step` is the one
  bool overflows_at(int64_t step) const { return mode_ == Mode::kInf && step == step_; }

 private:
  enum class Mode { kThrow, kKill, kHang, kInf };
  int64_t step_ = -1;
  Mode mode_ = Mode::kThrow;
};

}  // namespace gpt2
