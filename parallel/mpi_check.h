#pragma once
// MPI_CHECK(call): throws gpt2::Error naming the MPI call and MPI's error string when it fails.
#include <mpi.h>

#include <string>

#include "src/base/errors.h"

namespace gpt2::parallel {
std::string mpi_error_string(int code);
}  // namespace gpt2::parallel

#define MPI_CHECK(call)                                                                    \
  do {                                                                                     \
    int gpt2_mpi_rc_ = (call);                                                             \
    if (gpt2_mpi_rc_ != MPI_SUCCESS)                                                       \
      ::gpt2::throw_call_error(#call, ::gpt2::parallel::mpi_error_string(gpt2_mpi_rc_),    \
                               __FILE__, __LINE__);                                        \
  } while (0)
