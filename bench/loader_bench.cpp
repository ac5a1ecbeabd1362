// Token loader throughput on one CPU thread: batches/s of gpt2-124m shapes (B=32 rows of T+1 =
// 1025 tokens) read from a token file with TokenFile + BatchSampler, rows copied out of the mmap
// and widened to int64 (what the prefetcher does per batch before the host-to-device copy).
//   loader_bench [--batches N] [--B 32] [--T 1024] [TOKEN_FILE]
// Without a file, writes a temporary one of 64M random GPT-2 ids (128 MB, in the page cache after
// writing: this measures the loader, not the disk). Prints one comparable line:
//   RESULT loader_bench B=.. T=.. file_tokens=.. batches_per_s=.. tokens_per_s=.. gb_per_s_int64=..
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "data/batch_sampler.h"
#include "data/token_file.h"
#include "src/base/errors.h"
#include "src/base/files.h"

int main(int argc, char** argv) {
  using namespace gpt2::data;
  int64_t batches = 2000, B = 32, T = 1024;
  std::string path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--batches" && i + 1 < argc) {
      batches = std::atoll(argv[++i]);
    } else if (a == "--B" && i + 1 < argc) {
      B = std::atoll(argv[++i]);
    } else if (a == "--T" && i + 1 < argc) {
      T = std::atoll(argv[++i]);
    } else {
      path = a;
    }
  }
  std::string temp_dir;
  try {
    if (path.empty()) {
      temp_dir = gpt2::files::make_temp_dir("loader_bench");
      path = gpt2::files::join(temp_dir, "train.h5");
      std::vector<uint32_t> ids(size_t{64} << 20);
      std::mt19937 rng(1);
      std::uniform_int_distribution<uint32_t> dist(0, 50256);
      for (auto& id : ids) id = dist(rng);
      write_token_file(path, ids, TokenFileAttrs{});
    }
    const TokenFile file = TokenFile::open(path, 50304);
    const BatchSampler sampler(file.size(), T, 1337);
    std::vector<int64_t> batch(static_cast<size_t>(B * (T + 1)));
    int64_t checksum = 0;
    auto run = [&](int64_t first, int64_t n) {
      for (int64_t s = first; s < first + n; ++s) {
        for (int64_t r = 0; r < B; ++r) {
          file.read(sampler.window_start(s * B + r), T + 1, batch.data() + r * (T + 1));
        }
        checksum += batch[static_cast<size_t>(s % (B * (T + 1)))];
      }
    };
    run(0, std::min<int64_t>(batches, 50));  // warm-up: page faults of the first windows
    const auto t0 = std::chrono::steady_clock::now();
    run(50, batches);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double bps = batches / sec;
    std::printf(
        "RESULT loader_bench B=%lld T=%lld file_tokens=%lld batches_per_s=%.0f tokens_per_s=%.0fM "
        "gb_per_s_int64=%.2f threads=1 checksum=%lld\n",
        static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(file.size()), bps,
        bps * B * T / 1e6, bps * B * (T + 1) * 8 / 1e9, static_cast<long long>(checksum % 1000));
  } catch (const gpt2::Error& e) {
    std::fprintf(stderr, "loader_bench: %s\n", e.what());
    if (!temp_dir.empty()) gpt2::files::remove_tree(temp_dir);
    return 2;
  }
  if (!temp_dir.empty()) gpt2::files::remove_tree(temp_dir);
  return 0;
}
