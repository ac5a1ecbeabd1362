#pragma once
// gpt2-ckpt's logic, without MPI (the tool never calls MPI_Init): find a checkpoint, describe it,
// verify it deeply, consolidate its sharded fp32 masters into one model file (model_file.h),
// move weights to and from Hugging Face directories (export-hf, import-hf), and export ONNX graphs
// (export-onnx, src/deploy/onnx_export.h).
// Layout: docs/DESIGN.md "Checkpoint layout as built"; manifest reading: src/io/manifest.h.
// Exit codes (src/base/errors.h): kExitOk; kExitFailure when the checkpoint is damaged (every
// problem printed, one per line, naming the file); kExitUsage for usage errors, a path that is
// no checkpoint, or an output that cannot be written.
// defines: gpt2::ckpt::{resolve_checkpoint, read_manifest, Damaged, human_bytes, inspect_text,
//          inspect_json, consolidate_checkpoint, run_tool}; the checks of `verify` are
//          src/io/checkpoint_verify.h
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "src/base/errors.h"
#include "src/io/manifest.h"

namespace gpt2::ckpt {

// A checkpoint whose files or manifest are wrong: what() is the first problem, problems all of them.
class Damaged : public Error {
 public:
  explicit Damaged(std::vector<std::string> problems);
  const std::vector<std::string>& problems() const { return problems_; }

 private:
  std::vector<std::string> problems_;
};

// PATH is a checkpoint directory (holds manifest.json) or a checkpoint root (the newest complete
// step_* directory under it, find_checkpoint()). Throws UserError naming PATH when it is neither.
std::string resolve_checkpoint(const std::string& path);

// CheckpointManifest::read(dir); a manifest that exists but cannot be read is damage (Damaged).
CheckpointManifest read_manifest(const std::string& dir);

// 1536 -> "1.5 KiB"; below 1 KiB "N B".
std::string human_bytes(uint64_t bytes);

// The human summary `gpt2-ckpt inspect` prints (lines "step: 5", "world size: 2", ...).
std::string inspect_text(const CheckpointManifest& m);
// The manifest as indented JSON (what `inspect --json` prints), newline-terminated.
std::string inspect_json(const CheckpointManifest& m);

// Writes `out` durably (via out.tmp): a model file (src/io/model_file.h) with one fp32 dataset per
// manifest parameter, named and shaped as in the manifest, assembled from the shards' `master`
// datasets; source = the checkpoint directory. Throws Damaged (nothing written)
// when verify_checkpoint() finds problems, UserError naming `out` when it cannot be written.
// Returns the number of parameters (elements) written.
int64_t consolidate_checkpoint(const CheckpointManifest& m, const std::string& out);

// The whole command line (argv[1..]): prints to out/err and returns the exit code.
int run_tool(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace gpt2::ckpt
