// A checkpoint's manifest and names (see manifest.h).
#include "src/io/manifest.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "src/base/crc32c.h"
#include "src/base/errors.h"
#include "src/base/files.h"
#include "src/base/log.h"

namespace gpt2 {

const std::vector<ShardDataset>& shard_datasets(optim::MomentFormat moments, optim::UpdateRule rule) {
  using I = ShardDataset::Index;
  using S = optim::ShardState;
  auto with_muon = [](std::vector<ShardDataset> t) {
    t.push_back({"muon_momentum", false, I::kFlat, &S::muon_momentum});
    return t;
  };
  static const std::vector<ShardDataset> eight_bit{{"master", false, I::kFlat, &S::master},
                                                   {"exp_avg_codes", true, I::kFlat, &S::exp_avg_codes},
                                                   {"exp_avg_sq_codes", true, I::kFlat, &S::exp_avg_sq_codes},
                                                   {"exp_avg_absmax", false, I::kAbsmax, &S::exp_avg_absmax},
                                                   {"exp_avg_sq_absmax", false, I::kAbsmax, &S::exp_avg_sq_absmax},
                                                   {"exp_avg_fp32", false, I::kFp32Moment, &S::exp_avg},
                                                   {"exp_avg_sq_fp32", false, I::kFp32Moment, &S::exp_avg_sq}};
  static const std::vector<ShardDataset> fp32{{"master", false, I::kFlat, &S::master},
                                              {"exp_avg", false, I::kFlat, &S::exp_avg},
                                              {"exp_avg_sq", false, I::kFlat, &S::exp_avg_sq}};
  static const std::vector<ShardDataset> eight_bit_muon = with_muon(eight_bit), fp32_muon = with_muon(fp32);
  const bool muon = rule == optim::UpdateRule::kMuon;
  if (moments == optim::MomentFormat::k8bit) return muon ? eight_bit_muon : eight_bit;
  return muon ? fp32_muon : fp32;
}

const ShardDataset& shard_dataset(optim::MomentFormat moments, const std::string& name) {
  for (const ShardDataset& d : shard_datasets(moments, optim::UpdateRule::kMuon)) {  // the larger table
    if (name == d.name) return d;
  }
  throw UserError(std::string("a checkpoint with ") + choice_name(moments) + " moments has no dataset " + name);
}

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
  json::Value ps = json::Value::array(), ss = json::Value::array(), fs = json::Value::array();
  for (const auto& p : params)
    ps.push_back({{"name", p.name}, {"shape", p.shape}, {"offset", p.offset}, {"numel", p.numel}});
  bool several_ranges = false;
  for (const auto& s : shards) {
    json::Value shard = {{"file", s.file}, {"rank", s.rank}, {"begin", s.begin}, {"end", s.end}};
    if (s.ranges.size() > 1) {
      json::Value rs = json::Value::array();
      for (const auto& r : s.ranges) rs.push_back(json::Value::array({r.begin, r.end}));
      shard["ranges"] = rs;
      several_ranges = true;
    }
    ss.push_back(shard);
  }
  for (const auto& f : files)
    fs.push_back({{"name", f.name}, {"bytes", static_cast<int64_t>(f.bytes)}, {"crc32c", f.crc32c}});
  json::Value cfg = json::Value::object();
  for (const auto& [k, v] : config) cfg[k] = v;
  json::Value out = {{"format", kCheckpointFormat},
                     {"format_version", several_ranges ? kCheckpointVersion : int64_t{1}},
                     {"step", step},
                     {"world_size", world_size},
                     {"zero_stage", zero_stage},
                     {"offload", offload},
                     {"dtype", dtype},
                     {"optimizer_moments", choice_name(optimizer_moments)},
                     {"flat_total", flat_total},
                     {"flat_padded", flat_padded},
                     {"params", ps},
                     {"shards", ss},
                     {"loss_scaler", {{"scale", loss_scale}, {"growth_tracker", growth_tracker}}},
                     {"data", {{"seed", static_cast<int64_t>(seed)}, {"next_step", step}}},
                     {"config", cfg},
                     {"files", fs}};
  if (optimizer_moments == optim::MomentFormat::k8bit) out["exp_avg_sq_8bit"] = exp_avg_sq_8bit;
  if (optimizer != optim::UpdateRule::kAdamW) out["optimizer"] = choice_name(optimizer);
  if (!fp8_amax_shape.empty()) {
    out["fp8_amax_history"] = {{"shape", fp8_amax_shape}, {"steps", fp8_steps}, {"values", fp8_amax}};
  }
  return out;
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
  if (json::as_string(json::at(v, "format", what), "format") != kCheckpointFormat) {
    throw UserError(path + ": format is '" + json::as_string(json::at(v, "format", what), "value") + "', expected '" +
                    kCheckpointFormat + "'");
  }
  const int64_t version = json::as_int(json::at(v, "format_version", what), "format_version");
  if (version < 1 || version > kCheckpointVersion) {
    throw UserError(path + ": format_version " + std::to_string(version) + " is not supported (this build reads " +
                    std::to_string(kCheckpointVersion) + ")");
  }
  m.step = json::as_int(json::at(v, "step", what), "step");
  m.world_size = static_cast<int>(json::as_int(json::at(v, "world_size", what), "world_size"));
  m.zero_stage = json::as_int(json::at(v, "zero_stage", what), "zero_stage");
  m.offload = json::as_string(json::at(v, "offload", what), "offload");
  m.dtype = json::as_string(json::at(v, "dtype", what), "dtype");
  // Checkpoints from before 8-bit moments have no such key: theirs are fp32.
  if (const json::Value* moments = json::find(v, "optimizer_moments")) {
    m.optimizer_moments =
        parse_choice<optim::MomentFormat>(path + ": optimizer_moments", json::as_string(*moments, "optimizer_moments"));
  }
  if (const json::Value* rule = json::find(v, "optimizer")) {  // absent: AdamW
    m.optimizer = parse_choice<optim::UpdateRule>(path + ": optimizer", json::as_string(*rule, "optimizer"));
  }
  if (m.optimizer_moments == optim::MomentFormat::k8bit) {
    const json::Value* sq = json::find(v, "exp_avg_sq_8bit");
    m.exp_avg_sq_8bit = sq != nullptr ? json::as_string(*sq, "exp_avg_sq_8bit") : "plain";
    if (m.exp_avg_sq_8bit != "root" && m.exp_avg_sq_8bit != "plain") {
      throw UserError(path + ": exp_avg_sq_8bit is '" + m.exp_avg_sq_8bit + "', expected root or plain");
    }
  }
  m.flat_total = json::as_int(json::at(v, "flat_total", what), "flat_total");
  m.flat_padded = json::as_int(json::at(v, "flat_padded", what), "flat_padded");
  if (m.world_size < 1 || m.flat_total < 0 || m.flat_padded < m.flat_total) {
    throw UserError(path + ": inconsistent sizes (world_size " + std::to_string(m.world_size) + ", flat_total " +
                    std::to_string(m.flat_total) + ", flat_padded " + std::to_string(m.flat_padded) + ")");
  }
  for (const auto& p : json::as_array(json::at(v, "params", what), "params")) {
    Param q;
    q.name = json::as_string(json::at(p, "name", what + " params"), "params.name");
    for (const auto& d : json::as_array(json::at(p, "shape", what + " params"), "params.shape"))
      q.shape.push_back(json::as_int(d, "shape"));
    q.offset = json::as_int(json::at(p, "offset", what + " params"), "params.offset");
    q.numel = json::as_int(json::at(p, "numel", what + " params"), "params.numel");
    m.params.push_back(std::move(q));
  }
  for (const auto& s : json::as_array(json::at(v, "shards", what), "shards")) {
    Shard q;
    q.file = json::as_string(json::at(s, "file", what + " shards"), "shards.file");
    q.rank = static_cast<int>(json::as_int(json::at(s, "rank", what + " shards"), "shards.rank"));
    q.begin = json::as_int(json::at(s, "begin", what + " shards"), "shards.begin");
    q.end = json::as_int(json::at(s, "end", what + " shards"), "shards.end");
    if (const json::Value* rs = json::find(s, "ranges")) {
      for (const auto& r : json::as_array(*rs, "shards.ranges")) {
        const auto& pair = json::as_array(r, "shards.ranges[]");
        if (pair.size() != 2) throw UserError(path + ": shard " + q.file + ": a range is not [begin, end]");
        q.ranges.push_back({json::as_int(pair[0], "shards.ranges[][0]"), json::as_int(pair[1], "shards.ranges[][1]")});
      }
    } else {
      q.ranges.push_back({q.begin, q.end});
    }
    if (q.ranges.empty() || q.ranges.front().begin != q.begin || q.ranges.back().end != q.end) {
      throw UserError(path + ": shard " + q.file + ": its ranges do not run from begin " + std::to_string(q.begin) +
                      " to end " + std::to_string(q.end));
    }
    for (const auto& r : q.ranges) {
      if (r.begin < 0 || r.end < r.begin || r.end > m.flat_padded) {
        throw UserError(path + ": shard " + q.file + " has an invalid range [" + std::to_string(r.begin) + ", " +
                        std::to_string(r.end) + ")");
      }
    }
    m.shards.push_back(std::move(q));
  }
  for (const auto& f : json::as_array(json::at(v, "files", what), "files")) {
    File q;
    q.name = json::as_string(json::at(f, "name", what + " files"), "files.name");
    const int64_t bytes = json::as_int(json::at(f, "bytes", what + " files"), "files.bytes");
    if (bytes < 0) throw UserError(path + ": file " + q.name + " has a negative size");
    q.bytes = static_cast<uint64_t>(bytes);
    q.crc32c = json::as_string(json::at(f, "crc32c", what + " files"), "files.crc32c");
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
  const auto& scaler = json::at(v, "loss_scaler", what);
  m.loss_scale = json::as_double(json::at(scaler, "scale", what + " loss_scaler"), "loss_scaler.scale");
  m.growth_tracker =
      json::as_int(json::at(scaler, "growth_tracker", what + " loss_scaler"), "loss_scaler.growth_tracker");
  m.seed =
      static_cast<uint64_t>(json::as_int(json::at(json::at(v, "data", what), "seed", what + " data"), "data.seed"));
  for (const auto& [k, val] : json::as_object(json::at(v, "config", what), "config"))
    m.config.emplace_back(k, json::as_string(val, k));
  if (v.contains("fp8_amax_history")) {
    const auto& h = json::at(v, "fp8_amax_history", what);
    int64_t count = 1;
    for (const auto& d : json::as_array(json::at(h, "shape", what + " fp8_amax_history"), "fp8_amax_history.shape")) {
      m.fp8_amax_shape.push_back(json::as_int(d, "fp8_amax_history.shape"));
      if (m.fp8_amax_shape.back() < 1) throw UserError(path + ": fp8_amax_history.shape has a dimension below 1");
      count *= m.fp8_amax_shape.back();
    }
    m.fp8_steps = json::as_int(json::at(h, "steps", what + " fp8_amax_history"), "fp8_amax_history.steps");
    for (const auto& x : json::as_array(json::at(h, "values", what + " fp8_amax_history"), "fp8_amax_history.values")) {
      m.fp8_amax.push_back(static_cast<float>(json::as_double(x, "fp8_amax_history.values")));
    }
    if (m.fp8_amax_shape.size() != 4 || static_cast<int64_t>(m.fp8_amax.size()) != count || m.fp8_steps < 0) {
      throw UserError(path + ": fp8_amax_history holds " + std::to_string(m.fp8_amax.size()) + " values and " +
                      std::to_string(m.fp8_steps) + " steps, not a (layers, 4, 3, steps) history of that shape");
    }
  }
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

CheckpointRoot CheckpointRoot::scan(const std::string& root) {
  CheckpointRoot r;
  for (const auto& name : files::list_directory(root)) {
    const std::string path = files::join(root, name);
    if (!files::is_directory(path)) continue;
    const int64_t step = step_of_dir_name(name);
    if (step >= 0) {
      (files::is_regular_file(files::join(path, "manifest.json")) ? r.complete : r.incomplete).emplace_back(step, name);
    } else if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0 &&
               step_of_dir_name(name.substr(0, name.size() - 4)) >= 0) {
      r.unfinished.push_back(name);
    }
  }
  std::sort(r.complete.begin(), r.complete.end());
  std::sort(r.incomplete.begin(), r.incomplete.end());
  std::sort(r.unfinished.begin(), r.unfinished.end());
  const std::string latest = files::join(root, "latest");
  if (files::is_regular_file(latest)) {
    r.latest = files::read_file(latest);
    while (!r.latest.empty() && (r.latest.back() == '\n' || r.latest.back() == ' ')) r.latest.pop_back();
  }
  return r;
}

std::string find_checkpoint(const std::string& dir, bool warn) {
  if (dir.empty() || !files::is_directory(dir)) return "";
  if (files::is_regular_file(files::join(dir, "manifest.json"))) return dir;
  // The newest step_NNNNNNN/ with a manifest: a directory gets its final name only after its
  // manifest is on disk, so it is complete even when a crash came before `latest` was replaced.
  const CheckpointRoot root = CheckpointRoot::scan(dir);
  if (root.complete.empty()) {
    if (!root.latest.empty()) {
      throw UserError(files::join(dir, "latest") + ": names a checkpoint, but " + dir +
                      " holds no complete step_* directory");
    }
    return "";
  }
  const auto& [step, newest] = root.complete.back();
  if (!warn) return files::join(dir, newest);
  for (const auto& [s, name] : root.incomplete) {
    if (s > step) {
      log::warn(files::join(dir, name), ": no manifest.json (an interrupted save or damage): skipped; ", newest,
                " is the newest complete checkpoint");
    }
  }
  const bool latest_complete =
      std::any_of(root.complete.begin(), root.complete.end(), [&](const auto& c) { return c.second == root.latest; });
  if (!root.latest.empty() && !latest_complete) {
    log::warn(files::join(dir, "latest"), " names ", root.latest, ", which is not a complete checkpoint; taking ",
              newest);
  }
  return files::join(dir, newest);
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
      problems.push_back(
          crc == f.crc32c ? "" : path + ": checksum mismatch (manifest crc32c " + f.crc32c + ", file " + crc + ")");
    } catch (const Error& e) {  // unreadable: a problem like the others, so every rank reports it
      problems.push_back(e.what());
    }
  }
  return problems;
}

}  // namespace gpt2
