#pragma once
// Gradient buckets for data parallelism (the DDP reducer's scheme).
// Contract: the constructor lays the parameters out, in reverse order of registration (roughly the
// order backward produces their gradients), in flat buffers of about `bucket_bytes`, and makes each
// parameter's .grad a view into its bucket. A hook on each parameter's gradient accumulator counts
// it ready; when a bucket is complete it is all-reduced (summed) at once on the communicator while
// backward goes on. Buckets are launched strictly in index order on every rank (Note [Collective
// order]); finish() launches what is left (parameters that got no gradient) and waits for all.
// With one rank nothing is reduced; the buckets still give every gradient one contiguous home.
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace torch::autograd {
struct Node;
}

namespace gpt2::parallel {

class GradBuckets {
 public:
  // An event for tests and tracing: ("launch", bucket) when a bucket's reduction is issued, with the
  // number of parameters in the whole model whose gradient had not arrived yet at that moment.
  using Observer = std::function<void(const std::string& what, int bucket, int params_pending)>;

  GradBuckets(const std::vector<torch::Tensor>& params, int64_t bucket_bytes, Communicator& comm);
  ~GradBuckets();
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;

  // Call before each micro-step's backward. With reduce = false (gradient accumulation) the hooks
  // only count; with reduce = true completed buckets are reduced during this backward.
  void prepare_backward(bool reduce);
  // After the reducing backward: launches buckets not launched yet, in order, and waits for all.
  // On return every gradient holds the sum over ranks.
  void finish();
  // Zeroes every bucket (and so every .grad) in place.
  void zero();

  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  int64_t bucket_numel(int b) const { return buckets_[b].buffer.numel(); }
  void set_observer(Observer observer) { observer_ = std::move(observer); }

 private:
  struct Bucket {
    torch::Tensor buffer;       // flat, the params' dtype and device
    std::vector<int> params;    // indices into params_
    int pending = 0;            // gradients still to arrive in this backward
    std::unique_ptr<Work> work;
  };

  void mark_ready(int param);
  void launch_ready_buckets();
  void launch(int bucket);

  Communicator& comm_;
  std::vector<torch::Tensor> params_;
  std::vector<int> bucket_of_;  // param index -> bucket
  std::vector<Bucket> buckets_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // keeps the hooks alive
  std::vector<uintptr_t> hook_keys_;
  int next_to_launch_ = 0;
  int params_pending_ = 0;
  bool reduce_ = false;
  Observer observer_;
};

}  // namespace gpt2::parallel
