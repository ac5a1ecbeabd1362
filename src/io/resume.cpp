// Reading checkpoints back: flat ranges of the optimizer shards, and a collective resume (see
// resume.h).
#include "src/io/resume.h"

#include <torch/torch.h>
#ifdef GPT2_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "optim/loss_scaler.h"
#include "optim/sharded_optimizer.h"
#include "parallel/flat_layout.h"
#include "parallel/rank_env.h"
#include "src/base/errors.h"
#include "src/base/files.h"
#include "src/base/log.h"
#include "src/io/checkpoint_verify.h"
#include "src/io/h5_io.h"

namespace gpt2 {
namespace {

using h5::H5ErrorSilencer;
using h5::H5Id;
using h5::read_bytes;
using h5::read_f32_range;
using h5::read_int_attr_or_throw;
using h5::read_u8_range;

H5Id open_shard(const std::string& path) {
  const hid_t fid = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (fid < 0) throw UserError(path + ": cannot open the optimizer shard");
  return H5Id(fid, H5Fclose);
}

// A generator state read from a shard, as the uint8 tensor set_state() takes.
torch::Tensor as_tensor(const std::vector<uint8_t>& bytes) {
  auto t = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  std::copy(bytes.begin(), bytes.end(), t.data_ptr<uint8_t>());
  return t;
}

// The model's flat layout against the checkpoint's, parameter by parameter: the first parameter
// whose name, shape or flat offset differs is named (the total alone misses a model of the same
// size laid out otherwise, whose values would load into the wrong tensors). A manifest without a
// parameter list can only be checked by its total.
void check_layout(const CheckpointManifest& m, GPT2& model, const parallel::FlatLayout& layout) {
  const std::string mf = files::join(m.dir, "manifest.json");
  if (!m.params.empty()) {
    std::map<std::string, const CheckpointManifest::Param*> by_name;
    std::map<int64_t, const CheckpointManifest::Param*> by_offset;
    for (const auto& p : m.params) {
      by_name.emplace(p.name, &p);
      by_offset.emplace(p.offset, &p);
    }
    const auto named = model->named_parameters();
    std::set<std::string> in_model;
    for (size_t i = 0; i < named.size(); ++i) {
      const std::string& name = named[i].key();
      const int64_t offset = layout.offset[i];
      in_model.insert(name);
      const auto it = by_name.find(name);
      if (it == by_name.end()) {
        const auto there = by_offset.find(offset);
        throw UserError(mf + ": parameter " + name + " of the model is not in the checkpoint" +
                        (there == by_offset.end() ? std::string()
                                                  : " (the checkpoint has " + there->second->name +
                                                        " at its flat offset " + std::to_string(offset) + ")"));
      }
      const auto& saved = *it->second;
      if (saved.shape != named[i].value().sizes().vec()) {
        throw UserError(mf + ": parameter " + name + " has shape " + c10::str(c10::IntArrayRef(saved.shape)) +
                        " in the checkpoint, the model has " + c10::str(named[i].value().sizes()));
      }
      if (saved.offset != offset) {
        throw UserError(mf + ": parameter " + name + " is at flat offset " + std::to_string(saved.offset) +
                        " in the checkpoint, the model has it at " + std::to_string(offset));
      }
    }
    for (const auto& p : m.params) {
      if (!in_model.count(p.name))
        throw UserError(mf + ": parameter " + p.name + " of the checkpoint is not in the model");
    }
  }
  if (m.flat_total != layout.total) {
    throw UserError(m.dir + ": holds " + std::to_string(m.flat_total) + " parameters, the model has " +
                    std::to_string(layout.total));
  }
}

// The flat range `r` in the coordinates dataset `d` is indexed by (ShardDataset::Index).
std::pair<int64_t, int64_t> coordinates(const parallel::FlatRange& r, const ShardDataset& d,
                                        const optim::MomentLayout* moments) {
  switch (d.index) {
    case ShardDataset::Index::kAbsmax:
      return {moments->absmax_before(r.begin), moments->absmax_before(r.end)};
    case ShardDataset::Index::kFp32Moment:
      return {moments->fp32_before(r.begin), moments->fp32_before(r.end)};
    default:
      return {r.begin, r.end};
  }
}

// Where the shards hold dataset `d`: per range of each shard, its coordinates [lo, hi) and where
// they start in the shard's dataset (a shard's ranges are end to end in it).
struct Held {
  const CheckpointManifest::Shard* shard;
  int64_t lo, hi, at;
};
std::vector<Held> held_by_shards(const CheckpointManifest& m, const ShardDataset& d,
                                 const optim::MomentLayout* moments) {
  std::vector<Held> out;
  for (const auto& shard : m.shards) {
    int64_t at = 0;
    for (const auto& r : shard.ranges) {
      const auto [lo, hi] = coordinates(r, d, moments);
      out.push_back({&shard, lo, hi, at});
      at += hi - lo;
    }
  }
  return out;
}

// Elements [begin, end) of dataset `d` (in its coordinates) from whichever shards hold them; the
// shards' ranges tile every coordinate space.
void read_dataset_range(const CheckpointManifest& m, const ShardDataset& d, const optim::MomentLayout* moments,
                        int64_t begin, int64_t end, void* out) {
  H5ErrorSilencer quiet;
  const size_t elem = d.is_uint8 ? 1 : 4;
  const std::vector<Held> held = held_by_shards(m, d, moments);
  for (int64_t pos = begin; pos < end;) {
    const auto h = std::find_if(held.begin(), held.end(), [&](const Held& x) { return x.lo <= pos && pos < x.hi; });
    if (h == held.end()) {
      throw UserError(files::join(m.dir, "manifest.json") + ": element " + std::to_string(pos) + " of /" + d.name +
                      " is in no shard");
    }
    const auto& shard = *h->shard;
    const int64_t hi = std::min(end, h->hi);
    const std::string path = files::join(m.dir, shard.file);
    H5Id file = open_shard(path);
    if (read_int_attr_or_throw(file.get(), "begin", path) != shard.begin ||
        read_int_attr_or_throw(file.get(), "end", path) != shard.end) {
      throw UserError(path + ": its range does not match the manifest");
    }
    void* dst = static_cast<char*>(out) + (pos - begin) * elem;
    const int64_t from = h->at + pos - h->lo;
    if (d.is_uint8) {
      read_u8_range(file.get(), d.name, from, hi - pos, static_cast<uint8_t*>(dst), path);
    } else {
      read_f32_range(file.get(), d.name, from, hi - pos, static_cast<float*>(dst), path);
    }
    pos = hi;
  }
}

// The 8-bit moments of the flat range [begin, end) (on the grid) of an 8-bit checkpoint, as
// ShardedOptimizer holds them (codes for end - begin elements, zero past flat_total). Collective: an
// absmax that is not a finite non-negative number is a damaged checkpoint, named on every rank.
void read_8bit_moments(const CheckpointManifest& m, const optim::MomentLayout& ml, int64_t begin, int64_t end,
                       const parallel::RankEnv& env, optim::ShardState* s) {
  const int64_t real_end = std::max(begin, std::min(end, m.flat_total));
  const int64_t a0 = ml.absmax_before(begin), a1 = ml.absmax_before(end);
  const int64_t f0 = ml.fp32_before(begin), f1 = ml.fp32_before(end);
  struct Part {
    const char* name;
    torch::Tensor* t;
    int64_t lo, hi, size;
  };
  const Part parts[] = {{"exp_avg_codes", &s->exp_avg_codes, begin, real_end, end - begin},
                        {"exp_avg_sq_codes", &s->exp_avg_sq_codes, begin, real_end, end - begin},
                        {"exp_avg_absmax", &s->exp_avg_absmax, a0, a1, a1 - a0},
                        {"exp_avg_sq_absmax", &s->exp_avg_sq_absmax, a0, a1, a1 - a0},
                        {"exp_avg_fp32", &s->exp_avg, f0, f1, f1 - f0},
                        {"exp_avg_sq_fp32", &s->exp_avg_sq, f0, f1, f1 - f0}};
  for (const Part& p : parts) {
    const ShardDataset& d = shard_dataset(optim::MomentFormat::k8bit, p.name);
    *p.t = torch::zeros({p.size}, d.is_uint8 ? torch::kUInt8 : torch::kFloat);
    read_dataset_range(m, d, &ml, p.lo, p.hi, p.t->data_ptr());
  }
  // The first bad scale over all ranks: 2 * global absmax index + (0: exp_avg, 1: exp_avg_sq).
  int64_t bad = std::numeric_limits<int64_t>::max();
  for (int which = 0; which < 2; ++which) {
    const auto& t = which == 0 ? s->exp_avg_absmax : s->exp_avg_sq_absmax;
    const float* a = t.data_ptr<float>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (!(std::isfinite(a[i]) && a[i] >= 0)) bad = std::min(bad, 2 * (a0 + i) + which);
    }
  }
  bad = env.all_reduce_min(bad);
  if (bad == std::numeric_limits<int64_t>::max()) {
    if (m.exp_avg_sq_8bit == "plain") {  // Note [Second moment as its root]: an older checkpoint
      log::info("checkpoint ", m.dir, " holds 8-bit second moments as v: converting them to sqrt(v)");
      optim::roots_from_plain_second_moments(ml, begin, end, s->moment_buffers());
    }
    return;
  }
  const int64_t index = bad / 2;
  const char* name = bad % 2 == 0 ? "exp_avg_absmax" : "exp_avg_sq_absmax";
  const optim::MomentBlock block = ml.absmax_block(index);
  std::string file = "manifest.json";
  int64_t local = index;
  for (const Held& h : held_by_shards(m, shard_dataset(optim::MomentFormat::k8bit, name), &ml)) {
    if (h.lo <= index && index < h.hi) {
      file = h.shard->file;
      local = h.at + index - h.lo;
    }
  }
  throw UserError("checkpoint " + m.dir + " is damaged, nothing was loaded: " + files::join(m.dir, file) + ": /" +
                  name + "[" + std::to_string(local) + "], the scale of the 8-bit block of flat elements [" +
                  std::to_string(block.begin) + ", " + std::to_string(block.begin + block.len) +
                  "), is not a finite non-negative number");
}

// The flat range [begin, end) of the checkpoint's state (one of this rank's pieces), in the format
// `moments_8bit` says: read as saved, or converted (fp32 moments quantized, 8-bit ones dequantized).
optim::ShardState read_range_state(const CheckpointManifest& m, const optim::MomentLayout& ml, bool moments_8bit,
                                   bool muon, int64_t begin, int64_t end, const parallel::RankEnv& env) {
  const int64_t real_end = std::max(begin, std::min(end, m.flat_total));
  const bool saved_8bit = m.optimizer_moments == optim::MomentFormat::k8bit;
  auto dense = [&](const char* name, int64_t lo, int64_t hi) {  // fp32 values of [lo, hi), zero past flat_total
    auto t = torch::zeros({hi - lo}, torch::kFloat);
    read_dataset_range(m, shard_dataset(m.optimizer_moments, name), &ml, lo, std::max(lo, std::min(hi, m.flat_total)),
                       t.data_ptr());
    return t;
  };
  optim::ShardState s;
  s.moments_8bit = moments_8bit;
  s.master = dense("master", begin, end);
  if (muon && m.optimizer == optim::UpdateRule::kMuon) s.muon_momentum = dense("muon_momentum", begin, end);
  if (saved_8bit && s.moments_8bit) {
    read_8bit_moments(m, ml, begin, end, env, &s);
  } else if (!saved_8bit && !s.moments_8bit) {
    s.exp_avg = dense("exp_avg", begin, end);
    s.exp_avg_sq = dense("exp_avg_sq", begin, end);
  } else if (s.moments_8bit) {  // fp32 checkpoint, 8-bit run
    const auto exp_avg = dense("exp_avg", begin, end), exp_avg_sq = dense("exp_avg_sq", begin, end);
    const int64_t a = ml.absmax_before(end) - ml.absmax_before(begin), f = ml.fp32_before(end) - ml.fp32_before(begin);
    s.exp_avg_codes = torch::zeros({end - begin}, torch::kUInt8);
    s.exp_avg_sq_codes = torch::zeros({end - begin}, torch::kUInt8);
    s.exp_avg_absmax = torch::zeros({a}, torch::kFloat);
    s.exp_avg_sq_absmax = torch::zeros({a}, torch::kFloat);
    s.exp_avg = torch::zeros({f}, torch::kFloat);
    s.exp_avg_sq = torch::zeros({f}, torch::kFloat);
    optim::quantize_moments(ml, begin, end, exp_avg.data_ptr<float>(), exp_avg_sq.data_ptr<float>(),
                            s.moment_buffers());
  } else {  // 8-bit checkpoint, fp32 run: the blocks around this range, dequantized
    const int64_t g0 = begin / optim::kQuantBlock * optim::kQuantBlock;
    const int64_t g1 = std::min((real_end + optim::kQuantBlock - 1) / optim::kQuantBlock * optim::kQuantBlock,
                                std::max(m.flat_total, g0));
    optim::ShardState q;
    read_8bit_moments(m, ml, g0, g1, env, &q);
    auto exp_avg = torch::zeros({g1 - g0}, torch::kFloat), exp_avg_sq = torch::zeros({g1 - g0}, torch::kFloat);
    optim::dequantize_moments(ml, g0, g1, q.moment_buffers(), exp_avg.data_ptr<float>(), exp_avg_sq.data_ptr<float>());
    s.exp_avg = torch::zeros({end - begin}, torch::kFloat);
    s.exp_avg_sq = torch::zeros({end - begin}, torch::kFloat);
    s.exp_avg.narrow(0, 0, real_end - begin).copy_(exp_avg.narrow(0, begin - g0, real_end - begin));
    s.exp_avg_sq.narrow(0, 0, real_end - begin).copy_(exp_avg_sq.narrow(0, begin - g0, real_end - begin));
  }
  return s;
}

// This rank's state, its pieces end to end, in the optimizer's moment format (a conversion is
// logged). Collective: every rank reads as many pieces.
optim::ShardState read_shard_state(const CheckpointManifest& m, const optim::ShardedOptimizer& optimizer,
                                   const parallel::RankEnv& env) {
  const optim::MomentLayout& ml = optimizer.moment_layout();
  const bool saved_8bit = m.optimizer_moments == optim::MomentFormat::k8bit;
  if (saved_8bit) {
    for (const auto& shard : m.shards) {
      for (const auto& r : shard.ranges) {
        for (int64_t x : {r.begin, r.end}) {
          if (!ml.on_grid(x)) {
            throw UserError(files::join(m.dir, "manifest.json") + ": shard " + shard.file +
                            " of 8-bit moments has a range that begins or ends at " + std::to_string(x) +
                            ", not on the " + std::to_string(optim::kQuantBlock) + "-element grid");
          }
        }
      }
    }
  }
  if (saved_8bit != optimizer.moments_8bit()) {
    log::info("checkpoint ", m.dir,
              saved_8bit ? " has 8-bit optimizer moments: dequantizing them to fp32 moments"
                         : " has fp32 optimizer moments: quantizing them to 8-bit moments");
  }
  const bool muon = optimizer.muon();
  if (muon != (m.optimizer == optim::UpdateRule::kMuon)) {
    log::info("checkpoint ", m.dir, " was trained with optimizer ", choice_name(m.optimizer), "; this run uses ",
              muon ? "muon: its matrices start without momentum" : "adamw: their AdamW moments start at zero");
  }
  std::vector<optim::ShardState> parts;
  for (const auto& p : optimizer.pieces()) {
    parts.push_back(read_range_state(m, ml, optimizer.moments_8bit(), muon, p.begin, p.end, env));
  }
  return parts.size() == 1 ? parts.front() : optim::concat_states(parts);
}

}  // namespace

void read_flat_range(const CheckpointManifest& m, const char* dataset, int64_t begin, int64_t end, float* out) {
  read_dataset_range(m, shard_dataset(m.optimizer_moments, dataset), nullptr, begin, end, out);
}

namespace {

// FP8 delayed scaling's histories (the same on every rank when saved), so a resumed run scales as
// the uninterrupted one would; a run without delayed scaling ignores them.
void load_fp8_amax_history(const CheckpointManifest& m, GPT2& model) {
  const torch::Tensor& mine = model->fp8_amax_history();
  if (!mine.defined()) {
    if (!m.fp8_amax_shape.empty())
      log::info("checkpoint: FP8 amax histories not used (no delayed scaling in this run)");
    return;
  }
  if (m.fp8_amax_shape.empty()) {
    log::warn("checkpoint ", m.dir, " holds no FP8 amax histories (written without delayed scaling): they start empty");
    return;
  }
  std::vector<float> values = m.fp8_amax;
  const torch::Tensor saved = torch::from_blob(values.data(), m.fp8_amax_shape, torch::kFloat).to(mine.device());
  if (saved.sizes() != mine.sizes()) {
    throw UserError(files::join(m.dir, "manifest.json") + ": fp8_amax_history is " +
                    std::to_string(m.fp8_amax_shape.back()) + " steps long, this run's precision.fp8_amax_history " +
                    std::to_string(mine.size(-1)) + " (set it to the saved length, or to 0 for current scaling)");
  }
  model->load_fp8_amax_history(saved, m.fp8_steps);
}

}  // namespace

int64_t resume_checkpoint(const std::string& checkpoint_dir, GPT2& model, int64_t zero_stage,
                          const parallel::RankEnv& env, const parallel::FlatLayout& layout,
                          optim::ShardedOptimizer& optimizer, optim::LossScaler& scaler) {
  const int rank = env.rank(), world = env.world_size();
  const CheckpointManifest m = CheckpointManifest::read(checkpoint_dir);
  // The model must be the one that was saved: its config keys, then its layout.
  const GPT2Config& config = model->config();
  for (const auto& model_key : kGPT2ConfigKeys) {
    const std::string key = std::string("model.") + model_key.name;
    const std::string saved = m.config_value(key);
    const std::string now = std::to_string(config.*model_key.field);
    if (!saved.empty() && saved != now) {
      throw UserError("config: " + key + " = " + now + ": the checkpoint " + checkpoint_dir + " was trained with " +
                      saved + "; resume with the same model, or checkpoint.resume = none");
    }
  }
  check_layout(m, model, layout);
  // A manifest that contradicts itself otherwise (shards that leave a gap or overlap) is refused
  // before any shard is read: the same check on every rank, so every rank says it. (After the
  // model and layout checks, whose messages name the parameter.)
  if (const auto problems = verify_manifest(m); !problems.empty()) {
    throw UserError("checkpoint " + checkpoint_dir + " is damaged, nothing was loaded: " + problems.front() +
                    (problems.size() > 1 ? " (and " + std::to_string(problems.size() - 1) +
                                               " more problem(s): gpt2-ckpt verify lists them)"
                                         : ""));
  }
  // Verify every file: the ranks share the files, then all learn every problem, so each rank
  // reports the same error and none loads anything.
  std::vector<size_t> mine;
  for (size_t i = static_cast<size_t>(rank); i < m.files.size(); i += static_cast<size_t>(world)) mine.push_back(i);
  const auto problems = mine.empty() ? std::vector<std::string>{} : verify_checkpoint_files(m, mine);
  std::vector<int> bad(m.files.size(), 0);
  for (size_t k = 0; k < mine.size(); ++k) bad[mine[k]] = problems[k].empty() ? 0 : 1;
  bad = env.all_reduce_max(std::move(bad));
  for (size_t i = 0; i < bad.size(); ++i) {
    if (!bad[i]) continue;
    // Every rank re-checks that one file itself, so the message is the same everywhere.
    const auto again = verify_checkpoint_files(m, {i});
    throw UserError("checkpoint " + checkpoint_dir + " is damaged, nothing was loaded: " +
                    (again.front().empty()
                         ? files::join(m.dir, m.files[i].name) + ": failed verification on another rank"
                         : again.front()));
  }

  // This rank's range, read from the old shards that overlap it; padding stays zero.
  optim::ShardState s = read_shard_state(m, optimizer, env);
  // The step count (the same in every shard), and this rank's generator states from its own file.
  std::vector<uint8_t> rng_cpu, rng_cuda;
  {
    H5ErrorSilencer quiet;
    const bool same_world = world == m.world_size;
    const auto& shard = same_world ? m.shards.at(static_cast<size_t>(rank)) : m.shards.at(0);
    const std::string path = files::join(m.dir, shard.file);
    H5Id file = open_shard(path);
    s.adam_step = read_int_attr_or_throw(file.get(), "adam_step", path);
    if (same_world && shard.rank == rank) {
      rng_cpu = read_bytes(file.get(), "rng_cpu");
      rng_cuda = read_bytes(file.get(), "rng_cuda");
    }
  }
  optimizer.load_state(s);
  optimizer.gather();
  scaler.load(m.loss_scale, m.growth_tracker);
  load_fp8_amax_history(m, model);
  // Generator states only mean something for the same rank of the same world.
  if (!rng_cpu.empty()) {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(as_tensor(rng_cpu));
  }
#ifdef GPT2_WITH_CUDA
  // The generator of the device the model is on, which is the one the writer saved.
  const torch::Device device = model->parameters().front().device();
  if (!rng_cuda.empty() && device.is_cuda()) {
    at::Generator gen = at::cuda::detail::getDefaultCUDAGenerator(device.index());
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(as_tensor(rng_cuda));
  }
#endif
  log::info("resumed from ", checkpoint_dir, " at step ", m.step, " (saved by ", m.world_size, " rank(s), ZeRO ",
            m.zero_stage, "; now ", world, " rank(s), ZeRO ", zero_stage, ")");
  return m.step;
}

}  // namespace gpt2
