#pragma once
// Helpers shared by every C++ test folder: temp directories, repo paths, files, and capturing a
// gpt2::UserError's message. Built on src/base/files.h like the code under test, so
// temp directories also work in torch-linked test binaries (see files.h for why that matters).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "src/base/errors.h"
#include "src/base/files.h"

// gpt2::test, not gpt2::testing: that name would hide gtest's ::testing inside namespace gpt2.
namespace gpt2::test {

// A fresh directory under $TMPDIR, removed with everything in it when the object goes.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "gpt2_test") : path_(files::make_temp_dir(prefix)) {}
  ~TempDir() {
    try {
      files::remove_tree(path_);
    } catch (const gpt2::UserError& e) {
      ADD_FAILURE() << "cannot remove temp dir: " << e.what();  // a destructor must not throw
    }
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // The path of `name` inside the directory (nothing is created).
  std::string file(const std::string& name) const { return files::join(path_, name); }

 private:
  std::string path_;
};

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

// The message of the UserError `fn` throws; fails the test (and returns "") otherwise.
template <typename Fn>
std::string user_error(Fn&& fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected UserError, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected UserError, nothing thrown";
  return "";
}

}  // namespace gpt2::test

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "message: " << (haystack)
