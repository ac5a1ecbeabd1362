#pragma once
// What ends a training run from outside its steps.
// - StopSignals: SIGUSR1 (Slurm's warning before the time limit, forwarded by mpirun and srun) and
//   SIGTERM (preemption) only record the signal; the trainer reads it at the next step boundary,
//   saves a checkpoint and stops. The previous handlers come back when the guard goes, unless the
//   run stopped for a preemption (then both signals are ignored from there on). The handlers
//   restart the calls they interrupt (SA_RESTART), and only the main thread takes them: helper
//   threads block them (src/base/threads.h).
// - StepWatchdog: a rank that hangs (stopped, deadlocked, or waiting on a peer that hangs) never
//   finishes its step. The watchdog ends this process when no beat() came for `timeout_s`; the
//   launcher (mpirun, srun --kill-on-bad-exit) then ends the others, so a hang anywhere, on CPU
//   ranks as on GPUs, ends the job instead of holding the allocation.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <mutex>
#include <thread>

namespace gpt2 {

class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  int received() const;  // the signal number received since construction, 0 = none
  // The run stops for a preemption: a launcher may TERM the ranks that have not exited yet once
  // one has; dying of that would replace exit code 3 (kExitPreempted) by 143.
  void set_preempted() { preempted_ = true; }

 private:
  struct sigaction old_usr1_ {
  }, old_term_{};
  bool preempted_ = false;
};

class StepWatchdog {
 public:
  explicit StepWatchdog(double timeout_s);
  ~StepWatchdog();
  StepWatchdog(const StepWatchdog&) = delete;
  StepWatchdog& operator=(const StepWatchdog&) = delete;

  void beat();  // progress: a step, an eval or a save finished

 private:
  using Clock = std::chrono::steady_clock;
  double timeout_;
  std::atomic<Clock::rep> last_{0};
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace gpt2
