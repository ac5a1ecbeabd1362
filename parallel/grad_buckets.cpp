#include "parallel/grad_buckets.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

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

GradBuckets::GradBuckets(const std::vector<torch::Tensor>& params, int64_t bucket_bytes, Communicator& comm)
    : comm_(comm), params_(params), bucket_of_(params.size(), -1) {
  GPT2_ASSERT(bucket_bytes > 0, "bucket size must be positive");
  // Reverse registration order: the last layers' gradients arrive first in backward.
  std::vector<int> order;
  for (int i = static_cast<int>(params_.size()) - 1; i >= 0; --i) order.push_back(i);
  std::vector<std::vector<int>> groups;
  int64_t group_bytes = 0;
  for (int i : order) {
    const auto& p = params_[i];
    GPT2_ASSERT(p.requires_grad() && p.is_leaf(), "bucketed parameters must be leaves that require grad");
    const bool same_kind = groups.empty() || (params_[groups.back().front()].dtype() == p.dtype() &&
                                              params_[groups.back().front()].device() == p.device());
    if (groups.empty() || group_bytes >= bucket_bytes || !same_kind) {
      groups.emplace_back();
      group_bytes = 0;
    }
    groups.back().push_back(i);
    group_bytes += p.numel() * static_cast<int64_t>(p.element_size());
  }
  for (auto& group : groups) {
    int64_t numel = 0;
    for (int i : group) numel += params_[i].numel();
    Bucket bucket;
    bucket.buffer = torch::zeros({numel}, params_[group.front()].options().requires_grad(false));
    int64_t offset = 0;
    for (int i : group) {
      auto& p = params_[i];
      // The accumulator adds into an existing .grad in place, so gradients land in the bucket.
      p.mutable_grad() = bucket.buffer.narrow(0, offset, p.numel()).view(p.sizes());
      offset += p.numel();
      bucket_of_[i] = static_cast<int>(buckets_.size());
    }
    bucket.params = group;
    buckets_.push_back(std::move(bucket));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<AccumulatedHook>([this, i] { mark_ready(static_cast<int>(i)); })));
    accumulators_.push_back(std::move(acc));
  }
}

GradBuckets::~GradBuckets() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

void GradBuckets::prepare_backward(bool reduce) {
  reduce_ = reduce;
  next_to_launch_ = 0;
  params_pending_ = static_cast<int>(params_.size());
  for (auto& b : buckets_) {
    GPT2_ASSERT(!b.work, "prepare_backward() before finish() of the previous reducing backward");
    b.pending = static_cast<int>(b.params.size());
  }
}

void GradBuckets::mark_ready(int param) {
  --params_pending_;
  auto& bucket = buckets_[bucket_of_[param]];
  --bucket.pending;
  if (reduce_ && bucket.pending == 0) launch_ready_buckets();
}

void GradBuckets::launch_ready_buckets() {
  while (next_to_launch_ < num_buckets() && buckets_[next_to_launch_].pending == 0) launch(next_to_launch_++);
}

void GradBuckets::launch(int b) {
  if (observer_) observer_("launch", b, params_pending_);
  if (comm_.world_size() > 1) buckets_[b].work = comm_.all_reduce(buckets_[b].buffer, ReduceOp::kSum);
}

void GradBuckets::finish() {
  GPT2_ASSERT(reduce_, "finish() after a backward that was not prepared with reduce = true");
  // Parameters that got no gradient never fired their hook: reduce their buckets now, still in
  // index order, so every rank issues the same sequence.
  while (next_to_launch_ < num_buckets()) launch(next_to_launch_++);
  for (auto& b : buckets_) {
    if (b.work) b.work->wait();
    b.work.reset();
  }
  reduce_ = false;
}

void GradBuckets::zero() {
  for (auto& b : buckets_) b.buffer.zero_();
}

}  // namespace gpt2::parallel
