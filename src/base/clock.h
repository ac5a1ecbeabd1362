#pragma once
// Wall time for stats and logs: the steady clock, and the seconds elapsed since a point on it.
#include <chrono>

namespace gpt2 {

using SteadyClock = std::chrono::steady_clock;

inline double seconds_since(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

}  // namespace gpt2
