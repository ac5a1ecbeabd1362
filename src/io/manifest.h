#pragma once
// A checkpoint's manifest.json and names (layout in docs/DESIGN.md "Checkpoint layout as built"):
// reading and writing the manifest, finding the newest complete checkpoint under a root, and
// checking every listed file's size and CRC-32C. No MPI: gpt2-ckpt uses these too.
// defines: kCheckpointFormat, CheckpointManifest, step_dir_name, step_of_dir_name, shard_file_name,
//          find_checkpoint, verify_checkpoint_files
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "optim/moment_format.h"
#include "optim/shard_update.h"
#include "optim/update_rule.h"
#include "parallel/flat_layout.h"
#include "src/base/json.h"
#include "src/model/model_config.h"

namespace gpt2 {

inline constexpr char kCheckpointFormat[] = "gpt2-checkpoint";
// 2: a shard may hold several flat ranges (`ranges`, ZeRO 2's interleaved shards). A checkpoint
// whose shards each hold one range is written as 1, which builds before 2 read too.
inline constexpr int64_t kCheckpointVersion = 2;

struct CheckpointManifest {
  struct Param {
    std::string name;
    std::vector<int64_t> shape;
    int64_t offset = 0, numel = 0;
  };
  struct Shard {
    std::string file;
    int rank = 0;
    int64_t begin = 0, end = 0;  // the first range's begin and the last range's end
    // The flat ranges its datasets hold, end to end in this order: one for a contiguous shard, one
    // per block for ZeRO 2's interleaved one (manifest key `ranges`; absent: [begin, end)).
    std::vector<parallel::FlatRange> ranges;
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
  optim::MomentFormat optimizer_moments = optim::MomentFormat::kFp32;  // which datasets the shards hold (DESIGN.md)
  // muon: the shards also hold muon_momentum (flat, fp32; absent in older checkpoints: adamw).
  optim::UpdateRule optimizer = optim::UpdateRule::kAdamW;
  // 8bit: what exp_avg_sq's codes hold: "root", sqrt(v) (Note [Second moment as its root]), or
  // "plain", v itself (checkpoints written before it, which have no such key).
  std::string exp_avg_sq_8bit = "root";
  int64_t flat_total = 0, flat_padded = 0;
  std::vector<Param> params;
  std::vector<Shard> shards;
  std::vector<File> files;
  double loss_scale = 1;
  int64_t growth_tracker = 0;
  // precision.fp8 with delayed scaling (GPT2Impl::fp8_amax_history): the histories' shape, their
  // values (fp32, exactly: JSON numbers round-trip), and the steps recorded; empty otherwise
  // (manifest key fp8_amax_history, absent then).
  std::vector<int64_t> fp8_amax_shape;
  std::vector<float> fp8_amax;
  int64_t fp8_steps = 0;
  uint64_t seed = 0;
  std::vector<std::pair<std::string, std::string>> config;  // section.key -> value

  json::Value to_json() const;
  // Throws gpt2::UserError naming `dir`/manifest.json and the key for anything missing or wrong.
  static CheckpointManifest read(const std::string& dir);
  std::string config_value(const std::string& key) const;  // "" when absent
  // The model.* sizes; gpt2::UserError naming manifest.json and the key when one is missing or not
  // an integer.
  GPT2Config model_config() const;
};

// The datasets of an optimizer shard holding the flat range [begin, end): their names, element type,
// what they are indexed by (flat elements of the range, the range's 8-bit blocks, one absmax each,
// or the range's elements with fp32 moments when the others are 8-bit, Note [Moment blocks]) and
// the ShardState tensor each holds. The one table the writer, resume and the verifier read.
struct ShardDataset {
  enum class Index { kFlat, kAbsmax, kFp32Moment };
  const char* name;
  bool is_uint8;
  Index index;
  torch::Tensor optim::ShardState::*state;
};
// A Muon run's shards also hold muon_momentum (flat).
const std::vector<ShardDataset>& shard_datasets(optim::MomentFormat moments, optim::UpdateRule rule);
// The dataset of that name; gpt2::UserError when the format has none.
const ShardDataset& shard_dataset(optim::MomentFormat moments, const std::string& name);

// "step_0000020": the directory of the checkpoint after `step` optimizer steps.
std::string step_dir_name(int64_t step);
// The step of a "step_NNNNNNN" entry name, else -1 (".tmp" directories and anything else).
int64_t step_of_dir_name(const std::string& name);
// "optim_r00001.h5": rank r's optimizer shard.
std::string shard_file_name(int rank);

// What a checkpoint root holds: step_NNNNNNN directories with manifest.json (complete) and
// without (a save or a removal that a crash cut short, or damage), unfinished step_*.tmp saves,
// and the text of `latest` ("" when absent). Each list ascending by step.
struct CheckpointRoot {
  std::vector<std::pair<int64_t, std::string>> complete, incomplete;  // (step, directory name)
  std::vector<std::string> unfinished;                                // names
  std::string latest;
  static CheckpointRoot scan(const std::string& root);
};

// The checkpoint directory a resume spec names: `dir` itself when it holds manifest.json, else the
// newest complete `dir/step_NNNNNNN/` (what `latest` names, unless a crash came between the rename
// and the pointer update); "" when there is none (nothing to resume). Warns, naming them, about
// incomplete step directories newer than the one it returns and about a `latest` that names
// another, unless `warn` is false (the ranks of a job other than rank 0, which see the same).
std::string find_checkpoint(const std::string& dir, bool warn = true);

// Checks the size and CRC-32C of manifest.files[i] for the given indices (all when empty).
// Returns one problem per bad file, "" for good ones, in index order of `which` ("" everywhere =
// all good). Problems name the file: "<dir>/<file>: checksum mismatch (manifest crc32c e3069283,
// file 0badf00d)"; an unreadable file is a problem too, never an exception.
std::vector<std::string> verify_checkpoint_files(const CheckpointManifest& m, const std::vector<size_t>& which = {});

}  // namespace gpt2
