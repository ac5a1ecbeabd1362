#include "optim/muon_owners.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>
#include <utility>

#include "src/base/errors.h"

namespace gpt2::optim {
double newton_schulz_flops(int64_t rows, int64_t cols, int steps) {
  const auto m = static_cast<double>(std::min(rows, cols)), n = static_cast<double>(std::max(rows, cols));
  return steps * (4 * m * m * n + 2 * m * m * m);
}

std::vector<MuonStack> muon_stacks(const std::vector<MuonMatrix>& matrices, size_t max_stack) {
  GPT2_ASSERT(max_stack >= 1, "muon_stacks: a stack holds at least one matrix");
  std::vector<std::pair<int64_t, int64_t>> shapes;  // in order of first appearance
  std::vector<MuonStack> by_shape;
  for (size_t k = 0; k < matrices.size(); ++k) {
    const std::pair<int64_t, int64_t> shape{matrices[k].rows, matrices[k].cols};
    const auto at = static_cast<size_t>(std::find(shapes.begin(), shapes.end(), shape) - shapes.begin());
    if (at == shapes.size()) {
      shapes.push_back(shape);
      by_shape.emplace_back();
    }
    by_shape[at].push_back(k);
  }
  std::vector<MuonStack> stacks;
  for (const MuonStack& same : by_shape) {
    for (size_t i = 0; i < same.size(); i += max_stack) {
      stacks.emplace_back(same.begin() + static_cast<std::ptrdiff_t>(i),
                          same.begin() + static_cast<std::ptrdiff_t>(std::min(same.size(), i + max_stack)));
    }
  }
  return stacks;
}

std::vector<int> balance_muon_owners(const std::vector<MuonMatrix>& matrices, const std::vector<MuonStack>& stacks,
                                     int world, int steps) {
  GPT2_ASSERT(world >= 1, "balance_muon_owners: no ranks");
  std::vector<double> cost(stacks.size(), 0.0);
  for (size_t s = 0; s < stacks.size(); ++s) {
    for (size_t k : stacks[s]) cost[s] += newton_schulz_flops(matrices[k].rows, matrices[k].cols, steps);
  }
  std::vector<size_t> by_cost(stacks.size());
  std::iota(by_cost.begin(), by_cost.end(), size_t{0});
  std::stable_sort(by_cost.begin(), by_cost.end(), [&](size_t a, size_t b) { return cost[a] > cost[b]; });
  std::vector<double> load(static_cast<size_t>(world), 0.0);
  std::vector<int> owners(matrices.size(), -1);
  for (size_t s : by_cost) {
    const auto least = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    for (size_t k : stacks[s]) owners[k] = static_cast<int>(least);
    load[least] += cost[s];
  }
  GPT2_ASSERT(std::find(owners.begin(), owners.end(), -1) == owners.end(), "balance_muon_owners: a matrix in no stack");
  return owners;
}

std::vector<int> balance_muon_owners(const std::vector<MuonMatrix>& matrices, int world, int steps) {
  std::vector<MuonStack> alone;
  for (size_t k = 0; k < matrices.size(); ++k) alone.push_back({k});
  return balance_muon_owners(matrices, alone, world, steps);
}

MuonOwners::MuonOwners(std::vector<MuonMatrix> matrices, std::vector<int> owners,
                       const std::vector<std::vector<parallel::FlatRange>>& pieces, int rank)
    : matrices_(std::move(matrices)), owners_(std::move(owners)), world_(static_cast<int>(pieces.size())) {
  GPT2_ASSERT(owners_.size() == matrices_.size(), "MuonOwners: one owner per matrix");
  GPT2_ASSERT(rank >= 0 && rank < world_, "MuonOwners: rank outside the group");
  sends_.resize(static_cast<size_t>(world_));
  receives_.resize(static_cast<size_t>(world_));
  std::vector<size_t> owned_count(static_cast<size_t>(world_), 0);
  for (size_t k = 0; k < matrices_.size(); ++k) {
    const int o = owners_[k];
    GPT2_ASSERT(o >= 0 && o < world_, "MuonOwners: owner outside the group");
    const size_t owned_index = owned_count[static_cast<size_t>(o)]++;
    if (o == rank) {
      owned_.push_back(k);
      owned_numel_ += matrices_[k].numel();
    }
    const parallel::FlatRange matrix{matrices_[k].offset, matrices_[k].offset + matrices_[k].numel()};
    for (int h = 0; h < world_; ++h) {
      if (h != rank && o != rank) continue;
      int64_t local = 0;  // shard coordinate of the piece's first element on rank h
      for (const parallel::FlatRange& p : pieces[static_cast<size_t>(h)]) {
        if (const parallel::FlatRange r = p.intersect(matrix); !r.empty()) {
          const Segment s{local + r.begin - p.begin, r.begin - matrix.begin, r.size(), owned_index};
          if (h == rank) {
            sends_[static_cast<size_t>(o)].push_back(s);
            held_.push_back({s.shard_at, s.shard_at + s.len});
          }
          if (o == rank) receives_[static_cast<size_t>(h)].push_back(s);
        }
        local += p.size();
      }
    }
  }
}

namespace {

using Segments = std::vector<std::vector<MuonOwners::Segment>>;

std::vector<int64_t> lengths(const Segments& by_rank) {
  std::vector<int64_t> out;
  for (const auto& segs : by_rank) {
    int64_t n = 0;
    for (const auto& s : segs) n += s.len;
    out.push_back(n);
  }
  return out;
}

// Where a segment's values are on one side of a move: its run of the shard, or of its owned matrix.
enum class Side { kShard, kOwned };
torch::Tensor run_of(const MuonOwners::Segment& s, Side side, const torch::Tensor& shard,
                     const std::vector<torch::Tensor>& owned) {
  return side == Side::kShard ? shard.narrow(0, s.shard_at, s.len)
                              : owned[s.owned_index].view({-1}).narrow(0, s.matrix_at, s.len);
}

void check_owned(const std::vector<torch::Tensor>& owned, size_t expected, const torch::Tensor& shard) {
  GPT2_ASSERT(owned.size() == expected, "MuonOwners: one tensor per owned matrix");
  for (const auto& t : owned) {
    GPT2_ASSERT(t.is_contiguous() && t.scalar_type() == shard.scalar_type(),
                "MuonOwners: owned matrices are contiguous and of the shard's dtype");
  }
}

}  // namespace

// Packs `out`'s runs on side `from` end to end, exchanges them (one rank: they are what it
// receives), and unpacks what arrives into `in`'s runs on the other side.
void MuonOwners::move(parallel::Communicator& comm, const Segments& out, const Segments& in, bool to_owned,
                      torch::Tensor shard, const std::vector<torch::Tensor>& owned) const {
  check_owned(owned, owned_.size(), shard);
  const Side from = to_owned ? Side::kShard : Side::kOwned, to = to_owned ? Side::kOwned : Side::kShard;
  std::vector<torch::Tensor> runs;
  for (const auto& segs : out) {
    for (const Segment& s : segs) runs.push_back(run_of(s, from, shard, owned));
  }
  torch::Tensor sent = runs.empty() ? at::empty({0}, shard.options()) : at::cat(runs);
  torch::Tensor received = sent;
  if (world_ > 1) {
    const auto recv_counts = lengths(in);
    received = at::empty({std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0})}, shard.options());
    comm.all_to_all(received, recv_counts, sent, lengths(out))->wait();
  }
  int64_t at = 0;
  for (const auto& segs : in) {
    for (const Segment& s : segs) {
      run_of(s, to, shard, owned).copy_(received.narrow(0, at, s.len));
      at += s.len;
    }
  }
}

void MuonOwners::to_owners(parallel::Communicator& comm, const torch::Tensor& shard,
                           const std::vector<torch::Tensor>& owned) const {
  move(comm, sends_, receives_, /*to_owned=*/true, shard, owned);
}

void MuonOwners::to_holders(parallel::Communicator& comm, const std::vector<torch::Tensor>& owned,
                            torch::Tensor shard) const {
  move(comm, receives_, sends_, /*to_owned=*/false, shard, owned);
}

}  // namespace gpt2::optim
