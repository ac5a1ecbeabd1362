#pragma once
// Helpers shared by the gpt2_data unit tests: repo paths, files, and capturing a gpt2::UserError's
// message. The self-deleting temp directory is tests/test_util.h's.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "src/base/errors.h"

namespace gpt2::data::testing {

// The repository root: GPT2_SOURCE_DIR (set by CTest) or the working directory.
inline std::string source_dir() {
  const char* env = std::getenv("GPT2_SOURCE_DIR");
  return env != nullptr && *env != '\0' ? env : ".";
}
inline std::string tokenizer_dir() { return source_dir() + "/data/tokenizer/gpt2"; }
inline std::string golden_dir() { return source_dir() + "/tests/data/golden"; }

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_file(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary);
  out << content;
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

// The message of the gpt2::UserError `fn` throws; fails the test (and returns "") otherwise.
template <typename Fn>
std::string user_error(Fn&& fn) {
  try {
    fn();
  } catch (const gpt2::UserError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected gpt2::UserError, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected gpt2::UserError, nothing thrown";
  return "";
}

}  // namespace gpt2::data::testing

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "message: " << (haystack)
