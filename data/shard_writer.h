#pragma once
// gpt2-data's output: a split that fits in `shard_tokens` is DIR/<split>.h5, a larger one
// DIR/<split>_000000.h5, _000001, ... of exactly shard_tokens tokens but the last: in name order
// they concatenate to the one-file stream (documents may cross shards). Shards are written as they
// fill, into a hidden staging directory moved into DIR only by finish(), which also removes older
// outputs of the split: a failed run leaves DIR as it was, and a glob never mixes runs.
#include <cstdint>
#include <string>
#include <vector>

#include "data/token_file.h"

namespace gpt2::data {

inline constexpr int64_t kDefaultShardTokens = 100'000'000;

std::string single_output_path(const std::string& dir, const std::string& split);                // DIR/<split>.h5
std::string shard_output_path(const std::string& dir, const std::string& split, int64_t index);  // _NNNNNN
// Removes DIR/<split>.h5 and DIR/<split>_NNNNNN.h5 except those in `keep`; returns the removed paths.
std::vector<std::string> remove_stale_outputs(const std::string& dir, const std::string& split,
                                              const std::vector<std::string>& keep);

// One split's stream -> shards.
class ShardWriter {
 public:
  ShardWriter(std::string dir, std::string split, int64_t shard_tokens, TokenFileAttrs attrs);

  // Appends ids (each in [0, vocab_size): checked when the shard is written); may write a shard.
  void append(const int32_t* ids, size_t n);
  int64_t num_tokens() const { return flushed_ + static_cast<int64_t>(buffered()); }
  // Moves stream tokens [start, start + n) out of the buffer into *out when none of them is written
  // yet (the val/train fix-up in DatasetWriter); false otherwise.
  bool take_back(int64_t start, int64_t n, std::vector<int32_t>* out);
  // Writes what is buffered; returns every path written, in stream order (none for an empty split).
  std::vector<std::string> finish();

 private:
  size_t buffered() const { return wide_ ? buf32_.size() : buf16_.size(); }
  void write_full_shards();

  std::string dir_;
  std::string split_;
  int64_t shard_tokens_;
  TokenFileAttrs attrs_;
  bool wide_;  // vocab_size > 65536: buffer uint32, else uint16 (half the memory)
  std::vector<uint16_t> buf16_;
  std::vector<uint32_t> buf32_;
  int64_t flushed_ = 0;  // tokens already written to shards
  std::vector<std::string> paths_;
};

struct DatasetSummary {
  int64_t documents[2] = {0, 0};  // [0] train, [1] val
  int64_t tokens[2] = {0, 0};
  std::vector<std::string> paths[2];
  std::vector<std::string> removed;  // stale outputs of earlier runs
  std::vector<std::string> notes;    // things the user should know (a split could not be balanced)
};

// Both splits: documents go to val by validation_draw(seed, index) < val_fraction (corpus.h).
// When val_fraction > 0 and there are two or more documents, a split left empty gets the document
// with the extreme draw from the other one (the lowest draw goes to val, the highest to train);
// and train always gets a document. That needs the document still in memory: for a split that is
// only empty after shard_tokens tokens were written, a note says so instead.
class DatasetWriter {
 public:
  // Creates the staging directory DIR/.gpt2-data.XXXXXX (DIR must exist).
  DatasetWriter(const std::string& dir, int64_t shard_tokens, const TokenFileAttrs& attrs, double val_fraction,
                uint64_t seed);
  ~DatasetWriter();  // removes the staging directory (what a failed run wrote)
  DatasetWriter(const DatasetWriter&) = delete;
  DatasetWriter& operator=(const DatasetWriter&) = delete;
  // The next document (index 0, 1, ...); `add_eot`: append the end-of-text token after it.
  void add_document(const std::vector<int32_t>& tokens, bool add_eot);
  int64_t num_documents() const { return documents_[0] + documents_[1]; }
  // Writes the last shards, moves every file from staging into DIR and removes stale outputs.
  DatasetSummary finish();

 private:
  struct Extreme {  // a document with the lowest (train) / highest (val) draw so far
    double draw = 0;
    int64_t start = -1;  // in its split's stream; -1: none yet
    int64_t length = 0;
  };
  void move_document(int from, const Extreme& doc, DatasetSummary* summary);

  static std::string make_staging_dir(const std::string& dir);

  std::string dir_;
  std::string staging_;  // "" once finish() moved everything out
  ShardWriter writers_[2];
  double val_fraction_;
  uint64_t seed_;
  int32_t eot_;
  int64_t documents_[2] = {0, 0};
  Extreme lowest_train_;
  Extreme highest_val_;
};

}  // namespace gpt2::data
