#pragma once
// Sharded checkpoints (layout in docs/DESIGN.md "Checkpoint layout"). CheckpointWriter::save() is
// collective: every rank writes its optimizer shard into `step_NNNNNNN.tmp/`, rank 0 writes the
// model and, once every file is on disk with its size and CRC-32C, the manifest; then the
// directory is renamed and `latest` replaced, so a crash at any point leaves `latest` on the last
// complete checkpoint. resume_checkpoint() is collective too: it verifies every file (the ranks
// share the work, and all of them report the same named error), then each rank reads the part of
// the old shards that overlaps the range it owns now, so the world size and ZeRO stage may differ
// from the run that saved. Manifest reading and verification need no MPI (gpt2-ckpt uses them).
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "src/base/json.h"
#include "src/model/model_config.h"

namespace gpt2 {
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
  // The model.* sizes; gpt2::UserError naming manifest.json and the key when one is missing or not
  // an integer.
  GPT2Config model_config() const;
};

// The checkpoint directory a resume spec names: `dir` itself when it holds manifest.json, else the
// newest complete `dir/step_NNNNNNN/` (what `latest` names, unless a crash came between the rename
// and the pointer update); "" when there is none (nothing to resume).
std::string find_checkpoint(const std::string& dir);

// Checks the size and CRC-32C of manifest.files[i] for the given indices (all when empty).
// Returns one problem per bad file, "" for good ones, in index order of `which` ("" everywhere =
// all good). Problems name the file: "<dir>/<file>: checksum mismatch (manifest crc32c e3069283,
// file 0badf00d)"; an unreadable file is a problem too, never an exception.
std::vector<std::string> verify_checkpoint_files(const CheckpointManifest& m, const std::vector<size_t>& which = {});

// What a save records besides the tensors, and where it goes (the trainer fills it from its config).
struct CheckpointSettings {
  std::string dir;           // checkpoint root: step_NNNNNNN/ directories and `latest`
  int64_t keep = 3;          // complete checkpoints kept, newest first
  int64_t zero_stage = 0;    // recorded in the manifest
  std::string offload = "none";
  std::string dtype = "fp32";  // parameter dtype on CUDA (CPU runs record fp32)
  uint64_t seed = 0;
  std::vector<std::pair<std::string, std::string>> config;  // the resolved section.key -> value table
};

// Writes checkpoints (collective over env). save() snapshots the state after `step` optimizer
// steps to host memory and writes it under settings.dir, keeping the newest
// settings.keep; with async the files are written on a background thread while training
// goes on, and poll() (every step, all ranks) finishes the save (manifest, rename, latest) once
// every rank has written its files. Saving a step that is already saved does nothing (the state
// is a deterministic function of the step). A crash at any point leaves the last complete
// checkpoint what a resume finds.
class CheckpointWriter {
 public:
  CheckpointWriter(CheckpointSettings settings, const parallel::RankEnv& env);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Returns the directory when the save finished here (sync, or the step was saved already).
  std::string save(int64_t step, GPT2& model, const parallel::FlatLayout& layout, optim::ShardedAdamW& optimizer,
                   const optim::LossScaler& scaler, bool async);
  // Finishes a background save when every rank is done writing; its directory, else "".
  std::string poll();
  // Waits for a background save and finishes it; its directory, or "" when none was pending.
  std::string wait();
  bool pending() const { return pending_ != nullptr; }

 private:
  struct Snapshot;
  void write_files(Snapshot& snap);
  std::string finish();

  const CheckpointSettings settings_;
  const parallel::RankEnv& env_;
  std::unique_ptr<Snapshot> pending_;
  std::thread thread_;
  std::atomic<bool> written_{false};
  std::string error_;  // from the writing thread, rethrown by finish()
};

// Reads elements [begin, end) of the flat parameter space (end <= flat_total) from the fp32
// dataset `dataset` ("master", "exp_avg" or "exp_avg_sq") of whichever optimizer shards of `m`
// hold them, into out[0, end - begin): any world size and ZeRO stage. Throws gpt2::UserError
// naming the shard file when a range is in no shard or a file does not match the manifest.
void read_flat_range(const CheckpointManifest& m, const char* dataset, int64_t begin, int64_t end, float* out);

// Collective over env. Loads the checkpoint `checkpoint_dir` (from find_checkpoint) into the
// optimizer shards, the parameters of every rank and the loss scaler; returns its step (the next
// step to run). Throws gpt2::UserError on every rank, naming the file and what is wrong, when any
// file is missing, truncated or has another checksum, or when `model` (the config's model.* keys)
// is not the one saved. `zero_stage` is this run's, for the log.
int64_t resume_checkpoint(const std::string& checkpoint_dir, const GPT2Config& model, int64_t zero_stage,
                          const parallel::RankEnv& env,
                          const parallel::FlatLayout& layout, optim::ShardedAdamW& optimizer,
                          optim::LossScaler& scaler);

}  // namespace gpt2
