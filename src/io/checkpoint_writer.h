#pragma once
// Saving sharded checkpoints (layout in docs/DESIGN.md "Checkpoint layout as built").
// CheckpointWriter::save() is collective: every rank writes its optimizer shard into
// `step_NNNNNNN.tmp/` (the fp32 masters of its range are the model: there is no model file), and
// once every shard is on disk with its size and CRC-32C rank 0 writes the manifest; then the
// directory is renamed and `latest` replaced, each durably (files.h Note [Durable write]), so a
// crash at any point leaves `latest` on the last complete checkpoint. Test hooks:
// GPT2_CKPT_FAULT=RANK:POINT[:STEP] kills that rank with SIGKILL at save point POINT (1..10, marked
// in checkpoint_writer.cpp) of every save, or only of the save of STEP
// (tests/python/test_checkpoint_faults.py); GPT2_CKPT_HOLD=N holds an async save's writing thread
// until N more poll()s (steps) have run on this rank, or until wait(), so a test can change the
// state under a save deterministically (tests/io/checkpoint_test.cpp).
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace gpt2 {
class GPT2;
namespace parallel {
class RankEnv;
struct FlatLayout;
}  // namespace parallel
namespace optim {
class ShardedOptimizer;
class LossScaler;
}  // namespace optim

// What a save records besides the tensors, and where it goes (the trainer fills it from its config).
struct CheckpointSettings {
  std::string dir;         // checkpoint root: step_NNNNNNN/ directories and `latest`
  int64_t keep = 3;        // complete checkpoints kept, newest first
  int64_t zero_stage = 0;  // recorded in the manifest
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
  std::string save(int64_t step, GPT2& model, const parallel::FlatLayout& layout, optim::ShardedOptimizer& optimizer,
                   const optim::LossScaler& scaler, bool async);
  // Finishes a background save when every rank is done writing; its directory, else "".
  std::string poll();
  // Waits for a background save and finishes it; its directory, or "" when none was pending.
  std::string wait();
  bool pending() const { return pending_ != nullptr; }

 private:
  struct Snapshot;
  void write_files(Snapshot& snap);  // the shard, and on failure a UserError naming it and the OS error
  void write_shard(Snapshot& snap, const std::string& shard_path);
  std::string finish();
  void release_hold();

  const CheckpointSettings settings_;
  const parallel::RankEnv& env_;
  std::unique_ptr<Snapshot> pending_;
  std::thread thread_;
  std::atomic<bool> written_{false};
  std::string error_;  // from the writing thread, rethrown by finish()
  // Test hook GPT2_CKPT_HOLD: the writing thread waits until polls_ >= hold_ or released_.
  std::mutex hold_mutex_;
  std::condition_variable hold_cv_;
  int64_t hold_ = 0, polls_ = 0;
  bool released_ = true;
};

}  // namespace gpt2
