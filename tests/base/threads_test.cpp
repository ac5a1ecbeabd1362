// start_helper_thread: the new thread blocks the stop signals (asked from inside it), gets its
// arguments, and the caller's own mask is what it was.
#include "src/base/threads.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <string>

namespace gpt2 {
namespace {

sigset_t current_mask() {
  sigset_t mask;
  sigemptyset(&mask);
  pthread_sigmask(SIG_BLOCK, nullptr, &mask);  // no change: only reads the mask
  return mask;
}

TEST(Threads, HelperThreadBlocksTheStopSignalsAndTheCallerKeepsItsMask) {
  const sigset_t before = current_mask();
  ASSERT_EQ(sigismember(&before, SIGUSR1), 0);
  bool usr1 = false, term = false, alrm = true;
  std::string got;
  std::thread t = start_helper_thread(
      [&](const std::string& arg) {
        const sigset_t mask = current_mask();
        usr1 = sigismember(&mask, SIGUSR1) == 1;
        term = sigismember(&mask, SIGTERM) == 1;
        alrm = sigismember(&mask, SIGALRM) == 1;
        got = arg;
      },
      std::string("argument"));
  t.join();
  EXPECT_TRUE(usr1);
  EXPECT_TRUE(term);
  EXPECT_FALSE(alrm) << "only the stop signals are blocked";
  EXPECT_EQ(got, "argument");
  const sigset_t after = current_mask();
  EXPECT_EQ(sigismember(&after, SIGUSR1), 0);
  EXPECT_EQ(sigismember(&after, SIGTERM), 0);
}

TEST(Threads, StopSignalsBlockedRestoresTheMask) {
  {
    const StopSignalsBlocked blocked;
    const sigset_t inside = current_mask();
    EXPECT_EQ(sigismember(&inside, SIGUSR1), 1);
    EXPECT_EQ(sigismember(&inside, SIGTERM), 1);
  }
  const sigset_t after = current_mask();
  EXPECT_EQ(sigismember(&after, SIGUSR1), 0);
  EXPECT_EQ(sigismember(&after, SIGTERM), 0);
}

}  // namespace
}  // namespace gpt2
