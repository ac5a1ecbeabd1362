// The MPI communicator's collectives against values computed by hand from each rank's input.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "parallel/communicator.h"
#include "src/base/errors.h"

namespace gpt2::parallel {
namespace {

struct Group {
  std::unique_ptr<Communicator> comm = make_mpi_communicator(MPI_COMM_WORLD);
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

}  // namespace
}  // namespace gpt2::parallel
