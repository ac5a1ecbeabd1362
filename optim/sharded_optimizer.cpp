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

// 1-D views of matrices (what MuonOwners moves).
std::vector<torch::Tensor> flat_views(const std::vector<torch::Tensor>& matrices) {
  std::vector<torch::Tensor> out;
  for (const auto& m : matrices) out.push_back(m.view({-1}));
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
  for (int i : options.muon_params) {
    GPT2_ASSERT(params[i].dim() == 2, "Muon updates matrices");
    by_muon[i] = 1;
  }
  int64_t local = 0;
  for (const auto& piece : shard_.pieces) {
    for (int i : layout.order) {
      const parallel::FlatRange r = piece.intersect(layout.range_of(i));
      // GPT-2: decay matmuls and embeddings only. Muon's matrices are no span of AdamW's.
      if (!r.empty() && !by_muon[i]) {
        shard_.spans.push_back({local + r.begin - piece.begin, local + r.end - piece.begin, params[i].dim() >= 2});
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
  if (!options.muon_params.empty()) set_up_muon(params, layout, by_muon);
}

void ShardedOptimizer::set_up_muon(const std::vector<torch::Tensor>& params, const parallel::FlatLayout& layout,
                                   const std::vector<char>& by_muon) {
  std::vector<MuonMatrix> matrices;
  for (int i : layout.order) {  // flat order
    if (by_muon[i]) matrices.push_back({layout.offset[i], params[i].size(0), params[i].size(1)});
  }
  // Unsharded, this rank holds and owns every matrix: the moves are local copies.
  const int world = sharded_ ? comm_.world_size() : 1;
  std::vector<std::vector<parallel::FlatRange>> pieces;
  for (int r = 0; r < world; ++r) pieces.push_back(sharded_ ? layout.pieces(r) : shard_.pieces);
  const std::vector<MuonStack> stacks = muon_stacks(matrices);
  auto owners = balance_muon_owners(matrices, stacks, world, options_.muon.ns.steps);
  muon_ = std::make_unique<MuonOwners>(matrices, std::move(owners), pieces, sharded_ ? comm_.rank() : 0);

  // Masters: fp32 parameters are their own, unless offload writes the shard back whole from host
  // masters (stale over Muon's matrices) before Muon's step reads them. Unsharded, 16-bit
  // parameters take the update's device masters (shard coordinates are flat ones there, and
  // AdamW's step leaves Muon's elements alone); sharded, an owner's matrices lie in other ranks'
  // shards, so it keeps masters of its own.
  const bool fp32_params = param_flat_.scalar_type() == at::kFloat && !options_.offload;
  const torch::Tensor shared_masters = sharded_ ? torch::Tensor() : update_->device_masters();
  muon_rounds_params_ = !fp32_params;
  muon_momentum_buffer_ = at::zeros({muon_->owned_numel()}, param_flat_.options().dtype(at::kFloat));
  if (!fp32_params && !shared_masters.defined()) {
    muon_master_buffer_ = at::empty({muon_->owned_numel()}, param_flat_.options().dtype(at::kFloat));
  }
  // Each owned stack's momentum is one [k, rows, cols] tensor; muon_momentum_[j] its matrix's slice.
  std::vector<size_t> owned_index(matrices.size(), matrices.size());
  for (size_t j = 0; j < muon_->owned().size(); ++j) owned_index[muon_->owned()[j]] = j;
  muon_momentum_.resize(muon_->owned().size());
  int64_t at = 0;
  for (const MuonStack& stack : stacks) {
    if (owned_index[stack.front()] == matrices.size()) continue;  // another rank's (whole stacks have one owner)
    const MuonMatrix& m = matrices[stack.front()];
    const auto k = static_cast<int64_t>(stack.size());
    OwnedStack owned{{}, muon_momentum_buffer_.narrow(0, at, k * m.numel()).view({k, m.rows, m.cols})};
    for (size_t i = 0; i < stack.size(); ++i) {
      owned.owned.push_back(owned_index[stack[i]]);
      muon_momentum_[owned.owned.back()] = owned.momentum[static_cast<int64_t>(i)];
    }
    muon_stacks_.push_back(std::move(owned));
    at += k * m.numel();
  }
  int64_t pos = 0;
  for (size_t k : muon_->owned()) {
    const MuonMatrix& m = muon_->matrices()[k];
    muon_params_.push_back(param_flat_.narrow(0, m.offset, m.numel()).view({m.rows, m.cols}));
    if (fp32_params) {
      muon_masters_.push_back(muon_params_.back());
    } else if (shared_masters.defined()) {
      muon_masters_.push_back(shared_masters.narrow(0, m.offset, m.numel()).view({m.rows, m.cols}));
    } else {
      muon_masters_.push_back(muon_master_buffer_.narrow(0, pos, m.numel()).view({m.rows, m.cols}));
      muon_masters_.back().copy_(muon_params_.back());
    }
    pos += m.numel();
  }
}

int64_t ShardedOptimizer::muon_momentum_bytes() const {
  return muon_momentum_buffer_.defined() ? static_cast<int64_t>(muon_momentum_buffer_.nbytes()) : 0;
}

int64_t ShardedOptimizer::muon_master_bytes() const {
  return muon_master_buffer_.defined() ? static_cast<int64_t>(muon_master_buffer_.nbytes()) : 0;
}

ShardedOptimizer::~ShardedOptimizer() = default;

int64_t ShardedOptimizer::state_bytes() const {
  // A one-piece shard's parameters are a view of the model's; an interleaved one's a copy.
  const int64_t own_params = blocks_.empty() ? 0 : static_cast<int64_t>(shard_.params.nbytes());
  return own_params + muon_state_bytes() + update_->device_bytes();
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
  if (muon_) muon_step(lr * options_.muon_lr_ratio, clip_coef);
}

// Muon's matrices, after AdamW's step (which does not touch them: they are no span of its). Each
// owner gathers its matrices' reduced gradients from the shards, updates them, and sends the new
// parameters back into the shards; gather() then spreads them (Note [Muon's owners]). The gradient
// is clipped here where the AdamW kernel clips as it reads (the shards were scaled in place
// otherwise).
void ShardedOptimizer::muon_step(double lr, const torch::Tensor& clip_coef) {
  // Each owned stack's gradient as one [k, rows, cols] tensor. Sharded, the owners receive straight
  // into it; unsharded, the flat gradient holds every matrix as it is, and the stack is a copy.
  std::vector<torch::Tensor> grads(muon_->owned().size()), stack_grads;
  for (const OwnedStack& stack : muon_stacks_) {
    if (sharded_) {
      stack_grads.push_back(at::empty(stack.momentum.sizes(), shard_.grads.options()));
      for (size_t i = 0; i < stack.owned.size(); ++i) grads[stack.owned[i]] = stack_grads.back()[i].view({-1});
    } else {
      std::vector<torch::Tensor> views;
      for (size_t j : stack.owned) {
        const MuonMatrix& m = muon_->matrices()[muon_->owned()[j]];
        views.push_back(shard_.grads.narrow(0, m.offset, m.numel()).view({m.rows, m.cols}));
      }
      stack_grads.push_back(at::stack(views));
    }
  }
  if (sharded_) muon_->to_owners(comm_, shard_.grads, grads);
  for (size_t s = 0; s < muon_stacks_.size(); ++s) {  // Note [Muon's owners]: one batched update a stack
    std::vector<torch::Tensor> masters;
    for (size_t j : muon_stacks_[s].owned) masters.push_back(muon_masters_[j]);
    torch::Tensor grad = stack_grads[s].to(at::kFloat);
    if (clip_coef.defined()) grad = grad * clip_coef;
    optim::muon_step(masters, grad, muon_stacks_[s].momentum, lr, options_.muon);
  }
  round_muon_masters_into_params();
  if (sharded_) muon_->to_holders(comm_, flat_views(muon_params_), shard_.params);
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

ShardedOptimizer::MuonInShard ShardedOptimizer::muon_in_shard() const {
  if (!muon_ || !sharded_) return {};
  const auto options = param_flat_.options().dtype(at::kFloat);
  MuonInShard out{at::zeros({shard_.numel()}, options), at::zeros({shard_.numel()}, options)};
  muon_->to_holders(comm_, flat_views(muon_masters_), out.master);
  muon_->to_holders(comm_, flat_views(muon_momentum_), out.momentum);
  return out;
}

// The update's state of [begin, end), with Muon's masters over its elements and its momentum
// (flat, zero elsewhere).
ShardState ShardedOptimizer::range_state(int64_t begin, int64_t end, const MuonInShard& muon) const {
  at::NoGradGuard no_grad;
  ShardState s = update_->state(begin, end);  // gpt2::Error when not inside one piece
  s.adam_step = steps_;
  if (!muon_) return s;
  s.muon_momentum = at::zeros({end - begin}, at::kFloat);
  const int64_t first = locate(shard_.pieces, begin, end).local;  // shard coordinate of `begin`
  // [lo, hi) of the shard from `master` and `momentum` (shard coordinates lo - from onward).
  auto take = [&](int64_t lo, int64_t hi, const torch::Tensor& master, const torch::Tensor& momentum, int64_t from) {
    lo = std::max(lo, first);
    hi = std::min(hi, first + end - begin);
    if (lo >= hi) return;
    s.master.narrow(0, lo - first, hi - lo).copy_(master.narrow(0, lo - from, hi - lo));
    s.muon_momentum.narrow(0, lo - first, hi - lo).copy_(momentum.narrow(0, lo - from, hi - lo));
  };
  if (muon.master.defined()) {
    for (const parallel::FlatRange& h : muon_->held()) take(h.begin, h.end, muon.master, muon.momentum, 0);
  } else {  // unsharded: shard coordinates are flat ones, and every matrix is this rank's
    for (size_t j = 0; j < muon_->owned().size(); ++j) {
      const MuonMatrix& m = muon_->matrices()[muon_->owned()[j]];
      take(m.offset, m.offset + m.numel(), muon_masters_[j].view({-1}), muon_momentum_[j].view({-1}), m.offset);
    }
  }
  return s;
}

ShardState ShardedOptimizer::state(int64_t begin, int64_t end) const {
  return range_state(begin, end, muon_in_shard());
}

ShardState ShardedOptimizer::state() const {
  const MuonInShard muon = muon_in_shard();
  std::vector<ShardState> parts;
  for (const auto& p : shard_.pieces) parts.push_back(range_state(p.begin, p.end, muon));
  return parts.size() == 1 ? parts.front() : concat_states(parts);
}

void ShardedOptimizer::load_state(const ShardState& s) {
  at::NoGradGuard no_grad;
  GPT2_ASSERT(s.master.numel() == shard_.numel(), "optimizer state does not match this rank's shard");
  update_->load_state(s);
  shard_.params.copy_(s.master);
  steps_ = s.adam_step;
  if (!muon_) return;
  // The owners take their matrices' masters and momenta from the shards (an AdamW checkpoint has
  // no momentum: Muon starts without).
  const auto options = param_flat_.options().dtype(at::kFloat);
  muon_->to_owners(comm_, s.master.to(options), flat_views(muon_masters_));
  muon_->to_owners(comm_,
                   s.muon_momentum.defined() ? s.muon_momentum.to(options) : at::zeros({shard_.numel()}, options),
                   flat_views(muon_momentum_));
  round_muon_masters_into_params();
}

// 16-bit (or offloaded) parameters take their Muon masters, rounded: one multi-tensor copy.
void ShardedOptimizer::round_muon_masters_into_params() {
  if (muon_rounds_params_) at::_foreach_copy_(muon_params_, muon_masters_);
}

}  // namespace gpt2::optim
