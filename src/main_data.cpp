// gpt2-data: text files or directories -> GPT-2 tokens in HDF5 token files (DESIGN.md).
//   gpt2-data INPUT... --out DIR [--val_fraction F] [--doc_separator LINE] [--tokenizer_dir DIR]
//             [--threads N] [--seed S]
// Writes DIR/train.h5 and, unless F is 0, DIR/val.h5; every document is followed by EOT.
// defines: main. uses: Corpus, Gpt2Tokenizer, write_token_file (data/).
#include <boost/program_options.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "data/bpe_tokenizer.h"
#include "data/corpus.h"
#include "data/token_file.h"
#include "src/base/errors.h"
#include "src/base/files.h"
#include "src/base/log.h"

namespace po = boost::program_options;
namespace files = gpt2::files;

namespace {

struct Options {
  std::vector<std::string> inputs;
  std::string out;
  double val_fraction = 0.005;  // ~0.5% of documents: enough for a stable val loss on real corpora
  std::optional<std::string> doc_separator;
  std::string tokenizer_dir;  // empty: find_default_tokenizer_dir()
  int threads = 0;            // 0: one per core
  uint64_t seed = 1337;
};

constexpr char kUsage[] =
    "usage: gpt2-data INPUT... --out DIR [--val_fraction F] [--doc_separator LINE]\n"
    "                 [--tokenizer_dir DIR] [--threads N] [--seed S]\n"
    "Tokenizes text files (directories are read recursively) with GPT-2's BPE and writes\n"
    "DIR/train.h5 and DIR/val.h5 token files.";

// Returns nullopt when --help was asked for (usage printed).
std::optional<Options> parse_options(int argc, char** argv) {
  Options opt;
  std::string separator;
  po::options_description named("options");
  named.add_options()
      ("help,h", "print this help")
      ("out,o", po::value(&opt.out), "output directory (created if missing)")
      ("val_fraction", po::value(&opt.val_fraction)->default_value(opt.val_fraction),
       "fraction of documents for DIR/val.h5, in [0, 1); 0 writes no val file")
      ("doc_separator", po::value(&separator),
       "a line that separates documents inside a file (e.g. % for fortune files); "
       "default: each file is one document")
      ("tokenizer_dir", po::value(&opt.tokenizer_dir),
       "directory with encoder.json and vocab.bpe (default: the repo's data/tokenizer/gpt2)")
      ("threads", po::value(&opt.threads)->default_value(opt.threads), "tokenizer threads (0: one per core)")
      ("seed", po::value(&opt.seed)->default_value(opt.seed), "seed of the train/val document split");
  po::options_description hidden;
  hidden.add_options()("input", po::value(&opt.inputs)->composing(), "input files or directories");
  po::options_description all;
  all.add(named).add(hidden);
  po::positional_options_description positional;
  positional.add("input", -1);

  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(all).positional(positional).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw gpt2::UserError(std::string(e.what()) + " (see gpt2-data --help)");
  }
  if (vm.count("help")) {
    std::cout << kUsage << "\n\n" << named << "\n";
    return std::nullopt;
  }
  if (opt.inputs.empty()) throw gpt2::UserError("no INPUT given: pass text files or directories (see gpt2-data --help)");
  if (opt.out.empty()) throw gpt2::UserError("--out DIR is required (see gpt2-data --help)");
  if (!(opt.val_fraction >= 0 && opt.val_fraction < 1)) {
    throw gpt2::UserError("--val_fraction " + std::to_string(opt.val_fraction) + " must be in [0, 1)");
  }
  if (opt.threads < 0 || opt.threads > 1024) {
    throw gpt2::UserError("--threads " + std::to_string(opt.threads) + " must be in [0, 1024]");
  }
  if (vm.count("doc_separator")) {
    if (separator.find('\n') != std::string::npos) throw gpt2::UserError("--doc_separator must be a single line");
    opt.doc_separator = separator;
  }
  return opt;
}

int run(const Options& opt) {
  using Clock = std::chrono::steady_clock;
  namespace data = gpt2::data;
  namespace log = gpt2::log;

  const std::string tok_dir = opt.tokenizer_dir.empty() ? data::find_default_tokenizer_dir() : opt.tokenizer_dir;
  const data::Gpt2Tokenizer tokenizer = data::Gpt2Tokenizer::load(tok_dir);
  log::info("tokenizer: GPT-2 BPE from ", tok_dir, " (vocab ", tokenizer.vocab_size(), ", eot ",
            tokenizer.eot_token(), ")");

  // ---- read inputs
  const data::Corpus corpus = data::Corpus::load(opt.inputs, opt.doc_separator);
  // *.dat files come in dozens in a fortune directory: one line for all of them.
  std::vector<std::string> dat_files;
  for (const data::SkippedFile& s : corpus.skipped()) {
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
  const size_t num_docs = corpus.documents().size();
  if (num_docs == 0) {
    throw gpt2::UserError("no documents in the inputs (" + std::to_string(corpus.files().size()) +
                          " files read, all empty or whitespace)");
  }
  log::info("read ", corpus.files().size(), " files, ", num_docs, " documents, ",
            log::format("%.2f", corpus.document_bytes() / 1e6), " MB of text");

  // ---- tokenize (order preserved across threads)
  const auto t0 = Clock::now();
  const auto doc_tokens = data::tokenize_documents(tokenizer, corpus, opt.threads);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();

  // ---- split and write
  const std::vector<bool> is_val = data::assign_validation(num_docs, opt.val_fraction, opt.seed);
  std::vector<uint32_t> split_tokens[2];  // [0] train, [1] val
  size_t split_docs[2] = {0, 0};
  int64_t text_tokens = 0;
  for (size_t d = 0; d < num_docs; ++d) {
    auto& dst = split_tokens[is_val[d] ? 1 : 0];
    dst.insert(dst.end(), doc_tokens[d].begin(), doc_tokens[d].end());
    dst.push_back(static_cast<uint32_t>(tokenizer.eot_token()));
    ++split_docs[is_val[d] ? 1 : 0];
    text_tokens += static_cast<int64_t>(doc_tokens[d].size());
  }

  try {
    files::create_directories(opt.out);
  } catch (const gpt2::UserError& e) {
    throw gpt2::UserError("--out " + opt.out + ": " + e.what());
  }
  data::TokenFileAttrs attrs;
  attrs.vocab_size = tokenizer.vocab_size();
  attrs.eot_token = tokenizer.eot_token();
  attrs.tokenizer = "gpt2";
  const std::string train_path = files::join(opt.out, "train.h5");
  const std::string val_path = files::join(opt.out, "val.h5");
  data::write_token_file(train_path, split_tokens[0], attrs);
  if (split_docs[1] > 0) {
    data::write_token_file(val_path, split_tokens[1], attrs);
  } else {
    if (opt.val_fraction > 0) log::warn("only one document: no validation split written");
    // A val.h5 from an earlier run would no longer match train.h5.
    if (files::remove_file(val_path)) log::info("removed stale ", val_path);
  }

  // ---- summary
  const double mb = corpus.document_bytes() / 1e6;
  log::info("train: ", split_docs[0], " documents, ", split_tokens[0].size(), " tokens -> ", train_path);
  if (split_docs[1] > 0) {
    log::info("val:   ", split_docs[1], " documents, ", split_tokens[1].size(), " tokens -> ", val_path);
  }
  log::info(log::format("%zu documents, %lld text tokens (+%zu EOT), %.3f bytes/token, %.1f MB/s tokenizing "
                        "(%.2f s)",
                        num_docs, static_cast<long long>(text_tokens), num_docs,
                        text_tokens > 0 ? corpus.document_bytes() / static_cast<double>(text_tokens) : 0.0,
                        seconds > 0 ? mb / seconds : 0.0, seconds));
  return gpt2::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  gpt2::log::init(0, 1);
  try {
    const std::optional<Options> opt = parse_options(argc, argv);
    if (!opt) return gpt2::kExitOk;
    return run(*opt);
  } catch (const gpt2::UserError& e) {
    gpt2::log::error(e.what());
    return gpt2::kExitUsage;
  } catch (const std::exception& e) {
    gpt2::log::error("gpt2-data failed: ", e.what());
    return gpt2::kExitFailure;
  }
}
