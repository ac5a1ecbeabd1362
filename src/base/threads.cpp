// Helper threads with the stop signals blocked (see threads.h).
#include "src/base/threads.h"

#include <cstring>
#include <string>

#include "src/base/errors.h"

namespace gpt2 {

sigset_t stop_signal_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  sigaddset(&set, SIGTERM);
  return set;
}

StopSignalsBlocked::StopSignalsBlocked() {
  const sigset_t set = stop_signal_set();
  const int rc = pthread_sigmask(SIG_BLOCK, &set, &previous_);
  if (rc != 0) throw_call_error("pthread_sigmask(SIG_BLOCK)", std::strerror(rc), __FILE__, __LINE__);
}

StopSignalsBlocked::~StopSignalsBlocked() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }

}  // namespace gpt2
