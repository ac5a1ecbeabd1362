#pragma once
// Gradient buckets for data parallelism (the DDP reducer's scheme, and ZeRO 2's reduce-scatter).
// Contract: buckets are consecutive ranges of the flat space (FlatLayout). A hook on each
// parameter's gradient accumulator takes the gradient as backward produces it and counts it in;
// when a bucket is complete it is reduced at once on the communicator while backward goes on.
// Buckets are launched strictly in index order on every rank (Note [Collective order]); finish()
// launches what is left (parameters that got no gradient) and waits for all. With one rank nothing
// is reduced. Two modes, by the layout:
//  - contiguous layout (ZeRO 0/1): one flat gradient buffer of the whole space; buckets end at
//    parameter boundaries after about `bucket_bytes`, and only the last micro-step's backward
//    all-reduces them (earlier ones accumulate in the buffer: Note [Gradient hand-over]). In the
//    parameters' dtype .grad is the parameter's slot once its first gradient arrived.
//  - interleaved layout (ZeRO 2, Note [Interleaved shards]): the layout's blocks are the buckets.
//    A gradient is copied into its bucket's staging buffer (a few are reused, Note [Staging
//    buffers]) and .grad is dropped; every micro-step's backward reduce-scatters each bucket, and
//    this rank keeps only the sum of its chunks: grads() is its pieces end to end (padded / world
//    elements), the first micro-step's written, later ones added.
// The buffer's dtype (`grad_dtype`, precision.reduce_dtype) may differ from the parameters' (bf16
// parameters, fp32 gradients): the hook converts as it copies, and accumulation and the reduction
// run in grad_dtype.
#include <torch/types.h>

#include <cstdint>
#include <deque>
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
  // bucket_bytes: the contiguous layout's bucket size (the interleaved layout brings its own).
  GradBuckets(const std::vector<torch::Tensor>& params, const FlatLayout& layout, int64_t bucket_bytes,
              Communicator& comm, at::ScalarType grad_dtype = at::ScalarType::Undefined);
  ~GradBuckets();
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;

  // Call before each micro-step's backward. Contiguous layout: with reduce = false (gradient
  // accumulation) the hooks only count; with reduce = true completed buckets are reduced during
  // this backward. Interleaved: every backward reduces (the previous one's leftovers are launched
  // here first).
  void prepare_backward(bool reduce);
  // After the last micro-step's backward: gives parameters that got no gradient zeros, launches
  // the buckets not launched yet, in order, and waits for all. On return grads() holds the sum over
  // ranks and micro-steps.
  void finish();
  // Starts the next step's gradient: each parameter's next one replaces what its slot holds.
  void zero();

  // The gradient: the whole flat space (contiguous layout, padded) or this rank's pieces end to
  // end (interleaved layout).
  const torch::Tensor& grads() const { return grads_; }
  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // Bytes of gradient memory held: the buffer, plus the staging buffers (interleaved).
  int64_t bytes() const;
  void set_observer(Observer observer) { observer_ = std::move(observer); }

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;  // range of the flat space
    std::vector<int> params;     // parameter indices with elements in it
    int pending = 0;             // gradients still to arrive in this backward
    int64_t local = 0;           // interleaved: where this rank's chunk sits in grads_
    std::vector<std::unique_ptr<Work>> work;
  };
  // Interleaved: a bucket's gradients on their way to the reduce-scatter (Note [Staging buffers]).
  struct Staging {
    torch::Tensor in;   // the bucket (world x chunk)
    torch::Tensor out;  // this rank's reduced chunk, when it is to be added into grads_
    int filling = -1;   // the bucket being copied in, or -1
    int reducing = -1;  // the bucket whose reduce-scatter reads it, or -1
    bool add = false;   // out is added into grads_ once the reduction is done
    int64_t order = 0;  // launch order, for waiting on the oldest
    std::unique_ptr<Work> work;
  };

  void mark_ready(int param);
  void take_gradient(int param);
  void take_into_staging(int param, const at::Tensor& grad);
  void zero_missing();
  void zero_missing_in(int bucket);
  at::Tensor slot(int param) const;  // the parameter's part of grads_, in its shape (contiguous layout)
  void launch(int bucket);
  void launch_rest();  // zeros for parameters that got none, then every bucket not launched yet
  Staging& staging_for(int bucket);
  void add_staging();
  void complete(Staging& s);

  Communicator& comm_;
  const FlatLayout& layout_;
  bool scatter_;  // interleaved layout: reduce-scatter into this rank's pieces
  torch::Tensor grads_;
  bool convert_ = false;  // grads_'s dtype differs from the parameters'
  std::vector<torch::Tensor> params_;
  std::vector<char> fresh_;                  // no gradient taken for param i since zero() (contiguous) or
                                             // since prepare_backward() (interleaved)
  std::vector<std::vector<int>> bucket_of_;  // param index -> the buckets it has elements in
  std::vector<Bucket> buckets_;
  std::deque<Staging> staging_;  // a deque: growing it keeps references to the others valid
  int64_t launches_ = 0;
  bool first_reduce_ = true;  // interleaved: the step's first reduction writes grads_, later ones add
  bool backward_open_ = false;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // keep the hooks alive
  std::vector<uintptr_t> hook_keys_;
  int next_to_launch_ = 0;
  int params_pending_ = 0;
  bool reduce_ = false;
  Observer observer_;
};

}  // namespace gpt2::parallel
