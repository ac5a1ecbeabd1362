// Everything `gpt2-ckpt verify` checks of one checkpoint directory (see checkpoint_verify.h).
#include "src/io/checkpoint_verify.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <set>
#include <stdexcept>
#include <utility>

#include "optim/moment_layout.h"
#include "src/base/files.h"
#include "src/base/h5_check.h"
#include "src/io/h5_io.h"
#include "src/io/model_file.h"

namespace gpt2 {
namespace {

using h5::dataset_dims;
using h5::H5ErrorSilencer;
using h5::H5Id;
using h5::has_link;
using h5::open_h5;
using h5::read_int_attr;

// The full fp32 model that checkpoints written before the manifest + shards layout carry.
constexpr char kLegacyModelFile[] = "model.h5";

std::string str(int64_t v) { return std::to_string(v); }

std::string range_str(int64_t b, int64_t e) { return "[" + str(b) + ", " + str(e) + ")"; }

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + str(shape[i]);
  return s + "]";
}

// A positive decimal integer, or -1.
int64_t parse_positive(const std::string& s) {
  if (s.empty() || s.size() > 18 || s.find_first_not_of("0123456789") != std::string::npos) return -1;
  const int64_t v = std::strtoll(s.c_str(), nullptr, 10);
  return v > 0 ? v : -1;
}

// ---- HDF5 pieces: open_h5, has_link, dataset_dims, read_int_attr are in src/base/h5_check.h

std::string dims_str(const std::vector<hsize_t>& dims) {
  std::vector<int64_t> d(dims.begin(), dims.end());
  return shape_str(d);
}

// Where the manifest's parameters have 8-bit moments (Note [Moment blocks]); null when the manifest's
// parameters overlap (reported with the manifest) or the checkpoint's moments are fp32.
std::unique_ptr<optim::MomentLayout> moment_layout_of(const CheckpointManifest& m) {
  if (m.optimizer_moments != optim::MomentFormat::k8bit) return nullptr;
  std::vector<optim::MomentLayout::Param> params;
  for (const auto& p : m.params) params.push_back({p.offset, p.numel, p.shape.size() >= 2});
  try {
    return std::make_unique<optim::MomentLayout>(params);
  } catch (const std::logic_error&) {
    return nullptr;
  }
}

// The number of elements a shard's dataset holds (ShardDataset::Index), or -1 when the shard's
// range is not on the quantization grid (then reported) or there is no layout.
int64_t expected_elements(const CheckpointManifest::Shard& s, const ShardDataset& d, const optim::MomentLayout* ml) {
  int64_t n = 0;
  for (const auto& r : s.ranges) {
    if (d.index == ShardDataset::Index::kFlat) {
      n += r.size();
      continue;
    }
    if (ml == nullptr || !ml->on_grid(r.begin) || !ml->on_grid(r.end)) return -1;
    n += d.index == ShardDataset::Index::kAbsmax ? ml->absmax_before(r.end) - ml->absmax_before(r.begin)
                                                 : ml->fp32_before(r.end) - ml->fp32_before(r.begin);
  }
  return n;
}

// The flat element of a shard's absmax value `i` (its ranges end to end).
optim::MomentBlock absmax_block_of(const CheckpointManifest::Shard& s, const optim::MomentLayout& ml, int64_t i) {
  for (const auto& r : s.ranges) {
    const int64_t here = ml.absmax_before(r.end) - ml.absmax_before(r.begin);
    if (i < here) return ml.absmax_block(ml.absmax_before(r.begin) + i);
    i -= here;
  }
  throw std::out_of_range("absmax value past the shard's ranges");
}

// Problems of one optimizer shard file's contents against its manifest entry: attributes, every
// dataset of the checkpoint's moment format (type and length), and 8-bit scales that are not
// finite non-negative numbers.
void check_shard_contents(const std::string& path, const CheckpointManifest::Shard& s, const CheckpointManifest& m,
                          const optim::MomentLayout* ml, std::vector<std::string>* out) {
  H5Id file = open_h5(path);
  for (auto [name, want] : {std::pair<const char*, int64_t>{"begin", s.begin}, {"end", s.end}}) {
    int64_t got = 0;
    std::string why;
    if (!read_int_attr(file.get(), name, &got, &why)) {
      out->push_back(path + ": " + why);
    } else if (got != want) {
      out->push_back(path + ": attribute " + name + " = " + str(got) + ", the manifest says " + str(want));
    }
  }
  for (const auto& r : s.ranges) {
    if (ml != nullptr && !(ml->on_grid(r.begin) && ml->on_grid(r.end))) {
      out->push_back(path + ": range " + range_str(r.begin, r.end) + " of 8-bit moments is not on the " +
                     str(optim::kQuantBlock) + "-element grid");
    }
  }
  for (const ShardDataset& d : shard_datasets(m.optimizer_moments, m.optimizer)) {
    const std::string name = d.name;
    if (!has_link(file.get(), d.name)) {
      out->push_back(path + ": no dataset /" + name);
      continue;
    }
    H5Id dset(H5_ID(H5Dopen2(file.get(), d.name, H5P_DEFAULT)), H5Dclose);
    bool f32 = false;
    const auto dims = dataset_dims(dset.get(), &f32);
    H5Id type(H5_ID(H5Dget_type(dset.get())), H5Tclose);
    const bool u8 = H5Tget_class(type.get()) == H5T_INTEGER && H5Tget_size(type.get()) == 1;
    if (d.is_uint8 ? !u8 : !f32) out->push_back(path + ": /" + name + " is not " + (d.is_uint8 ? "uint8" : "fp32"));
    const int64_t n = expected_elements(s, d, ml);
    if (n < 0) continue;
    if (dims.size() != 1 || dims[0] != static_cast<hsize_t>(n)) {
      out->push_back(path + ": /" + name + " has shape " + dims_str(dims) + ", the manifest's range " +
                     range_str(s.begin, s.end) + " needs [" + str(n) + "]");
      continue;
    }
    if (d.index != ShardDataset::Index::kAbsmax || !f32) continue;
    std::vector<float> scales(static_cast<size_t>(n));
    h5::read_f32_range(file.get(), d.name, 0, n, scales.data(), path);
    for (int64_t i = 0; i < n; ++i) {
      if (std::isfinite(scales[i]) && scales[i] >= 0) continue;
      const optim::MomentBlock b = absmax_block_of(s, *ml, i);
      char v[32];
      std::snprintf(v, sizeof v, "%g", scales[i]);
      out->push_back(path + ": /" + name + "[" + str(i) + "] = " + v +
                     ", the scale of the 8-bit block of flat elements " + range_str(b.begin, b.begin + b.len) +
                     ", is not a finite non-negative number");
      break;
    }
  }
}

void check_model_contents(const std::string& path, const CheckpointManifest& m, std::vector<std::string>* out) {
  const ModelFile file(path);
  if (const auto step = file.int_attr("step"); step && *step != m.step) {
    out->push_back(path + ": attribute step = " + str(*step) + ", the manifest says " + str(m.step));
  }
  for (const auto& p : m.params) {
    if (p.name.empty() || p.name.find('/') != std::string::npos) continue;  // reported with the manifest
    bool f32 = false;
    const auto shape = file.shape(p.name, &f32);
    if (!shape) {
      out->push_back(path + ": no dataset '" + p.name + "' (a parameter in the manifest)");
      continue;
    }
    if (*shape != p.shape) {
      out->push_back(path + ": '" + p.name + "' has shape " + shape_str(*shape) + ", the manifest says " +
                     shape_str(p.shape));
    }
    if (!f32) out->push_back(path + ": '" + p.name + "' is not fp32");
  }
}

// The manifest's own consistency: parameters, model config, shard list and coverage.
void check_manifest(const CheckpointManifest& m, const std::set<std::string>& listed, std::vector<std::string>* out) {
  const std::string mf = files::join(m.dir, "manifest.json");
  if (m.flat_total < 0 || m.flat_padded < m.flat_total) {
    out->push_back(mf + ": flat_padded " + str(m.flat_padded) + " is less than flat_total " + str(m.flat_total));
  }
  if (m.world_size < 1) out->push_back(mf + ": world_size " + str(m.world_size) + " is not positive");
  for (const auto& key : kGPT2ConfigKeys) {
    const std::string k = std::string("model.") + key.name;
    const std::string v = m.config_value(k);
    if (v.empty()) {
      out->push_back(mf + ": config has no " + k);
    } else if (parse_positive(v) < 0) {
      out->push_back(mf + ": config " + k + " = '" + v + "' is not a positive integer");
    }
  }

  // Parameters: named once, numel = product of the shape, inside [0, flat_total), no overlaps.
  std::set<std::string> names;
  std::vector<std::pair<int64_t, int64_t>> spans;  // offset, index
  int64_t sum = 0;
  for (size_t i = 0; i < m.params.size(); ++i) {
    const auto& p = m.params[i];
    if (p.name.empty() || p.name.find('/') != std::string::npos) {
      out->push_back(mf + ": parameter name '" + p.name + "' is not a plain dataset name");
    }
    if (!names.insert(p.name).second) out->push_back(mf + ": parameter '" + p.name + "' is listed twice");
    int64_t prod = 1;
    bool shape_ok = true;
    for (int64_t d : p.shape) {
      if (d < 0 || (d > 0 && prod > (int64_t{1} << 40) / d)) shape_ok = false;
      prod *= std::max<int64_t>(d, 0);
    }
    if (!shape_ok || prod != p.numel) {
      out->push_back(mf + ": parameter '" + p.name + "' has shape " + shape_str(p.shape) + " but numel " +
                     str(p.numel));
    }
    if (p.offset < 0 || p.numel < 0 || p.offset + p.numel > m.flat_total) {
      out->push_back(mf + ": parameter '" + p.name + "' at " + range_str(p.offset, p.offset + p.numel) +
                     " is outside the flat space [0, " + str(m.flat_total) + ")");
      continue;
    }
    sum += p.numel;
    spans.emplace_back(p.offset, static_cast<int64_t>(i));
  }
  std::sort(spans.begin(), spans.end());
  for (size_t k = 1; k < spans.size(); ++k) {
    const auto& a = m.params[static_cast<size_t>(spans[k - 1].second)];
    const auto& b = m.params[static_cast<size_t>(spans[k].second)];
    if (a.offset + a.numel > b.offset) {
      out->push_back(mf + ": parameters '" + a.name + "' " + range_str(a.offset, a.offset + a.numel) + " and '" +
                     b.name + "' " + range_str(b.offset, b.offset + b.numel) + " overlap");
    }
  }
  if (sum != m.flat_total) {
    out->push_back(mf + ": the parameters hold " + str(sum) + " elements, flat_total says " + str(m.flat_total));
  }

  // Shards: one per rank, listed (so checksummed), covering [0, flat_padded).
  if (static_cast<int64_t>(m.shards.size()) != m.world_size) {
    out->push_back(mf + ": " + str(static_cast<int64_t>(m.shards.size())) + " shard(s) for world_size " +
                   str(m.world_size));
  }
  std::set<int> ranks;
  for (const auto& s : m.shards) {
    if (!ranks.insert(s.rank).second) out->push_back(mf + ": rank " + str(s.rank) + " has two shards");
    if (s.file.empty() || s.file.find('/') != std::string::npos) {
      out->push_back(mf + ": shard file '" + s.file + "' is not a plain name in the checkpoint directory");
    } else if (!listed.count(s.file)) {
      out->push_back(mf + ": shard " + s.file + " is not in its files list (so it has no checksum)");
    }
  }
  if (m.shards.empty()) {
    out->push_back(mf + ": no shards");
    return;
  }
  // Every range of every shard, by where it begins: together they tile [0, flat_padded).
  std::vector<std::pair<const CheckpointManifest::Shard*, parallel::FlatRange>> sorted;
  for (const auto& s : m.shards) {
    for (const auto& r : s.ranges) sorted.emplace_back(&s, r);
  }
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return a.second.begin < b.second.begin; });
  int64_t pos = 0;
  const std::pair<const CheckpointManifest::Shard*, parallel::FlatRange>* prev = nullptr;
  for (const auto& x : sorted) {
    const auto& [s, r] = x;
    if (r.begin > pos) {
      out->push_back(mf + ": flat range " + range_str(pos, r.begin) + " is in no shard (gap before " + s->file + ")");
    } else if (r.begin < pos && prev != nullptr) {
      out->push_back(mf + ": shard " + s->file + " " + range_str(r.begin, r.end) + " overlaps " + prev->first->file +
                     " " + range_str(prev->second.begin, prev->second.end));
    }
    if (r.end > pos) {
      pos = r.end;
      prev = &x;
    }
  }
  if (pos < m.flat_padded) {
    out->push_back(mf + ": flat range " + range_str(pos, m.flat_padded) + " is in no shard (gap at the end)");
  }
}

}  // namespace

std::vector<std::string> verify_manifest(const CheckpointManifest& m) {
  std::set<std::string> listed;
  for (const auto& f : m.files) listed.insert(f.name);
  std::vector<std::string> problems;
  check_manifest(m, listed, &problems);
  return problems;
}

std::vector<std::string> verify_checkpoint(const CheckpointManifest& m) {
  std::vector<std::string> problems;
  // Sizes and checksums first: a file that fails them is reported once, not opened.
  std::set<std::string> listed, damaged;
  for (size_t i = 0; i < m.files.size(); ++i) {
    listed.insert(m.files[i].name);
    const std::string problem = verify_checkpoint_files(m, {i}).front();  // never throws
    if (!problem.empty()) {
      problems.push_back(problem);
      damaged.insert(m.files[i].name);
    }
  }
  check_manifest(m, listed, &problems);

  H5ErrorSilencer quiet;
  auto contents = [&](const std::string& name, auto&& check) {
    if (name.empty() || name.find('/') != std::string::npos || damaged.count(name)) return;
    const std::string path = files::join(m.dir, name);
    if (!files::is_regular_file(path)) {
      if (!listed.count(name)) problems.push_back(path + ": missing");  // listed ones were reported above
      return;
    }
    try {
      check(path);
    } catch (const std::exception& e) {
      const std::string what = e.what();
      problems.push_back(what.rfind(path, 0) == 0 ? what : path + ": " + what);
    }
  };
  const auto moment_layout = moment_layout_of(m);
  for (const auto& s : m.shards) {
    contents(s.file,
             [&](const std::string& path) { check_shard_contents(path, s, m, moment_layout.get(), &problems); });
  }
  // Checkpoints of older versions also carry the model as a model file; when one is listed it is
  // checked like the shards (nothing reads it: weights come from the masters).
  if (listed.count(kLegacyModelFile)) {
    contents(kLegacyModelFile, [&](const std::string& path) { check_model_contents(path, m, &problems); });
  }
  return problems;
}

}  // namespace gpt2
