// RankEnv's nodes (Note [Node-local rank]) under mpiexec on one host, where MPI says every rank
// shares memory: ranks placed on made-up node names must split by name, as two slurmd on one host
// do, with node-local ranks in rank order, nodes numbered by their lowest rank, and every rank's
// text gathered on rank 0.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "parallel/rank_env.h"

namespace gpt2::parallel {
namespace {

TEST(RankEnv, NodesFollowTheNodeName) {
  const RankEnv world(MPI_COMM_WORLD);
  const int rank = world.rank(), n = world.world_size();
  // Ranks 0, 2, 4, ... on "b", ranks 1, 3, ... on "a": the node of rank 0 is node 0 whatever its name.
  const RankEnv env(MPI_COMM_WORLD, rank % 2 == 0 ? "b" : "a");
  const int on_b = (n + 1) / 2, on_a = n / 2;
  EXPECT_EQ(env.num_nodes(), n > 1 ? 2 : 1);
  EXPECT_EQ(env.node_index(), rank % 2);
  EXPECT_EQ(env.node_name(), rank % 2 == 0 ? "b" : "a");
  EXPECT_EQ(env.local_rank(), rank / 2);
  EXPECT_EQ(env.local_size(), rank % 2 == 0 ? on_b : on_a);
  EXPECT_EQ(env.rank(), rank);
  EXPECT_EQ(env.world_size(), n);
}

TEST(RankEnv, OneNameIsOneNode) {
  const RankEnv env(MPI_COMM_WORLD, "same");
  EXPECT_EQ(env.num_nodes(), 1);
  EXPECT_EQ(env.node_index(), 0);
  EXPECT_EQ(env.local_rank(), env.rank());
  EXPECT_EQ(env.local_size(), env.world_size());
}

// Names of different lengths: the gather pads them to the longest.
TEST(RankEnv, NamesOfDifferentLengths) {
  const RankEnv world(MPI_COMM_WORLD);
  const std::string name = world.rank() == world.world_size() - 1 ? "a-much-longer-node-name-042" : "n1";
  const RankEnv env(MPI_COMM_WORLD, name);
  EXPECT_EQ(env.num_nodes(), world.world_size() > 1 ? 2 : 1);
  EXPECT_EQ(env.node_name(), name);
  EXPECT_EQ(env.local_rank(), name == "n1" ? world.rank() : 0);
}

TEST(RankEnv, GatherToMain) {
  const RankEnv env(MPI_COMM_WORLD);
  const auto all = env.gather_to_main(std::string(static_cast<size_t>(env.rank()), 'x') + std::to_string(env.rank()));
  if (!env.is_main()) {
    EXPECT_TRUE(all.empty());
    return;
  }
  ASSERT_EQ(static_cast<int>(all.size()), env.world_size());
  for (int r = 0; r < env.world_size(); ++r) {
    EXPECT_EQ(all[r], std::string(static_cast<size_t>(r), 'x') + std::to_string(r));
  }
}

// The small collectives against values computed here from the rank numbers 0..N-1.
TEST(RankEnv, SmallCollectivesGiveEveryRankTheSameAnswer) {
  const RankEnv env(MPI_COMM_WORLD);
  const int r = env.rank(), n = env.world_size();
  const auto sums = env.all_reduce_sum(std::vector<double>{1.0, 0.5 * r, r == n - 1 ? 1.0 : 0.0});
  EXPECT_EQ(sums, (std::vector<double>{1.0 * n, 0.25 * n * (n - 1), 1.0}));
  EXPECT_EQ(env.all_reduce_max(std::vector<int>{r, -r, r == 1 ? 7 : 0}), (std::vector<int>{n - 1, 0, n > 1 ? 7 : 0}));
  EXPECT_EQ(env.all_reduce_min(int64_t{1} << 40 | r), int64_t{1} << 40);  // 64 bits, not 32
  EXPECT_EQ(env.broadcast_from_main(r == 0 ? 42 : r), 42);
  struct Pair {
    int64_t a;
    double b;
  };
  const auto pairs = env.gather_to_main(Pair{10 + r, 0.5 * r});
  if (!env.is_main()) {
    EXPECT_TRUE(pairs.empty());
    return;
  }
  ASSERT_EQ(static_cast<int>(pairs.size()), n);
  for (int k = 0; k < n; ++k) EXPECT_EQ((std::pair{pairs[k].a, pairs[k].b}), (std::pair{int64_t{10} + k, 0.5 * k}));
}

TEST(RankEnv, SelfIsOneNode) {
  const RankEnv self(MPI_COMM_SELF);
  EXPECT_EQ(self.num_nodes(), 1);
  EXPECT_EQ(self.local_rank(), 0);
  EXPECT_EQ(self.local_size(), 1);
  EXPECT_FALSE(self.node_name().empty());
}

}  // namespace
}  // namespace gpt2::parallel
