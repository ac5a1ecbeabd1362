// Parse time of GPT-2's encoder.json (50,257 members, read by every tokenizer load) through
// src/base/json (nlohmann::json, members sorted by key) and through nlohmann::ordered_json (members
// in file order), which is why src/base/json uses the former: ordered_json's insertion is linear
// per member. bench/results/2026-12-02-json-cpu.log has the numbers, with the hand-written
// parser this replaced.
//   build/bin/json_bench data/tokenizer/gpt2/encoder.json
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>

#include "src/base/files.h"
#include "src/base/json.h"

namespace {

double best_ms(const std::function<size_t()>& parse, size_t* members) {
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    *members = parse();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "data/tokenizer/gpt2/encoder.json";
  const std::string text = gpt2::files::read_file(path);
  size_t n = 0;
  const double ours = best_ms([&] { return gpt2::json::parse(text, path).size(); }, &n);
  std::printf("gpt2::json::parse (nlohmann::json, sorted)  %9.1f ms  %zu members\n", ours, n);
  const double ordered = best_ms([&] { return nlohmann::ordered_json::parse(text).size(); }, &n);
  std::printf("nlohmann::ordered_json (members in order)   %9.1f ms  %zu members\n", ordered, n);
  return 0;
}
