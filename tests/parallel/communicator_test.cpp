// The MPI communicator's collectives against values computed by hand from each rank's input, on
// MPI's own types and on bf16/fp16 (staged through host buffers).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <string>
#include <thread>

#include "parallel/communicator.h"
#include "src/base/errors.h"
#include "tests/parallel/collective_checks.h"
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

// Note [Rank-order sums]: every floating-point sum is ((x_0 + x_1) + x_2) + ... element by element,
// whichever collective takes it and whatever the length. Rank r's values span 16 orders of
// magnitude with alternating signs, so another order gives other bits (with 3 ranks, 1 + 1e8 - 1e8
// is 0 in this order and 1 in another); the expected values are that loop, written out in fp32 and
// fp64 here.
TEST(MpiCommunicator, FloatSumsAreTakenInRankOrder) {
  Group g;
  const double scales[] = {1.0, 1e8, -1e8, 3.0, -7e-9};
  auto value = [&](int r, int64_t e) { return scales[r % 5] * (1.0 + 1e-3 * static_cast<double>(e)); };
  for (auto dtype : {torch::kFloat32, torch::kFloat64}) {
    SCOPED_TRACE(c10::toString(dtype));
    const int64_t len = 1001;  // not a multiple of 2 or 3: all_reduce pads its chunks
    auto mine = torch::empty({len}, torch::kFloat64);
    for (int64_t e = 0; e < len; ++e) mine[e] = value(g.rank, e);
    mine = mine.to(dtype);
    auto expected = torch::empty({len}, dtype);
    for (int64_t e = 0; e < len; ++e) {
      if (dtype == torch::kFloat32) {
        float sum = static_cast<float>(value(0, e));
        for (int r = 1; r < g.n; ++r) sum += static_cast<float>(value(r, e));
        expected[e] = sum;
      } else {
        double sum = value(0, e);
        for (int r = 1; r < g.n; ++r) sum += value(r, e);
        expected[e] = sum;
      }
    }
    auto all = mine.clone();
    g.comm->all_reduce(all, ReduceOp::kSum)->wait();
    EXPECT_TRUE(torch::equal(all, expected)) << "all_reduce";
    auto avg = mine.clone();
    g.comm->all_reduce(avg, ReduceOp::kAvg)->wait();
    EXPECT_TRUE(torch::equal(avg, expected / g.n)) << "all_reduce, average";
    for (int root : {0, g.n - 1}) {
      auto t = mine.clone();
      g.comm->reduce(t, root, ReduceOp::kSum)->wait();
      EXPECT_TRUE(torch::equal(t, g.rank == root ? expected : mine)) << "reduce to " << root;
    }
    const int64_t chunk = len / g.n;
    auto in = mine.narrow(0, 0, chunk * g.n).contiguous();
    auto out = torch::empty({chunk}, dtype);
    g.comm->reduce_scatter(out, in, ReduceOp::kSum)->wait();
    EXPECT_TRUE(torch::equal(out, expected.narrow(0, g.rank * chunk, chunk))) << "reduce_scatter";
  }
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
  auto comm = make_mpi_communicator(MPI_COMM_WORLD, {1.0, "parallel.timeout_s"});  // the name the error carries
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
