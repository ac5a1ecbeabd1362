// Sharded token-file output of gpt2-data (see shard_writer.h).
#include "data/shard_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "data/corpus.h"
#include "src/base/errors.h"
#include "src/base/files.h"

namespace gpt2::data {
namespace {

// "<split>_NNNNNN.h5" with exactly six or more digits.
bool is_shard_name(const std::string& name, const std::string& split) {
  const std::string prefix = split + "_";
  if (name.size() < prefix.size() + 6 + 3 || name.compare(0, prefix.size(), prefix) != 0) return false;
  if (name.compare(name.size() - 3, 3, ".h5") != 0) return false;
  for (size_t i = prefix.size(); i < name.size() - 3; ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
  }
  return true;
}

}  // namespace

std::string single_output_path(const std::string& dir, const std::string& split) {
  return files::join(dir, split + ".h5");
}

std::string shard_output_path(const std::string& dir, const std::string& split, int64_t index) {
  char name[64];
  std::snprintf(name, sizeof name, "_%06lld.h5", static_cast<long long>(index));
  return files::join(dir, split + name);
}

std::vector<std::string> remove_stale_outputs(const std::string& dir, const std::string& split,
                                              const std::vector<std::string>& keep) {
  std::vector<std::string> removed;
  for (const std::string& name : files::list_directory(dir)) {
    if (name != split + ".h5" && !is_shard_name(name, split)) continue;
    const std::string path = files::join(dir, name);
    bool kept = false;
    for (const std::string& k : keep) kept = kept || files::filename(k) == name;
    if (!kept && files::remove_file(path)) removed.push_back(path);
  }
  return removed;
}

// ------------------------------------------------------------------------------ ShardWriter

ShardWriter::ShardWriter(std::string dir, std::string split, int64_t shard_tokens, TokenFileAttrs attrs)
    : dir_(std::move(dir)),
      split_(std::move(split)),
      shard_tokens_(shard_tokens),
      attrs_(std::move(attrs)),
      wide_(attrs_.vocab_size > 65536) {
  if (shard_tokens_ <= 0) throw UserError("--shard_tokens " + std::to_string(shard_tokens_) + " must be positive");
}

void ShardWriter::append(const int32_t* ids, size_t n) {
  // Checked here, before the narrowing to uint16 could hide an id: write_token_file checks the
  // narrowed values only.
  int32_t lo = 0, hi = 0;
  for (size_t i = 0; i < n; ++i) {
    lo = std::min(lo, ids[i]);
    hi = std::max(hi, ids[i]);
  }
  if (lo < 0 || hi >= attrs_.vocab_size) {
    throw UserError(split_ + ": token id " + std::to_string(lo < 0 ? lo : hi) + " is outside [0, vocab_size " +
                    std::to_string(attrs_.vocab_size) + ")");
  }
  if (wide_) {
    buf32_.insert(buf32_.end(), ids, ids + n);
  } else {
    buf16_.insert(buf16_.end(), ids, ids + n);  // in range: checked above
  }
  write_full_shards();
}

void ShardWriter::write_full_shards() {
  // Only when more than a shard is buffered: a split of exactly shard_tokens stays one file.
  size_t pos = 0;
  const auto shard = static_cast<size_t>(shard_tokens_);
  while (buffered() - pos > shard) {
    const std::string path = shard_output_path(dir_, split_, static_cast<int64_t>(paths_.size()));
    if (wide_) {
      write_token_file(path, buf32_.data() + pos, shard, attrs_);
    } else {
      write_token_file(path, buf16_.data() + pos, shard, attrs_);
    }
    paths_.push_back(path);
    pos += shard;
    flushed_ += shard_tokens_;
  }
  if (pos == 0) return;
  if (wide_) {
    buf32_.erase(buf32_.begin(), buf32_.begin() + static_cast<std::ptrdiff_t>(pos));
  } else {
    buf16_.erase(buf16_.begin(), buf16_.begin() + static_cast<std::ptrdiff_t>(pos));
  }
}

bool ShardWriter::take_back(int64_t start, int64_t n, std::vector<int32_t>* out) {
  if (start < flushed_ || n < 0 || start + n > num_tokens()) return false;
  const auto begin = static_cast<std::ptrdiff_t>(start - flushed_);
  const auto end = begin + static_cast<std::ptrdiff_t>(n);
  if (wide_) {
    out->assign(buf32_.begin() + begin, buf32_.begin() + end);
    buf32_.erase(buf32_.begin() + begin, buf32_.begin() + end);
  } else {
    out->assign(buf16_.begin() + begin, buf16_.begin() + end);
    buf16_.erase(buf16_.begin() + begin, buf16_.begin() + end);
  }
  return true;
}

std::vector<std::string> ShardWriter::finish() {
  if (buffered() > 0) {
    const std::string path = paths_.empty() ? single_output_path(dir_, split_)
                                            : shard_output_path(dir_, split_, static_cast<int64_t>(paths_.size()));
    if (wide_) {
      write_token_file(path, buf32_.data(), buf32_.size(), attrs_);
    } else {
      write_token_file(path, buf16_.data(), buf16_.size(), attrs_);
    }
    paths_.push_back(path);
    flushed_ += static_cast<int64_t>(buffered());
    buf16_ = {};
    buf32_ = {};
  }
  return paths_;
}

// ------------------------------------------------------------------------------ DatasetWriter

std::string DatasetWriter::make_staging_dir(const std::string& dir) {
  std::string templ = files::join(dir, ".gpt2-data.XXXXXX");
  if (::mkdtemp(templ.data()) == nullptr) {
    throw UserError("cannot create a staging directory in " + dir + ": " + std::strerror(errno));
  }
  return templ;
}

DatasetWriter::DatasetWriter(const std::string& dir, int64_t shard_tokens, const TokenFileAttrs& attrs,
                             double val_fraction, uint64_t seed)
    : dir_(dir),
      staging_(make_staging_dir(dir)),
      writers_{ShardWriter(staging_, "train", shard_tokens, attrs), ShardWriter(staging_, "val", shard_tokens, attrs)},
      val_fraction_(val_fraction),
      seed_(seed),
      eot_(static_cast<int32_t>(attrs.eot_token)) {}

DatasetWriter::~DatasetWriter() {
  if (staging_.empty()) return;
  try {
    files::remove_tree(staging_);
  } catch (const Error&) {
    // Nothing better to do while failing already; the hidden directory is harmless.
  }
}

void DatasetWriter::add_document(const std::vector<int32_t>& tokens, bool add_eot) {
  const int64_t index = num_documents();
  const double draw = val_fraction_ > 0 ? validation_draw(seed_, static_cast<uint64_t>(index)) : 1.0;
  const int split = draw < val_fraction_ ? 1 : 0;
  ShardWriter& w = writers_[split];
  const int64_t start = w.num_tokens();
  const int64_t length = static_cast<int64_t>(tokens.size()) + (add_eot ? 1 : 0);
  // Strict comparisons: ties keep the earliest document, as std::min_element/max_element do.
  if (split == 0 && (lowest_train_.start < 0 || draw < lowest_train_.draw)) lowest_train_ = {draw, start, length};
  if (split == 1 && (highest_val_.start < 0 || draw > highest_val_.draw)) highest_val_ = {draw, start, length};
  w.append(tokens.data(), tokens.size());
  if (add_eot) w.append(&eot_, 1);
  ++documents_[split];
}

void DatasetWriter::move_document(int from, const Extreme& doc, DatasetSummary* summary) {
  const char* names[2] = {"train", "val"};
  std::vector<int32_t> tokens;
  if (doc.start < 0 || !writers_[from].take_back(doc.start, doc.length, &tokens)) {
    summary->notes.push_back(std::string("no document fell into ") + names[1 - from] + " and the candidate was " +
                             "already written to a shard; the " + names[1 - from] + " split is empty");
    return;
  }
  // The other split is empty, so appending keeps document order within it.
  writers_[1 - from].append(tokens.data(), tokens.size());
  --documents_[from];
  ++documents_[1 - from];
}

DatasetSummary DatasetWriter::finish() {
  DatasetSummary summary;
  const int64_t total = num_documents();
  if (total >= 1 && documents_[0] == 0) {
    move_document(1, highest_val_, &summary);  // train always gets a document
  } else if (val_fraction_ > 0 && total >= 2 && documents_[1] == 0) {
    move_document(0, lowest_train_, &summary);
  }
  for (int s = 0; s < 2; ++s) {
    summary.documents[s] = documents_[s];
    summary.tokens[s] = writers_[s].num_tokens();
    for (const std::string& staged : writers_[s].finish()) {
      const std::string path = files::join(dir_, files::filename(staged));
      files::rename_durably(staged, path);
      summary.paths[s].push_back(path);
    }
  }
  files::remove_tree(staging_);
  staging_.clear();
  for (int s = 0; s < 2; ++s) {
    for (std::string& p : remove_stale_outputs(dir_, s == 0 ? "train" : "val", summary.paths[s])) {
      summary.removed.push_back(std::move(p));
    }
  }
  return summary;
}

}  // namespace gpt2::data
