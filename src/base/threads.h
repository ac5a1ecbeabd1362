#pragma once
// Helper threads (data prefetch, checkpoint writes, watchdogs, optimizer offload workers).
// Contract: start_helper_thread(fn, args...) is std::thread(fn, args...) except that the new thread
// blocks SIGUSR1 and SIGTERM, the stop signals (src/train/run_guard.h); the caller's own signal
// mask is left as it was. Why: the kernel hands a process-wide signal to any thread that does not
// block it. Kept on the main thread, the handler's flag is read where it is expected, and a
// helper's blocking calls (file writes, waits) are never cut short by it (EINTR).
#include <signal.h>

#include <thread>
#include <utility>

namespace gpt2 {

// SIGUSR1 and SIGTERM.
sigset_t stop_signal_set();

// Blocks the stop signals in the calling thread for its lifetime, then restores the mask.
class StopSignalsBlocked {
 public:
  StopSignalsBlocked();
  ~StopSignalsBlocked();
  StopSignalsBlocked(const StopSignalsBlocked&) = delete;
  StopSignalsBlocked& operator=(const StopSignalsBlocked&) = delete;

 private:
  sigset_t previous_;
};

template <typename Fn, typename... Args>
std::thread start_helper_thread(Fn&& fn, Args&&... args) {
  const StopSignalsBlocked blocked;  // a new thread inherits its creator's mask
  return std::thread(std::forward<Fn>(fn), std::forward<Args>(args)...);
}

}  // namespace gpt2
