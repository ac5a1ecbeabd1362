#pragma once
// A group of one rank: ShardedOptimizer without MPI (its collectives are never called at world 1).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace gpt2::test {

class OneRank : public parallel::Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend() const override { return "none"; }
  std::unique_ptr<parallel::Work> all_reduce(torch::Tensor, parallel::ReduceOp) override { return unused(); }
  std::unique_ptr<parallel::Work> reduce(torch::Tensor, int, parallel::ReduceOp) override { return unused(); }
  std::unique_ptr<parallel::Work> reduce_scatter(torch::Tensor, torch::Tensor, parallel::ReduceOp) override {
    return unused();
  }
  std::unique_ptr<parallel::Work> all_gather(torch::Tensor, torch::Tensor) override { return unused(); }
  std::unique_ptr<parallel::Work> broadcast(torch::Tensor, int) override { return unused(); }
  std::unique_ptr<parallel::Work> all_to_all(torch::Tensor, const std::vector<int64_t>&, torch::Tensor,
                                             const std::vector<int64_t>&) override {
    return unused();
  }
  void barrier() override {}

 private:
  static std::unique_ptr<parallel::Work> unused() {
    ADD_FAILURE() << "a one-rank group must not communicate";
    return nullptr;
  }
};

}  // namespace gpt2::test
