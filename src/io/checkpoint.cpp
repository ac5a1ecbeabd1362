// Sharded checkpoints: manifest, save and resume (see checkpoint.h).
#include "src/io/checkpoint.h"

#include <fcntl.h>
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <torch/torch.h>
#ifdef GPT2_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "src/base/h5_check.h"
#include "optim/loss_scaler.h"
#include "optim/sharded_adamw.h"
#include "parallel/flat_layout.h"
#include "src/base/mpi_check.h"
#include "parallel/rank_env.h"
#include "src/base/crc32c.h"
#include "src/base/errors.h"
#include "src/base/files.h"
#include "src/base/log.h"
#include "src/model/gpt2_model.h"

namespace gpt2 {
namespace {

using h5::H5ErrorSilencer;
using h5::H5Id;
using h5::write_int_attr;

// The step of a complete-looking "step_NNNNNNN" entry name, else -1 (".tmp" and others).
int64_t step_of(const std::string& name) {
  if (name.rfind("step_", 0) != 0 || name.size() == 5) return -1;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || v > (int64_t{1} << 58)) return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

std::string step_name(int64_t step) {
  char s[32];
  std::snprintf(s, sizeof s, "step_%07lld", static_cast<long long>(step));
  return s;
}

std::string shard_name(int rank) {
  char s[32];
  std::snprintf(s, sizeof s, "optim_r%05d.h5", rank);
  return s;
}

// Test hook: GPT2_CKPT_FAULT=RANK:POINT[:STEP] kills that rank with SIGKILL at save point POINT
// (1..10 below) of every save, or only of the save of STEP, so tests can check that a crash
// anywhere in a save never spoils what a resume finds.
void fault_point(int rank, int point, int64_t step) {
  static const char* spec = std::getenv("GPT2_CKPT_FAULT");
  if (spec == nullptr) return;
  int r = -1, p = -1;
  long long s = -1;
  const int n = std::sscanf(spec, "%d:%d:%lld", &r, &p, &s);
  if (n >= 2 && r == rank && p == point && (n < 3 || s == step)) ::raise(SIGKILL);
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) throw UserError(path + ": cannot open to sync: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw UserError(path + ": fsync failed: " + std::strerror(err));
}

// Writes `text` to `path` durably: path.tmp, fsync, rename, fsync of the directory.
void write_durably(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) throw UserError(tmp + ": cannot write: " + std::strerror(errno));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0 &&
                  ::fsync(::fileno(f)) == 0;
  const int err = errno;
  std::fclose(f);
  if (!ok) throw UserError(tmp + ": write failed: " + std::strerror(err));
  files::rename_file(tmp, path);
  fsync_path(files::parent_path(path).empty() ? "." : files::parent_path(path), true);
}

// ---- HDF5 pieces

H5Id create_h5(const std::string& path) {
  const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0) throw UserError(path + ": cannot create (is the checkpoint directory writable?)");
  return H5Id(f, H5Fclose);
}

// Dataset creation without modification times, so the same state always gives the same bytes
// (and checksums).
H5Id untimed_dcpl() {
  H5Id dcpl(H5_ID(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
  H5_CHECK(H5Pset_obj_track_times(dcpl.get(), 0));
  return dcpl;
}

void write_f32(hid_t loc, const std::string& name, const torch::Tensor& cpu_f32, const std::vector<hsize_t>& dims) {
  H5Id space(H5_ID(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)), H5Sclose);
  H5Id dcpl = untimed_dcpl();
  H5Id dset(H5_ID(H5Dcreate2(loc, name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT)),
            H5Dclose);
  if (cpu_f32.numel() > 0) {
    H5_CHECK(H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, cpu_f32.contiguous().data_ptr()));
  }
}

void write_bytes(hid_t loc, const std::string& name, const torch::Tensor& bytes) {
  const hsize_t dims[1] = {static_cast<hsize_t>(bytes.numel())};
  H5Id space(H5_ID(H5Screate_simple(1, dims, nullptr)), H5Sclose);
  H5Id dcpl = untimed_dcpl();
  H5Id dset(H5_ID(H5Dcreate2(loc, name.c_str(), H5T_NATIVE_UINT8, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT)),
            H5Dclose);
  if (bytes.numel() > 0) H5_CHECK(H5Dwrite(dset.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data_ptr()));
}


int64_t read_int_attr(hid_t loc, const char* name, const std::string& path) {
  if (H5Aexists(loc, name) <= 0) throw UserError(path + ": missing attribute '" + std::string(name) + "'");
  H5Id attr(H5_ID(H5Aopen(loc, name, H5P_DEFAULT)), H5Aclose);
  int64_t v = 0;
  H5_CHECK(H5Aread(attr.get(), H5T_NATIVE_INT64, &v));
  return v;
}

// Reads elements [from, from + n) of the 1-D fp32 dataset `name` into out (n floats).
void read_f32_range(hid_t file, const char* name, int64_t from, int64_t n, float* out, const std::string& path) {
  if (H5Lexists(file, name, H5P_DEFAULT) <= 0) throw UserError(path + ": no dataset /" + name);
  H5Id dset(H5_ID(H5Dopen2(file, name, H5P_DEFAULT)), H5Dclose);
  H5Id space(H5_ID(H5Dget_space(dset.get())), H5Sclose);
  hsize_t dims[1] = {0};
  if (H5Sget_simple_extent_ndims(space.get()) != 1) throw UserError(path + ": /" + name + " is not 1-D");
  H5_CHECK(H5Sget_simple_extent_dims(space.get(), dims, nullptr));
  if (from < 0 || n < 0 || static_cast<hsize_t>(from + n) > dims[0]) {
    throw UserError(path + ": /" + name + " has " + std::to_string(dims[0]) + " elements, the manifest needs [" +
                    std::to_string(from) + ", " + std::to_string(from + n) + ")");
  }
  if (n == 0) return;
  const hsize_t start[1] = {static_cast<hsize_t>(from)}, count[1] = {static_cast<hsize_t>(n)};
  H5_CHECK(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr));
  H5Id mem(H5_ID(H5Screate_simple(1, count, nullptr)), H5Sclose);
  H5_CHECK(H5Dread(dset.get(), H5T_NATIVE_FLOAT, mem.get(), space.get(), H5P_DEFAULT, out));
}

H5Id open_shard(const std::string& path) {
  const hid_t fid = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (fid < 0) throw UserError(path + ": cannot open the optimizer shard");
  return H5Id(fid, H5Fclose);
}

torch::Tensor read_bytes(hid_t file, const char* name) {
  if (H5Lexists(file, name, H5P_DEFAULT) <= 0) return {};
  H5Id dset(H5_ID(H5Dopen2(file, name, H5P_DEFAULT)), H5Dclose);
  H5Id space(H5_ID(H5Dget_space(dset.get())), H5Sclose);
  hsize_t dims[1] = {0};
  H5_CHECK(H5Sget_simple_extent_dims(space.get(), dims, nullptr));
  auto out = torch::empty({static_cast<int64_t>(dims[0])}, torch::kUInt8);
  if (dims[0] > 0) H5_CHECK(H5Dread(dset.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data_ptr()));
  return out;
}

struct FileRecord {
  uint64_t bytes;
  uint32_t crc;
  int32_t pad;
};

FileRecord record_of(const std::string& path) {
  fsync_path(path, false);
  FileRecord r{0, 0, 0};
  r.crc = crc32c_file(path, &r.bytes);
  return r;
}

}  // namespace

// ------------------------------------------------------------------------------------ manifest

json::Value CheckpointManifest::to_json() const {
  using json::Value;
  Value::Array ps, ss, fs;
  for (const auto& p : params) {
    Value::Array shape;
    for (int64_t d : p.shape) shape.push_back(Value::integer(d));
    ps.push_back(Value::object({{"name", Value::string(p.name)},
                                {"shape", Value::array(shape)},
                                {"offset", Value::integer(p.offset)},
                                {"numel", Value::integer(p.numel)}}));
  }
  for (const auto& s : shards) {
    ss.push_back(Value::object({{"file", Value::string(s.file)},
                                {"rank", Value::integer(s.rank)},
                                {"begin", Value::integer(s.begin)},
                                {"end", Value::integer(s.end)}}));
  }
  for (const auto& f : files) {
    fs.push_back(Value::object({{"name", Value::string(f.name)},
                                {"bytes", Value::integer(static_cast<int64_t>(f.bytes))},
                                {"crc32c", Value::string(f.crc32c)}}));
  }
  Value::Object cfg;
  for (const auto& [k, v] : config) cfg.emplace_back(k, Value::string(v));
  return Value::object({
      {"format", Value::string(kCheckpointFormat)},
      {"format_version", Value::integer(kCheckpointVersion)},
      {"step", Value::integer(step)},
      {"world_size", Value::integer(world_size)},
      {"zero_stage", Value::integer(zero_stage)},
      {"offload", Value::string(offload)},
      {"dtype", Value::string(dtype)},
      {"flat_total", Value::integer(flat_total)},
      {"flat_padded", Value::integer(flat_padded)},
      {"params", Value::array(ps)},
      {"shards", Value::array(ss)},
      {"loss_scaler", Value::object({{"scale", Value::number(loss_scale)},
                                     {"growth_tracker", Value::integer(growth_tracker)}})},
      {"data", Value::object({{"seed", Value::integer(static_cast<int64_t>(seed))}, {"next_step", Value::integer(step)}})},
      {"config", Value::object(cfg)},
      {"files", Value::array(fs)},
  });
}

CheckpointManifest CheckpointManifest::read(const std::string& dir) {
  const std::string path = files::join(dir, "manifest.json");
  if (!files::is_regular_file(path)) {
    throw UserError(path + ": missing (not a checkpoint directory, or an incomplete one)");
  }
  const json::Value v = json::parse(files::read_file(path), path);
  const std::string what = path;
  CheckpointManifest m;
  m.dir = dir;
  if (v.at("format", what).as_string("format") != kCheckpointFormat) {
    throw UserError(path + ": format is '" + v.at("format", what).as_string() + "', expected '" + kCheckpointFormat + "'");
  }
  const int64_t version = v.at("format_version", what).as_int("format_version");
  if (version != kCheckpointVersion) {
    throw UserError(path + ": format_version " + std::to_string(version) + " is not supported (this build reads " +
                    std::to_string(kCheckpointVersion) + ")");
  }
  m.step = v.at("step", what).as_int("step");
  m.world_size = static_cast<int>(v.at("world_size", what).as_int("world_size"));
  m.zero_stage = v.at("zero_stage", what).as_int("zero_stage");
  m.offload = v.at("offload", what).as_string("offload");
  m.dtype = v.at("dtype", what).as_string("dtype");
  m.flat_total = v.at("flat_total", what).as_int("flat_total");
  m.flat_padded = v.at("flat_padded", what).as_int("flat_padded");
  if (m.world_size < 1 || m.flat_total < 0 || m.flat_padded < m.flat_total) {
    throw UserError(path + ": inconsistent sizes (world_size " + std::to_string(m.world_size) + ", flat_total " +
                    std::to_string(m.flat_total) + ", flat_padded " + std::to_string(m.flat_padded) + ")");
  }
  for (const auto& p : v.at("params", what).as_array("params")) {
    Param q;
    q.name = p.at("name", what + " params").as_string("params.name");
    for (const auto& d : p.at("shape", what + " params").as_array("params.shape")) q.shape.push_back(d.as_int("shape"));
    q.offset = p.at("offset", what + " params").as_int("params.offset");
    q.numel = p.at("numel", what + " params").as_int("params.numel");
    m.params.push_back(std::move(q));
  }
  for (const auto& s : v.at("shards", what).as_array("shards")) {
    Shard q;
    q.file = s.at("file", what + " shards").as_string("shards.file");
    q.rank = static_cast<int>(s.at("rank", what + " shards").as_int("shards.rank"));
    q.begin = s.at("begin", what + " shards").as_int("shards.begin");
    q.end = s.at("end", what + " shards").as_int("shards.end");
    if (q.begin < 0 || q.end < q.begin || q.end > m.flat_padded) {
      throw UserError(path + ": shard " + q.file + " has an invalid range [" + std::to_string(q.begin) + ", " +
                      std::to_string(q.end) + ")");
    }
    m.shards.push_back(std::move(q));
  }
  for (const auto& f : v.at("files", what).as_array("files")) {
    File q;
    q.name = f.at("name", what + " files").as_string("files.name");
    const int64_t bytes = f.at("bytes", what + " files").as_int("files.bytes");
    if (bytes < 0) throw UserError(path + ": file " + q.name + " has a negative size");
    q.bytes = static_cast<uint64_t>(bytes);
    q.crc32c = f.at("crc32c", what + " files").as_string("files.crc32c");
    if (q.name.empty() || q.name.find('/') != std::string::npos || q.name == "." || q.name == "..") {
      throw UserError(path + ": file name '" + q.name + "' is not a plain name in the checkpoint directory");
    }
    m.files.push_back(std::move(q));
  }
  for (const auto& shard : m.shards) {  // a shard outside `files` would never be checksummed
    if (std::none_of(m.files.begin(), m.files.end(), [&](const File& f) { return f.name == shard.file; })) {
      throw UserError(path + ": shard " + shard.file + " is not among the checksummed files");
    }
  }
  const auto& scaler = v.at("loss_scaler", what);
  m.loss_scale = scaler.at("scale", what + " loss_scaler").as_double("loss_scaler.scale");
  m.growth_tracker = scaler.at("growth_tracker", what + " loss_scaler").as_int("loss_scaler.growth_tracker");
  m.seed = static_cast<uint64_t>(v.at("data", what).at("seed", what + " data").as_int("data.seed"));
  for (const auto& [k, val] : v.at("config", what).as_object("config")) m.config.emplace_back(k, val.as_string(k));
  return m;
}

std::string CheckpointManifest::config_value(const std::string& key) const {
  for (const auto& [k, v] : config)
    if (k == key) return v;
  return "";
}

GPT2Config CheckpointManifest::model_config() const {
  GPT2Config c;
  for (const auto& key : kGPT2ConfigKeys) {
    const std::string k = std::string("model.") + key.name, v = config_value(k);
    char* end = nullptr;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0') {
      throw UserError(files::join(dir, "manifest.json") + ": config " + k + " = '" + v + "' is not an integer");
    }
    c.*key.field = n;
  }
  return c;
}

std::string find_checkpoint(const std::string& dir) {
  if (dir.empty() || !files::is_directory(dir)) return "";
  if (files::is_regular_file(files::join(dir, "manifest.json"))) return dir;
  // The newest step_NNNNNNN/ with a manifest: a directory gets its final name only after its
  // manifest is on disk, so it is complete even when a crash came before `latest` was replaced.
  std::string newest;
  int64_t newest_step = -1;
  for (const auto& name : files::list_directory(dir)) {
    const int64_t step = step_of(name);
    if (step > newest_step && files::is_regular_file(files::join(files::join(dir, name), "manifest.json"))) {
      newest = name;
      newest_step = step;
    }
  }
  if (!newest.empty()) return files::join(dir, newest);
  const std::string latest = files::join(dir, "latest");
  if (files::is_regular_file(latest)) {
    throw UserError(latest + ": names a checkpoint, but " + dir + " holds no complete step_* directory");
  }
  return "";
}

std::vector<std::string> verify_checkpoint_files(const CheckpointManifest& m, const std::vector<size_t>& which) {
  std::vector<size_t> idx = which;
  if (idx.empty())
    for (size_t i = 0; i < m.files.size(); ++i) idx.push_back(i);
  std::vector<std::string> problems;
  for (size_t i : idx) {
    const auto& f = m.files.at(i);
    const std::string path = files::join(m.dir, f.name);
    uint64_t size = 0;
    try {
      if (!files::is_regular_file(path)) {
        problems.push_back(path + ": missing");
        continue;
      }
      size = static_cast<uint64_t>(files::file_size(path));
    } catch (const Error& e) {
      problems.push_back(e.what());
      continue;
    }
    if (size != f.bytes) {
      problems.push_back(path + ": " + std::to_string(size) + " bytes, the manifest says " + std::to_string(f.bytes) +
                         " (truncated or replaced)");
      continue;
    }
    try {
      const std::string crc = crc32c_hex(crc32c_file(path));
      problems.push_back(crc == f.crc32c ? "" : path + ": checksum mismatch (manifest crc32c " + f.crc32c + ", file " + crc + ")");
    } catch (const Error& e) {  // unreadable: a problem like the others, so every rank reports it
      problems.push_back(e.what());
    }
  }
  return problems;
}

// ------------------------------------------------------------------------------------ save

// Everything a save writes, copied to host memory, so training may go on while it is written.
struct CheckpointWriter::Snapshot {
  int64_t step = 0;
  std::string root, final_dir, tmp;
  optim::ShardedAdamW::ShardState state;
  int64_t begin = 0, end = 0;
  torch::Tensor rng_cpu, rng_cuda;
  // Rank 0 only: the model (fp32) and what the manifest needs.
  std::vector<std::pair<std::string, torch::Tensor>> params;
  CheckpointManifest manifest;
  // Filled by write_files().
  FileRecord shard_record{0, 0, 0}, model_record{0, 0, 0};
};

CheckpointWriter::CheckpointWriter(CheckpointSettings settings, const parallel::RankEnv& env)
    : settings_(std::move(settings)), env_(env) {}

CheckpointWriter::~CheckpointWriter() {
  if (thread_.joinable()) thread_.join();  // files only; an unfinished save stays a .tmp directory
}

std::string CheckpointWriter::save(int64_t step, GPT2& model, const parallel::FlatLayout& layout,
                                   optim::ShardedAdamW& optimizer, const optim::LossScaler& scaler, bool async) {
  const int rank = env_.rank(), world = env_.world_size();
  if (pending_) wait();  // one save at a time
  auto snap = std::make_unique<Snapshot>();
  snap->step = step;
  snap->root = settings_.dir;
  snap->final_dir = files::join(snap->root, step_name(step));
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
  MPI_CHECK(MPI_Bcast(&exists, 1, MPI_INT, 0, env_.comm()));
  if (exists) return snap->final_dir;
  fault_point(rank, 1, step);

  // The snapshot: optimizer shard, generator states, and on rank 0 the model and manifest fields.
  snap->state = optimizer.state();
  snap->begin = optimizer.shard_begin();
  snap->end = optimizer.shard_begin() + optimizer.shard_numel();
  if (!optimizer.sharded() && world > 1) {
    // ZeRO 0: every rank holds the same full state; each writes only its partition, in parallel.
    snap->begin = layout.shard_begin(rank);
    snap->end = layout.shard_end(rank);
    for (auto* t : {&snap->state.master, &snap->state.exp_avg, &snap->state.exp_avg_sq}) {
      *t = t->narrow(0, snap->begin, snap->end - snap->begin).contiguous();
    }
  }
  snap->rng_cpu = at::detail::getDefaultCPUGenerator().get_state();
  const auto named = model->named_parameters();
#ifdef GPT2_WITH_CUDA
  if (named[0].value().is_cuda()) {
    snap->rng_cuda = at::cuda::detail::getDefaultCUDAGenerator(named[0].value().device().index()).get_state();
  }
#endif
  if (rank == 0) {
    for (const auto& item : named) snap->params.emplace_back(item.key(), item.value().detach().to(torch::kCPU, torch::kFloat));
    CheckpointManifest& m = snap->manifest;
    m.step = step;
    m.world_size = world;
    m.zero_stage = settings_.zero_stage;
    m.offload = settings_.offload;
    m.dtype = named[0].value().is_cuda() ? settings_.dtype : "fp32";
    m.flat_total = layout.total;
    m.flat_padded = layout.padded;
    for (size_t i = 0; i < named.size(); ++i) {
      m.params.push_back({named[i].key(), named[i].value().sizes().vec(), layout.offset[i], layout.numel[i]});
    }
    m.loss_scale = scaler.enabled() ? scaler.scale() : 1.0;
    m.growth_tracker = scaler.growth_tracker().item<int64_t>();
    m.seed = settings_.seed;
    m.config = settings_.config;
  }
  pending_ = std::move(snap);
  if (!async) {
    write_files(*pending_);
    return finish();
  }
  // Files on a thread (HDF5 is used by no other thread during training); finish() is collective
  // and runs on this thread once every rank's files are written (poll()).
  written_.store(false);
  thread_ = std::thread([this] {
    try {
      write_files(*pending_);
    } catch (const std::exception& e) {
      error_ = e.what();
    }
    written_.store(true);
  });
  return "";
}

void CheckpointWriter::write_files(Snapshot& snap) {
  const int rank = env_.rank();
  const int64_t step = snap.step;
  const std::string shard_file = shard_name(rank);
  {
    H5ErrorSilencer quiet;
    H5Id file = create_h5(files::join(snap.tmp, shard_file));
    const hsize_t n = static_cast<hsize_t>(snap.end - snap.begin);
    write_f32(file.get(), "master", snap.state.master, {n});
    fault_point(rank, 2, step);
    write_f32(file.get(), "exp_avg", snap.state.exp_avg, {n});
    write_f32(file.get(), "exp_avg_sq", snap.state.exp_avg_sq, {n});
    write_int_attr(file.get(), "begin", snap.begin);
    write_int_attr(file.get(), "end", snap.end);
    write_int_attr(file.get(), "adam_step", snap.state.adam_step);
    write_bytes(file.get(), "rng_cpu", snap.rng_cpu);
    if (snap.rng_cuda.defined()) write_bytes(file.get(), "rng_cuda", snap.rng_cuda);
    if (H5Fclose(file.release()) < 0) throw UserError(files::join(snap.tmp, shard_file) + ": writing failed (disk full?)");
  }
  fault_point(rank, 3, step);
  snap.shard_record = record_of(files::join(snap.tmp, shard_file));
  fault_point(rank, 4, step);
  if (rank == 0) {
    H5ErrorSilencer quiet;
    H5Id file = create_h5(files::join(snap.tmp, "model.h5"));
    write_int_attr(file.get(), "step", step);
    for (const auto& [name, p] : snap.params) {
      std::vector<hsize_t> dims(p.sizes().begin(), p.sizes().end());
      write_f32(file.get(), name, p, dims);
    }
    if (H5Fclose(file.release()) < 0) throw UserError(files::join(snap.tmp, "model.h5") + ": writing failed (disk full?)");
    snap.model_record = record_of(files::join(snap.tmp, "model.h5"));
  }
  fault_point(rank, 5, step);
}

std::string CheckpointWriter::poll() {
  if (!pending_) return "";
  int done = written_.load() ? 1 : 0;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &done, 1, MPI_INT, MPI_MIN, env_.comm()));
  return done ? finish() : "";
}

std::string CheckpointWriter::wait() {
  if (!pending_) return "";
  if (thread_.joinable()) thread_.join();
  return finish();
}

std::string CheckpointWriter::finish() {
  if (thread_.joinable()) thread_.join();
  std::unique_ptr<Snapshot> snap = std::move(pending_);
  if (!error_.empty()) {
    const std::string e = error_;
    error_.clear();
    throw UserError(e);
  }
  const int rank = env_.rank(), world = env_.world_size();
  const int64_t step = snap->step;
  std::vector<FileRecord> records(rank == 0 ? world : 0);
  std::vector<int64_t> ranges(rank == 0 ? 2 * world : 0);
  const int64_t my_range[2] = {snap->begin, snap->end};
  MPI_CHECK(MPI_Gather(&snap->shard_record, sizeof(FileRecord), MPI_BYTE, records.data(), sizeof(FileRecord), MPI_BYTE,
                       0, env_.comm()));
  MPI_CHECK(MPI_Gather(my_range, 2, MPI_INT64_T, ranges.data(), 2, MPI_INT64_T, 0, env_.comm()));
  if (rank == 0) {
    CheckpointManifest& m = snap->manifest;
    for (int r = 0; r < world; ++r) m.shards.push_back({shard_name(r), r, ranges[2 * r], ranges[2 * r + 1]});
    m.files.push_back({"model.h5", snap->model_record.bytes, crc32c_hex(snap->model_record.crc)});
    for (int r = 0; r < world; ++r) m.files.push_back({shard_name(r), records[r].bytes, crc32c_hex(records[r].crc)});
    fault_point(rank, 6, step);
    write_durably(files::join(snap->tmp, "manifest.json"), json::dump(m.to_json()) + "\n");
    fsync_path(snap->tmp, true);
    fault_point(rank, 7, step);
    files::rename_file(snap->tmp, snap->final_dir);
    fsync_path(snap->root, true);
    fault_point(rank, 8, step);
    write_durably(files::join(snap->root, "latest"), step_name(step) + "\n");
    fault_point(rank, 9, step);
    // Keep the newest `keep` complete checkpoints (and never the one just written).
    std::vector<std::pair<int64_t, std::string>> complete;  // by step, not by name
    for (const auto& name : files::list_directory(snap->root)) {
      const int64_t s = step_of(name);
      if (s >= 0 && files::is_regular_file(files::join(files::join(snap->root, name), "manifest.json"))) {
        complete.emplace_back(s, name);
      }
    }
    std::sort(complete.begin(), complete.end());
    for (size_t i = 0; i + static_cast<size_t>(settings_.keep) < complete.size(); ++i) {
      if (complete[i].first != step) files::remove_tree(files::join(snap->root, complete[i].second));
    }
    fault_point(rank, 10, step);
  }
  env_.barrier();
  return snap->final_dir;
}

// ------------------------------------------------------------------------------------ resume

void read_flat_range(const CheckpointManifest& m, const char* dataset, int64_t begin, int64_t end, float* out) {
  H5ErrorSilencer quiet;
  // Walk the range through whichever shard holds each part (ZeRO 0 checkpoints of older builds
  // hold everything in every shard: the first one serves).
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
    if (read_int_attr(file.get(), "begin", path) != shard.begin || read_int_attr(file.get(), "end", path) != shard.end) {
      throw UserError(path + ": its range does not match the manifest");
    }
    read_f32_range(file.get(), dataset, pos - shard.begin, hi - pos, out + (pos - begin), path);
    pos = hi;
  }
}

int64_t resume_checkpoint(const std::string& checkpoint_dir, const GPT2Config& model, int64_t zero_stage,
                          const parallel::RankEnv& env, const parallel::FlatLayout& layout,
                          optim::ShardedAdamW& optimizer, optim::LossScaler& scaler) {
  const int rank = env.rank(), world = env.world_size();
  const CheckpointManifest m = CheckpointManifest::read(checkpoint_dir);
  // The model must be the one that was saved.
  for (const auto& model_key : kGPT2ConfigKeys) {
    const std::string key = std::string("model.") + model_key.name;
    const std::string saved = m.config_value(key);
    const std::string now = std::to_string(model.*model_key.field);
    if (!saved.empty() && saved != now) {
      throw UserError("config: " + key + " = " + now + ": the checkpoint " + checkpoint_dir +
                      " was trained with " + saved + "; resume with the same model, or checkpoint.resume = none");
    }
  }
  if (m.flat_total != layout.total) {
    throw UserError(checkpoint_dir + ": holds " + std::to_string(m.flat_total) + " parameters, the model has " +
                    std::to_string(layout.total));
  }
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
  torch::Tensor rng_cpu, rng_cuda;
  {
    H5ErrorSilencer quiet;
    const bool same_world = world == m.world_size;
    const auto& shard = same_world ? m.shards.at(static_cast<size_t>(rank)) : m.shards.at(0);
    const std::string path = files::join(m.dir, shard.file);
    H5Id file = open_shard(path);
    s.adam_step = read_int_attr(file.get(), "adam_step", path);
    if (same_world && shard.rank == rank) {
      rng_cpu = read_bytes(file.get(), "rng_cpu");
      rng_cuda = read_bytes(file.get(), "rng_cuda");
    }
  }
  optimizer.load_state(s);
  optimizer.gather();
  scaler.load(m.loss_scale, m.growth_tracker);
  // Generator states only mean something for the same rank of the same world.
  if (rng_cpu.defined() && rng_cpu.numel() > 0) {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng_cpu);
  }
#ifdef GPT2_WITH_CUDA
  if (rng_cuda.defined() && rng_cuda.numel() > 0 && torch::cuda::is_available()) {
    at::Generator gen = at::cuda::detail::getDefaultCUDAGenerator(
        static_cast<c10::DeviceIndex>(env.local_rank() % static_cast<int>(torch::cuda::device_count())));
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng_cuda);
  }
#endif
  log::info("resumed from ", checkpoint_dir, " at step ", m.step, " (saved by ", m.world_size, " rank(s), ZeRO ",
            m.zero_stage, "; now ", world, " rank(s), ZeRO ", zero_stage, ")");
  return m.step;
}

}  // namespace gpt2
