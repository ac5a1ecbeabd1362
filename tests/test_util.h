#pragma once
// Helpers shared by every C++ test folder. Built on src/base/files.h like the code under test, so
// temp directories also work in torch-linked test binaries (see files.h for why that matters).
#include <gtest/gtest.h>

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

}  // namespace gpt2::test
