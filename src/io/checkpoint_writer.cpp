// Saving sharded checkpoints: snapshot, files (maybe on a thread), manifest, rename, latest,
// retention (see checkpoint_writer.h).
#include "src/io/checkpoint_writer.h"

#include <signal.h>
#include <sys/statvfs.h>

#include <torch/torch.h>
#ifdef GPT2_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "optim/loss_scaler.h"
#include "optim/sharded_optimizer.h"
#include "parallel/flat_layout.h"
#include "parallel/rank_env.h"
#include "src/base/crc32c.h"
#include "src/base/errors.h"
#include "src/base/files.h"
#include "src/base/log.h"
#include "src/base/threads.h"
#include "src/io/h5_io.h"
#include "src/io/manifest.h"
#include "src/io/retention.h"
#include "src/model/gpt2_model.h"

namespace gpt2 {
namespace {

// Test hook GPT2_CKPT_FAULT=RANK:POINT[:STEP] (checkpoint_writer.h): kills this rank at `point`.
void fault_point(int rank, int point, int64_t step) {
  static const char* spec = std::getenv("GPT2_CKPT_FAULT");
  if (spec == nullptr) return;
  int r = -1, p = -1;
  long long s = -1;
  const int n = std::sscanf(spec, "%d:%d:%lld", &r, &p, &s);
  if (n >= 2 && r == rank && p == point && (n < 3 || s == step)) ::raise(SIGKILL);
}

// A written file's size and CRC-32C.
struct FileRecord {
  uint64_t bytes;
  uint32_t crc;
  int32_t pad;
};

// Bytes of the shard's datasets (HDF5 adds its headers on top).
double shard_bytes(const optim::ShardState& s) {
  double bytes = 0;
  for (const torch::Tensor* t : {&s.master, &s.exp_avg, &s.exp_avg_sq, &s.exp_avg_codes, &s.exp_avg_sq_codes,
                                 &s.exp_avg_absmax, &s.exp_avg_sq_absmax}) {
    if (t->defined()) bytes += static_cast<double>(t->numel()) * static_cast<double>(t->element_size());
  }
  return bytes;
}

// Bytes an unprivileged writer may still use on the file system of `dir`; -1 when unknown.
double free_bytes(const std::string& dir) {
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) != 0) return -1;
  return static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize);
}

// What rank 0 gathers from every rank for the manifest: its file (rank 0 knows every rank's ranges).
struct ShardRecord {
  FileRecord file;
};

// The flat ranges rank r's shard file holds: its pieces (sharded: one range, or one per block of
// ZeRO 2's interleaved layout), or (ZeRO 0, where every rank holds all) its contiguous partition.
std::vector<parallel::FlatRange> saved_ranges(const parallel::FlatLayout& layout, bool sharded, int rank) {
  return sharded ? layout.pieces(rank) : std::vector<parallel::FlatRange>{layout.contiguous_shard(rank)};
}

FileRecord record_of(const std::string& path) {
  files::sync_path(path);
  FileRecord r{0, 0, 0};
  r.crc = crc32c_file(path, &r.bytes);
  return r;
}

}  // namespace

// Everything a save writes, copied to host memory, so training may go on while it is written:
// every tensor here owns its storage (none is a view of a parameter or of optimizer state).
struct CheckpointWriter::Snapshot {
  int64_t step = 0;
  std::string root, final_dir, tmp;
  optim::ShardState state;
  int64_t begin = 0, end = 0;                            // the first range's begin, the last's end
  std::vector<std::vector<parallel::FlatRange>> ranges;  // rank 0: every rank's
  torch::Tensor rng_cpu, rng_cuda;
  CheckpointManifest manifest;  // rank 0 only
  // Filled by write_files().
  FileRecord shard_record{0, 0, 0};
};

CheckpointWriter::CheckpointWriter(CheckpointSettings settings, const parallel::RankEnv& env)
    : settings_(std::move(settings)), env_(env) {
  if (env_.rank() == 0 && !settings_.dir.empty()) {
    for (const std::string& path : remove_checkpoint_leftovers(settings_.dir)) {
      log::info("removed ", path, ": left by an interrupted save or removal");
    }
  }
}

CheckpointWriter::~CheckpointWriter() {
  release_hold();
  if (thread_.joinable()) thread_.join();  // files only; an unfinished save stays a .tmp directory
}

std::string CheckpointWriter::save(int64_t step, GPT2& model, const parallel::FlatLayout& layout,
                                   optim::ShardedOptimizer& optimizer, const optim::LossScaler& scaler, bool async) {
  const int rank = env_.rank(), world = env_.world_size();
  if (pending_) wait();  // one save at a time
  auto snap = std::make_unique<Snapshot>();
  snap->step = step;
  snap->root = settings_.dir;
  snap->final_dir = files::join(snap->root, step_dir_name(step));
  snap->tmp = snap->final_dir + ".tmp";
  // Rank 0 decides (one view of the file system) and prepares the directory.
  int exists = 0;
  if (rank == 0) {
    files::create_directories(snap->root);
    exists = files::is_regular_file(files::join(snap->final_dir, "manifest.json")) ? 1 : 0;
    if (!exists) {
      files::remove_tree(snap->tmp);  // a crashed earlier attempt at this step
      files::create_directories(snap->tmp);
    }
  }
  if (env_.broadcast_from_main(exists)) return snap->final_dir;
  fault_point(rank, 1, step);

  // The snapshot: optimizer shard, generator states, and on rank 0 the manifest fields. The
  // parameters are not saved apart: the shards' fp32 masters are the model (model_weights.h).
  // ZeRO 0: every rank holds the same full state; each writes only its partition, in parallel.
  const auto mine = saved_ranges(layout, optimizer.sharded(), rank);
  snap->begin = mine.front().begin;
  snap->end = mine.back().end;
  snap->state = mine.size() == 1 ? optimizer.state(snap->begin, snap->end) : optimizer.state();
  snap->rng_cpu = at::detail::getDefaultCPUGenerator().get_state();
  const auto named = model->named_parameters();
#ifdef GPT2_WITH_CUDA
  if (named[0].value().is_cuda()) {
    snap->rng_cuda = at::cuda::detail::getDefaultCUDAGenerator(named[0].value().device().index()).get_state();
  }
#endif
  if (rank == 0) {
    CheckpointManifest& m = snap->manifest;
    m.step = step;
    m.world_size = world;
    m.zero_stage = settings_.zero_stage;
    m.offload = settings_.offload;
    m.dtype = settings_.dtype;
    m.optimizer_moments = optimizer.moments_8bit() ? optim::MomentFormat::k8bit : optim::MomentFormat::kFp32;
    m.optimizer = snap->state.update_rule();
    m.flat_total = layout.total;
    m.flat_padded = layout.padded;
    for (size_t i = 0; i < named.size(); ++i) {
      m.params.push_back({named[i].key(), named[i].value().sizes().vec(), layout.offset[i], layout.numel[i]});
    }
    if (const torch::Tensor& amax = model->fp8_amax_history(); amax.defined()) {
      const torch::Tensor host = amax.to(torch::kCPU).contiguous();
      m.fp8_amax_shape = host.sizes().vec();
      m.fp8_amax.assign(host.data_ptr<float>(), host.data_ptr<float>() + host.numel());
      m.fp8_steps = model->fp8_steps_recorded();
    }
    m.loss_scale = scaler.enabled() ? scaler.scale() : 1.0;
    m.growth_tracker = scaler.growth_tracker().item<int64_t>();
    m.seed = settings_.seed;
    m.config = settings_.config;
    for (int r = 0; r < world; ++r) snap->ranges.push_back(saved_ranges(layout, optimizer.sharded(), r));
  }
  pending_ = std::move(snap);
  if (!async) {
    write_files(*pending_);
    return finish();
  }
  // Files on a thread (HDF5 is used by no other thread during training); finish() is collective
  // and runs on this thread once every rank's files are written (poll()).
  written_.store(false);
  {
    const char* hold = std::getenv("GPT2_CKPT_HOLD");  // read per save, so a test can set it
    std::lock_guard<std::mutex> lock(hold_mutex_);
    hold_ = hold != nullptr ? std::strtoll(hold, nullptr, 10) : 0;
    polls_ = 0;
    released_ = hold_ <= 0;
  }
  thread_ = start_helper_thread([this] {
    try {
      {
        std::unique_lock<std::mutex> lock(hold_mutex_);
        hold_cv_.wait(lock, [this] { return released_ || polls_ >= hold_; });
      }
      write_files(*pending_);
    } catch (const std::exception& e) {
      error_ = e.what();
    }
    written_.store(true);
  });
  return "";
}

void CheckpointWriter::write_files(Snapshot& snap) {
  const std::string shard_path = files::join(snap.tmp, shard_file_name(env_.rank()));
  std::string reason;
  // A disk that cannot hold the shard is found before HDF5 starts on it: a write that fails inside
  // HDF5 leaves a file it cannot close (its own message at exit is noise, Note [HDF5 at exit]).
  // (HDF5's headers for the shard's few datasets are a few KiB; 64 KiB covers them.)
  const double need = shard_bytes(snap.state) + 65536, have = free_bytes(snap.tmp);
  if (have >= 0 && have < need) {
    reason = log::format("%s (%.1f MiB free, the shard needs %.1f MiB)", std::strerror(ENOSPC), have / 1048576.0,
                         need / 1048576.0);
  } else {
    try {
      write_shard(snap, shard_path);
      return;
    } catch (const std::exception& e) {
      // errno still holds the failed write's reason (HDF5 reports a failed write(2) without
      // clearing it); HDF5's own message is the fallback.
      const int err = errno;
      const std::string what = e.what();
      reason = err == ENOSPC || err == EDQUOT || err == EIO || err == EFBIG || err == EROFS
                   ? std::strerror(err)
                   : what.substr(0, what.find('\n'));
    }
  }
  files::remove_file(shard_path);
  if (env_.rank() == 0) files::remove_tree(snap.tmp);  // another rank's unfinished .tmp goes at the next start
  throw UserError("checkpoint of step " + std::to_string(snap.step) + ": cannot write " + shard_path + ": " + reason +
                  " (the checkpoints saved before it are intact)");
}

void CheckpointWriter::write_shard(Snapshot& snap, const std::string& shard_path) {
  const int rank = env_.rank();
  const int64_t step = snap.step;
  {
    h5::H5ErrorSilencer quiet;
    h5::H5Id file = h5::create_h5(shard_path);
    const optim::ShardState& s = snap.state;
    // The datasets of docs/DESIGN.md "Checkpoint layout as built", from manifest.h's table.
    for (const ShardDataset& d :
         shard_datasets(s.moments_8bit ? optim::MomentFormat::k8bit : optim::MomentFormat::kFp32, s.update_rule())) {
      const torch::Tensor t = (s.*d.state).contiguous();
      if (d.is_uint8) {
        h5::write_bytes(file.get(), d.name, t.data_ptr<uint8_t>(), t.numel());
      } else {
        h5::write_f32(file.get(), d.name, t.data_ptr<float>(), {static_cast<hsize_t>(t.numel())});
      }
      if (d.state == &optim::ShardState::master) fault_point(rank, 2, step);
    }
    h5::write_int_attr(file.get(), "begin", snap.begin);
    h5::write_int_attr(file.get(), "end", snap.end);
    h5::write_int_attr(file.get(), "adam_step", snap.state.adam_step);
    for (auto [name, rng] :
         {std::pair<const char*, torch::Tensor*>{"rng_cpu", &snap.rng_cpu}, {"rng_cuda", &snap.rng_cuda}}) {
      if (rng->defined()) h5::write_bytes(file.get(), name, rng->contiguous().data_ptr<uint8_t>(), rng->numel());
    }
    if (H5Fclose(file.release()) < 0) throw UserError(shard_path + ": writing failed (disk full?)");
  }
  fault_point(rank, 3, step);
  snap.shard_record = record_of(shard_path);
  fault_point(rank, 4, step);
  fault_point(rank, 5, step);
}

void CheckpointWriter::release_hold() {
  {
    std::lock_guard<std::mutex> lock(hold_mutex_);
    released_ = true;
  }
  hold_cv_.notify_all();
}

std::string CheckpointWriter::poll() {
  if (!pending_) return "";
  {
    std::lock_guard<std::mutex> lock(hold_mutex_);
    ++polls_;
  }
  hold_cv_.notify_all();
  return env_.all_reduce_min(written_.load() ? 1 : 0) ? finish() : "";
}

std::string CheckpointWriter::wait() {
  if (!pending_) return "";
  release_hold();
  if (thread_.joinable()) thread_.join();
  return finish();
}

std::string CheckpointWriter::finish() {
  release_hold();
  if (thread_.joinable()) thread_.join();
  std::unique_ptr<Snapshot> snap = std::move(pending_);
  if (!error_.empty()) {
    const std::string e = error_;
    error_.clear();
    throw UserError(e);
  }
  const int rank = env_.rank(), world = env_.world_size();
  const int64_t step = snap->step;
  const std::vector<ShardRecord> shards = env_.gather_to_main(ShardRecord{snap->shard_record});
  if (rank == 0) {
    CheckpointManifest& m = snap->manifest;
    for (int r = 0; r < world; ++r) {
      const auto& ranges = snap->ranges[static_cast<size_t>(r)];
      m.shards.push_back({shard_file_name(r), r, ranges.front().begin, ranges.back().end, ranges});
    }
    for (int r = 0; r < world; ++r) {
      m.files.push_back({shard_file_name(r), shards[r].file.bytes, crc32c_hex(shards[r].file.crc)});
    }
    fault_point(rank, 6, step);
    files::write_file_durably(files::join(snap->tmp, "manifest.json"), json::dump(m.to_json()) + "\n");
    fault_point(rank, 7, step);
    if (files::exists(snap->final_dir)) {  // an incomplete one of this step (find_checkpoint warned)
      log::warn("replacing ", snap->final_dir, ": it has no manifest.json");
      files::remove_tree(snap->final_dir);
    }
    files::rename_durably(snap->tmp, snap->final_dir);  // from here on the checkpoint is complete
    fault_point(rank, 8, step);
    files::write_file_durably(files::join(snap->root, "latest"), step_dir_name(step) + "\n");
    fault_point(rank, 9, step);
    prune_checkpoints(snap->root, settings_.keep, step);
    fault_point(rank, 10, step);
  }
  env_.barrier();
  return snap->final_dir;
}

}  // namespace gpt2
