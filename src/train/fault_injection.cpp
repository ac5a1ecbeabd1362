// GPT2_FAULT_AT (see fault_injection.h).
#include "src/train/fault_injection.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "src/base/errors.h"

namespace gpt2 {

StepFault StepFault::from_environment(int rank) {
  StepFault fault;
  const char* spec = std::getenv("GPT2_FAULT_AT");
  if (spec == nullptr) return fault;
  int fault_rank = -1;
  long long fault_step = -1;
  char mode[8] = {0};
  const int n = std::sscanf(spec, "%d:%lld:%7s", &fault_rank, &fault_step, mode);
  if (n < 2 || fault_rank != rank) return fault;
  fault.step_ = fault_step;
  if (n == 3 && std::string(mode) == "kill") fault.mode_ = Mode::kKill;
  if (n == 3 && std::string(mode) == "hang") fault.mode_ = Mode::kHang;
  if (n == 3 && std::string(mode) == "inf") fault.mode_ = Mode::kInf;
  if (n == 3 && std::string(mode) == "stall") fault.mode_ = Mode::kStall;
  return fault;
}

void StepFault::at_step_start(int64_t step) const {
  if (step != step_ || mode_ == Mode::kInf || mode_ == Mode::kStall) return;
  if (mode_ == Mode::kKill) std::raise(SIGKILL);
  while (mode_ == Mode::kHang) std::this_thread::sleep_for(std::chrono::seconds(1));
  throw Error("injected fault (GPT2_FAULT_AT) at step " + std::to_string(step));
}

void StepFault::before_sample(int64_t step) const {
  if (step == step_ && mode_ == Mode::kStall) std::this_thread::sleep_for(std::chrono::seconds(kStallSeconds));
}

}  // namespace gpt2
