// libFuzzer target: arbitrary bytes as a token file. TokenFile::open, then validate_ids and read
// every token, must either succeed or throw gpt2::Error (a UserError naming the file); anything
// else (a crash, a sanitizer report, another exception) is a finding. Built by tests/fuzz/run.sh.
#include <cstdint>
#include <vector>

#include "data/token_file.h"
#include "src/base/errors.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = gpt2::fuzz::write_scratch(data, size, ".h5");
  try {
    const gpt2::data::TokenFile file = gpt2::data::TokenFile::open(path);
    file.validate_ids();
    std::vector<int64_t> buf(4096);
    for (int64_t start = 0; start < file.size(); start += 4096) {
      file.read(start, std::min<int64_t>(4096, file.size() - start), buf.data());
    }
  } catch (const gpt2::Error&) {
    // expected for malformed input
  }
  return 0;
}
