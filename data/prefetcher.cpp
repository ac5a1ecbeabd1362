#include "data/prefetcher.h"

#include <ATen/ATen.h>

#include "src/base/errors.h"
#include "src/base/threads.h"

namespace gpt2::data {

Prefetcher::Prefetcher(int64_t rows, int64_t cols, int depth, bool pinned, Fill fill, int64_t first_index)
    : fill_(std::move(fill)), ring_(static_cast<size_t>(depth)), next_fill_(first_index), next_consume_(first_index) {
  GPT2_ASSERT(depth >= 1, "prefetch depth must be at least 1");
  for (auto& e : ring_) {
    e.buffer = at::empty({rows, cols}, at::TensorOptions().dtype(at::kLong).pinned_memory(pinned));
  }
  thread_ = start_helper_thread([this] { run(); });
}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void Prefetcher::run() {
  try {
    while (true) {
      Entry* entry = nullptr;
      std::function<void()> reusable;
      const int64_t index = next_fill_;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        entry = &ring_[static_cast<size_t>(index % static_cast<int64_t>(ring_.size()))];
        changed_.wait(lock, [&] { return stop_ || entry->state == State::kFree; });
        if (stop_) return;
        reusable = std::move(entry->reusable);
        entry->reusable = nullptr;
      }
      if (reusable) reusable();     // e.g. the last copy out of this buffer has finished
      fill_(index, entry->buffer);  // outside the lock: the trainer keeps consuming meanwhile
      {
        std::lock_guard<std::mutex> lock(mutex_);
        entry->index = index;
        entry->state = State::kReady;
        ++next_fill_;
      }
      changed_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = std::current_exception();
    changed_.notify_all();
  }
}

Prefetcher::Slot Prefetcher::next() {
  std::unique_lock<std::mutex> lock(mutex_);
  const int id = static_cast<int>(next_consume_ % static_cast<int64_t>(ring_.size()));
  Entry& entry = ring_[static_cast<size_t>(id)];
  changed_.wait(lock, [&] { return error_ || (entry.state == State::kReady && entry.index == next_consume_); });
  // Batches filled before the error are still delivered; the error comes when its batch is due.
  if (!(entry.state == State::kReady && entry.index == next_consume_)) std::rethrow_exception(error_);
  entry.state = State::kInUse;
  return Slot{id, next_consume_++, entry.buffer};
}

void Prefetcher::release(const Slot& slot, std::function<void()> reusable) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Entry& entry = ring_[static_cast<size_t>(slot.id)];
    GPT2_ASSERT(entry.state == State::kInUse && entry.index == slot.index, "release() of a slot not in use");
    entry.state = State::kFree;
    entry.reusable = std::move(reusable);
  }
  changed_.notify_all();
}

}  // namespace gpt2::data
