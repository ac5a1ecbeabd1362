#pragma once
// Which rank updates each Muon matrix, and how a matrix's values move between the ranks whose flat
// shards hold its pieces and the rank that owns it whole.
//
// Note [Muon's owners]
// Newton–Schulz needs whole matrices, and a ZeRO 1/2 shard holds pieces of them. So each matrix
// gets one owner, which keeps its momentum (and its fp32 master when the parameters are 16-bit)
// and updates it; the flat shards keep everything else. The matrices of one shape are orthogonalised
// in stacks of up to kMuonStack, one batched product per Newton–Schulz product for the whole stack
// (a GPT-2 block's Muon step on its own is some thirty small kernels a matrix); a stack is also the
// unit of ownership, and the stacks depend on the model only, so every world size and ZeRO stage
// runs the same batched products on the same values (ZeRO 0's bits). Owners are chosen by
// Newton–Schulz FLOPs, largest stack first, each to the rank with the fewest FLOPs so far (ties:
// the lower rank), so the slowest rank's share is within one stack of the mean. A step moves each matrix's reduced
// gradient from the shards to its owner, and the updated matrix back into the shards, each with one
// all_to_all; the parameter all-gather that follows spreads it. Each element crosses once each way:
// per rank about (W − 1) / W² of the matrices' elements, against the (W − 1) / W of the
// reduce-scatter and all-gather. Checkpoints keep the flat format: state() moves the owners' masters
// and momenta into the shards' ranges, and load_state() moves them back, so any world size and ZeRO
// stage resumes them. With one holder of everything (ZeRO 0) the same moves are local copies.
#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/flat_layout.h"

namespace gpt2::optim {

// A matrix Muon updates: where it starts in the flat space, and its shape as stored.
struct MuonMatrix {
  int64_t offset = 0, rows = 0, cols = 0;
  int64_t numel() const { return rows * cols; }
};

// Newton–Schulz FLOPs of one rows x cols matrix over `steps` iterations (three products each, on
// the smaller Gram matrix): steps (4 m² n + 2 m³), m = min(rows, cols), n = max.
double newton_schulz_flops(int64_t rows, int64_t cols, int steps);

// Matrices per stack: 4 keeps a GPT-2 model's stacks (4 shapes x n_layer / 4) more than the ranks
// of a node at 124m's 12 layers, and cuts the Muon step's kernels about fourfold.
inline constexpr size_t kMuonStack = 4;

// Muon's stacks (Note [Muon's owners]): indices into `matrices`, the matrices of each shape in
// flat order cut into runs of at most max_stack, the shapes in the order they first appear.
using MuonStack = std::vector<size_t>;
std::vector<MuonStack> muon_stacks(const std::vector<MuonMatrix>& matrices, size_t max_stack = kMuonStack);

// The owner of each of `matrices` (same order) among `world` ranks, every stack's matrices one
// rank's, balanced by Newton–Schulz FLOPs (Note [Muon's owners]). A rank may own none. Without
// stacks each matrix is a stack of its own.
std::vector<int> balance_muon_owners(const std::vector<MuonMatrix>& matrices, const std::vector<MuonStack>& stacks,
                                     int world, int steps);
std::vector<int> balance_muon_owners(const std::vector<MuonMatrix>& matrices, int world, int steps);

class MuonOwners {
 public:
  // matrices: flat order, not overlapping; owners: one per matrix; pieces[r]: what rank r's shard
  // holds (FlatLayout::pieces), for every rank; `rank`: this one.
  MuonOwners(std::vector<MuonMatrix> matrices, std::vector<int> owners,
             const std::vector<std::vector<parallel::FlatRange>>& pieces, int rank);

  const std::vector<MuonMatrix>& matrices() const { return matrices_; }
  int owner(size_t matrix) const { return owners_[matrix]; }
  // The matrices this rank owns (indices into matrices()), in flat order, and their elements.
  const std::vector<size_t>& owned() const { return owned_; }
  int64_t owned_numel() const { return owned_numel_; }
  // Shard coordinates (this rank's pieces end to end) of the Muon elements it holds, as [begin, end).
  const std::vector<parallel::FlatRange>& held() const { return held_; }

  // Collective: every rank's `shard` (its pieces end to end) into the owners' matrices: owned[j] is
  // a contiguous tensor of owned()[j]'s elements, of shard's dtype. One rank (ZeRO 0): a local copy,
  // `comm` unused.
  void to_owners(parallel::Communicator& comm, const torch::Tensor& shard,
                 const std::vector<torch::Tensor>& owned) const;
  // Collective, the other way: the owned matrices into the Muon elements of every rank's `shard`;
  // its other elements are left as they are.
  void to_holders(parallel::Communicator& comm, const std::vector<torch::Tensor>& owned, torch::Tensor shard) const;

  // A run of elements of one matrix that one rank holds: its place in that rank's shard and in the
  // matrix.
  struct Segment {
    int64_t shard_at = 0, matrix_at = 0, len = 0;
    size_t owned_index = 0;  // the matrix among its owner's owned()
  };

 private:
  std::vector<MuonMatrix> matrices_;
  std::vector<int> owners_;
  std::vector<size_t> owned_;
  int64_t owned_numel_ = 0;
  int world_ = 1;
  std::vector<parallel::FlatRange> held_;
  // sends_[q]: what this rank holds of rank q's matrices; receives_[p]: what rank p holds of this
  // rank's matrices. Both in one order (matrix, then flat position), so a pair agrees.
  std::vector<std::vector<Segment>> sends_, receives_;
  void move(parallel::Communicator& comm, const std::vector<std::vector<Segment>>& out,
            const std::vector<std::vector<Segment>>& in, bool to_owned, torch::Tensor shard,
            const std::vector<torch::Tensor>& owned) const;
};

}  // namespace gpt2::optim
