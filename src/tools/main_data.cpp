// gpt2-data: text / JSON lines / .bin token shards -> GPT-2 tokens in HDF5 token files (DESIGN.md).
//   gpt2-data INPUT... --out DIR [--val_fraction F] [--doc_separator LINE] [--tokenizer_dir DIR]
//             [--threads N] [--seed S] [--shard_tokens N] [--bin_format auto|llmc|raw]
// Streams the corpus in batches (read ahead on one thread while the others tokenize), writes
// DIR/train.h5 and DIR/val.h5, or numbered shards when a split exceeds --shard_tokens.
// defines: main. uses: CorpusReader, Gpt2Tokenizer, DatasetWriter (data/).
#include <hdf5.h>

#include <boost/program_options.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <future>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "data/bin_shard.h"
#include "data/bpe_tokenizer.h"
#include "data/corpus.h"
#include "data/shard_writer.h"
#include "data/token_file.h"
#include "src/base/clock.h"
#include "src/base/errors.h"
#include "src/base/files.h"
#include "src/base/log.h"
#include "src/base/threads.h"
#include "src/tools/command_line.h"

namespace po = boost::program_options;
namespace files = gpt2::files;
namespace data = gpt2::data;

namespace {

// Input read per batch: large enough to keep every tokenizer thread busy, small enough that
// memory stays flat however large the corpus is.
constexpr int64_t kBatchBytes = int64_t{64} << 20;

struct Options {
  std::vector<std::string> inputs;
  std::string out;
  double val_fraction = 0.005;  // ~0.5% of documents: enough for a stable val loss on real corpora
  std::optional<std::string> doc_separator;
  std::string tokenizer_dir;  // empty: find_default_tokenizer_dir()
  int threads = 0;            // 0: one per core
  uint64_t seed = 1337;
  int64_t shard_tokens = data::kDefaultShardTokens;
  data::BinFormat bin_format = data::BinFormat::kAuto;
};

constexpr char kUsage[] =
    "usage: gpt2-data INPUT... --out DIR [--val_fraction F] [--doc_separator LINE]\n"
    "                 [--tokenizer_dir DIR] [--threads N] [--seed S] [--shard_tokens N]\n"
    "                 [--bin_format auto|llmc|raw]\n"
    "Tokenizes a corpus with GPT-2's BPE into HDF5 token files for gpt2-train.\n"
    "\n"
    "INPUT: files, directories (read recursively, sorted; hidden files, symlinks and *.dat skipped)\n"
    "or quoted shell globs ('corpus/*.txt', expanded here, sorted; matching nothing is an error).\n"
    "By extension: *.jsonl = JSON lines, one document per line from its \"text\" string;\n"
    "*.bin = already tokenized llm.c shards (header magic 20240520, version 1, uint16) or nanoGPT\n"
    "raw uint16 files, copied through unchanged (documents end after each EOT);\n"
    "anything else = UTF-8 text, a file per document unless --doc_separator is given.\n"
    "\n"
    "Output: DIR/train.h5 and DIR/val.h5 when a split holds at most --shard_tokens tokens;\n"
    "otherwise DIR/train_000000.h5, DIR/train_000001.h5, ... (and val_000000.h5, ...), each\n"
    "exactly --shard_tokens tokens but the last; in name order they are the split's token stream\n"
    "(give gpt2-train DIR/train*.h5). Outputs of earlier runs in DIR are replaced.\n"
    "Progress (MB done / total, tokens/s, ETA) goes to stderr every 0.5 s on a terminal, every 10 s\n"
    "otherwise.";

// Returns nullopt when --help was asked for (usage printed).
std::optional<Options> parse_options(int argc, char** argv) {
  Options opt;
  std::string separator;
  std::string bin_format = "auto";
  po::options_description named("options");
  named.add_options()("help,h", "print this help")("out,o", po::value(&opt.out),
                                                   "output directory (created if missing)")(
      "val_fraction", po::value(&opt.val_fraction)->default_value(opt.val_fraction, "0.005"),
      "fraction of documents for the val split, in [0, 1); 0 writes no val file")(
      "doc_separator", po::value(&separator),
      "a line that separates documents inside a text file (e.g. % for fortune files); "
      "default: each text file is one document")(
      "tokenizer_dir", po::value(&opt.tokenizer_dir),
      "directory with encoder.json and vocab.bpe (default: the repo's data/tokenizer/gpt2)")(
      "threads", po::value(&opt.threads)->default_value(opt.threads), "tokenizer threads (0: one per core)")(
      "seed", po::value(&opt.seed)->default_value(opt.seed), "seed of the train/val document split")(
      "shard_tokens", po::value(&opt.shard_tokens)->default_value(opt.shard_tokens),
      "most tokens per output file; a larger split is written as numbered shards")(
      "bin_format", po::value(&bin_format)->default_value(bin_format),
      "*.bin layout: auto (llm.c header if its magic is there, else raw uint16), llmc, raw (nanoGPT)");
  po::options_description hidden;
  hidden.add_options()("input", po::value(&opt.inputs)->composing(), "input files, directories or globs");
  po::positional_options_description positional;
  positional.add("input", -1);
  po::variables_map vm;
  if (!gpt2::tools::parse_command_line(argc, argv, "gpt2-data", kUsage, named, positional, vm, hidden)) {
    return std::nullopt;
  }
  if (opt.inputs.empty()) {
    throw gpt2::UserError(
        "no INPUT given: pass text, .jsonl or .bin files, directories or globs (see gpt2-data --help)");
  }
  if (opt.out.empty()) throw gpt2::UserError("--out DIR is required (see gpt2-data --help)");
  if (!(opt.val_fraction >= 0 && opt.val_fraction < 1)) {
    throw gpt2::UserError("--val_fraction " + std::to_string(opt.val_fraction) + " must be in [0, 1)");
  }
  if (opt.threads < 0 || opt.threads > 1024) {
    throw gpt2::UserError("--threads " + std::to_string(opt.threads) + " must be in [0, 1024]");
  }
  if (opt.shard_tokens <= 0) {
    throw gpt2::UserError("--shard_tokens " + std::to_string(opt.shard_tokens) + " must be positive");
  }
  opt.bin_format = data::parse_bin_format(bin_format);
  if (vm.count("doc_separator")) {
    if (separator.find('\n') != std::string::npos) throw gpt2::UserError("--doc_separator must be a single line");
    opt.doc_separator = separator;
  }
  return opt;
}

std::string format_duration(double seconds) {
  const auto s = static_cast<long long>(seconds + 0.5);
  return s >= 3600 ? gpt2::log::format("%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60)
                   : gpt2::log::format("%lld:%02lld", s / 60, s % 60);
}

// The progress line on stderr. A thread redraws it from counters the pipeline advances: input
// bytes of finished batches, and within the batch being tokenized the tokenizer's own counters,
// scaled from document bytes to the batch's input bytes.
class Progress {
 public:
  explicit Progress(int64_t total_bytes)
      : total_bytes_(total_bytes), tty_(::isatty(STDERR_FILENO) == 1), start_(Clock::now()) {
    thread_ = gpt2::start_helper_thread([this] { loop(); });
  }
  ~Progress() { stop(); }

  // Before tokenizing a batch of `input_bytes` input holding `work_bytes` of documents.
  void begin_batch(int64_t input_bytes, int64_t work_bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    batch_input_ = input_bytes;
    batch_work_ = work_bytes;
    batch_.bytes = 0;
    batch_.tokens = 0;
  }
  void end_batch() {
    std::lock_guard<std::mutex> lock(mutex_);
    done_bytes_ += batch_input_;
    done_tokens_ += batch_.tokens;
    batch_input_ = batch_work_ = 0;
    batch_.bytes = 0;
    batch_.tokens = 0;
  }
  data::TokenizeProgress* counters() { return &batch_; }

  // Stops the thread and prints the final line.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopped_) return;
      stopped_ = true;
    }
    wake_.notify_all();
    thread_.join();
    print(true);
  }

 private:
  using Clock = std::chrono::steady_clock;

  void loop() {
    const auto interval = std::chrono::milliseconds(tty_ ? 500 : 10000);
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, interval, [this] { return stopped_; })) {
      lock.unlock();
      print(false);
      lock.lock();
    }
  }

  void print(bool final) {
    int64_t bytes, tokens;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const int64_t work_done = batch_.bytes.load();
      const double fraction = batch_work_ > 0 ? std::min(1.0, static_cast<double>(work_done) / batch_work_) : 0.0;
      bytes = done_bytes_ + static_cast<int64_t>(fraction * batch_input_);
      tokens = done_tokens_ + batch_.tokens.load();
    }
    const double seconds = gpt2::seconds_since(start_);
    const double rate = seconds > 0 ? bytes / seconds : 0.0;
    std::string line = gpt2::log::format("progress: %.1f / %.1f MB (%.0f%%), %.2fM tokens/s, %.1f MB/s", bytes / 1e6,
                                         total_bytes_ / 1e6, total_bytes_ > 0 ? 100.0 * bytes / total_bytes_ : 100.0,
                                         seconds > 0 ? tokens / seconds / 1e6 : 0.0, rate / 1e6);
    line += final ? ", " + format_duration(seconds) + " elapsed"
                  : ", ETA " + (rate > 0 ? format_duration(std::max<int64_t>(0, total_bytes_ - bytes) / rate) : "?");
    if (tty_) {
      std::fprintf(stderr, "\r%s\x1b[K%s", line.c_str(), final ? "\n" : "");
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    std::fflush(stderr);
  }

  const int64_t total_bytes_;
  const bool tty_;
  const Clock::time_point start_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopped_ = false;
  int64_t done_bytes_ = 0;
  int64_t done_tokens_ = 0;
  int64_t batch_input_ = 0;
  int64_t batch_work_ = 0;
  data::TokenizeProgress batch_;
  std::thread thread_;
};

void warn_skipped(const std::vector<data::SkippedFile>& skipped) {
  namespace log = gpt2::log;
  // *.dat files come in dozens in a fortune directory: one line for all of them.
  std::vector<std::string> dat_files;
  for (const data::SkippedFile& s : skipped) {
    if (s.reason == data::kSkippedDat) {
      dat_files.push_back(files::filename(s.path));
    } else {
      log::warn("skipped ", s.path, ": ", s.reason);
    }
  }
  if (!dat_files.empty()) {
    std::string names;
    for (size_t i = 0; i < dat_files.size() && i < 5; ++i) names += (i ? ", " : "") + dat_files[i];
    if (dat_files.size() > 5) names += ", ...";
    log::warn("skipped ", dat_files.size(), " *.dat files (fortune indexes, not text): ", names);
  }
}

std::string describe_outputs(const std::vector<std::string>& paths) {
  if (paths.size() == 1) return paths[0];
  return std::to_string(paths.size()) + " shards " + files::filename(paths.front()) + " .. " +
         files::filename(paths.back()) + " in " + files::parent_path(paths.front());
}

int run(const Options& opt) {
  using Clock = std::chrono::steady_clock;
  namespace log = gpt2::log;

  const std::string tok_dir = opt.tokenizer_dir.empty() ? data::find_default_tokenizer_dir() : opt.tokenizer_dir;
  const data::Gpt2Tokenizer tokenizer = data::Gpt2Tokenizer::load(tok_dir);
  log::info("tokenizer: GPT-2 BPE from ", tok_dir, " (vocab ", tokenizer.vocab_size(), ", eot ", tokenizer.eot_token(),
            ")");

  // ---- list inputs (every path and pattern is checked before any work)
  data::CorpusOptions corpus_options;
  corpus_options.separator = opt.doc_separator;
  corpus_options.bin_format = opt.bin_format;
  corpus_options.vocab_size = tokenizer.vocab_size();
  corpus_options.eot_token = tokenizer.eot_token();
  data::CorpusReader reader(opt.inputs, corpus_options);
  int64_t by_kind[3] = {0, 0, 0};
  for (const data::InputFile& f : reader.inputs()) ++by_kind[static_cast<int>(f.kind)];
  log::info("inputs: ", reader.inputs().size(), " files (", by_kind[0], " text, ", by_kind[1], " JSON lines, ",
            by_kind[2], " .bin token shards), ", log::format("%.2f", reader.total_bytes() / 1e6), " MB");

  try {
    files::create_directories(opt.out);
  } catch (const gpt2::UserError& e) {
    throw gpt2::UserError("--out " + opt.out + ": " + e.what());
  }
  data::TokenFileAttrs attrs;
  attrs.vocab_size = tokenizer.vocab_size();
  attrs.eot_token = tokenizer.eot_token();
  attrs.tokenizer = "gpt2";
  data::DatasetWriter writer(opt.out, opt.shard_tokens, attrs, opt.val_fraction, opt.seed);

  // ---- read (one batch ahead), tokenize (all threads), write (shards as they fill)
  const auto t0 = Clock::now();
  int64_t text_bytes = 0, text_tokens = 0, text_docs = 0, shard_tokens = 0;
  Progress progress(reader.total_bytes());
  data::Corpus batch;
  bool have = reader.next(&batch, kBatchBytes);
  while (have) {
    data::Corpus next_batch;
    // The reader is only ever used by one thread at a time: this one, or the read-ahead.
    std::future<bool> ahead = [&] {
      const gpt2::StopSignalsBlocked blocked;  // a helper thread, as start_helper_thread makes
      return std::async(std::launch::async, [&reader, &next_batch] { return reader.next(&next_batch, kBatchBytes); });
    }();
    warn_skipped(batch.skipped());
    progress.begin_batch(batch.input_bytes(), batch.document_bytes() + 2 * batch.shard_tokens());
    const auto doc_tokens = data::tokenize_documents(tokenizer, batch, opt.threads, progress.counters());
    const auto& docs = batch.documents();
    for (size_t d = 0; d < docs.size(); ++d) {
      const bool is_text = docs[d].token_run < 0;
      writer.add_document(doc_tokens[d], is_text);  // .bin documents carry their own EOT
      if (is_text) {
        ++text_docs;
        text_tokens += static_cast<int64_t>(doc_tokens[d].size());
      }
    }
    text_bytes += batch.document_bytes();
    shard_tokens += batch.shard_tokens();
    progress.end_batch();
    have = ahead.get();
    batch = std::move(next_batch);
  }
  progress.stop();
  const double seconds = gpt2::seconds_since(t0);

  const int64_t num_docs = writer.num_documents();
  if (num_docs == 0) {
    throw gpt2::UserError("no documents in the inputs (" + std::to_string(reader.inputs().size()) +
                          " files read, all empty or whitespace)");
  }
  if (reader.added_eot() > 0) {
    log::info("added ", reader.added_eot(), " EOT after .bin tokens that did not end with one");
  }
  const data::DatasetSummary summary = writer.finish();
  for (const std::string& note : summary.notes) log::warn(note);
  if (opt.val_fraction > 0 && num_docs == 1) log::warn("only one document: no validation split written");
  for (const std::string& path : summary.removed) log::info("removed stale ", path);

  // ---- summary
  const char* labels[2] = {"train: ", "val:   "};
  for (int s = 0; s < 2; ++s) {
    if (summary.paths[s].empty()) continue;
    log::info(labels[s], summary.documents[s], " documents, ", summary.tokens[s], " tokens -> ",
              describe_outputs(summary.paths[s]));
  }
  const double mb = reader.total_bytes() / 1e6;
  log::info(log::format(
      "%lld documents, %lld text tokens (+%lld EOT), %lld .bin tokens, %.3f bytes/token, "
      "%.1f MB/s (%.2f s)",
      static_cast<long long>(num_docs), static_cast<long long>(text_tokens), static_cast<long long>(text_docs),
      static_cast<long long>(shard_tokens), text_tokens > 0 ? static_cast<double>(text_bytes) / text_tokens : 0.0,
      seconds > 0 ? mb / seconds : 0.0, seconds));
  return gpt2::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  H5dont_atexit();  // Note [HDF5 at exit] in main_train.cpp
  gpt2::log::init(0, 1);
  try {
    const std::optional<Options> opt = parse_options(argc, argv);
    if (!opt) return gpt2::kExitOk;
    return run(*opt);
  } catch (const gpt2::UserError& e) {
    gpt2::log::error(e.what());
    return gpt2::kExitUsage;
  } catch (const std::exception& e) {
    gpt2::log::error("gpt2-data failed: ", gpt2::error_message(e));
    return gpt2::kExitFailure;
  }
}
