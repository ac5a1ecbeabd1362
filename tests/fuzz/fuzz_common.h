#pragma once
// Shared by the libFuzzer targets: the input bytes as a file. Each process writes to its own path
// under $TMPDIR (/tmp), reused for every input, so the readers under test see a real file
// (TokenFile mmaps it, HDF5 opens it by name).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace gpt2::fuzz {

inline const std::string& scratch_path(const char* suffix) {
  static const std::string path = [&] {
    const char* tmp = std::getenv("TMPDIR");
    return std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/gpt2_fuzz." + std::to_string(::getpid()) +
           suffix;
  }();
  return path;
}

// Writes the bytes to scratch_path(suffix) and returns the path.
inline const std::string& write_scratch(const uint8_t* data, size_t size, const char* suffix) {
  const std::string& path = scratch_path(suffix);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();  // the harness itself is broken: stop loudly
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

}  // namespace gpt2::fuzz
