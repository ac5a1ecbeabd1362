#pragma once
// Reading text corpora for gpt2-data: input paths -> files -> documents -> train/val token streams.
// Contract: a document is a whole file, or, with a separator line, each run of lines between lines
// equal to it (a trailing "\r" is ignored, for CRLF files); documents with nothing but whitespace
// are dropped. Directories are walked recursively in sorted order, taking regular files only
// (symlinks and hidden entries are skipped) and skipping, with a warning, *.dat files and files
// that are not UTF-8 text. A file named explicitly must be UTF-8. Problems are gpt2::UserError.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/bpe_tokenizer.h"

namespace gpt2::data {

struct CorpusFile {
  std::string path;
  std::string text;  // whole file, valid UTF-8
};

struct SkippedFile {
  std::string path;
  std::string reason;  // kSkippedDat, or "not UTF-8 text (byte offset N)"
};
inline constexpr char kSkippedDat[] = "a *.dat file (e.g. a fortune index)";

struct DocumentRef {
  uint32_t file = 0;  // index into Corpus::files()
  size_t offset = 0;  // byte range of the document in that file's text
  size_t length = 0;
};

class Corpus {
 public:
  // Reads every input (files or directories). `separator`: the document separator line, if any.
  // Throws gpt2::UserError for a missing or unreadable input, or an explicit non-UTF-8 file.
  static Corpus load(const std::vector<std::string>& inputs, const std::optional<std::string>& separator);

  const std::vector<CorpusFile>& files() const { return files_; }
  const std::vector<DocumentRef>& documents() const { return documents_; }
  std::string_view text(const DocumentRef& doc) const {
    return std::string_view(files_[doc.file].text).substr(doc.offset, doc.length);
  }
  // Files skipped while walking directories, each with the reason.
  const std::vector<SkippedFile>& skipped() const { return skipped_; }
  // Bytes of document text (what bytes/token and MB/s are measured against).
  int64_t document_bytes() const { return document_bytes_; }

 private:
  std::vector<CorpusFile> files_;
  std::vector<DocumentRef> documents_;
  std::vector<SkippedFile> skipped_;
  int64_t document_bytes_ = 0;
};

// Splits `text` into documents (byte ranges). Without a separator the whole text is one
// document. Whitespace-only documents are dropped.
std::vector<std::pair<size_t, size_t>> split_documents(std::string_view text,
                                                       const std::optional<std::string>& separator);

// For each of `num_documents` documents, whether it goes to the validation split: a deterministic
// hash of (seed, index) below val_fraction. When val_fraction > 0 and there are at least two
// documents, at least one goes to val and at least one stays in train.
std::vector<bool> assign_validation(size_t num_documents, double val_fraction, uint64_t seed);

// Tokenizes every document with `threads` worker threads (0: one per core); result[i] holds the
// tokens of document i, in order, without EOT.
std::vector<std::vector<int32_t>> tokenize_documents(const Gpt2Tokenizer& tokenizer, const Corpus& corpus,
                                                     int threads);

}  // namespace gpt2::data
