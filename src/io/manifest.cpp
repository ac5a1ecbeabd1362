// A checkpoint's manifest and names (see manifest.h).
#include "src/io/manifest.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "src/base/crc32c.h"
#include "src/base/errors.h"
#include "src/base/files.h"

namespace gpt2 {

std::string step_dir_name(int64_t step) {
  char s[32];
  std::snprintf(s, sizeof s, "step_%07lld", static_cast<long long>(step));
  return s;
}

int64_t step_of_dir_name(const std::string& name) {
  if (name.rfind("step_", 0) != 0 || name.size() == 5) return -1;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || v > (int64_t{1} << 58)) return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

std::string shard_file_name(int rank) {
  char s[32];
  std::snprintf(s, sizeof s, "optim_r%05d.h5", rank);
  return s;
}

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
    const int64_t step = step_of_dir_name(name);
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

}  // namespace gpt2
