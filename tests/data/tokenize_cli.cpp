// Test driver for the Python reference tests: prints the token ids our tokenizer gives.
//   tokenize_cli TOKENIZER_DIR FILE            ids of the whole file, one line, space-separated
//   tokenize_cli TOKENIZER_DIR --batch FILE    FILE is a JSON array of strings; one line of ids each
//   tokenize_cli TOKENIZER_DIR --bench FILE N  tokenizes FILE N times, prints MB/s (one thread)
// Exit 2 with the error message on stderr for user errors (e.g. invalid UTF-8).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "data/bpe_tokenizer.h"
#include "src/base/errors.h"
#include "src/base/json.h"

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw gpt2::UserError("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void print_ids(const std::vector<int32_t>& ids, std::string& out) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ' ';
    out += std::to_string(ids[i]);
  }
  out += '\n';
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 3) {
      std::cerr << "usage: tokenize_cli TOKENIZER_DIR FILE | --batch FILE | --bench FILE N\n";
      return 2;
    }
    const auto tok = gpt2::data::Gpt2Tokenizer::load(argv[1]);
    const std::string mode = argv[2];
    std::string out;
    if (mode == "--batch" && argc == 4) {
      const std::string text = read_file(argv[3]);
      const gpt2::json::Value doc = gpt2::json::parse(text, argv[3]);
      for (const gpt2::json::Value& s : gpt2::json::as_array(doc, "batch"))
        print_ids(tok.encode(gpt2::json::as_string(s, "text")), out);
    } else if (mode == "--bench" && argc == 5) {
      const std::string text = read_file(argv[3]);
      const int reps = std::stoi(argv[4]);
      size_t tokens = 0;
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) tokens += tok.encode(text, argv[3]).size();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("%.1f MB/s (%zu bytes x %d, %zu tokens, %.3f s)\n", text.size() * reps / s / 1e6, text.size(), reps,
                  tokens, s);
      return 0;
    } else if (argc == 3) {
      print_ids(tok.encode(read_file(argv[2]), argv[2]), out);
    } else {
      std::cerr << "bad arguments\n";
      return 2;
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  } catch (const gpt2::UserError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
}
