#pragma once
// parallel.backend's values: which library carries the collectives (communicator.h).
#include <array>
#include <utility>

#include "src/base/choices.h"

namespace gpt2::parallel {

// auto = NCCL for CUDA devices when the group has several ranks, MPI otherwise.
enum class Backend { kAuto, kNccl, kMpi };

}  // namespace gpt2::parallel

namespace gpt2 {
template <>
struct ChoiceNames<parallel::Backend> {
  static constexpr std::array<std::pair<parallel::Backend, const char*>, 3> names{
      {{parallel::Backend::kAuto, "auto"}, {parallel::Backend::kNccl, "nccl"}, {parallel::Backend::kMpi, "mpi"}}};
};
}  // namespace gpt2
