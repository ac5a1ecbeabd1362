#pragma once
// Logging facade over spdlog. Every line carries the time, `rank r/N` and the level. Rank 0 logs at
// info by default; other ranks log warnings and errors unless `verbose_all_ranks` is set.
// Why a facade: pip torch ships fmt 12 headers that clash with the fmt 9 Debian's spdlog needs, so
// log.cpp is the only file that sees spdlog, and it never sees torch's include directories.
#include <cstdarg>
#include <sstream>
#include <string>

namespace gpt2::log {

enum class Level { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

// Call once per process, after the rank is known (before that, rank 0 of 1 is assumed).
void init(int rank, int world_size, bool verbose_all_ranks = false);
void set_level(Level level);
Level level();
bool enabled(Level level);

void write(Level level, const std::string& message);
void flush();

// printf-style formatting into a std::string (checked by the compiler).
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Streams every argument into one string: log::info("step ", step, " loss ", loss).
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

template <typename... Args>
void debug(const Args&... a) {
  if (enabled(Level::kDebug)) write(Level::kDebug, cat(a...));
}
template <typename... Args>
void info(const Args&... a) {
  if (enabled(Level::kInfo)) write(Level::kInfo, cat(a...));
}
template <typename... Args>
void warn(const Args&... a) {
  if (enabled(Level::kWarn)) write(Level::kWarn, cat(a...));
}
template <typename... Args>
void error(const Args&... a) {
  if (enabled(Level::kError)) write(Level::kError, cat(a...));
}

}  // namespace gpt2::log
