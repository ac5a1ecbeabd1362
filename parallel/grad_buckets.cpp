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

// Note [Staging buffers]
// Interleaved (ZeRO 2), no rank holds the whole gradient: a bucket's gradients are copied into a
// staging buffer of the bucket's size, and the reduce-scatter reads it. Buffers are reused: a
// bucket takes a free one, else, while fewer than kStagingBuffers exist, a new one, else the
// buffer of the oldest bucket in flight once its reduction is done (on NCCL the compute stream
// waits, the host does not). Only when every buffer holds a bucket still being filled (gradients
// arriving far out of flat order) does another one come. So gradient memory is padded / world
// elements plus a few buckets, where the contiguous layout holds padded.
constexpr size_t kStagingBuffers = 3;

GradBuckets::GradBuckets(const std::vector<torch::Tensor>& params, const FlatLayout& layout, int64_t bucket_bytes,
                         Communicator& comm, at::ScalarType grad_dtype)
    : comm_(comm), layout_(layout), scatter_(layout.interleaved() && comm.world_size() > 1), bucket_of_(params.size()) {
  GPT2_ASSERT(bucket_bytes > 0, "bucket size must be positive");
  GPT2_ASSERT(!params.empty() && layout.world_size == comm.world_size(), "layout does not match the group");
  const auto options = params.front().options().requires_grad(false);
  for (const auto& p : params) {
    GPT2_ASSERT(p.requires_grad() && p.is_leaf(), "bucketed parameters must be leaves that require grad");
    GPT2_ASSERT(p.dtype() == options.dtype() && p.device() == options.device(),
                "bucketed parameters must share one dtype and device");
  }
  convert_ = grad_dtype != at::ScalarType::Undefined && grad_dtype != options.dtype().toScalarType();
  const auto grad_options = convert_ ? options.dtype(grad_dtype) : options;
  params_ = params;
  fresh_.resize(params.size());
  if (scatter_) {
    int64_t local = 0;
    for (const FlatRange& r : layout.blocks) {
      Bucket b;
      b.begin = r.begin;
      b.end = r.end;
      b.local = local;
      local += r.size() / layout.world_size;
      buckets_.push_back(std::move(b));
    }
    grads_ = torch::zeros({layout.shard_size()}, grad_options);
    // Allocated now, so the memory the log states at set-up is what the run holds.
    while (staging_.size() < std::min(kStagingBuffers, buckets_.size())) add_staging();
    for (int i : layout.order) {
      for (size_t k = 0; k < buckets_.size(); ++k) {
        if (buckets_[k].begin < layout.offset[i] + layout.numel[i] && layout.offset[i] < buckets_[k].end) {
          buckets_[k].params.push_back(i);
          bucket_of_[i].push_back(static_cast<int>(k));
        }
      }
    }
  } else {
    grads_ = torch::zeros({layout.padded}, grad_options);
    const int64_t element = static_cast<int64_t>(grads_.element_size());
    for (int i : layout.order) {
      if (buckets_.empty() || (buckets_.back().end - buckets_.back().begin) * element >= bucket_bytes) {
        Bucket b;
        b.begin = b.end = layout.offset[i];
        buckets_.push_back(std::move(b));
      }
      buckets_.back().params.push_back(i);
      buckets_.back().end = layout.offset[i] + layout.numel[i];
      bucket_of_[i].push_back(static_cast<int>(buckets_.size()) - 1);
    }
    buckets_.back().end = layout.padded;  // the padding rides with the last bucket
  }
  zero();  // also drops a stale .grad, which would be added to, then taken
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
  if (scatter_) {
    if (backward_open_) launch_rest();  // the previous micro-step's
    std::fill(fresh_.begin(), fresh_.end(), 1);
    reduce = true;
  }
  reduce_ = reduce;
  backward_open_ = true;
  next_to_launch_ = 0;
  params_pending_ = static_cast<int>(bucket_of_.size());
  for (auto& b : buckets_) {
    GPT2_ASSERT(b.work.empty(), "prepare_backward() before finish() of the previous reducing backward");
    b.pending = static_cast<int>(b.params.size());
  }
}

void GradBuckets::zero() {
  for (auto& p : params_) p.mutable_grad().reset();
  if (scatter_) {
    first_reduce_ = true;  // the step's first reduce-scatter writes over grads_
    return;
  }
  // Nothing is filled: each parameter's first gradient since now is copied over its slot, and
  // finish() zeroes the slots of those that got none (Note [Gradient hand-over]).
  std::fill(fresh_.begin(), fresh_.end(), 1);
  // The padding is no parameter's, but a clip by a non-finite norm scales it to NaN with the rest.
  if (layout_.padded > layout_.total) grads_.narrow(0, layout_.total, layout_.padded - layout_.total).zero_();
}

int64_t GradBuckets::bytes() const {
  int64_t n = static_cast<int64_t>(grads_.nbytes());
  for (const Staging& s : staging_) n += static_cast<int64_t>(s.in.nbytes() + s.out.nbytes());
  return n;
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
  if (scatter_) {
    take_into_staging(param, grad);
    p.mutable_grad().reset();
    return;
  }
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

// Interleaved: this backward's gradient of `param` into the staging buffers of its buckets.
void GradBuckets::take_into_staging(int param, const at::Tensor& grad) {
  at::NoGradGuard no_grad;
  const at::Tensor g = grad.reshape({-1});
  const int64_t offset = layout_.offset[param], numel = layout_.numel[param];
  for (int b : bucket_of_[param]) {
    const Bucket& bucket = buckets_[b];
    const parallel::FlatRange r = parallel::FlatRange{bucket.begin, bucket.end}.intersect({offset, offset + numel});
    staging_for(b).in.narrow(0, r.begin - bucket.begin, r.size()).copy_(g.narrow(0, r.begin - offset, r.size()));
  }
  fresh_[param] = 0;
}

GradBuckets::Staging& GradBuckets::staging_for(int bucket) {
  for (Staging& s : staging_) {
    if (s.filling == bucket) return s;
  }
  Staging* pick = nullptr;
  for (Staging& s : staging_) {
    if (s.filling < 0 && s.reducing < 0) {
      pick = &s;
      break;
    }
  }
  if (pick == nullptr && staging_.size() >= kStagingBuffers) {  // the oldest reduction in flight
    for (Staging& s : staging_) {
      if (s.reducing >= 0 && (pick == nullptr || s.order < pick->order)) pick = &s;
    }
    if (pick != nullptr) complete(*pick);
  }
  if (pick == nullptr) {
    add_staging();
    pick = &staging_.back();
  }
  pick->filling = bucket;
  const Bucket& b = buckets_[bucket];
  // The padding is no parameter's: zeros into the sum.
  if (b.end > layout_.total) {
    const int64_t from = std::max(b.begin, layout_.total);
    pick->in.narrow(0, from - b.begin, b.end - from).zero_();
  }
  return *pick;
}

void GradBuckets::add_staging() {
  int64_t longest = 0;
  for (const Bucket& b : buckets_) longest = std::max(longest, b.end - b.begin);
  Staging s;
  s.in = at::empty({longest}, grads_.options());
  s.out = at::empty({longest / layout_.world_size}, grads_.options());
  staging_.push_back(std::move(s));
}

// Waits for the reduction that reads `s`, adds its result in where it is to be added, and frees it.
void GradBuckets::complete(Staging& s) {
  if (s.reducing < 0) return;
  s.work->wait();
  s.work.reset();
  if (s.add) {
    at::NoGradGuard no_grad;
    const Bucket& b = buckets_[s.reducing];
    const int64_t n = (b.end - b.begin) / layout_.world_size;
    grads_.narrow(0, b.local, n).add_(s.out.narrow(0, 0, n));
  }
  s.reducing = -1;
}

at::Tensor GradBuckets::slot(int param) const {
  return grads_.narrow(0, layout_.offset[param], layout_.numel[param]).view(params_[param].sizes());
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

// Interleaved: zeros in `bucket`'s staging buffer for the parameters that got no gradient in this
// backward.
void GradBuckets::zero_missing_in(int bucket) {
  at::NoGradGuard no_grad;
  const Bucket& b = buckets_[bucket];
  Staging& s = staging_for(bucket);
  for (int i : b.params) {
    if (!fresh_[i]) continue;
    const parallel::FlatRange r = parallel::FlatRange{b.begin, b.end}.intersect(layout_.range_of(i));
    s.in.narrow(0, r.begin - b.begin, r.size()).zero_();
  }
}

void GradBuckets::mark_ready(int param) {
  --params_pending_;
  bool completed = false;
  for (int b : bucket_of_[param]) completed |= --buckets_[b].pending == 0;
  if (!reduce_ || !completed) return;
  while (next_to_launch_ < num_buckets() && buckets_[next_to_launch_].pending == 0) launch(next_to_launch_++);
}

void GradBuckets::launch(int b) {
  if (observer_) observer_("launch", b, params_pending_);
  if (comm_.world_size() == 1) return;
  Bucket& bucket = buckets_[b];
  const int64_t len = bucket.end - bucket.begin;
  if (!scatter_) {
    bucket.work.push_back(comm_.all_reduce(grads_.narrow(0, bucket.begin, len), ReduceOp::kSum));
    return;
  }
  // Chunk `rank` of the bucket, summed over ranks: written over this rank's piece by the step's
  // first reduction, added to it by later micro-steps' (after the wait, complete()).
  Staging& s = staging_for(b);
  const int64_t n = len / layout_.world_size;
  s.add = !first_reduce_;
  auto out = s.add ? s.out.narrow(0, 0, n) : grads_.narrow(0, bucket.local, n);
  s.work = comm_.reduce_scatter(out, s.in.narrow(0, 0, len), ReduceOp::kSum);
  s.filling = -1;
  s.reducing = b;
  s.order = launches_++;
}

void GradBuckets::launch_rest() {
  if (!scatter_) zero_missing();
  while (next_to_launch_ < num_buckets()) {
    if (scatter_) zero_missing_in(next_to_launch_);
    launch(next_to_launch_++);
  }
  if (scatter_) first_reduce_ = false;
  backward_open_ = false;
}

void GradBuckets::finish() {
  GPT2_ASSERT(reduce_, "finish() after a backward that was not prepared with reduce = true");
  // Parameters that got no gradient never fired their hook: their slots still hold the last
  // step's values, so zero them, then reduce their buckets now, still in index order, so every
  // rank issues the same sequence.
  if (backward_open_) launch_rest();
  std::vector<Staging*> in_flight;
  for (Staging& s : staging_) {
    if (s.reducing >= 0) in_flight.push_back(&s);
  }
  std::sort(in_flight.begin(), in_flight.end(), [](const Staging* a, const Staging* b) { return a->order < b->order; });
  for (Staging* s : in_flight) complete(*s);
  for (auto& b : buckets_) {
    for (auto& w : b.work) w->wait();
    b.work.clear();
  }
  reduce_ = false;
}

}  // namespace gpt2::parallel
