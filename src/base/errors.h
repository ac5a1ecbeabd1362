#pragma once
// Error types and the call-checking helpers every folder uses.
// Contract: `Error` is an internal/system failure (a library call failed); `UserError` is a mistake
// the user can fix (bad file, key or value) and maps to exit code 2. `check_call` throws `Error`
// naming the failed call, its result and the source location; the per-library macros (CUDA_CHECK,
// NCCL_CHECK, MPI_CHECK, H5_CHECK) live beside their library and all go through it.
#include <stdexcept>
#include <string>

namespace gpt2 {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A mistake in input the user controls (config, file, command line). Messages name the key or file.
class UserError : public Error {
 public:
  using Error::Error;
};

// Exit codes shared by every executable.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;
// gpt2-train caught SIGUSR1/SIGTERM, saved a checkpoint and stopped: requeue the job to go on.
inline constexpr int kExitPreempted = 3;

// An exception's message for the user: LibTorch's errors (c10::Error) carry a C++ stack trace in
// what(); it is cut unless TORCH_SHOW_CPP_STACKTRACES=1 (PyTorch's own switch) asks for it.
std::string error_message(const std::exception& e);

[[noreturn]] void throw_call_error(const char* call, const std::string& result, const char* file, int line);

// Internal invariant (a bug in gpt2-dist, not in the user's input).
#define GPT2_ASSERT(cond, msg)                                               \
  do {                                                                       \
    if (!(cond)) ::gpt2::throw_call_error(#cond, (msg), __FILE__, __LINE__); \
  } while (0)

}  // namespace gpt2
