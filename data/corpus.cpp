// Corpus reading and parallel tokenization for gpt2-data (see corpus.h).
#include "data/corpus.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

#include "data/unicode_tables.h"
#include "src/base/errors.h"
#include "src/base/files.h"
#include "src/base/log.h"
#include "src/base/threads.h"

namespace gpt2::data {
namespace {

bool is_blank(std::string_view s) { return s.find_first_not_of(" \t\r\n\v\f") == std::string_view::npos; }

// Offset of the first byte that makes `text` not UTF-8 text (invalid UTF-8 or NUL), or npos.
size_t find_non_text(std::string_view text) {
  const size_t invalid = unicode::find_invalid_utf8(reinterpret_cast<const unsigned char*>(text.data()), text.size());
  const size_t nul = text.find('\0');
  const size_t first = std::min(invalid, nul == std::string_view::npos ? text.size() : nul);
  return first == text.size() ? std::string_view::npos : first;
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

void Corpus::add_text(const std::string& path, std::string text, const std::optional<std::string>& separator) {
  const auto ranges = split_documents(text, separator);
  const auto index = static_cast<uint32_t>(files_.size());
  for (const auto& [offset, length] : ranges) {
    documents_.push_back(DocumentRef{index, offset, length, -1});
    document_bytes_ += static_cast<int64_t>(length);
  }
  if (ranges.empty()) text.clear();  // nothing to keep
  files_.push_back(CorpusFile{path, std::move(text)});
}

Corpus Corpus::load(const std::vector<std::string>& inputs, const std::optional<std::string>& separator) {
  CorpusOptions options;
  options.separator = separator;
  CorpusReader reader(inputs, options);
  Corpus corpus;
  reader.next(&corpus, INT64_MAX);
  return corpus;
}

CorpusReader::CorpusReader(const std::vector<std::string>& inputs, CorpusOptions options)
    : options_(std::move(options)) {
  ExpandedInputs expanded = expand_inputs(inputs);
  inputs_ = std::move(expanded.files);
  pending_skipped_ = std::move(expanded.skipped);
  for (const InputFile& f : inputs_) {
    total_bytes_ += f.bytes;
    // Headers are cheap to check: a bad shard among hundreds fails now, not hours into the run.
    if (f.kind == InputKind::kTokenShard) BinShardReader(f.path, options_.bin_format, options_.vocab_size);
  }
}

CorpusReader::~CorpusReader() = default;

void CorpusReader::flush_token_run(Corpus* batch, bool end_of_stream) {
  if (run_.empty()) return;
  if (end_of_stream && run_.back() != options_.eot_token) {
    // Every document of a token file is followed by EOT (DESIGN.md); llm.c shards put EOT before
    // each document instead, so their last document has none.
    run_.push_back(options_.eot_token);
    ++added_eot_;
  }
  batch->shard_tokens_ += static_cast<int64_t>(run_.size());
  batch->documents_.push_back(DocumentRef{0, 0, 0, static_cast<int32_t>(batch->token_runs_.size())});
  batch->token_runs_.push_back(std::move(run_));
  run_.clear();
}

bool CorpusReader::next(Corpus* batch, int64_t target_bytes) {
  *batch = Corpus();
  batch->skipped_ = std::move(pending_skipped_);
  pending_skipped_.clear();
  if (next_input_ >= inputs_.size()) return false;
  int64_t gathered = 0;
  while (next_input_ < inputs_.size() && gathered < target_bytes) {
    const InputFile& input = inputs_[next_input_];
    switch (input.kind) {
      case InputKind::kText: {
        std::string text = files::read_file(input.path);
        batch->input_bytes_ += static_cast<int64_t>(text.size());
        gathered += static_cast<int64_t>(text.size());
        if (input.named) {
          const size_t bad =
              unicode::find_invalid_utf8(reinterpret_cast<const unsigned char*>(text.data()), text.size());
          if (bad != text.size()) {
            throw UserError(input.path + ": not UTF-8 text (invalid byte at offset " + std::to_string(bad) + ")");
          }
        } else if (const size_t bad = find_non_text(text); bad != std::string_view::npos) {
          batch->skipped_.push_back(
              SkippedFile{input.path, "not UTF-8 text (byte offset " + std::to_string(bad) + ")"});
          ++next_input_;
          break;
        }
        batch->add_text(input.path, std::move(text), options_.separator);
        ++next_input_;
        break;
      }
      case InputKind::kJsonLines: {
        if (!jsonl_) jsonl_ = std::make_unique<JsonlReader>(input.path);
        // All of this file's documents in this batch share one CorpusFile.
        const auto file_index = static_cast<uint32_t>(batch->files_.size());
        batch->files_.push_back(CorpusFile{input.path, {}});
        std::string& all = batch->files_.back().text;
        std::string doc;
        const int64_t before = jsonl_->bytes_read();
        bool more = true;
        while (gathered + (jsonl_->bytes_read() - before) < target_bytes && (more = jsonl_->next(&doc))) {
          if (is_blank(doc)) continue;
          batch->documents_.push_back(DocumentRef{file_index, all.size(), doc.size(), -1});
          batch->document_bytes_ += static_cast<int64_t>(doc.size());
          all += doc;
        }
        const int64_t consumed = jsonl_->bytes_read() - before;
        batch->input_bytes_ += consumed;
        gathered += consumed;
        if (!more) {
          jsonl_.reset();
          ++next_input_;
        }
        break;
      }
      case InputKind::kTokenShard: {
        if (!shard_) {
          shard_ = std::make_unique<BinShardReader>(input.path, options_.bin_format, options_.vocab_size);
          if (shard_->info().llmc_header) {
            batch->input_bytes_ += kLlmcHeaderBytes;
            gathered += kLlmcHeaderBytes;
          }
        }
        std::vector<int32_t> block;
        const auto want = static_cast<size_t>(std::clamp<int64_t>((target_bytes - gathered) / 2, 1, 1 << 20));
        const size_t got = shard_->read(block, want);
        batch->input_bytes_ += 2 * static_cast<int64_t>(got);
        gathered += 2 * static_cast<int64_t>(got);
        for (const int32_t id : block) {
          run_.push_back(id);
          if (id == options_.eot_token || run_.size() >= kMaxTokenRun) flush_token_run(batch, false);
        }
        if (got == 0) {
          shard_.reset();
          ++next_input_;
          const bool stream_ends = next_input_ >= inputs_.size() || inputs_[next_input_].kind != InputKind::kTokenShard;
          if (stream_ends) flush_token_run(batch, true);
        }
        break;
      }
    }
  }
  return true;
}

double validation_draw(uint64_t seed, uint64_t index) {
  return static_cast<double>(splitmix64(splitmix64(seed) ^ splitmix64(index)) >> 11) * 0x1.0p-53;
}

std::vector<std::vector<int32_t>> tokenize_documents(const Gpt2Tokenizer& tokenizer, const Corpus& corpus, int threads,
                                                     TokenizeProgress* progress) {
  const auto& docs = corpus.documents();
  std::vector<std::vector<int32_t>> result(docs.size());
  struct Work {
    size_t doc;
    std::string_view text;
    std::vector<int32_t> tokens;
  };
  std::vector<Work> work;
  for (size_t d = 0; d < docs.size(); ++d) {
    if (docs[d].token_run >= 0) {
      result[d] = corpus.token_run(docs[d]);  // already tokens
      if (progress != nullptr) {
        progress->bytes += 2 * static_cast<int64_t>(result[d].size());
        progress->tokens += static_cast<int64_t>(result[d].size());
      }
      continue;
    }
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
        if (progress != nullptr) {
          progress->bytes.fetch_add(static_cast<int64_t>(work[i].text.size()), std::memory_order_relaxed);
          progress->tokens.fetch_add(static_cast<int64_t>(work[i].tokens.size()), std::memory_order_relaxed);
        }
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(work.size());  // stop the others early
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < num_threads; ++t) pool.push_back(start_helper_thread(worker));
  worker();
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);

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
