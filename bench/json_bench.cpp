// Why src/base/json stays ours (issue: "replace it with nlohmann-json unless a measurement says
// otherwise"): parse time of GPT-2's encoder.json (50,257 members, read by every tokenizer load)
// by our parser and by nlohmann-json, whose member-order-keeping ordered_json is what our users
// of object order (manifest config table, safetensors header, inspect) would need. Built only
// where nlohmann-json is installed (Debian nlohmann-json3-dev); not a product dependency.
//   build/bin/json_bench data/tokenizer/gpt2/encoder.json
#include <nlohmann/json.hpp>

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
  const double ours = best_ms([&] { return gpt2::json::parse(text, path).as_object().size(); }, &n);
  std::printf("gpt2::json::parse (members in file order)  %9.1f ms  %zu members\n", ours, n);
  const double plain = best_ms([&] { return nlohmann::json::parse(text).size(); }, &n);
  std::printf("nlohmann::json (std::map, sorted members)  %9.1f ms  %zu members\n", plain, n);
  const double ordered = best_ms([&] { return nlohmann::ordered_json::parse(text).size(); }, &n);
  std::printf("nlohmann::ordered_json (members in order)  %9.1f ms  %zu members\n", ordered, n);
  return 0;
}
