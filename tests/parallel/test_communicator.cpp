// The MPI communicator's collectives against values computed by hand from each rank's input.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <string>
#include <thread>

#include "parallel/communicator.h"
#include "src/base/errors.h"
#include "tests/test_util.h"

namespace gpt2::parallel {
namespace {

// Long enough never to trip on a healthy run of these tests.
constexpr double kTimeoutSeconds = 120;

struct Group {
  std::unique_ptr<Communicator> comm = make_mpi_communicator(MPI_COMM_WORLD, kTimeoutSeconds);
  int rank = comm->rank();
  int n = comm->world_size();
};

TEST(MpiCommunicator, AllReduceSumAvgMax) {
  Group g;
  // Rank r holds [r, 10r, 1]: sum over ranks = [n(n-1)/2, 10 n(n-1)/2, n].
  auto make = [&] { return torch::tensor({double(g.rank), 10.0 * g.rank, 1.0}, torch::kFloat64); };
  const double s = g.n * (g.n - 1) / 2.0;
  auto t = make();
  g.comm->all_reduce(t, ReduceOp::kSum)->wait();
  EXPECT_TRUE(torch::equal(t, torch::tensor({s, 10 * s, double(g.n)}, torch::kFloat64)));
  t = make();
  g.comm->all_reduce(t, ReduceOp::kAvg)->wait();
  EXPECT_TRUE(torch::allclose(t, torch::tensor({s / g.n, 10 * s / g.n, 1.0}, torch::kFloat64)));
  t = make();
  g.comm->all_reduce(t, ReduceOp::kMax)->wait();
  EXPECT_TRUE(torch::equal(t, torch::tensor({double(g.n - 1), 10.0 * (g.n - 1), 1.0}, torch::kFloat64)));
}

TEST(MpiCommunicator, ReduceScatterAndAllGather) {
  Group g;
  // Input on rank r: element i = r * 100 + i, for i < 2n. Rank q gets chunk q summed over ranks.
  auto in = torch::arange(2 * g.n, torch::kFloat32) + 100.0f * g.rank;
  auto out = torch::empty({2}, torch::kFloat32);
  g.comm->reduce_scatter(out, in, ReduceOp::kSum)->wait();
  const float rank_sum = 100.0f * g.n * (g.n - 1) / 2.0f;
  EXPECT_FLOAT_EQ(out[0].item<float>(), g.n * float(2 * g.rank) + rank_sum);
  EXPECT_FLOAT_EQ(out[1].item<float>(), g.n * float(2 * g.rank + 1) + rank_sum);

  auto mine = torch::full({3}, int64_t(g.rank), torch::kInt64);
  auto all = torch::empty({3 * g.n}, torch::kInt64);
  g.comm->all_gather(all, mine)->wait();
  for (int r = 0; r < g.n; ++r)
    for (int k = 0; k < 3; ++k) EXPECT_EQ(all[3 * r + k].item<int64_t>(), r);
}

TEST(MpiCommunicator, BroadcastFromLastRankAndManyInFlight) {
  Group g;
  auto t = torch::full({4}, float(g.rank), torch::kFloat32);
  g.comm->broadcast(t, g.n - 1)->wait();
  EXPECT_TRUE(torch::equal(t, torch::full({4}, float(g.n - 1), torch::kFloat32)));
  // Several reductions in flight at once complete independently.
  std::vector<torch::Tensor> ts;
  std::vector<std::unique_ptr<Work>> works;
  for (int i = 0; i < 8; ++i) {
    ts.push_back(torch::full({1000}, float(i + g.rank), torch::kFloat32));
    works.push_back(g.comm->all_reduce(ts.back(), ReduceOp::kSum));
  }
  for (int i = 7; i >= 0; --i) works[i]->wait();
  for (int i = 0; i < 8; ++i)
    EXPECT_FLOAT_EQ(ts[i][999].item<float>(), float(g.n * i + g.n * (g.n - 1) / 2));
}

TEST(MpiCommunicator, RejectsWhatMpiCannotReduce) {
  Group g;
  auto bf16 = torch::ones({2}, torch::kBFloat16);
  EXPECT_THROW(g.comm->all_reduce(bf16, ReduceOp::kSum), Error);
  auto strided = torch::ones({4, 4}).t();
  EXPECT_THROW(g.comm->all_reduce(strided, ReduceOp::kSum), Error);
}

// The time `fn` takes, in seconds, and the message of the gpt2::Error it throws ("" if none).
template <typename Fn>
std::pair<double, std::string> timed_error(Fn&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string message;
  try {
    fn();
  } catch (const Error& e) {
    message = e.what();
  }
  return {std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), message};
}

// A peer that does not join a collective within the timeout (it died, hangs, or is busy elsewhere)
// ends the wait with an error naming the collective and parallel.timeout_s, counted from when this
// rank issued it, as the NCCL watchdog does. Rank 0 is on time; the others join 3 s late, and their
// collective then completes against rank 0's, which stays in flight.
TEST(MpiCommunicator, CollectiveTimesOutWhenAPeerIsLate) {
  auto comm = make_mpi_communicator(MPI_COMM_WORLD, /*timeout_seconds=*/1.0);
  const int rank = comm->rank(), n = comm->world_size();
  auto t = torch::ones({4}, torch::kFloat32);
  if (rank == 0) {
    auto work = comm->all_reduce(t, ReduceOp::kSum);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // counted from the issue, not from wait()
    const auto [seconds, message] = timed_error([&] { work->wait(); });
    EXPECT_HAS(message, "MPI all_reduce did not finish within 1 s of being issued (parallel.timeout_s)");
    EXPECT_GE(seconds, 0.4);
    EXPECT_LT(seconds, 1.5);
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    comm->all_reduce(t, ReduceOp::kSum)->wait();
    EXPECT_FLOAT_EQ(t[3].item<float>(), float(n));
  }
  // The same for the barrier.
  if (rank == 0) {
    const auto [seconds, message] = timed_error([&] { comm->barrier(); });
    EXPECT_HAS(message, "MPI barrier did not finish within 1 s of being issued (parallel.timeout_s)");
    EXPECT_GE(seconds, 0.9);
    EXPECT_LT(seconds, 2.0);
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    comm->barrier();
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace gpt2::parallel
