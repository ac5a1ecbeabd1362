#include "optim/adamw_updates.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#ifdef GPT2_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#endif

#include <algorithm>
#include <utility>

#include "optim/adamw_step.h"
#include "src/base/errors.h"
#ifdef GPT2_WITH_CUDA
#include "src/base/cuda_check.h"
#endif

namespace gpt2::optim {
namespace {

#ifdef GPT2_WITH_CUDA
constexpr bool kHaveKernel = true;
#else
constexpr bool kHaveKernel = false;
#endif

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

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }

at::Tensor cpu_copy(const at::Tensor& t, int64_t at, int64_t len) {
  return t.narrow(0, at, len).to(at::kCPU, t.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
}

HostGradType host_grad_type(at::ScalarType t) {
  return t == at::kFloat ? HostGradType::kFloat32 : HostGradType::kBFloat16;
}

CpuAdamWStep step_constants(const AdamWOptions& o, const StepArgs& args) {
  CpuAdamWStep st;
  st.lr = args.lr;
  st.beta1 = o.beta1;
  st.beta2 = o.beta2;
  st.eps = o.eps;
  st.weight_decay = o.weight_decay;
  st.step = args.step;
  return st;
}

// `bytes` bytes from the host as a uint8 tensor where `options` says (the GPU kernel's block list
// and quantization tables).
at::Tensor bytes_on(const void* data, size_t bytes, const at::TensorOptions& options) {
  const auto n = static_cast<int64_t>(bytes);
  auto out = at::empty({n}, options.dtype(at::kByte));
  out.copy_(at::from_blob(const_cast<void*>(data), {n}, at::kByte));
  return out;
}

// The checkpoint form of the flat range [begin, end) inside one piece of `shard`: its fp32 values
// from `masters` (fp32 masters, or the fp32 parameters themselves) and its moments.
ShardState state_of(const at::Tensor& masters, const ShardView& shard, int64_t begin, int64_t end,
                    const AdamWMoments& moments) {
  ShardState s;
  s.moments_8bit = moments.is_8bit();
  s.master = cpu_copy(masters, locate(shard.pieces, begin, end).local, end - begin).to(at::kFloat);
  moments.copy_out(begin, end, &s);
  return s;
}

// The state both in-place updates keep beside the parameters: fp32 masters when the parameters are
// 16-bit, an fp32 copy of a gradient the step cannot read as it is (fp16), and the moments.
class ResidentAdamW : public ShardUpdate {
 public:
  ResidentAdamW(const ShardView& shard, const AdamWOptions& options)
      : shard_(shard), options_(options), moments_(shard, options.moments_8bit, shard.params.options()) {
    const int64_t n = shard.numel();
    if (shard.params.scalar_type() != at::kFloat) master_ = shard.params.to(at::kFloat);
    const at::ScalarType g = shard.grads.scalar_type();
    if (g != at::kFloat && g != at::kBFloat16) grad32_ = at::empty({n}, shard.params.options().dtype(at::kFloat));
  }
  int64_t device_bytes() const override { return bytes_of(master_) + bytes_of(grad32_) + moments_.bytes(); }
  int64_t host_bytes() const override { return 0; }
  torch::Tensor device_masters() const override { return master_; }
  ShardState state(int64_t begin, int64_t end) const override {
    return state_of(master_.defined() ? master_ : shard_.params, shard_, begin, end, moments_);
  }
  void load_state(const ShardState& s) override {
    if (master_.defined()) master_.copy_(s.master);
    moments_.load(s);
  }

 protected:
  // What the AdamW step reads and writes: the fp32 values it updates (masters or the parameters),
  // the gradient as it can read it, and the bf16 parameters it also writes.
  struct Operands {
    float* param;
    const at::Tensor* grads;
    uint16_t* param_bf16;
  };
  Operands operands() {
    if (grad32_.defined()) grad32_.copy_(shard_.grads);
    const bool bf16 = shard_.params.scalar_type() == at::kBFloat16;
    return {(master_.defined() ? master_ : shard_.params).data_ptr<float>(),
            grad32_.defined() ? &grad32_ : &shard_.grads,
            bf16 ? static_cast<uint16_t*>(shard_.params.data_ptr()) : nullptr};
  }
  // fp16 parameters take the rounded masters after the step (bf16 ones the step wrote itself).
  void round_into_fp16_params() {
    if (master_.defined() && shard_.params.scalar_type() == at::kHalf) shard_.params.copy_(master_);
  }

  ShardView shard_;
  AdamWOptions options_;
  AdamWMoments moments_;
  torch::Tensor master_, grad32_;
};

#ifdef GPT2_WITH_CUDA
class GpuAdamW final : public ResidentAdamW {
 public:
  GpuAdamW(const ShardView& shard, const AdamWOptions& options) : ResidentAdamW(shard, options) {
    const auto& blocks = moments_.blocks();
    blocks_device_ = bytes_on(blocks.data(), blocks.size() * sizeof(MomentBlock), shard.params.options());
    if (options.moments_8bit) tables_device_ = bytes_on(&quant_tables(), sizeof(QuantTables), shard.params.options());
  }
  bool clips_as_it_reads() const override { return true; }
  int64_t device_bytes() const override {
    return ResidentAdamW::device_bytes() + bytes_of(blocks_device_) + bytes_of(tables_device_);
  }
  void step(const StepArgs& args) override {
    const Operands op = operands();
    AdamWStepArgs a;
    a.tables = tables_device_.defined() ? reinterpret_cast<const QuantTables*>(tables_device_.data_ptr<uint8_t>())
                                        : nullptr;  // fp32 moments: no 8-bit block
    a.c = adamw_coeffs(step_constants(options_, args));
    a.blocks = reinterpret_cast<const MomentBlock*>(blocks_device_.data_ptr<uint8_t>());
    a.num_blocks = static_cast<int64_t>(moments_.blocks().size());
    a.param = op.param;
    a.moments = moments_.buffers();
    a.grad = op.grads->data_ptr();
    a.grad_type = host_grad_type(op.grads->scalar_type());
    a.param_bf16 = op.param_bf16;
    a.grad_scale_device = args.clip_coef.defined() ? args.clip_coef.data_ptr<float>() : nullptr;
    CUDA_CHECK(adamw_step_gpu(a, at::cuda::getCurrentCUDAStream(shard_.params.device().index()).stream()));
    round_into_fp16_params();
  }

 private:
  torch::Tensor blocks_device_, tables_device_;  // the block list and quant_tables() as bytes on the GPU
};
#endif

class CpuAdamW final : public ResidentAdamW {
 public:
  using ResidentAdamW::ResidentAdamW;
  bool clips_as_it_reads() const override { return false; }
  void step(const StepArgs& args) override {
    const Operands op = operands();
    const CpuAdamWStep st = step_constants(options_, args);
    const MomentBuffers mb = moments_.buffers();
    const std::vector<MomentBlock>& blocks = moments_.blocks();
    const HostGradType grad_type = host_grad_type(op.grads->scalar_type());
    at::parallel_for(0, static_cast<int64_t>(blocks.size()), 16, [&](int64_t b, int64_t e) {
      adamw_step_cpu(st, blocks.data() + b, e - b, op.param, mb, op.grads->data_ptr(), grad_type, op.param_bf16);
    });
    round_into_fp16_params();
  }
};

// Note [Offload pipeline]
// The shard is cut into chunks. The gradient chunks are copied to pinned host memory on one
// stream, each followed by an event; the host waits for chunk k's event, updates it on the pool,
// and queues its parameters for the device on a second stream, while later gradient chunks are
// still in flight and earlier parameter chunks already travel back. The compute stream waits for
// the last parameter copy, so the next forward sees the update. Gradients are final when step()
// starts (unscaled and clipped on the device), so the host applies them as they are.
class OffloadAdamW final : public ShardUpdate {
 public:
  OffloadAdamW(const ShardView& shard, const AdamWOptions& options)
      : shard_(shard),
        options_(options),
        moments_(shard, options.moments_8bit, host_options()),
        pool_(options.host_threads) {
    const at::ScalarType g = shard.grads.scalar_type();
    GPT2_ASSERT(g == at::kFloat || g == at::kBFloat16, "offload takes fp32 or bf16 gradients");
    const int64_t n = shard.numel();
    master_ = at::empty({n}, host_options().dtype(at::kFloat));
    master_.copy_(shard.params);
    host_grad_ = at::empty({n}, host_options().dtype(g));
    // bf16 parameters come back as bf16 (half the bytes over the bus); others from the master.
    if (shard.params.scalar_type() == at::kBFloat16)
      host_param_out_ = at::empty({n}, host_options().dtype(at::kBFloat16));
  }
  bool clips_as_it_reads() const override { return false; }
  int64_t device_bytes() const override { return 0; }
  int64_t host_bytes() const override {
    return bytes_of(master_) + bytes_of(host_grad_) + bytes_of(host_param_out_) + moments_.bytes();
  }
  ShardState state(int64_t begin, int64_t end) const override {
    return state_of(master_, shard_, begin, end, moments_);
  }
  void load_state(const ShardState& s) override {
    master_.copy_(s.master);
    moments_.load(s);
  }
  void step(const StepArgs& args) override;

 private:
  at::TensorOptions host_options() const {
    return at::TensorOptions().device(at::kCPU).pinned_memory(shard_.params.is_cuda());
  }
  void update_chunk(const CpuAdamWStep& st, int64_t c0, int64_t c1);

  ShardView shard_;
  AdamWOptions options_;
  AdamWMoments moments_;
  torch::Tensor master_, host_grad_, host_param_out_;
  HostThreadPool pool_;
};

// The elements [c0, c1) of the shard, on the pool.
void OffloadAdamW::update_chunk(const CpuAdamWStep& st, int64_t c0, int64_t c1) {
  const HostGradType grad_type = host_grad_type(host_grad_.scalar_type());
  auto* param = master_.data_ptr<float>();
  auto* grad = static_cast<const char*>(host_grad_.data_ptr());
  auto* out = host_param_out_.defined() ? static_cast<uint16_t*>(host_param_out_.data_ptr()) : nullptr;
  const MomentBuffers mb = moments_.buffers();
  if (moments_.is_8bit()) {  // the blocks that begin in the chunk, split across the pool
    const std::vector<MomentBlock>& blocks = moments_.blocks();
    const auto first = static_cast<int64_t>(first_block_at(blocks, c0));
    const auto last = static_cast<int64_t>(first_block_at(blocks, c1));
    pool_.parallel_for(last - first, 1, [&](int64_t b, int64_t e) {
      adamw_step_cpu(st, blocks.data() + first + b, e - b, param, mb, grad, grad_type, out);
    });
    return;
  }
  const size_t grad_bytes = host_grad_.element_size();
  pool_.parallel_for(c1 - c0, 64, [&](int64_t b, int64_t e) {
    b += c0;
    e += c0;
    for (size_t k = 0; k < shard_.spans.size(); ++k) {
      const ParamSpan& s = shard_.spans[k];
      const int64_t lo = std::max(b, s.begin), hi = std::min(e, s.end);
      if (lo >= hi) continue;
      CpuAdamWStep seg = st;
      if (!s.weight_decay) seg.weight_decay = 0;
      const int64_t m = moments_.fp32_at(k) + lo - s.begin;  // packed moments (dense_fp32_blocks)
      cpu_adamw_update(seg, hi - lo, param + lo, mb.exp_avg + m, mb.exp_avg_sq + m, grad + lo * grad_bytes, grad_type,
                       out != nullptr ? out + lo : nullptr);
    }
  });
}

void OffloadAdamW::step(const StepArgs& args) {
  const int64_t n = shard_.numel();
  // 8-bit: chunks of whole quantization blocks (the shard starts on the grid).
  const int64_t unit = moments_.is_8bit() ? kQuantBlock : 1;
  const int64_t chunk = std::max<int64_t>((options_.chunk_elements + unit - 1) / unit * unit, unit);
  const int64_t num_chunks = (n + chunk - 1) / chunk;
  const CpuAdamWStep st = step_constants(options_, args);
  const at::Tensor& param_source = host_param_out_.defined() ? host_param_out_ : master_;
#ifdef GPT2_WITH_CUDA
  if (shard_.params.is_cuda()) {
    const auto device = shard_.params.device().index();
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
        host_grad_.narrow(0, c0, len).copy_(shard_.grads.narrow(0, c0, len), /*non_blocking=*/true);
        landed[static_cast<size_t>(k)].record(d2h);
      }
    }
    for (int64_t k = 0; k < num_chunks; ++k) {
      const int64_t c0 = k * chunk, len = std::min(chunk, n - c0);
      landed[static_cast<size_t>(k)].synchronize();
      update_chunk(st, c0, c0 + len);
      c10::cuda::CUDAStreamGuard guard(h2d);
      shard_.params.narrow(0, c0, len).copy_(param_source.narrow(0, c0, len), /*non_blocking=*/true);
    }
    at::cuda::CUDAEvent params_back;
    params_back.record(h2d);
    params_back.block(at::cuda::getCurrentCUDAStream(device));
    return;
  }
#endif
  host_grad_.copy_(shard_.grads);
  for (int64_t c0 = 0; c0 < n; c0 += chunk) {
    const int64_t len = std::min(chunk, n - c0);
    update_chunk(st, c0, c0 + len);
    shard_.params.narrow(0, c0, len).copy_(param_source.narrow(0, c0, len));
  }
}

}  // namespace

AdamWMoments::AdamWMoments(const ShardView& shard, bool moments_8bit, const at::TensorOptions& where)
    : eight_bit_(moments_8bit), pieces_(shard.pieces), layout_(shard.moment_layout) {
  const int64_t n = shard.numel();
  if (!moments_8bit) {  // packed over AdamW's spans (none over Muon's matrices)
    spans_ = shard.spans;
    blocks_ = dense_fp32_blocks(spans_, &span_states_);
    const int64_t size = blocks_.empty() ? 0 : blocks_.back().state + blocks_.back().len;
    m_ = at::zeros({size}, where.dtype(at::kFloat));
    v_ = at::zeros({size}, where.dtype(at::kFloat));
    return;
  }
  // Each piece's blocks, moved to where the piece sits: its elements, absmax values and fp32
  // moments follow the previous pieces'.
  int64_t local = 0, absmax = 0, fp32 = 0;
  for (const parallel::FlatRange& p : pieces_) {
    GPT2_ASSERT(layout_->on_grid(p.begin) && layout_->on_grid(p.end),
                "8-bit moments need shards of whole quantization blocks (FlatLayout::kGrid cells)");
    for (MomentBlock b : layout_->blocks(p.begin, p.end)) {
      b.begin += local;
      b.state += b.quantized ? absmax : fp32;
      blocks_.push_back(b);
    }
    absmax_at_.push_back(absmax);
    fp32_at_.push_back(fp32);
    local += p.size();
    absmax += layout_->absmax_before(p.end) - layout_->absmax_before(p.begin);
    fp32 += layout_->fp32_before(p.end) - layout_->fp32_before(p.begin);
  }
  // Only AdamW's spans: Muon's matrices keep their codes (the checkpoint numbering is the
  // parameters') but no step touches them.
  std::vector<MomentBlock> adamw_blocks;
  size_t k = 0;
  for (const MomentBlock& b : blocks_) {
    while (k < shard.spans.size() && shard.spans[k].end <= b.begin) ++k;
    if (k < shard.spans.size() && shard.spans[k].begin <= b.begin && b.begin + b.len <= shard.spans[k].end)
      adamw_blocks.push_back(b);
  }
  blocks_ = std::move(adamw_blocks);
  codes_m_ = at::zeros({n}, where.dtype(at::kByte));
  codes_v_ = at::zeros({n}, where.dtype(at::kByte));
  absmax_m_ = at::zeros({absmax}, where.dtype(at::kFloat));
  absmax_v_ = at::zeros({absmax}, where.dtype(at::kFloat));
  m_ = at::zeros({fp32}, where.dtype(at::kFloat));
  v_ = at::zeros({fp32}, where.dtype(at::kFloat));
}

MomentBuffers AdamWMoments::buffers() const {
  if (eight_bit_) return buffers_of(codes_m_, codes_v_, absmax_m_, absmax_v_, m_, v_);
  MomentBuffers mb;  // dense fp32 moments: a block's are at its state = begin
  mb.exp_avg = m_.data_ptr<float>();
  mb.exp_avg_sq = v_.data_ptr<float>();
  return mb;
}

void AdamWMoments::copy_out(int64_t begin, int64_t end, ShardState* s) const {
  const PieceAt at = locate(pieces_, begin, end);
  if (!eight_bit_) {  // dense over the range, zero outside the spans
    s->exp_avg = at::zeros({end - begin}, at::kFloat);
    s->exp_avg_sq = at::zeros({end - begin}, at::kFloat);
    for (size_t k = 0; k < spans_.size(); ++k) {
      const int64_t lo = std::max(spans_[k].begin, at.local), hi = std::min(spans_[k].end, at.local + end - begin);
      if (lo >= hi) continue;
      const int64_t from = span_states_[k] + lo - spans_[k].begin;
      s->exp_avg.narrow(0, lo - at.local, hi - lo).copy_(m_.narrow(0, from, hi - lo));
      s->exp_avg_sq.narrow(0, lo - at.local, hi - lo).copy_(v_.narrow(0, from, hi - lo));
    }
    return;
  }
  const MomentLayout& ml = *layout_;
  const int64_t piece_begin = pieces_[at.piece].begin;
  const int64_t a0 = absmax_at_[at.piece] + ml.absmax_before(begin) - ml.absmax_before(piece_begin),
                a1 = absmax_at_[at.piece] + ml.absmax_before(end) - ml.absmax_before(piece_begin);
  const int64_t f0 = fp32_at_[at.piece] + ml.fp32_before(begin) - ml.fp32_before(piece_begin),
                f1 = fp32_at_[at.piece] + ml.fp32_before(end) - ml.fp32_before(piece_begin);
  s->exp_avg_codes = cpu_copy(codes_m_, at.local, end - begin);
  s->exp_avg_sq_codes = cpu_copy(codes_v_, at.local, end - begin);
  s->exp_avg_absmax = cpu_copy(absmax_m_, a0, a1 - a0);
  s->exp_avg_sq_absmax = cpu_copy(absmax_v_, a0, a1 - a0);
  s->exp_avg = cpu_copy(m_, f0, f1 - f0);
  s->exp_avg_sq = cpu_copy(v_, f0, f1 - f0);
}

void AdamWMoments::load(const ShardState& s) {
  GPT2_ASSERT(s.moments_8bit == eight_bit_, "optimizer state has the other moment format");
  auto take = [](torch::Tensor& mine, const torch::Tensor& saved) {
    GPT2_ASSERT(saved.numel() == mine.numel(), "optimizer state does not match this rank's shard");
    mine.copy_(saved);
  };
  if (!eight_bit_) {  // dense over the shard: the spans' parts
    const int64_t n = spans_.empty() ? 0 : spans_.back().end;
    GPT2_ASSERT(s.exp_avg.numel() >= n && s.exp_avg_sq.numel() >= n,
                "optimizer state does not match this rank's shard");
    for (size_t k = 0; k < spans_.size(); ++k) {
      const int64_t len = spans_[k].end - spans_[k].begin;
      m_.narrow(0, span_states_[k], len).copy_(s.exp_avg.narrow(0, spans_[k].begin, len));
      v_.narrow(0, span_states_[k], len).copy_(s.exp_avg_sq.narrow(0, spans_[k].begin, len));
    }
    return;
  }
  take(m_, s.exp_avg);
  take(v_, s.exp_avg_sq);
  take(codes_m_, s.exp_avg_codes);
  take(codes_v_, s.exp_avg_sq_codes);
  take(absmax_m_, s.exp_avg_absmax);
  take(absmax_v_, s.exp_avg_sq_absmax);
}

int64_t AdamWMoments::bytes() const {
  int64_t bytes = 0;
  for (const auto* t : {&m_, &v_, &codes_m_, &codes_v_, &absmax_m_, &absmax_v_}) bytes += bytes_of(*t);
  return bytes;
}

MomentBuffers ShardState::moment_buffers() const {
  return buffers_of(exp_avg_codes, exp_avg_sq_codes, exp_avg_absmax, exp_avg_sq_absmax, exp_avg, exp_avg_sq);
}

bool gpu_adamw_updates(const torch::Device& device, bool offload) {
  return kHaveKernel && device.is_cuda() && !offload;
}

std::unique_ptr<ShardUpdate> make_adamw_update(const ShardView& shard, const AdamWOptions& options, bool offload) {
  if (shard.params.is_cuda() && !kHaveKernel) {
    throw Error(
        "this build of gpt2-dist has no CUDA kernels (no nvcc when it was configured): it cannot update "
        "CUDA parameters; rebuild with the CUDA toolkit");
  }
  if (offload) return std::make_unique<OffloadAdamW>(shard, options);
#ifdef GPT2_WITH_CUDA
  if (shard.params.is_cuda()) return std::make_unique<GpuAdamW>(shard, options);
#endif
  return std::make_unique<CpuAdamW>(shard, options);
}

int64_t offload_host_bytes(int64_t n, int64_t adamw_elements, at::ScalarType param_dtype, at::ScalarType grad_dtype,
                           bool moments_8bit) {
  // master + moments (fp32: 8 bytes an AdamW element; 8-bit: 2 bytes of codes and an absmax pair
  // per block) + gradient copy + bf16 parameter staging. The small parameters' fp32 moments are
  // left out.
  const int64_t moments = moments_8bit ? 2 * n + 8 * ((n + kQuantBlock - 1) / kQuantBlock) : 8 * adamw_elements;
  return 4 * n + moments +
         n * (static_cast<int64_t>(c10::elementSize(grad_dtype)) + (param_dtype == at::kBFloat16 ? 2 : 0));
}

}  // namespace gpt2::optim
