#pragma once
// MPI_CHECK(call): throws gpt2::Error naming the MPI call and MPI's error string when it fails.
#include <mpi.h>

#include <string>

#include "src/base/errors.h"

namespace gpt2 {
inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, len);
}
}  // namespace gpt2

#define MPI_CHECK(call)                                                                            \
  do {                                                                                             \
    int gpt2_mpi_rc_ = (call);                                                                     \
    if (gpt2_mpi_rc_ != MPI_SUCCESS)                                                               \
      ::gpt2::throw_call_error(#call, ::gpt2::mpi_error_string(gpt2_mpi_rc_), __FILE__, __LINE__); \
  } while (0)
