// Stop signals and the step watchdog (see run_guard.h).
#include "src/train/run_guard.h"

#include <cstdlib>

#include "src/base/errors.h"
#include "src/base/log.h"
#include "src/base/threads.h"

namespace gpt2 {
namespace {

// The handler only sets this flag (async-signal-safe); StopSignals reads it.
std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

}  // namespace

StopSignals::StopSignals() {
  g_stop_signal.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  // The run goes on after the signal: a read, write or wait it lands in must go on too, not fail
  // with EINTR. (Helper threads block these signals, src/base/threads.h: the main thread gets them.)
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, &old_usr1_);
  sigaction(SIGTERM, &sa, &old_term_);
}

StopSignals::~StopSignals() {
  if (preempted_) {
    std::signal(SIGUSR1, SIG_IGN);
    std::signal(SIGTERM, SIG_IGN);
    return;
  }
  sigaction(SIGUSR1, &old_usr1_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
}

int StopSignals::received() const { return g_stop_signal.load(); }

StepWatchdog::StepWatchdog(double timeout_s) : timeout_(timeout_s) {
  beat();
  thread_ = start_helper_thread([this] {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(500));
      const double idle =
          std::chrono::duration<double>(Clock::now() - Clock::time_point(Clock::duration(last_.load()))).count();
      if (!stop_ && idle > timeout_) {
        log::error(
            log::format("no training step finished for %.0f s (parallel.step_timeout_s): a rank died or "
                        "hangs; ending the job",
                        idle));
        log::flush();
        std::_Exit(kExitFailure);
      }
    }
  });
}

StepWatchdog::~StepWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StepWatchdog::beat() { last_.store(Clock::now().time_since_epoch().count()); }

}  // namespace gpt2
