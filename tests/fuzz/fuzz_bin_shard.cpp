// libFuzzer target: arbitrary bytes as a .bin token shard, read in every --bin_format. Reading
// must succeed with exactly the tokens the header promises, or throw gpt2::UserError. Built by
// tests/fuzz/run.sh.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "data/bin_shard.h"
#include "src/base/errors.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = gpt2::fuzz::write_scratch(data, size, ".bin");
  using gpt2::data::BinFormat;
  for (const BinFormat format : {BinFormat::kAuto, BinFormat::kLlmc, BinFormat::kRaw}) {
    try {
      gpt2::data::BinShardReader reader(path, format, 50257);
      std::vector<int32_t> tokens;
      while (reader.read(tokens, 777) > 0) {
      }
      if (static_cast<int64_t>(tokens.size()) != reader.info().num_tokens) std::abort();
      for (const int32_t t : tokens) {
        if (t < 0 || t >= 50257) std::abort();
      }
    } catch (const gpt2::UserError&) {
    }
  }
  return 0;
}
