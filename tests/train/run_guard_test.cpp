// The stop signals (SIGUSR1, SIGTERM): their handlers restart the system calls they interrupt, and
// only the main thread receives them: every helper thread blocks them. A thread's mask is read
// from /proc/self/task/TID/status (SigBlk), so the helpers are checked as they are, from outside.
#include <dirent.h>
#include <signal.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "data/prefetcher.h"
#include "optim/cpu_adamw.h"
#include "src/train/run_guard.h"

namespace gpt2 {
namespace {

std::set<int> thread_ids() {
  std::set<int> ids;
  DIR* d = ::opendir("/proc/self/task");
  if (d == nullptr) return ids;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') ids.insert(std::atoi(e->d_name));
  }
  ::closedir(d);
  return ids;
}

// Whether thread `tid` of this process blocks `sig`: bit sig - 1 of the hexadecimal SigBlk mask.
bool blocks(int tid, int sig) {
  std::ifstream status("/proc/self/task/" + std::to_string(tid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("SigBlk:", 0) == 0) return (std::stoull(line.substr(7), nullptr, 16) >> (sig - 1)) & 1;
  }
  ADD_FAILURE() << "no SigBlk for thread " << tid;
  return false;
}

// glibc starts a thread with every signal blocked and sets the mask it inherited only once it
// runs: wait until SIGHUP (blocked by no one here) is no longer blocked.
void wait_until_started(int tid) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (blocks(tid, SIGHUP) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_FALSE(blocks(tid, SIGHUP)) << "thread " << tid << " did not start";
}

// The threads that `make` starts (those that appear while it runs) block both stop signals.
template <typename Make>
void expect_new_threads_block_stop_signals(const char* what, Make make) {
  const std::set<int> before = thread_ids();
  auto object = make();
  int started = 0;
  for (int tid : thread_ids()) {
    if (before.count(tid) != 0) continue;
    ++started;
    wait_until_started(tid);
    EXPECT_TRUE(blocks(tid, SIGUSR1)) << what << ": thread " << tid << " takes SIGUSR1";
    EXPECT_TRUE(blocks(tid, SIGTERM)) << what << ": thread " << tid << " takes SIGTERM";
  }
  EXPECT_GT(started, 0) << what << " started no thread";
}

TEST(StopSignals, HandlersRecordTheSignalAndRestartInterruptedCalls) {
  StopSignals stop;
  for (int sig : {SIGUSR1, SIGTERM}) {
    struct sigaction now {};
    ASSERT_EQ(::sigaction(sig, nullptr, &now), 0);
    EXPECT_NE(now.sa_flags & SA_RESTART, 0) << "signal " << sig << ": a read or write it interrupts fails with EINTR";
  }
  EXPECT_EQ(stop.received(), 0);
  ASSERT_EQ(::raise(SIGUSR1), 0);
  EXPECT_EQ(stop.received(), SIGUSR1);
}

TEST(HelperThreads, BlockTheStopSignals) {
  // The main thread takes them (it reads the flag at each step boundary).
  ASSERT_FALSE(blocks(::getpid(), SIGUSR1));
  ASSERT_FALSE(blocks(::getpid(), SIGTERM));
  ASSERT_FALSE(blocks(::getpid(), SIGHUP));
  expect_new_threads_block_stop_signals("StepWatchdog", [] { return std::make_unique<StepWatchdog>(600.0); });
  expect_new_threads_block_stop_signals("optim::HostThreadPool",
                                        [] { return std::make_unique<optim::HostThreadPool>(3); });
  expect_new_threads_block_stop_signals("data::Prefetcher", [] {
    return std::make_unique<data::Prefetcher>(
        2, 4, /*depth=*/2, /*pinned=*/false, [](int64_t i, torch::Tensor& b) { b.fill_(i); }, 0);
  });
}

}  // namespace
}  // namespace gpt2
