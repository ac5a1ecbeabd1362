#include "optim/sharded_adamw.h"

#include <ATen/ATen.h>
#ifdef GPT2_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#endif

#include <algorithm>

#include "optim/cpu_adamw.h"
#include "src/base/errors.h"

namespace gpt2::optim {

ShardedAdamW::ShardedAdamW(const std::vector<torch::Tensor>& params, const parallel::FlatLayout& layout,
                           const torch::Tensor& grad_flat, parallel::Communicator& comm, Options options)
    : comm_(comm), options_(options), sharded_(options.sharded && comm.world_size() > 1) {
  GPT2_ASSERT(grad_flat.numel() == layout.padded, "gradient buffer does not match the layout");
  begin_ = sharded_ ? layout.shard_begin(comm.rank()) : 0;
  end_ = sharded_ ? layout.shard_end(comm.rank()) : layout.padded;
  const int64_t n = end_ - begin_;
  // Parameters move into one flat buffer so the shards can be all-gathered in place.
  param_flat_ = at::zeros({layout.padded}, params.front().options().requires_grad(false));
  {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      auto view = param_flat_.narrow(0, layout.offset[i], layout.numel[i]).view(params[i].sizes());
      view.copy_(params[i]);
      auto p = params[i];
      p.set_data(view);
    }
  }
  param_shard_ = param_flat_.narrow(0, begin_, n);
  grad_shard_ = grad_flat.narrow(0, begin_, n);
  for (int i : layout.order) {
    const int64_t lo = std::max(begin_, layout.offset[i]);
    const int64_t hi = std::min(end_, layout.offset[i] + layout.numel[i]);
    // GPT-2: decay matmuls and embeddings only.
    if (lo < hi) segments_.push_back({lo - begin_, hi - begin_, params[i].dim() >= 2 ? options.weight_decay : 0.0});
  }
  const bool low_precision = param_flat_.scalar_type() != at::kFloat;

  if (options.offload) {
    const at::ScalarType g = grad_flat.scalar_type();
    GPT2_ASSERT(g == at::kFloat || g == at::kBFloat16, "offload takes fp32 or bf16 gradients");
    const auto host = at::TensorOptions().device(at::kCPU).pinned_memory(param_flat_.is_cuda());
    master_ = at::empty({n}, host.dtype(at::kFloat));
    master_.copy_(param_shard_);
    host_m_ = at::zeros({n}, host.dtype(at::kFloat));
    host_v_ = at::zeros({n}, host.dtype(at::kFloat));
    host_grad_ = at::empty({n}, host.dtype(g));
    // bf16 parameters come back as bf16 (half the bytes over the bus); others from the master.
    if (param_flat_.scalar_type() == at::kBFloat16) host_param_out_ = at::empty({n}, host.dtype(at::kBFloat16));
    pool_ = std::make_unique<HostThreadPool>(options.host_threads);
    return;
  }

  AdamW::Group decay, no_decay;
  decay.weight_decay = options.weight_decay;
  if (low_precision) {
    master_ = param_shard_.to(at::kFloat);  // fp32 master weights for the shard
    if (grad_flat.scalar_type() != at::kFloat) grad32_ = at::empty({n}, master_.options());
  }
  const at::Tensor& update = low_precision ? master_ : param_shard_;
  const at::Tensor& grads = grad32_.defined() ? grad32_ : grad_shard_;
  m_ = at::zeros({n}, update.options().dtype(at::kFloat));
  v_ = at::zeros({n}, update.options().dtype(at::kFloat));
  for (const Segment& s : segments_) {
    auto& group = s.weight_decay != 0 ? decay : no_decay;
    group.params.push_back(update.narrow(0, s.begin, s.end - s.begin));
    group.grads.push_back(grads.narrow(0, s.begin, s.end - s.begin));
    group.exp_avg.push_back(m_.narrow(0, s.begin, s.end - s.begin));
    group.exp_avg_sq.push_back(v_.narrow(0, s.begin, s.end - s.begin));
  }
  adamw_ = std::make_unique<AdamW>(std::vector<AdamW::Group>{decay, no_decay}, options.adamw);
}

ShardedAdamW::~ShardedAdamW() = default;

torch::Tensor ShardedAdamW::clip_grad_norm(double max_norm) {
  at::NoGradGuard no_grad;
  const auto acc = at::promote_types(grad_shard_.scalar_type(), at::kFloat);
  // A reduction in acc without a full-size temporary (a .to(acc).pow(2) copy of a 1.5B-element
  // shard is 6 GiB of peak memory).
  auto local = at::linalg_vector_norm(grad_shard_, 2, c10::nullopt, /*keepdim=*/false, acc);
  auto sum_sq = (local * local).reshape({1});
  if (sharded_) comm_.all_reduce(sum_sq, parallel::ReduceOp::kSum)->wait();
  auto norm = sum_sq.sqrt().reshape({});
  if (max_norm > 0) grad_shard_.mul_((max_norm / (norm + 1e-6)).clamp_max(1.0).to(grad_shard_.scalar_type()));
  return norm;
}

void ShardedAdamW::step(double lr, const torch::Tensor& found_inf) {
  at::NoGradGuard no_grad;
  if (options_.offload) {
    step_on_host(lr, found_inf);
  } else {
    step_on_device(lr, found_inf);
  }
}

void ShardedAdamW::step_on_device(double lr, const torch::Tensor& found_inf) {
  if (grad32_.defined()) grad32_.copy_(grad_shard_);
  adamw_->step(lr, found_inf);
  if (master_.defined()) param_shard_.copy_(master_);  // round the masters into the compute copy
}

// Note [Offload pipeline]
// The shard is cut into chunks. The gradient chunks are copied to pinned host memory on one
// stream, each followed by an event; the host waits for chunk k's event, updates it on the pool,
// and queues its parameters for the device on a second stream, while later gradient chunks are
// still in flight and earlier parameter chunks already travel back. The compute stream waits for
// the last parameter copy, so the next forward sees the update. Gradients are final when step()
// starts (unscaled and clipped on the device), so the host applies them as they are.
void ShardedAdamW::step_on_host(double lr, const torch::Tensor& found_inf) {
  if (found_inf.defined() && found_inf.item<float>() != 0) return;  // fp16 overflow: skip (host sync)
  ++host_steps_;
  const int64_t n = end_ - begin_;
  const int64_t chunk = std::max<int64_t>(options_.chunk_elements, 1);
  const int64_t num_chunks = (n + chunk - 1) / chunk;
  const HostGradType grad_type = host_grad_.scalar_type() == at::kFloat ? HostGradType::kFloat32 : HostGradType::kBFloat16;
  const size_t grad_bytes = host_grad_.element_size();
  auto* param = master_.data_ptr<float>();
  auto* m = host_m_.data_ptr<float>();
  auto* v = host_v_.data_ptr<float>();
  auto* grad = static_cast<const char*>(host_grad_.data_ptr());
  auto* out = host_param_out_.defined() ? static_cast<uint16_t*>(host_param_out_.data_ptr()) : nullptr;
  const at::Tensor& param_source = host_param_out_.defined() ? host_param_out_ : master_;

  auto update_chunk = [&](int64_t c0, int64_t c1) {
    pool_->parallel_for(c1 - c0, 64, [&](int64_t b, int64_t e) {
      b += c0;
      e += c0;
      for (const Segment& s : segments_) {
        const int64_t lo = std::max(b, s.begin), hi = std::min(e, s.end);
        if (lo >= hi) continue;
        CpuAdamWStep st;
        st.lr = lr;
        st.beta1 = options_.adamw.beta1;
        st.beta2 = options_.adamw.beta2;
        st.eps = options_.adamw.eps;
        st.weight_decay = s.weight_decay;
        st.step = host_steps_;
        cpu_adamw_update(st, hi - lo, param + lo, m + lo, v + lo, grad + lo * grad_bytes, grad_type,
                         out != nullptr ? out + lo : nullptr);
      }
    });
  };

#ifdef GPT2_WITH_CUDA
  if (param_flat_.is_cuda()) {
    const auto device = param_flat_.device().index();
    auto d2h = at::cuda::getStreamFromPool(/*isHighPriority=*/false, device);
    auto h2d = at::cuda::getStreamFromPool(/*isHighPriority=*/false, device);
    at::cuda::CUDAEvent grads_final;
    grads_final.record(at::cuda::getCurrentCUDAStream(device));
    std::vector<at::cuda::CUDAEvent> landed(static_cast<size_t>(num_chunks));
    {
      c10::cuda::CUDAStreamGuard guard(d2h);
      grads_final.block(d2h);
      for (int64_t k = 0; k < num_chunks; ++k) {
        const int64_t c0 = k * chunk, len = std::min(chunk, n - c0);
        host_grad_.narrow(0, c0, len).copy_(grad_shard_.narrow(0, c0, len), /*non_blocking=*/true);
        landed[static_cast<size_t>(k)].record(d2h);
      }
    }
    for (int64_t k = 0; k < num_chunks; ++k) {
      const int64_t c0 = k * chunk, len = std::min(chunk, n - c0);
      landed[static_cast<size_t>(k)].synchronize();
      update_chunk(c0, c0 + len);
      c10::cuda::CUDAStreamGuard guard(h2d);
      param_shard_.narrow(0, c0, len).copy_(param_source.narrow(0, c0, len), /*non_blocking=*/true);
    }
    at::cuda::CUDAEvent params_back;
    params_back.record(h2d);
    params_back.block(at::cuda::getCurrentCUDAStream(device));
    return;
  }
#endif
  host_grad_.copy_(grad_shard_);
  for (int64_t c0 = 0; c0 < n; c0 += chunk) {
    const int64_t len = std::min(chunk, n - c0);
    update_chunk(c0, c0 + len);
    param_shard_.narrow(0, c0, len).copy_(param_source.narrow(0, c0, len));
  }
}

void ShardedAdamW::gather() {
  if (!sharded_) return;
  comm_.all_gather(param_flat_, param_shard_)->wait();
}

ShardedAdamW::ShardState ShardedAdamW::state() const {
  at::NoGradGuard no_grad;
  auto cpu32 = [](const at::Tensor& t) { return t.to(at::kCPU, at::kFloat, /*non_blocking=*/false, /*copy=*/true); };
  ShardState s;
  if (options_.offload) {
    s.master = cpu32(master_);
    s.exp_avg = cpu32(host_m_);
    s.exp_avg_sq = cpu32(host_v_);
    s.adam_step = host_steps_;
  } else {
    s.master = cpu32(master_.defined() ? master_ : param_shard_);
    s.exp_avg = cpu32(m_);
    s.exp_avg_sq = cpu32(v_);
    s.adam_step = adamw_->adam_step();
  }
  return s;
}

void ShardedAdamW::load_state(const ShardState& s) {
  at::NoGradGuard no_grad;
  const int64_t n = end_ - begin_;
  GPT2_ASSERT(s.master.numel() == n && s.exp_avg.numel() == n && s.exp_avg_sq.numel() == n,
              "optimizer state does not match this rank's shard");
  if (options_.offload) {
    master_.copy_(s.master);
    host_m_.copy_(s.exp_avg);
    host_v_.copy_(s.exp_avg_sq);
    host_steps_ = s.adam_step;
    param_shard_.copy_(s.master);
    return;
  }
  if (master_.defined()) master_.copy_(s.master);
  param_shard_.copy_(s.master);
  m_.copy_(s.exp_avg);
  v_.copy_(s.exp_avg_sq);
  adamw_->set_adam_step(s.adam_step);
}

int64_t ShardedAdamW::state_bytes() const {
  if (options_.offload) return 0;
  int64_t bytes = adamw_->state_bytes();
  if (master_.defined()) bytes += master_.nbytes();
  if (grad32_.defined()) bytes += grad32_.nbytes();
  return bytes;
}

int64_t ShardedAdamW::host_state_bytes() const {
  int64_t bytes = 0;
  for (const auto* t : {&master_, &host_m_, &host_v_, &host_grad_, &host_param_out_}) {
    if (options_.offload && t->defined()) bytes += static_cast<int64_t>(t->nbytes());
  }
  return bytes;
}

int64_t ShardedAdamW::host_bytes_for(int64_t n, at::ScalarType param_dtype, at::ScalarType grad_dtype) {
  return n * (3 * 4 + static_cast<int64_t>(c10::elementSize(grad_dtype)) + (param_dtype == at::kBFloat16 ? 2 : 0));
}

}  // namespace gpt2::optim
