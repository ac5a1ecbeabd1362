#pragma once
// Gradient buckets for data parallelism (the DDP reducer's scheme, plus ZeRO-2's reduce-scatter).
// Contract: the gradients live in one flat buffer laid out by FlatLayout; buckets are consecutive
// ranges of about `bucket_bytes`. A hook on each parameter's gradient accumulator takes the
// gradient into the buffer (Note [Gradient hand-over]: the step's first one is copied over the
// parameter's slot, nothing is zeroed in between) and counts it in; when a bucket is complete it is reduced at once on
// the communicator while backward goes on: all-reduced (ZeRO 0/1: every rank gets the summed gradient), or, with
// reduce_to_owners (ZeRO 2), each part of it summed onto the rank whose shard holds it, so no rank
// holds the full reduced gradient. Every rank still allocates the whole flat gradient buffer: ZeRO 2
// here saves reduction traffic and the optimizer's reads, not gradient memory. Buckets are launched strictly in index
// order on every rank (Note [Collective order]); finish() launches what is left (parameters that got no gradient) and
// waits for all. With one rank nothing is reduced.
// In the parameters' dtype .grad is the parameter's slot once its first gradient arrived (later
// micro-steps add into it in place). The buffer's dtype (`grad_dtype`, precision.reduce_dtype) may
// differ from the parameters' (bf16 parameters, fp32 gradients): then the hook adds each later
// gradient into the buffer, converting it, and drops .grad, so accumulation over micro-steps and
// the reduction run in grad_dtype.
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/flat_layout.h"

namespace torch::autograd {
struct Node;
}

namespace gpt2::parallel {

class GradBuckets {
 public:
  // An event for tests and tracing: ("launch", bucket) when a bucket's reduction is issued, with the
  // number of parameters in the whole model whose gradient had not arrived yet at that moment.
  using Observer = std::function<void(const std::string& what, int bucket, int params_pending)>;

  // grad_dtype: the buffer's dtype; Undefined = the parameters' own.
  GradBuckets(const std::vector<torch::Tensor>& params, const FlatLayout& layout, int64_t bucket_bytes,
              Communicator& comm, bool reduce_to_owners = false, at::ScalarType grad_dtype = at::ScalarType::Undefined);
  ~GradBuckets();
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;

  // Call before each micro-step's backward. With reduce = false (gradient accumulation) the hooks
  // only count; with reduce = true completed buckets are reduced during this backward.
  void prepare_backward(bool reduce);
  // After the reducing backward: zeroes the slots of parameters that got no gradient, launches
  // buckets not launched yet, in order, and waits for all. On return the gradient holds the sum
  // over ranks: everywhere (ZeRO 0/1) or in this rank's shard of the flat space (ZeRO 2; the rest
  // holds this rank's own contribution).
  void finish();
  // Starts the next step's gradient: each parameter's next one replaces what its slot holds.
  void zero();

  // The flat gradient buffer (FlatLayout order, padded).
  const torch::Tensor& flat() const { return flat_; }
  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  void set_observer(Observer observer) { observer_ = std::move(observer); }

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;  // range of the flat buffer
    std::vector<int> params;     // parameter indices in it
    int pending = 0;             // gradients still to arrive in this backward
    std::vector<std::unique_ptr<Work>> work;
  };

  void mark_ready(int param);
  void take_gradient(int param);
  void zero_missing();
  at::Tensor slot(int param) const;  // the parameter's part of flat_, in its shape
  void launch(int bucket);

  Communicator& comm_;
  const FlatLayout& layout_;
  bool reduce_to_owners_;
  torch::Tensor flat_;
  bool convert_ = false;  // flat_'s dtype differs from the parameters'
  std::vector<torch::Tensor> params_;
  std::vector<char> fresh_;     // no gradient taken for param i since zero()
  std::vector<int> bucket_of_;  // param index -> bucket
  std::vector<Bucket> buckets_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // keep the hooks alive
  std::vector<uintptr_t> hook_keys_;
  int next_to_launch_ = 0;
  int params_pending_ = 0;
  bool reduce_ = false;
  Observer observer_;
};

}  // namespace gpt2::parallel
