// The NCCL communicator, for the GPU machine (every test skips without CUDA): collectives against
// hand-computed values on a non-blocking communicator, and a set-up that a peer never joins ends
// after parallel.timeout_s with an error instead of waiting forever.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <chrono>
#include <string>

#include "parallel/communicator.h"
#include "src/base/errors.h"
#include "tests/test_util.h"

namespace gpt2::parallel {
namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

TEST(NcclCommunicator, CollectivesGiveHandComputedResults) {
  const int rank = world_rank(), n = world_size();
  if (!torch::cuda::is_available() || static_cast<int>(torch::cuda::device_count()) < n) {
    GTEST_SKIP() << "needs a CUDA device per rank";
  }
  const torch::Device device(torch::kCUDA, static_cast<c10::DeviceIndex>(rank));
  auto comm = make_nccl_communicator(MPI_COMM_WORLD, rank, /*timeout_seconds=*/120);
  const auto on = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  // Rank r holds r + 1 everywhere: the sum is n(n+1)/2.
  auto t = torch::full({1000}, float(rank + 1), on);
  comm->all_reduce(t, ReduceOp::kSum)->wait();
  EXPECT_FLOAT_EQ(t[999].item<float>(), n * (n + 1) / 2.0f);
  auto b = torch::full({8}, float(rank), on);
  comm->broadcast(b, n - 1)->wait();
  EXPECT_FLOAT_EQ(b.sum().item<float>(), 8.0f * (n - 1));
  auto mine = torch::full({3}, float(rank), on), all = torch::empty({3 * n}, on);
  comm->all_gather(all, mine)->wait();
  for (int r = 0; r < n; ++r) EXPECT_FLOAT_EQ(all[3 * r].item<float>(), float(r));
  auto in = torch::arange(2 * n, on) + 100.0f * rank, out = torch::empty({2}, on);
  comm->reduce_scatter(out, in, ReduceOp::kSum)->wait();
  EXPECT_FLOAT_EQ(out[0].item<float>(), n * float(2 * rank) + 100.0f * n * (n - 1) / 2.0f);
  comm->barrier();
}

// Rank 0 sets up a communicator of every rank; the others make only the MPI broadcast of NCCL's
// unique id that set-up starts with (128 bytes, NCCL_UNIQUE_ID_BYTES) and never join.
TEST(NcclCommunicator, SetUpThatAPeerNeverJoinsTimesOut) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs CUDA";
  if (world_size() < 2) GTEST_SKIP() << "needs mpiexec -n 2 or more";
  if (world_rank() == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    std::string message;
    try {
      make_nccl_communicator(MPI_COMM_WORLD, 0, {3, "parallel.timeout_s"});
    } catch (const Error& e) {
      message = e.what();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_HAS(message,
               "NCCL communicator set-up (ncclCommInitRankConfig) did not finish within 3 s (parallel.timeout_s)");
    EXPECT_GE(seconds, 2.5);
    EXPECT_LT(seconds, 30);
  } else {
    char id[128];
    MPI_Bcast(id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace gpt2::parallel
