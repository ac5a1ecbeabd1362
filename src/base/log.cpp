// The only translation unit that includes spdlog (see log.h for why).
#include "src/base/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <memory>
#include <vector>

namespace gpt2::log {
namespace {

struct State {
  std::shared_ptr<spdlog::logger> logger;
  Level level = Level::kInfo;
};

State& state() {
  static State s;
  return s;
}

spdlog::level::level_enum to_spdlog(Level l) {
  switch (l) {
    case Level::kDebug:
      return spdlog::level::debug;
    case Level::kInfo:
      return spdlog::level::info;
    case Level::kWarn:
      return spdlog::level::warn;
    case Level::kError:
      return spdlog::level::err;
    case Level::kOff:
      return spdlog::level::off;
  }
  return spdlog::level::info;
}

void make_logger(int rank, int world_size) {
  // stderr for every rank: MPI forwards it unbuffered, and stdout stays free for tool output.
  auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>("gpt2", sink);
  char prefix[64];
  std::snprintf(prefix, sizeof prefix, "[rank %d/%d]", rank, world_size);
  logger->set_pattern(std::string("[%H:%M:%S.%e] ") + prefix + " [%^%l%$] %v");
  logger->set_level(spdlog::level::trace);
  logger->flush_on(spdlog::level::warn);
  state().logger = std::move(logger);
}

}  // namespace

void init(int rank, int world_size, bool verbose_all_ranks) {
  make_logger(rank, world_size);
  set_level(rank == 0 || verbose_all_ranks ? Level::kInfo : Level::kWarn);
}

void set_level(Level level) { state().level = level; }
Level level() { return state().level; }
bool enabled(Level level) { return level >= state().level && level != Level::kOff; }

void write(Level level, const std::string& message) {
  if (!state().logger) make_logger(0, 1);
  state().logger->log(to_spdlog(level), "{}", message);
}

void flush() {
  if (state().logger) state().logger->flush();
}

std::string format(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list copy;
  va_copy(copy, args);
  int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, fmt, args);
  va_end(args);
  return out;
}

}  // namespace gpt2::log
