#pragma once
// gpt2-data's corpus: inputs (data/inputs.h) -> batches of documents -> tokens. Documents: a text
// file, or its runs of lines between separator lines ("\r" ignored); a .jsonl line's "text"; a
// .bin stream cut after each EOT (tokens unchanged; one EOT added if the stream lacks a final one).
// Whitespace-only documents are dropped; found non-UTF-8 text files are skipped, named ones are an
// error. Problems are gpt2::UserError naming the file.
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/bin_shard.h"
#include "data/bpe_tokenizer.h"
#include "data/inputs.h"
#include "data/jsonl.h"

namespace gpt2::data {

struct CorpusFile {
  std::string path;
  std::string text;  // document text of this file (a JSON lines file: its documents, concatenated)
};

struct DocumentRef {
  uint32_t file = 0;  // index into Corpus::files()
  size_t offset = 0;  // byte range of the document in that file's text
  size_t length = 0;
  int32_t token_run = -1;  // >= 0: already tokens (from .bin shards), Corpus::token_run(); no text
};

// A .bin document longer than this (no EOT for that long) is cut: it bounds memory, and only the
// train/val split sees the cut (the tokens stay in order).
inline constexpr size_t kMaxTokenRun = size_t{1} << 20;

// A batch of documents (or, from load(), a whole corpus).
class Corpus {
 public:
  // Reads every input at once (text files, directories, globs, .jsonl; .bin with default options).
  // Throws gpt2::UserError for a missing or unreadable input, or an explicit non-UTF-8 file.
  static Corpus load(const std::vector<std::string>& inputs, const std::optional<std::string>& separator);

  const std::vector<CorpusFile>& files() const { return files_; }
  const std::vector<DocumentRef>& documents() const { return documents_; }
  std::string_view text(const DocumentRef& doc) const {
    return std::string_view(files_[doc.file].text).substr(doc.offset, doc.length);
  }
  const std::vector<int32_t>& token_run(const DocumentRef& doc) const {
    return token_runs_[static_cast<size_t>(doc.token_run)];
  }
  // Files skipped while walking directories / matching patterns, each with the reason.
  const std::vector<SkippedFile>& skipped() const { return skipped_; }
  // Bytes of document text (what bytes/token and MB/s are measured against).
  int64_t document_bytes() const { return document_bytes_; }
  // Tokens that came from .bin shards (already tokenized).
  int64_t shard_tokens() const { return shard_tokens_; }
  // Bytes of input files this batch consumed (progress).
  int64_t input_bytes() const { return input_bytes_; }

 private:
  friend class CorpusReader;
  void add_text(const std::string& path, std::string text, const std::optional<std::string>& separator);

  std::vector<CorpusFile> files_;
  std::vector<DocumentRef> documents_;
  std::vector<std::vector<int32_t>> token_runs_;
  std::vector<SkippedFile> skipped_;
  int64_t document_bytes_ = 0;
  int64_t shard_tokens_ = 0;
  int64_t input_bytes_ = 0;
};

struct CorpusOptions {
  std::optional<std::string> separator;  // document separator line for text files
  BinFormat bin_format = BinFormat::kAuto;
  int64_t vocab_size = 50257;  // .bin ids must be below this
  int32_t eot_token = 50256;   // .bin documents end after it
};

// Streams a corpus in batches of about `target_bytes` of input, in input order; memory is bounded
// by a batch (plus one whole text file, which is read at once).
class CorpusReader {
 public:
  // Expands the inputs (data/inputs.h); throws gpt2::UserError for a missing path or empty glob.
  CorpusReader(const std::vector<std::string>& inputs, CorpusOptions options);
  ~CorpusReader();
  CorpusReader(const CorpusReader&) = delete;
  CorpusReader& operator=(const CorpusReader&) = delete;

  // Replaces *batch with the next documents; false (and an empty batch) when everything was read.
  // A batch may hold no documents (e.g. only blank files) but still report input_bytes().
  bool next(Corpus* batch, int64_t target_bytes);

  const std::vector<InputFile>& inputs() const { return inputs_; }
  int64_t total_bytes() const { return total_bytes_; }  // sum of the input files' sizes
  // EOT tokens added because a .bin stream did not end with one (0 or 1 per run of .bin inputs).
  int64_t added_eot() const { return added_eot_; }

 private:
  void flush_token_run(Corpus* batch, bool end_of_stream);

  CorpusOptions options_;
  std::vector<InputFile> inputs_;
  std::vector<SkippedFile> pending_skipped_;  // from expansion; handed to the first batch
  int64_t total_bytes_ = 0;
  size_t next_input_ = 0;
  std::unique_ptr<JsonlReader> jsonl_;     // open while inside a .jsonl input
  std::unique_ptr<BinShardReader> shard_;  // open while inside a .bin input
  std::vector<int32_t> run_;               // the .bin document being collected
  int64_t added_eot_ = 0;
};

// Splits `text` into documents (byte ranges). Without a separator the whole text is one
// document. Whitespace-only documents are dropped.
std::vector<std::pair<size_t, size_t>> split_documents(std::string_view text,
                                                       const std::optional<std::string>& separator);

// The draw in [0, 1) that decides document `index`'s split: val when below val_fraction
// (DatasetWriter, data/shard_writer.h).
double validation_draw(uint64_t seed, uint64_t index);

// Counters the tokenizer threads advance as they finish pieces (progress lines).
struct TokenizeProgress {
  std::atomic<int64_t> bytes{0};   // document bytes done (.bin: 2 per token)
  std::atomic<int64_t> tokens{0};  // tokens produced
};

// Tokenizes every document with `threads` worker threads (0: one per core); result[i] holds the
// tokens of document i, in order, without EOT (a .bin document: its tokens as they are).
std::vector<std::vector<int32_t>> tokenize_documents(const Gpt2Tokenizer& tokenizer, const Corpus& corpus, int threads,
                                                     TokenizeProgress* progress = nullptr);

}  // namespace gpt2::data
