#pragma once
// Sharded checkpoints (layout in docs/DESIGN.md "Checkpoint layout"). save_checkpoint() is
// collective: every rank writes its optimizer shard into `step_NNNNNNN.tmp/`, rank 0 writes the
// model and, once every file is on disk with its size and CRC-32C, the manifest; then the
// directory is renamed and `latest` replaced, so a crash at any point leaves `latest` on the last
// complete checkpoint. resume_checkpoint() is collective too: it verifies every file (the ranks
// share the work, and all of them report the same named error), then each rank reads the part of
// the old shards that overlaps the range it owns now, so the world size and ZeRO stage may differ
// from the run that saved. Manifest reading and verification need no MPI (gpt2-ckpt uses them).
#include <cstdint>
#include <string>
#include <vector>

#include "src/base/json.h"

namespace gpt2 {
struct Config;
class GPT2;
namespace parallel {
class RankEnv;
struct FlatLayout;
}  // namespace parallel
namespace optim {
class ShardedAdamW;
class LossScaler;
}  // namespace optim

inline constexpr char kCheckpointFormat[] = "gpt2-checkpoint";
inline constexpr int64_t kCheckpointVersion = 1;

struct CheckpointManifest {
  struct Param {
    std::string name;
    std::vector<int64_t> shape;
    int64_t offset = 0, numel = 0;
  };
  struct Shard {
    std::string file;
    int rank = 0;
    int64_t begin = 0, end = 0;
  };
  struct File {
    std::string name;
    uint64_t bytes = 0;
    std::string crc32c;  // 8 hex digits
  };
  std::string dir;  // where it was read from
  int64_t step = 0;
  int world_size = 1;
  int64_t zero_stage = 0;
  std::string offload, dtype;
  int64_t flat_total = 0, flat_padded = 0;
  std::vector<Param> params;
  std::vector<Shard> shards;
  std::vector<File> files;
  double loss_scale = 1;
  int64_t growth_tracker = 0;
  uint64_t seed = 0;
  std::vector<std::pair<std::string, std::string>> config;  // section.key -> value

  json::Value to_json() const;
  // Throws gpt2::UserError naming `dir`/manifest.json and the key for anything missing or wrong.
  static CheckpointManifest read(const std::string& dir);
  std::string config_value(const std::string& key) const;  // "" when absent
};

// The checkpoint directory a resume spec names: `dir` itself when it holds manifest.json, else the
// newest complete `dir/step_NNNNNNN/` (what `latest` names, unless a crash came between the rename
// and the pointer update); "" when there is none (nothing to resume).
std::string find_checkpoint(const std::string& dir);

// Checks the size and CRC-32C of manifest.files[i] for the given indices (all when empty).
// Returns one problem per bad file, "" for good ones, in index order of `which` ("" everywhere =
// all good). Problems name the file: "<dir>/<file>: checksum mismatch (manifest e3069283, file ...)".
std::vector<std::string> verify_checkpoint_files(const CheckpointManifest& m, const std::vector<size_t>& which = {});

// Collective over env. Saves the state after `step` optimizer steps under cfg.checkpoint.dir and
// keeps the newest cfg.checkpoint.keep. Returns the directory written (skips, returning it, when
// that step is already saved: the state is a deterministic function of the step).
std::string save_checkpoint(int64_t step, const Config& cfg, const parallel::RankEnv& env, GPT2& model,
                            const parallel::FlatLayout& layout, optim::ShardedAdamW& optimizer,
                            const optim::LossScaler& scaler);

// Collective over env. Loads the checkpoint `checkpoint_dir` (from find_checkpoint) into the
// optimizer shards, the parameters of every rank and the loss scaler; returns its step (the next
// step to run). Throws gpt2::UserError on every rank, naming the file and what is wrong, when any
// file is missing, truncated or has another checksum, or when the model does not match.
int64_t resume_checkpoint(const std::string& checkpoint_dir, const Config& cfg, const parallel::RankEnv& env,
                          const parallel::FlatLayout& layout, optim::ShardedAdamW& optimizer,
                          optim::LossScaler& scaler);

}  // namespace gpt2
