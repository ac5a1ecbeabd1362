// Muon's owners (optim/muon_owners.h): the FLOP balance against hand-computed loads, and the moves
// between the shards and the owners on 2 and 3 MPI ranks, against the flat positions they must
// carry: every owned matrix receives exactly its elements, and they come back to exactly the
// shards' places, for contiguous (ZeRO 1) and interleaved (ZeRO 2) shards, in fp32 and bf16.
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <vector>

#include "optim/muon_owners.h"
#include "parallel/communicator.h"
#include "parallel/flat_layout.h"

namespace gpt2::optim {
namespace {

// Newton–Schulz FLOPs of 5 steps: m = min side, n = max side, 5 (4 m² n + 2 m³).
TEST(MuonOwners, FlopsAreThreeProductsOnTheSmallerGram) {
  EXPECT_EQ(newton_schulz_flops(12, 3, 5), 5 * (4.0 * 9 * 12 + 2.0 * 27));
  EXPECT_EQ(newton_schulz_flops(3, 12, 5), newton_schulz_flops(12, 3, 5));
}

// A GPT-2 block's matrices at C = 8 (fc, fc2: 18 C³ a step; qkv: 14 C³; proj: 6 C³). Largest
// first, each to the least loaded rank (ties: the lower): on 2 ranks fc -> 0, fc2 -> 1, qkv -> 0,
// proj -> 1, loads 32 C³ and 24 C³; on 4 ranks one each; on 5 ranks rank 4 owns none.
TEST(MuonOwners, LargestFirstToTheLeastLoadedRank) {
  const int64_t c = 8;
  const std::vector<MuonMatrix> block = {{0, 3 * c, c}, {0, c, c}, {0, 4 * c, c}, {0, c, 4 * c}};  // qkv proj fc fc2
  EXPECT_EQ(balance_muon_owners(block, 2, 5), (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(balance_muon_owners(block, 4, 5), (std::vector<int>{2, 3, 0, 1}));
  EXPECT_EQ(balance_muon_owners(block, 5, 5), (std::vector<int>{2, 3, 0, 1}));
  EXPECT_EQ(balance_muon_owners(block, 1, 5), (std::vector<int>{0, 0, 0, 0}));
}

// Three blocks at C = 8 in flat order (qkv proj fc fc2, three times), stacks of at most 2: each
// shape's matrices in flat order, cut into runs, the shapes as they first appear. Whole stacks go
// to owners, largest first (per step: fc and fc2 pairs 36 C³, qkv pair 28, fc and fc2 alone 18, qkv
// alone 14, proj pair 12, proj alone 6): on 2 ranks r0 takes fc pair, qkv pair, qkv alone, proj
// alone; r1 fc2 pair, fc alone, fc2 alone, proj pair; 84 C³ each.
TEST(MuonOwners, StacksAreRunsOfOneShapeOwnedWhole) {
  const int64_t c = 8;
  std::vector<MuonMatrix> matrices;
  for (int b = 0; b < 3; ++b) {
    for (auto [rows, cols] : {std::pair{3 * c, c}, {c, c}, {4 * c, c}, {c, 4 * c}}) matrices.push_back({0, rows, cols});
  }
  const auto stacks = muon_stacks(matrices, 2);
  EXPECT_EQ(stacks, (std::vector<MuonStack>{{0, 4}, {8}, {1, 5}, {9}, {2, 6}, {10}, {3, 7}, {11}}));
  EXPECT_EQ(balance_muon_owners(matrices, stacks, 2, 5), (std::vector<int>{0, 1, 0, 1, 0, 1, 0, 1, 0, 0, 1, 1}));
  EXPECT_EQ(muon_stacks(matrices, kMuonStack).size(), 4u);  // 3 of each shape fit one stack
  EXPECT_EQ(muon_stacks(matrices, 1).size(), matrices.size());
}

TEST(MuonOwners, MovesCarryEveryElementToItsOwnerAndBack) {
  auto comm = parallel::make_mpi_communicator(MPI_COMM_WORLD, 120);
  const int rank = comm->rank(), world = comm->world_size();
  // Parameters of awkward sizes, three of them matrices Muon updates.
  std::vector<torch::Tensor> params = {torch::zeros({40, 50}), torch::zeros({7}), torch::zeros({30, 90}),
                                       torch::zeros({13}), torch::zeros({64, 64})};
  for (int64_t interleave : {int64_t{0}, int64_t{2048}}) {
    const parallel::FlatLayout layout(params, world, interleave);
    SCOPED_TRACE(layout.interleaved() ? "interleaved shards" : "contiguous shards");
    std::vector<MuonMatrix> matrices;
    for (int i : layout.order) {
      if (params[i].dim() == 2) matrices.push_back({layout.offset[i], params[i].size(0), params[i].size(1)});
    }
    std::vector<std::vector<parallel::FlatRange>> pieces;
    for (int r = 0; r < world; ++r) pieces.push_back(layout.pieces(r));
    const std::vector<int> owners = balance_muon_owners(matrices, world, 5);
    const MuonOwners muon(matrices, owners, pieces, rank);
    // Shard values: each element's flat position (exact in fp32 and, below 256, in bf16: so bf16
    // carries position % 256).
    for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      SCOPED_TRACE(c10::toString(dtype));
      const int64_t wrap = dtype == torch::kBFloat16 ? 256 : layout.padded;
      std::vector<torch::Tensor> flat_positions;
      for (const auto& p : pieces[static_cast<size_t>(rank)]) {
        flat_positions.push_back(torch::arange(p.begin, p.end, torch::kDouble));
      }
      const torch::Tensor positions = torch::cat(flat_positions);
      const torch::Tensor shard = positions.fmod(wrap).to(dtype);
      std::vector<torch::Tensor> owned;
      for (size_t k : muon.owned()) owned.push_back(torch::full({matrices[k].numel()}, -1.0, dtype));
      muon.to_owners(*comm, shard, owned);
      int64_t owned_numel = 0;
      for (size_t j = 0; j < owned.size(); ++j) {
        const MuonMatrix& m = matrices[muon.owned()[j]];
        EXPECT_EQ(owners[muon.owned()[j]], rank);
        const auto want = torch::arange(m.offset, m.offset + m.numel(), torch::kDouble).fmod(wrap);
        EXPECT_TRUE(torch::equal(owned[j].to(torch::kDouble), want)) << "matrix at " << m.offset;
        owned_numel += m.numel();
      }
      EXPECT_EQ(owned_numel, muon.owned_numel());
      // Back: the owners send the negated values; Muon's elements of every shard take them, the
      // others keep theirs.
      for (auto& t : owned) t.neg_();
      auto back = shard.clone();
      muon.to_holders(*comm, owned, back);
      auto is_muon = torch::zeros({shard.numel()}, torch::kBool);
      for (const auto& h : muon.held()) is_muon.narrow(0, h.begin, h.end - h.begin).fill_(true);
      for (const MuonMatrix& m : matrices) {
        const auto in_m = positions.ge(m.offset).logical_and(positions.lt(m.offset + m.numel()));
        EXPECT_TRUE(torch::equal(in_m.logical_and(is_muon), in_m))
            << "held() misses part of the matrix at " << m.offset;
      }
      const auto want = torch::where(is_muon, shard.neg(), shard);
      EXPECT_TRUE(torch::equal(back, want));
    }
  }
}

}  // namespace
}  // namespace gpt2::optim
