#include "optim/sharded_optimizer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

#include "optim/grad_norm.h"
#include "src/base/errors.h"

namespace gpt2::optim {
namespace {

std::vector<MomentLayout::Param> moment_params(const std::vector<torch::Tensor>& params,
                                               const parallel::FlatLayout& layout) {
  std::vector<MomentLayout::Param> out;
  for (size_t i = 0; i < params.size(); ++i) out.push_back({layout.offset[i], layout.numel[i], params[i].dim() >= 2});
  return out;
}

// Shards are whole cells of the layout's grid, so whole quantization blocks.
static_assert(parallel::FlatLayout::kGrid % kQuantBlock == 0, "the flat grid must hold whole quantization blocks");

}  // namespace

ShardedOptimizer::ShardedOptimizer(const std::vector<torch::Tensor>& params, const parallel::FlatLayout& layout,
                                   const torch::Tensor& grads, parallel::Communicator& comm, Options options)
    : comm_(comm),
      options_(options),
      sharded_(options.sharded && comm.world_size() > 1),
      moment_layout_(moment_params(params, layout)) {
  GPT2_ASSERT(!layout.interleaved() || sharded_, "an interleaved layout is for a sharded optimizer");
  shard_.pieces = sharded_ ? layout.pieces(comm.rank()) : std::vector<parallel::FlatRange>{{0, layout.padded}};
  const int64_t n = shard_.numel();
  // Parameters move into one flat buffer so the shards can be all-gathered into it.
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
  const bool one_piece = shard_.pieces.size() == 1;
  const parallel::FlatRange& first = shard_.pieces.front();
  if (one_piece) {
    shard_.params = param_flat_.narrow(0, first.begin, n);  // updated in place, gathered in place
  } else {
    // Interleaved: the pieces end to end, all-gathered block by block (gather()).
    shard_.params = at::empty({n}, param_flat_.options());
    int64_t local = 0;
    for (const auto& p : shard_.pieces) {
      shard_.params.narrow(0, local, p.size()).copy_(param_flat_.narrow(0, p.begin, p.size()));
      local += p.size();
    }
    blocks_ = layout.blocks;
  }
  if (grads.numel() == layout.padded && one_piece) {
    shard_.grads = grads.narrow(0, first.begin, n);
  } else {
    GPT2_ASSERT(grads.numel() == n, "gradient buffer does not match the layout");
    shard_.grads = grads;
  }
  shard_.moment_layout = &moment_layout_;
  std::vector<char> by_muon(params.size(), 0);
  if (!options.muon_params.empty()) {
    GPT2_ASSERT(one_piece && first.begin == 0 && !options.offload && !options.adamw.moments_8bit,
                "Muon runs with ZeRO 0, no offload and fp32 moments");
    int64_t total = 0;
    for (int i : options.muon_params) {
      GPT2_ASSERT(params[i].dim() == 2, "Muon updates matrices");
      by_muon[i] = 1;
      total += layout.numel[i];
    }
    muon_momentum_ = at::zeros({total}, param_flat_.options().dtype(at::kFloat));
    int64_t at = 0;
    for (int i : layout.order) {  // flat order
      if (!by_muon[i]) continue;
      muon_.push_back({layout.offset[i], params[i].size(0), params[i].size(1),
                       muon_momentum_.narrow(0, at, layout.numel[i]).view(params[i].sizes())});
      at += layout.numel[i];
    }
  }
  int64_t local = 0;
  for (const auto& piece : shard_.pieces) {
    for (int i : layout.order) {
      const int64_t lo = std::max(piece.begin, layout.offset[i]);
      const int64_t hi = std::min(piece.end, layout.offset[i] + layout.numel[i]);
      // GPT-2: decay matmuls and embeddings only. Muon's matrices are no span of AdamW's.
      if (lo < hi && !by_muon[i]) {
        shard_.spans.push_back({local + lo - piece.begin, local + hi - piece.begin, params[i].dim() >= 2});
      }
    }
    local += piece.size();
  }
  if (!one_piece) {
    // The all-gathered cells come rank by rank, each rank's pieces end to end; ordered_sum wants
    // them in flat order.
    const int64_t per_rank = n / parallel::FlatLayout::kGrid;
    std::vector<int64_t> order(static_cast<size_t>(layout.padded / parallel::FlatLayout::kGrid));
    for (int r = 0; r < comm.world_size(); ++r) {
      int64_t cell = r * per_rank;
      for (const auto& p : layout.pieces(r)) {
        for (int64_t f = p.begin; f < p.end; f += parallel::FlatLayout::kGrid) {
          order[static_cast<size_t>(f / parallel::FlatLayout::kGrid)] = cell++;
        }
      }
    }
    cells_in_flat_order_ = at::tensor(order, at::kLong).to(grads.device());
  }
  update_ = make_adamw_update(shard_, options.adamw, options.offload);
}

ShardedOptimizer::~ShardedOptimizer() = default;

int64_t ShardedOptimizer::state_bytes() const {
  // A one-piece shard's parameters are a view of the model's; an interleaved one's a copy.
  const int64_t own_params = blocks_.empty() ? 0 : static_cast<int64_t>(shard_.params.nbytes());
  const int64_t muon = muon_momentum_.defined() ? static_cast<int64_t>(muon_momentum_.nbytes()) : 0;
  return own_params + muon + update_->device_bytes();
}

torch::Tensor ShardedOptimizer::clip_grad_norm(double max_norm) {
  at::NoGradGuard no_grad;
  // Note [Partition-free arithmetic]: each cell's sum of squares, then all cells' in flat order.
  auto cells = block_sum_squares(shard_.grads, parallel::FlatLayout::kGrid);
  if (sharded_) {
    auto all = at::empty({cells.numel() * comm_.world_size()}, cells.options());
    comm_.all_gather(all, cells)->wait();
    cells = cells_in_flat_order_.defined() ? all.index_select(0, cells_in_flat_order_) : all;
  }
  auto norm = ordered_sum(cells).sqrt();
  clip_coef_ = torch::Tensor();
  if (max_norm <= 0) return norm;
  auto coef = (max_norm / (norm + 1e-6)).clamp_max(1.0);
  if (update_->clips_as_it_reads()) {
    // The kernel multiplies each gradient by it as it reads it, in fp32: the pass over the
    // gradient that mul_ costs is saved, and a bf16 gradient is not rounded to bf16 once more.
    clip_coef_ = coef.to(at::kFloat).reshape({1});
  } else {
    shard_.grads.mul_(coef.to(shard_.grads.scalar_type()));
  }
  return norm;
}

void ShardedOptimizer::step(double lr, const torch::Tensor& found_inf) {
  at::NoGradGuard no_grad;
  StepArgs args;
  args.clip_coef = std::exchange(clip_coef_, torch::Tensor());      // this step's only
  if (found_inf.defined() && found_inf.item<float>() != 0) return;  // fp16 overflow: skip (host sync)
  args.lr = lr;
  args.step = ++steps_;
  const torch::Tensor clip_coef = args.clip_coef;
  update_->step(args);
  if (!muon_.empty()) muon_step(lr * options_.muon_lr_ratio, clip_coef);
}

// Muon's matrices, after AdamW's step (which does not touch them: they are no span of its). The
// gradient is clipped here where the AdamW kernel clips as it reads (the owner scaled it in place
// otherwise); the masters are the update's, so checkpoints and the rounding into 16-bit parameters
// are AdamW's.
void ShardedOptimizer::muon_step(double lr, const torch::Tensor& clip_coef) {
  const torch::Tensor masters = update_->device_masters();
  const bool rounded = shard_.params.scalar_type() != at::kFloat;
  for (MuonMatrix& m : muon_) {
    const int64_t n = m.rows * m.cols;
    torch::Tensor grad = shard_.grads.narrow(0, m.local, n).view({m.rows, m.cols}).to(at::kFloat);
    if (clip_coef.defined()) grad = grad * clip_coef;
    torch::Tensor master = masters.narrow(0, m.local, n).view({m.rows, m.cols});
    optim::muon_step(master, grad, m.momentum, lr, options_.muon);
    if (rounded) shard_.params.narrow(0, m.local, n).copy_(master.reshape({-1}));
  }
}

void ShardedOptimizer::gather() {
  if (!sharded_) return;
  if (blocks_.empty()) {
    comm_.all_gather(param_flat_, shard_.params)->wait();
    return;
  }
  // Interleaved: rank r's piece of each block is chunk r of it.
  std::vector<std::unique_ptr<parallel::Work>> work;
  int64_t local = 0;
  for (size_t k = 0; k < blocks_.size(); ++k) {
    const int64_t n = shard_.pieces[k].size();
    work.push_back(comm_.all_gather(param_flat_.narrow(0, blocks_[k].begin, blocks_[k].size()),
                                    shard_.params.narrow(0, local, n)));
    local += n;
  }
  for (auto& w : work) w->wait();
}

ShardState ShardedOptimizer::state(int64_t begin, int64_t end) const {
  at::NoGradGuard no_grad;
  ShardState s = update_->state(begin, end);  // gpt2::Error when not inside one piece
  s.adam_step = steps_;
  if (!muon_.empty()) {  // Muon's momentum over [begin, end), flat (one piece: shard = flat coordinates)
    s.muon_momentum = at::zeros({end - begin}, at::kFloat);
    for (const MuonMatrix& m : muon_) {
      const int64_t lo = std::max(begin, m.local), hi = std::min(end, m.local + m.rows * m.cols);
      if (lo < hi)
        s.muon_momentum.narrow(0, lo - begin, hi - lo).copy_(m.momentum.reshape({-1}).narrow(0, lo - m.local, hi - lo));
    }
  }
  return s;
}

ShardState ShardedOptimizer::state() const {
  std::vector<ShardState> parts;
  for (const auto& p : shard_.pieces) parts.push_back(state(p.begin, p.end));
  return parts.size() == 1 ? parts.front() : concat_states(parts);
}

void ShardedOptimizer::load_state(const ShardState& s) {
  at::NoGradGuard no_grad;
  GPT2_ASSERT(s.master.numel() == shard_.numel(), "optimizer state does not match this rank's shard");
  update_->load_state(s);
  shard_.params.copy_(s.master);
  steps_ = s.adam_step;
  for (MuonMatrix& m : muon_) {  // none saved (an AdamW checkpoint): Muon starts without momentum
    const int64_t n = m.rows * m.cols;
    if (s.muon_momentum.defined()) {
      m.momentum.copy_(s.muon_momentum.narrow(0, m.local, n).view({m.rows, m.cols}));
    } else {
      m.momentum.zero_();
    }
  }
}

}  // namespace gpt2::optim
