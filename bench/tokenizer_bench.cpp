// Tokenizer throughput: GPT-2 BPE MB/s over a corpus on one thread and on all threads.
//   tokenizer_bench [--reps R] [--threads N] [--separator LINE] [PATH...]
// PATHs as gpt2-data takes them (default: /usr/share/games/fortunes, split at "%" lines). Each
// rep loads a fresh tokenizer, so its per-thread word cache starts cold as in a real run; the
// median rep is reported. Prints one comparable line:
//   RESULT tokenizer_bench corpus_mb=.. docs=.. threads_1_mb_s=.. threads_N_mb_s=.. speedup=.. tokens_per_s=..
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "data/bpe_tokenizer.h"
#include "data/corpus.h"
#include "src/base/errors.h"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gpt2::data;
  int reps = 3;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::optional<std::string> separator;
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--separator" && i + 1 < argc) {
      separator = argv[++i];
    } else {
      inputs.push_back(a);
    }
  }
  if (inputs.empty()) {
    inputs.push_back("/usr/share/games/fortunes");
    if (!separator) separator = "%";
  }
  try {
    const Corpus corpus = Corpus::load(inputs, separator);
    const double mb = corpus.document_bytes() / 1e6;
    if (mb <= 0) throw gpt2::UserError("no text in the inputs");
    const std::string dir = find_default_tokenizer_dir();
    int64_t tokens = 0;
    auto run = [&](int n) {
      std::vector<double> rates;
      for (int r = 0; r < reps; ++r) {
        const Gpt2Tokenizer tok = Gpt2Tokenizer::load(dir);  // cold word cache
        const auto t0 = std::chrono::steady_clock::now();
        const auto out = tokenize_documents(tok, corpus, n);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        tokens = 0;
        for (const auto& d : out) tokens += static_cast<int64_t>(d.size());
        rates.push_back(mb / s);
        std::fprintf(stderr, "threads=%d rep %d: %.3f s, %.1f MB/s\n", n, r, s, mb / s);
      }
      return median(rates);
    };
    const double one = run(1);
    const double all = run(threads);
    std::printf(
        "RESULT tokenizer_bench corpus_mb=%.2f docs=%zu tokens=%lld threads_1_mb_s=%.1f threads_%d_mb_s=%.1f "
        "speedup=%.2f tokens_per_s_all=%.1fM\n",
        mb, corpus.documents().size(), static_cast<long long>(tokens), one, threads, all, all / one,
        all * 1e6 / (corpus.document_bytes() / static_cast<double>(tokens)) / 1e6);
  } catch (const gpt2::Error& e) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
    return 2;
  }
  return 0;
}
