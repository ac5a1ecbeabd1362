#include "parallel/grad_buckets.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>

#include "src/base/errors.h"

namespace gpt2::parallel {
namespace {

// Runs a callback after a leaf's gradient accumulator has added this backward's gradient.
class AccumulatedHook : public torch::autograd::FunctionPostHook {
 public:
  explicit AccumulatedHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

}  // namespace

GradBuckets::GradBuckets(const std::vector<torch::Tensor>& params, const FlatLayout& layout, int64_t bucket_bytes,
                         Communicator& comm, bool reduce_to_owners, at::ScalarType grad_dtype)
    : comm_(comm), layout_(layout), reduce_to_owners_(reduce_to_owners), bucket_of_(params.size(), -1) {
  GPT2_ASSERT(bucket_bytes > 0, "bucket size must be positive");
  GPT2_ASSERT(!params.empty() && layout.world_size == comm.world_size(), "layout does not match the group");
  const auto options = params.front().options().requires_grad(false);
  for (const auto& p : params) {
    GPT2_ASSERT(p.requires_grad() && p.is_leaf(), "bucketed parameters must be leaves that require grad");
    GPT2_ASSERT(p.dtype() == options.dtype() && p.device() == options.device(),
                "bucketed parameters must share one dtype and device");
  }
  convert_ = grad_dtype != at::ScalarType::Undefined && grad_dtype != options.dtype().toScalarType();
  flat_ = torch::zeros({layout.padded}, convert_ ? options.dtype(grad_dtype) : options);
  params_ = params;
  fresh_.resize(params.size());
  zero();  // also drops a stale .grad, which would be added to, then taken
  const int64_t element = static_cast<int64_t>(flat_.element_size());
  for (int i : layout.order) {
    if (buckets_.empty() || (buckets_.back().end - buckets_.back().begin) * element >= bucket_bytes) {
      Bucket b;
      b.begin = b.end = layout.offset[i];
      buckets_.push_back(std::move(b));
    }
    buckets_.back().params.push_back(i);
    buckets_.back().end = layout.offset[i] + layout.numel[i];
    bucket_of_[i] = static_cast<int>(buckets_.size()) - 1;
  }
  buckets_.back().end = layout.padded;  // the padding rides with the last bucket
  for (size_t i = 0; i < params.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params[i]);
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<AccumulatedHook>([this, i] {
      take_gradient(static_cast<int>(i));
      mark_ready(static_cast<int>(i));
    })));
    accumulators_.push_back(std::move(acc));
  }
}

GradBuckets::~GradBuckets() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

void GradBuckets::prepare_backward(bool reduce) {
  reduce_ = reduce;
  next_to_launch_ = 0;
  params_pending_ = static_cast<int>(bucket_of_.size());
  for (auto& b : buckets_) {
    GPT2_ASSERT(b.work.empty(), "prepare_backward() before finish() of the previous reducing backward");
    b.pending = static_cast<int>(b.params.size());
  }
}

void GradBuckets::zero() {
  // Nothing is filled: each parameter's first gradient since now is copied over its slot, and
  // finish() zeroes the slots of those that got none (Note [Gradient hand-over]).
  std::fill(fresh_.begin(), fresh_.end(), 1);
  for (auto& p : params_) p.mutable_grad().reset();
  // The padding is no parameter's, but a clip by a non-finite norm scales it to NaN with the rest.
  if (layout_.padded > layout_.total) flat_.narrow(0, layout_.total, layout_.padded - layout_.total).zero_();
}

// Note [Gradient hand-over]
// A parameter whose .grad is undefined gets backward's gradient tensor as is (the accumulator
// steals it, no kernel); a defined .grad is added to in place. So after zero() the hook copies the
// first gradient into the parameter's slot of the flat buffer: one pass that reads and writes a
// gradient, where zeroing the buffer and adding into it took three (gpt2-1558m: 3 GiB each). In
// the parameters' dtype the slot then becomes .grad, so later micro-steps add into it in place; in
// another dtype the hook adds each later gradient in, converting it, and drops .grad.
void GradBuckets::take_gradient(int param) {
  auto& p = params_[param];
  const at::Tensor grad = p.grad();
  if (!grad.defined()) return;
  const bool first = fresh_[param];
  if (!first && !convert_) return;  // same dtype: the accumulator added into the slot itself
  fresh_[param] = 0;
  auto dst = slot(param);
  {
    at::NoGradGuard no_grad;
    if (first) {
      dst.copy_(grad);  // converting where the dtypes differ
    } else {
      dst.add_(grad);
    }
  }
  if (convert_) {
    p.mutable_grad().reset();
  } else {
    p.mutable_grad() = dst;
  }
}

at::Tensor GradBuckets::slot(int param) const {
  return flat_.narrow(0, layout_.offset[param], layout_.numel[param]).view(params_[param].sizes());
}

void GradBuckets::zero_missing() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < fresh_.size(); ++i) {
    if (!fresh_[i]) continue;
    auto dst = slot(static_cast<int>(i));
    dst.zero_();
    if (!convert_) params_[i].mutable_grad() = dst;
    fresh_[i] = 0;
  }
}

void GradBuckets::mark_ready(int param) {
  --params_pending_;
  auto& bucket = buckets_[bucket_of_[param]];
  --bucket.pending;
  if (!reduce_ || bucket.pending != 0) return;
  while (next_to_launch_ < num_buckets() && buckets_[next_to_launch_].pending == 0) launch(next_to_launch_++);
}

void GradBuckets::launch(int b) {
  if (observer_) observer_("launch", b, params_pending_);
  if (comm_.world_size() == 1) return;
  Bucket& bucket = buckets_[b];
  if (!reduce_to_owners_) {
    bucket.work.push_back(comm_.all_reduce(flat_.narrow(0, bucket.begin, bucket.end - bucket.begin), ReduceOp::kSum));
    return;
  }
  // ZeRO 2: the part of this bucket inside rank r's shard is summed onto rank r.
  for (int r = 0; r < layout_.world_size; ++r) {
    const int64_t lo = std::max(bucket.begin, layout_.shard_begin(r));
    const int64_t hi = std::min(bucket.end, layout_.shard_end(r));
    if (lo < hi) bucket.work.push_back(comm_.reduce(flat_.narrow(0, lo, hi - lo), r, ReduceOp::kSum));
  }
}

void GradBuckets::finish() {
  GPT2_ASSERT(reduce_, "finish() after a backward that was not prepared with reduce = true");
  // Parameters that got no gradient never fired their hook: their slots still hold the last
  // step's values, so zero them, then reduce their buckets now, still in index order, so every
  // rank issues the same sequence.
  zero_missing();
  while (next_to_launch_ < num_buckets()) launch(next_to_launch_++);
  for (auto& b : buckets_) {
    for (auto& w : b.work) w->wait();
    b.work.clear();
  }
  reduce_ = false;
}

}  // namespace gpt2::parallel
