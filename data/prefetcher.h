#pragma once
// A background thread that fills a ring of `depth` host buffers (pinned when asked, for
// asynchronous copies to the GPU) with batches index, index + 1, ... ahead of the trainer.
// Contract: next() returns the batches strictly in order; the buffer it returns stays untouched
// until release(), which may hand over a `reusable` wait (e.g. a CUDA event's synchronize) that the
// thread runs before writing that buffer again. An exception in `fill` is rethrown by next() with
// its message; the destructor stops the thread cleanly at any point.
#include <torch/types.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace gpt2::data {

class Prefetcher {
 public:
  // Writes batch `index` into `buffer` (a (rows, cols) int64 host tensor). Runs on the thread.
  using Fill = std::function<void(int64_t index, torch::Tensor& buffer)>;

  Prefetcher(int64_t rows, int64_t cols, int depth, bool pinned, Fill fill, int64_t first_index);
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  struct Slot {
    int id;
    int64_t index;
    torch::Tensor buffer;
  };
  // The next batch in order; blocks while the thread has not filled it.
  Slot next();
  // Gives the buffer back. `reusable`, if set, is called on the thread before the buffer is refilled.
  void release(const Slot& slot, std::function<void()> reusable = nullptr);

 private:
  enum class State { kFree, kReady, kInUse };
  struct Entry {
    torch::Tensor buffer;
    State state = State::kFree;
    int64_t index = -1;
    std::function<void()> reusable;
  };
  void run();

  Fill fill_;
  std::vector<Entry> ring_;
  int64_t next_fill_;     // the thread's next index
  int64_t next_consume_;  // next()'s next index
  std::mutex mutex_;
  std::condition_variable changed_;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace gpt2::data
