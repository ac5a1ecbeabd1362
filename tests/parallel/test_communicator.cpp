// The MPI communicator's collectives against values computed by hand from each rank's input, on
// MPI's own types and on bf16/fp16 (staged through host buffers).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "parallel/communicator.h"
#include "src/base/errors.h"
#include "tests/parallel/collective_checks.h"

namespace gpt2::parallel {
namespace {

struct Group {
  std::unique_ptr<Communicator> comm = make_mpi_communicator(MPI_COMM_WORLD);
  int rank = comm->rank();
  int n = comm->world_size();
};

// bf16 and fp16 are staged through fp32 host buffers (Note [Host staging]); non-contiguous tensors
// are refused.
TEST(MpiCommunicator, EveryCollectiveOnEveryDtype) {
  Group g;
  for (auto dtype : {torch::kFloat32, torch::kFloat64, torch::kBFloat16, torch::kFloat16}) {
    test::expect_collectives_exact(*g.comm, torch::TensorOptions().dtype(dtype));
  }
  auto strided = torch::ones({4, 4}).t();
  EXPECT_THROW(g.comm->all_reduce(strided, ReduceOp::kSum), Error);
  EXPECT_THROW(g.comm->all_reduce(strided.to(torch::kBFloat16), ReduceOp::kSum), Error);
}

}  // namespace
}  // namespace gpt2::parallel
