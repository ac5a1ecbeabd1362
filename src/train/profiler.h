#pragma once
// Profiling a few training steps (profile.steps, profile.dir): LibTorch's Kineto profiler records
// CPU ops and CUDA kernels of N steps, after two warm-up steps, into a Chrome/Perfetto trace
// (profile.dir/trace_rank<R>.json, open in ui.perfetto.dev or chrome://tracing), and rank 0 logs
// the kernels (or, on CPU, the ops) that took the most time. Phase marks the parts of a step both
// in that trace and as NVTX ranges for Nsight Systems.
#include <ATen/record_function.h>

#include <cstdint>
#include <memory>
#include <string>

namespace gpt2 {

// A named range for the duration of a scope: an NVTX range on CUDA builds, and a user scope in
// the Kineto trace when profiling is on.
class Phase {
 public:
  explicit Phase(const char* name);
  ~Phase();
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;

 private:
  at::RecordFunction record_{at::RecordScope::USER_SCOPE};
};

class StepProfiler {
 public:
  // steps = 0: does nothing. first_step: the run's first step (profiling starts two later).
  StepProfiler(int64_t steps, std::string dir, int64_t first_step, int rank, bool cuda);
  ~StepProfiler();
  void step_begin(int64_t step);
  void step_end(int64_t step);  // writes the trace after the last profiled step

 private:
  int64_t steps_, begin_ = 0;
  std::string dir_;
  int rank_;
  bool cuda_, active_ = false;
};

}  // namespace gpt2
