// libFuzzer target: arbitrary bytes as JSON (gpt2::json::parse) and as one JSON line of a corpus
// (data/jsonl.h). Parsing must succeed or throw gpt2::UserError; a parsed value must survive
// dump -> parse -> dump unchanged. Built by tests/fuzz/run.sh.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "data/jsonl.h"
#include "src/base/errors.h"
#include "src/base/json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const gpt2::json::Value v = gpt2::json::parse(text, "fuzz");
    const std::string once = gpt2::json::dump(v);
    const std::string twice = gpt2::json::dump(gpt2::json::parse(once, "fuzz-dump"));
    if (once != twice) std::abort();  // dump is not a fixed point: a writer/parser mismatch
  } catch (const gpt2::UserError&) {
  }
  try {
    (void)gpt2::data::jsonl_document(text, "fuzz.jsonl:1");
  } catch (const gpt2::UserError&) {
  }
  return 0;
}
