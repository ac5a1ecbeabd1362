#include "optim/sharded_adamw.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#ifdef GPT2_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#endif

#include <algorithm>
#include <utility>

#include "optim/cpu_adamw.h"
#include "optim/grad_norm.h"
#include "src/base/errors.h"
#ifdef GPT2_WITH_CUDA
#include "src/base/cuda_check.h"
#endif

namespace gpt2::optim {
namespace {

std::vector<MomentLayout::Param> moment_params(const std::vector<torch::Tensor>& params,
                                               const parallel::FlatLayout& layout) {
  std::vector<MomentLayout::Param> out;
  for (size_t i = 0; i < params.size(); ++i) out.push_back({layout.offset[i], layout.numel[i], params[i].dim() >= 2});
  return out;
}

MomentBuffers buffers_of(const at::Tensor& m_codes, const at::Tensor& v_codes, const at::Tensor& m_absmax,
                         const at::Tensor& v_absmax, const at::Tensor& m32, const at::Tensor& v32) {
  MomentBuffers mb;
  mb.exp_avg_codes = m_codes.data_ptr<uint8_t>();
  mb.exp_avg_sq_codes = v_codes.data_ptr<uint8_t>();
  mb.exp_avg_absmax = m_absmax.data_ptr<float>();
  mb.exp_avg_sq_absmax = v_absmax.data_ptr<float>();
  mb.exp_avg = m32.data_ptr<float>();
  mb.exp_avg_sq = v32.data_ptr<float>();
  return mb;
}

HostGradType host_grad_type(at::ScalarType t) {
  return t == at::kFloat ? HostGradType::kFloat32 : HostGradType::kBFloat16;
}

// `bytes` bytes from the host as a uint8 tensor where `options` says (the GPU kernel's block list
// and quantization tables).
at::Tensor bytes_on(const void* data, size_t bytes, const at::TensorOptions& options) {
  const auto n = static_cast<int64_t>(bytes);
  auto out = at::empty({n}, options.dtype(at::kByte));
  out.copy_(at::from_blob(const_cast<void*>(data), {n}, at::kByte));
  return out;
}

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }

// Shards are whole cells of the layout's grid, so whole quantization blocks.
static_assert(parallel::FlatLayout::kGrid % kQuantBlock == 0, "the flat grid must hold whole quantization blocks");

#ifdef GPT2_WITH_CUDA
constexpr bool kHaveKernel = true;
#else
constexpr bool kHaveKernel = false;
#endif

}  // namespace

ShardedAdamW::ShardedAdamW(const std::vector<torch::Tensor>& params, const parallel::FlatLayout& layout,
                           const torch::Tensor& grad_flat, parallel::Communicator& comm, Options options)
    : comm_(comm),
      options_(options),
      sharded_(options.sharded && comm.world_size() > 1),
      kernel_update_(kernel_update(grad_flat.device(), options.offload)),
      moment_layout_(moment_params(params, layout)) {
  GPT2_ASSERT(grad_flat.numel() == layout.padded, "gradient buffer does not match the layout");
  if (grad_flat.is_cuda() && !kHaveKernel) {
    throw Error("this build of gpt2-dist has no CUDA kernels (no nvcc when it was configured): it cannot update "
                "CUDA parameters; rebuild with the CUDA toolkit");
  }
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
  const at::ScalarType g = grad_flat.scalar_type();
  if (options.moments_8bit) {
    GPT2_ASSERT(begin_ % kQuantBlock == 0 && (end_ % kQuantBlock == 0 || end_ >= layout.total),
                "8-bit moments need shards of whole quantization blocks (FlatLayout's shard_multiple)");
    blocks_ = moment_layout_.blocks(begin_, end_);
    const int64_t num_absmax = moment_layout_.absmax_before(end_) - moment_layout_.absmax_before(begin_);
    const int64_t num_fp32 = moment_layout_.fp32_before(end_) - moment_layout_.fp32_before(begin_);
    auto where = options.offload ? at::TensorOptions().device(at::kCPU).pinned_memory(param_flat_.is_cuda())
                                 : param_flat_.options();
    codes_m_ = at::zeros({n}, where.dtype(at::kByte));
    codes_v_ = at::zeros({n}, where.dtype(at::kByte));
    absmax_m_ = at::zeros({num_absmax}, where.dtype(at::kFloat));
    absmax_v_ = at::zeros({num_absmax}, where.dtype(at::kFloat));
    m32_ = at::zeros({num_fp32}, where.dtype(at::kFloat));
    v32_ = at::zeros({num_fp32}, where.dtype(at::kFloat));
    if (kernel_update_) {
      upload_blocks();
      tables_device_ = bytes_on(&quant_tables(), sizeof(QuantTables), param_flat_.options());
    }
  }

  if (options.offload) {
    GPT2_ASSERT(g == at::kFloat || g == at::kBFloat16, "offload takes fp32 or bf16 gradients");
    const auto host = at::TensorOptions().device(at::kCPU).pinned_memory(param_flat_.is_cuda());
    master_ = at::empty({n}, host.dtype(at::kFloat));
    master_.copy_(param_shard_);
    if (!options.moments_8bit) {
      host_m_ = at::zeros({n}, host.dtype(at::kFloat));
      host_v_ = at::zeros({n}, host.dtype(at::kFloat));
    }
    host_grad_ = at::empty({n}, host.dtype(g));
    // bf16 parameters come back as bf16 (half the bytes over the bus); others from the master.
    if (param_flat_.scalar_type() == at::kBFloat16) host_param_out_ = at::empty({n}, host.dtype(at::kBFloat16));
    pool_ = std::make_unique<HostThreadPool>(options.host_threads);
    return;
  }

  // Both moment formats: one pass over the shard's blocks (step_blocks) with fp32 master weights for
  // the shard when the parameters are 16-bit; it reads fp32 and bf16 gradients as they are, others
  // (fp16) through an fp32 copy.
  if (low_precision) master_ = param_shard_.to(at::kFloat);
  GPT2_ASSERT((low_precision ? master_ : param_shard_).scalar_type() == at::kFloat,
              "the optimizer updates fp32 parameters or fp32 masters");
  if (g != at::kFloat && g != at::kBFloat16) grad32_ = at::empty({n}, param_flat_.options().dtype(at::kFloat));
  if (options.moments_8bit) return;
  // fp32 moments: dense blocks over m_ and v_.
  m_ = at::zeros({n}, param_flat_.options().dtype(at::kFloat));
  v_ = at::zeros({n}, param_flat_.options().dtype(at::kFloat));
  std::vector<ParamSpan> spans;
  for (const Segment& s : segments_) spans.push_back({s.begin, s.end, s.weight_decay != 0});
  blocks_ = dense_fp32_blocks(spans);
  if (kernel_update_) upload_blocks();
}

ShardedAdamW::~ShardedAdamW() = default;

bool ShardedAdamW::kernel_update(const torch::Device& device, bool offload) {
  return kHaveKernel && device.is_cuda() && !offload;
}

void ShardedAdamW::upload_blocks() {
  blocks_device_ = bytes_on(blocks_.data(), blocks_.size() * sizeof(MomentBlock), param_flat_.options());
}

torch::Tensor ShardedAdamW::clip_grad_norm(double max_norm) {
  at::NoGradGuard no_grad;
  // Note [Partition-free arithmetic]: each cell's sum of squares, then all cells' in flat order.
  auto cells = block_sum_squares(grad_shard_, parallel::FlatLayout::kGrid);
  if (sharded_) {
    auto all = at::empty({cells.numel() * comm_.world_size()}, cells.options());
    comm_.all_gather(all, cells)->wait();
    cells = all;
  }
  auto norm = ordered_sum(cells).sqrt();
  clip_coef_ = torch::Tensor();
  if (max_norm <= 0) return norm;
  auto coef = (max_norm / (norm + 1e-6)).clamp_max(1.0);
  if (kernel_update_) {
    // The kernel multiplies each gradient by it as it reads it, in fp32: the pass over the
    // gradient that mul_ costs is saved, and a bf16 gradient is not rounded to bf16 once more.
    clip_coef_ = coef.to(at::kFloat).reshape({1});
  } else {
    grad_shard_.mul_(coef.to(grad_shard_.scalar_type()));
  }
  return norm;
}

void ShardedAdamW::step(double lr, const torch::Tensor& found_inf) {
  at::NoGradGuard no_grad;
  if (options_.offload) {
    step_on_host(lr, found_inf);
  } else {
    step_blocks(lr, found_inf);
  }
}

CpuAdamWStep ShardedAdamW::host_step(double lr) const {
  CpuAdamWStep st;
  st.lr = lr;
  st.beta1 = options_.adamw.beta1;
  st.beta2 = options_.adamw.beta2;
  st.eps = options_.adamw.eps;
  st.weight_decay = options_.weight_decay;
  st.step = steps_;
  return st;
}

MomentBuffers ShardedAdamW::moment_buffers() const {
  if (options_.moments_8bit) return buffers_of(codes_m_, codes_v_, absmax_m_, absmax_v_, m32_, v32_);
  MomentBuffers mb;  // dense fp32 moments: a block's are at its state = begin
  mb.exp_avg = m_.data_ptr<float>();
  mb.exp_avg_sq = v_.data_ptr<float>();
  return mb;
}

MomentBuffers ShardedAdamW::ShardState::moment_buffers() const {
  return buffers_of(exp_avg_codes, exp_avg_sq_codes, exp_avg_absmax, exp_avg_sq_absmax, exp_avg, exp_avg_sq);
}

// One pass over the shard's blocks (8-bit or fp32 moments, on either device) that reads the
// gradient as it is, times the clip coefficient on the GPU, and writes the fp32 master and the bf16
// parameters.
void ShardedAdamW::step_blocks(double lr, const torch::Tensor& found_inf) {
  const torch::Tensor clip = std::exchange(clip_coef_, torch::Tensor());  // this step's only
  if (found_inf.defined() && found_inf.item<float>() != 0) return;  // fp16 overflow: skip (host sync)
  ++steps_;
  const CpuAdamWStep st = host_step(lr);
  if (grad32_.defined()) grad32_.copy_(grad_shard_);
  const at::Tensor& grads = grad32_.defined() ? grad32_ : grad_shard_;
  const HostGradType grad_type = host_grad_type(grads.scalar_type());
  float* param = (master_.defined() ? master_ : param_shard_).data_ptr<float>();
  const bool bf16 = param_shard_.scalar_type() == at::kBFloat16;
  auto* param_bf16 = bf16 ? static_cast<uint16_t*>(param_shard_.data_ptr()) : nullptr;
  const MomentBuffers mb = moment_buffers();
  if (param_flat_.is_cuda()) {
#ifdef GPT2_WITH_CUDA
    Adamw8bitArgs a;
    a.tables = tables_device_.defined() ? reinterpret_cast<const QuantTables*>(tables_device_.data_ptr<uint8_t>())
                                        : nullptr;  // fp32 moments: no 8-bit block
    a.c = adamw_coeffs(st);
    a.blocks = reinterpret_cast<const MomentBlock*>(blocks_device_.data_ptr<uint8_t>());
    a.num_blocks = static_cast<int64_t>(blocks_.size());
    a.param = param;
    a.moments = mb;
    a.grad = grads.data_ptr();
    a.grad_type = grad_type;
    a.param_bf16 = param_bf16;
    a.grad_scale_device = clip.defined() ? clip.data_ptr<float>() : nullptr;
    CUDA_CHECK(launch_adamw_8bit(a, at::cuda::getCurrentCUDAStream(param_flat_.device().index()).stream()));
#endif
  } else {  // CPU: the gradient was clipped in place; blocks are independent, so any split gives the same bits
    at::parallel_for(0, static_cast<int64_t>(blocks_.size()), 16, [&](int64_t b, int64_t e) {
      cpu_adamw_update_8bit(st, blocks_.data() + b, e - b, param, mb, grads.data_ptr(), grad_type, param_bf16);
    });
  }
  if (master_.defined() && !bf16) param_shard_.copy_(master_);  // fp16 parameters: round the masters
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
  ++steps_;
  const int64_t n = end_ - begin_;
  // 8-bit: chunks of whole quantization blocks (the shard starts on the grid).
  const int64_t unit = options_.moments_8bit ? kQuantBlock : 1;
  const int64_t chunk = std::max<int64_t>((options_.chunk_elements + unit - 1) / unit * unit, unit);
  const int64_t num_chunks = (n + chunk - 1) / chunk;
  const HostGradType grad_type = host_grad_type(host_grad_.scalar_type());
  const size_t grad_bytes = host_grad_.element_size();
  const CpuAdamWStep st = host_step(lr);
  auto* param = master_.data_ptr<float>();
  auto* grad = static_cast<const char*>(host_grad_.data_ptr());
  auto* out = host_param_out_.defined() ? static_cast<uint16_t*>(host_param_out_.data_ptr()) : nullptr;
  const at::Tensor& param_source = host_param_out_.defined() ? host_param_out_ : master_;

  auto update_chunk = [&](int64_t c0, int64_t c1) {
    if (options_.moments_8bit) {  // the blocks that begin in the chunk, split across the pool
      const auto first = static_cast<int64_t>(first_block_at(blocks_, c0));
      const auto last = static_cast<int64_t>(first_block_at(blocks_, c1));
      const MomentBuffers mb = moment_buffers();
      pool_->parallel_for(last - first, 1, [&](int64_t b, int64_t e) {
        cpu_adamw_update_8bit(st, blocks_.data() + first + b, e - b, param, mb, grad, grad_type, out);
      });
      return;
    }
    float* m = host_m_.data_ptr<float>();
    float* v = host_v_.data_ptr<float>();
    pool_->parallel_for(c1 - c0, 64, [&](int64_t b, int64_t e) {
      b += c0;
      e += c0;
      for (const Segment& s : segments_) {
        const int64_t lo = std::max(b, s.begin), hi = std::min(e, s.end);
        if (lo >= hi) continue;
        CpuAdamWStep seg = st;
        seg.weight_decay = s.weight_decay;
        cpu_adamw_update(seg, hi - lo, param + lo, m + lo, v + lo, grad + lo * grad_bytes, grad_type,
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

ShardedAdamW::ShardState ShardedAdamW::state() const { return state(begin_, end_); }

ShardedAdamW::ShardState ShardedAdamW::state(int64_t begin, int64_t end) const {
  at::NoGradGuard no_grad;
  GPT2_ASSERT(begin_ <= begin && begin <= end && end <= end_, "state(): the range is not in this rank's shard");
  const int64_t from = begin - begin_, n = end - begin;
  auto cpu = [](const at::Tensor& t, int64_t at, int64_t len) {
    return t.narrow(0, at, len).to(at::kCPU, t.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
  };
  ShardState s;
  s.moments_8bit = options_.moments_8bit;
  s.master = cpu(master_.defined() ? master_ : param_shard_, from, n).to(at::kFloat);
  s.adam_step = steps_;
  if (!options_.moments_8bit) {
    s.exp_avg = cpu(options_.offload ? host_m_ : m_, from, n);
    s.exp_avg_sq = cpu(options_.offload ? host_v_ : v_, from, n);
    return s;
  }
  const MomentLayout& ml = moment_layout_;
  const int64_t a0 = ml.absmax_before(begin) - ml.absmax_before(begin_), a1 = ml.absmax_before(end) - ml.absmax_before(begin_);
  const int64_t f0 = ml.fp32_before(begin) - ml.fp32_before(begin_), f1 = ml.fp32_before(end) - ml.fp32_before(begin_);
  s.exp_avg_codes = cpu(codes_m_, from, n);
  s.exp_avg_sq_codes = cpu(codes_v_, from, n);
  s.exp_avg_absmax = cpu(absmax_m_, a0, a1 - a0);
  s.exp_avg_sq_absmax = cpu(absmax_v_, a0, a1 - a0);
  s.exp_avg = cpu(m32_, f0, f1 - f0);
  s.exp_avg_sq = cpu(v32_, f0, f1 - f0);
  return s;
}

void ShardedAdamW::load_state(const ShardState& s) {
  at::NoGradGuard no_grad;
  const int64_t n = end_ - begin_;
  GPT2_ASSERT(s.moments_8bit == options_.moments_8bit, "optimizer state has the other moment format");
  GPT2_ASSERT(s.master.numel() == n, "optimizer state does not match this rank's shard");
  if (master_.defined()) master_.copy_(s.master);
  param_shard_.copy_(s.master);
  if (options_.moments_8bit) {
    const std::pair<torch::Tensor*, const torch::Tensor*> parts[] = {
        {&codes_m_, &s.exp_avg_codes}, {&codes_v_, &s.exp_avg_sq_codes}, {&absmax_m_, &s.exp_avg_absmax},
        {&absmax_v_, &s.exp_avg_sq_absmax}, {&m32_, &s.exp_avg}, {&v32_, &s.exp_avg_sq}};
    for (const auto& [mine, saved] : parts) {
      GPT2_ASSERT(saved->numel() == mine->numel(), "8-bit optimizer state does not match this rank's shard");
      mine->copy_(*saved);
    }
    steps_ = s.adam_step;
    return;
  }
  GPT2_ASSERT(s.exp_avg.numel() == n && s.exp_avg_sq.numel() == n, "optimizer state does not match this rank's shard");
  if (options_.offload) {
    host_m_.copy_(s.exp_avg);
    host_v_.copy_(s.exp_avg_sq);
    steps_ = s.adam_step;
    return;
  }
  m_.copy_(s.exp_avg);
  v_.copy_(s.exp_avg_sq);
  steps_ = s.adam_step;
}

int64_t ShardedAdamW::state_bytes() const {
  if (options_.offload) return 0;
  int64_t bytes = bytes_of(m_) + bytes_of(v_);
  for (const auto* t : {&master_, &grad32_, &codes_m_, &codes_v_, &absmax_m_, &absmax_v_, &m32_, &v32_, &blocks_device_, &tables_device_}) {
    bytes += bytes_of(*t);
  }
  return bytes;
}

int64_t ShardedAdamW::host_state_bytes() const {
  if (!options_.offload) return 0;
  int64_t bytes = 0;
  for (const auto* t : {&master_, &host_m_, &host_v_, &host_grad_, &host_param_out_, &codes_m_, &codes_v_, &absmax_m_,
                        &absmax_v_, &m32_, &v32_}) {
    bytes += bytes_of(*t);
  }
  return bytes;
}

int64_t ShardedAdamW::host_bytes_for(int64_t n, at::ScalarType param_dtype, at::ScalarType grad_dtype,
                                     bool moments_8bit) {
  // master + moments (fp32: 8 bytes; 8-bit: 2 bytes of codes and an absmax pair per block) +
  // gradient copy + bf16 parameter staging. The small parameters' fp32 moments are left out.
  const int64_t moments = moments_8bit ? 2 * n + 8 * ((n + kQuantBlock - 1) / kQuantBlock) : 8 * n;
  return 4 * n + moments + n * (static_cast<int64_t>(c10::elementSize(grad_dtype)) + (param_dtype == at::kBFloat16 ? 2 : 0));
}

}  // namespace gpt2::optim
