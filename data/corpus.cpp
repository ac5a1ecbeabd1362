// Corpus reading and parallel tokenization for gpt2-data (see corpus.h).
#include "data/corpus.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

#include "data/unicode_tables.h"
#include "src/base/errors.h"
#include "src/base/files.h"
#include "src/base/log.h"

namespace gpt2::data {
namespace {

bool is_blank(std::string_view s) {
  return s.find_first_not_of(" \t\r\n\v\f") == std::string_view::npos;
}

// Offset of the first byte that makes `text` not UTF-8 text (invalid UTF-8 or NUL), or npos.
size_t find_non_text(std::string_view text) {
  const size_t invalid = unicode::find_invalid_utf8(reinterpret_cast<const unsigned char*>(text.data()), text.size());
  const size_t nul = text.find('\0');
  const size_t first = std::min(invalid, nul == std::string_view::npos ? text.size() : nul);
  return first == text.size() ? std::string_view::npos : first;
}

// Appends the regular files under `dir` (not following symlinks, skipping hidden entries).
void walk_directory_into(const std::string& dir, std::vector<std::string>& out) {
  for (const std::string& name : files::list_directory(dir)) {
    if (name[0] == '.') continue;
    const std::string path = files::join(dir, name);
    // Symlinks are skipped: in a directory they usually alias files already listed (fortune's
    // *.u8 links), and not following them rules out loops.
    if (files::is_symlink(path)) continue;
    if (files::is_directory(path)) {
      walk_directory_into(path, out);
    } else if (files::is_regular_file(path)) {
      out.push_back(path);
    }
  }
}

// Regular files under `dir` (not following symlinks, skipping hidden entries), sorted.
std::vector<std::string> walk_directory(const std::string& dir) {
  std::vector<std::string> out;
  walk_directory_into(dir, out);
  std::sort(out.begin(), out.end());
  return out;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A document longer than this is cut, at safe points, into segments tokenized in parallel.
constexpr size_t kSegmentBytes = size_t{1} << 20;

// Cut points for a long text such that tokenizing the pieces separately gives the same tokens as
// tokenizing it whole: a '\n' right after an ASCII graphic byte (a non-whitespace code point).
// Every pre-tokenizer piece that holds that byte stops before the '\n', and the scanner keeps no
// state across pieces, so the text after the cut tokenizes the same on its own
// (Note [Pre-tokenizer] in bpe_tokenizer.cpp).
std::vector<std::pair<size_t, size_t>> segment(std::string_view text) {
  std::vector<std::pair<size_t, size_t>> out;
  size_t start = 0;
  while (text.size() - start > kSegmentBytes) {
    size_t cut = std::string_view::npos;
    for (size_t p = text.find('\n', start + kSegmentBytes); p != std::string_view::npos; p = text.find('\n', p + 1)) {
      const auto before = static_cast<unsigned char>(text[p - 1]);
      if (before > 0x20 && before < 0x7F) {
        cut = p;
        break;
      }
    }
    if (cut == std::string_view::npos) break;
    out.emplace_back(start, cut - start);
    start = cut;
  }
  out.emplace_back(start, text.size() - start);
  return out;
}

}  // namespace

std::vector<std::pair<size_t, size_t>> split_documents(std::string_view text,
                                                       const std::optional<std::string>& separator) {
  std::vector<std::pair<size_t, size_t>> docs;
  auto add = [&](size_t begin, size_t end) {
    if (!is_blank(text.substr(begin, end - begin))) docs.emplace_back(begin, end - begin);
  };
  if (!separator) {
    add(0, text.size());
    return docs;
  }
  size_t doc_start = 0;
  size_t line_start = 0;
  while (line_start < text.size()) {
    size_t line_end = text.find('\n', line_start);
    const size_t next = line_end == std::string_view::npos ? text.size() : line_end + 1;
    if (line_end == std::string_view::npos) line_end = text.size();
    std::string_view line = text.substr(line_start, line_end - line_start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line == *separator) {
      add(doc_start, line_start);
      doc_start = next;
    }
    line_start = next;
  }
  add(doc_start, text.size());
  return docs;
}

Corpus Corpus::load(const std::vector<std::string>& inputs, const std::optional<std::string>& separator) {
  if (inputs.empty()) throw UserError("no INPUT given (text files or directories)");
  Corpus corpus;
  auto add_file = [&](const std::string& path, std::string text) {
    const auto ranges = split_documents(text, separator);
    const auto index = static_cast<uint32_t>(corpus.files_.size());
    for (const auto& [offset, length] : ranges) {
      corpus.documents_.push_back(DocumentRef{index, offset, length});
      corpus.document_bytes_ += static_cast<int64_t>(length);
    }
    if (ranges.empty()) text.clear();  // nothing to keep
    corpus.files_.push_back(CorpusFile{path, std::move(text)});
  };
  for (const std::string& input : inputs) {
    if (!files::exists(input)) throw UserError(input + ": no such file or directory");
    if (files::is_directory(input)) {
      for (const std::string& path : walk_directory(input)) {
        if (files::extension(path) == ".dat") {
          corpus.skipped_.push_back(SkippedFile{path, kSkippedDat});
          continue;
        }
        std::string text = files::read_file(path);
        const size_t bad = find_non_text(text);
        if (bad != std::string_view::npos) {
          corpus.skipped_.push_back(SkippedFile{path, "not UTF-8 text (byte offset " + std::to_string(bad) + ")"});
          continue;
        }
        add_file(path, std::move(text));
      }
    } else if (files::is_regular_file(input)) {
      std::string text = files::read_file(input);
      const size_t bad = unicode::find_invalid_utf8(reinterpret_cast<const unsigned char*>(text.data()), text.size());
      if (bad != text.size()) {
        throw UserError(input + ": not UTF-8 text (invalid byte at offset " + std::to_string(bad) + ")");
      }
      add_file(input, std::move(text));
    } else {
      throw UserError(input + ": not a regular file or directory");
    }
  }
  return corpus;
}

std::vector<bool> assign_validation(size_t num_documents, double val_fraction, uint64_t seed) {
  std::vector<bool> val(num_documents, false);
  if (val_fraction <= 0 || num_documents == 0) return val;
  // u[i] in [0, 1) from a hash of (seed, i): the split of a document does not depend on the others.
  std::vector<double> u(num_documents);
  const uint64_t seed_hash = splitmix64(seed);
  size_t num_val = 0;
  for (size_t i = 0; i < num_documents; ++i) {
    u[i] = static_cast<double>(splitmix64(seed_hash ^ splitmix64(i)) >> 11) * 0x1.0p-53;
    val[i] = u[i] < val_fraction;
    num_val += val[i] ? 1 : 0;
  }
  if (num_documents >= 2) {
    if (num_val == 0) val[static_cast<size_t>(std::min_element(u.begin(), u.end()) - u.begin())] = true;
    if (num_val == num_documents) val[static_cast<size_t>(std::max_element(u.begin(), u.end()) - u.begin())] = false;
  }
  return val;
}

std::vector<std::vector<int32_t>> tokenize_documents(const Gpt2Tokenizer& tokenizer, const Corpus& corpus,
                                                     int threads) {
  const auto& docs = corpus.documents();
  struct Work {
    size_t doc;
    std::string_view text;
    std::vector<int32_t> tokens;
  };
  std::vector<Work> work;
  for (size_t d = 0; d < docs.size(); ++d) {
    const std::string_view text = corpus.text(docs[d]);
    for (const auto& [offset, length] : segment(text)) work.push_back(Work{d, text.substr(offset, length), {}});
  }
  size_t num_threads = threads > 0 ? static_cast<size_t>(threads) : std::max(1u, std::thread::hardware_concurrency());
  num_threads = std::max<size_t>(1, std::min(num_threads, work.size()));

  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    try {
      for (size_t i = next.fetch_add(1); i < work.size(); i = next.fetch_add(1)) {
        const std::string& path = corpus.files()[docs[work[i].doc].file].path;
        tokenizer.encode_append(work[i].text, work[i].tokens, path);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(work.size());  // stop the others early
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < num_threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);

  std::vector<std::vector<int32_t>> result(docs.size());
  for (Work& w : work) {
    auto& dst = result[w.doc];
    if (dst.empty()) {
      dst = std::move(w.tokens);
    } else {
      dst.insert(dst.end(), w.tokens.begin(), w.tokens.end());
    }
  }
  return result;
}

}  // namespace gpt2::data
