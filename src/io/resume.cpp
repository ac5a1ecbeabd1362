// Reading checkpoints back: flat ranges of the optimizer shards, and a collective resume (see
// resume.h).
#include "src/io/resume.h"

#include <mpi.h>

#include <torch/torch.h>
#ifdef GPT2_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "optim/loss_scaler.h"
#include "optim/sharded_adamw.h"
#include "parallel/flat_layout.h"
#include "parallel/rank_env.h"
#include "src/base/errors.h"
#include "src/base/files.h"
#include "src/base/log.h"
#include "src/base/mpi_check.h"
#include "src/io/h5_io.h"

namespace gpt2 {
namespace {

using h5::H5ErrorSilencer;
using h5::H5Id;
using h5::read_bytes;
using h5::read_f32_range;
using h5::read_int_attr_or_throw;

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
      if (!in_model.count(p.name)) throw UserError(mf + ": parameter " + p.name + " of the checkpoint is not in the model");
    }
  }
  if (m.flat_total != layout.total) {
    throw UserError(m.dir + ": holds " + std::to_string(m.flat_total) + " parameters, the model has " +
                    std::to_string(layout.total));
  }
}

}  // namespace

void read_flat_range(const CheckpointManifest& m, const char* dataset, int64_t begin, int64_t end, float* out) {
  H5ErrorSilencer quiet;
  // Walk the range through the shard that holds each part (the shards tile the flat space).
  for (int64_t pos = begin; pos < end;) {
    size_t k = 0;
    while (k < m.shards.size() && !(m.shards[k].begin <= pos && pos < m.shards[k].end)) ++k;
    if (k == m.shards.size()) {
      throw UserError(files::join(m.dir, "manifest.json") + ": flat element " + std::to_string(pos) + " is in no shard");
    }
    const auto& shard = m.shards[k];
    const int64_t hi = std::min(end, shard.end);
    const std::string path = files::join(m.dir, shard.file);
    H5Id file = open_shard(path);
    if (read_int_attr_or_throw(file.get(), "begin", path) != shard.begin ||
        read_int_attr_or_throw(file.get(), "end", path) != shard.end) {
      throw UserError(path + ": its range does not match the manifest");
    }
    read_f32_range(file.get(), dataset, pos - shard.begin, hi - pos, out + (pos - begin), path);
    pos = hi;
  }
}

int64_t resume_checkpoint(const std::string& checkpoint_dir, GPT2& model, int64_t zero_stage,
                          const parallel::RankEnv& env, const parallel::FlatLayout& layout,
                          optim::ShardedAdamW& optimizer, optim::LossScaler& scaler) {
  const int rank = env.rank(), world = env.world_size();
  const CheckpointManifest m = CheckpointManifest::read(checkpoint_dir);
  // The model must be the one that was saved: its config keys, then its layout.
  const GPT2Config& config = model->config();
  for (const auto& model_key : kGPT2ConfigKeys) {
    const std::string key = std::string("model.") + model_key.name;
    const std::string saved = m.config_value(key);
    const std::string now = std::to_string(config.*model_key.field);
    if (!saved.empty() && saved != now) {
      throw UserError("config: " + key + " = " + now + ": the checkpoint " + checkpoint_dir +
                      " was trained with " + saved + "; resume with the same model, or checkpoint.resume = none");
    }
  }
  check_layout(m, model, layout);
  // Verify every file: the ranks share the files, then all learn every problem, so each rank
  // reports the same error and none loads anything.
  std::vector<size_t> mine;
  for (size_t i = static_cast<size_t>(rank); i < m.files.size(); i += static_cast<size_t>(world)) mine.push_back(i);
  const auto problems = mine.empty() ? std::vector<std::string>{} : verify_checkpoint_files(m, mine);
  std::vector<int> bad(m.files.size(), 0);
  for (size_t k = 0; k < mine.size(); ++k) bad[mine[k]] = problems[k].empty() ? 0 : 1;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, bad.data(), static_cast<int>(bad.size()), MPI_INT, MPI_MAX, env.comm()));
  for (size_t i = 0; i < bad.size(); ++i) {
    if (!bad[i]) continue;
    // Every rank re-checks that one file itself, so the message is the same everywhere.
    const auto again = verify_checkpoint_files(m, {i});
    throw UserError("checkpoint " + checkpoint_dir + " is damaged, nothing was loaded: " +
                    (again.front().empty() ? files::join(m.dir, m.files[i].name) + ": failed verification on another rank"
                                           : again.front()));
  }

  // This rank's range, read from the old shards that overlap it; padding stays zero.
  const int64_t begin = optimizer.shard_begin(), end = begin + optimizer.shard_numel();
  const int64_t real_end = std::max(begin, std::min(end, m.flat_total));
  optim::ShardedAdamW::ShardState s;
  for (auto [name, t] : {std::pair<const char*, torch::Tensor*>{"master", &s.master},
                         {"exp_avg", &s.exp_avg}, {"exp_avg_sq", &s.exp_avg_sq}}) {
    *t = torch::zeros({end - begin}, torch::kFloat);
    read_flat_range(m, name, begin, real_end, t->data_ptr<float>());
  }
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
