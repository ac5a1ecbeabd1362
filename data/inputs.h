#pragma once
// gpt2-data's INPUT arguments -> files to read, in order: a file; a directory (recursive, sorted;
// hidden entries and symlinks skipped, *.dat skipped with a reason); or, when no such path exists
// and it holds * ? [, a glob(3) pattern (sorted; matched directories walked). Kind by extension:
// .jsonl, .bin, else text. A file reached twice is read once. A missing path or a pattern matching
// nothing is a gpt2::UserError naming it.
#include <cstdint>
#include <string>
#include <vector>

namespace gpt2::data {

enum class InputKind { kText, kJsonLines, kTokenShard };
InputKind input_kind(const std::string& path);  // by extension

struct InputFile {
  std::string path;
  InputKind kind = InputKind::kText;
  // Named on the command line (not found by walking a directory or matching a pattern): a named
  // text file that is not UTF-8 is an error, a found one is skipped with a warning.
  bool named = false;
  int64_t bytes = 0;  // size when listed (progress and ETA)
};

struct SkippedFile {
  std::string path;
  std::string reason;  // kSkippedDat, or "not UTF-8 text (byte offset N)", ...
};
inline constexpr char kSkippedDat[] = "a *.dat file (e.g. a fortune index)";

struct ExpandedInputs {
  std::vector<InputFile> files;
  std::vector<SkippedFile> skipped;
};

// True when `arg` has glob(3) metacharacters (* ? [).
bool has_glob_chars(const std::string& arg);

ExpandedInputs expand_inputs(const std::vector<std::string>& inputs);

}  // namespace gpt2::data
