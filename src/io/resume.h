#pragma once
// Reading checkpoints back (layout in docs/DESIGN.md "Checkpoint layout as built"). Each rank reads
// the part of the old optimizer shards that overlaps the flat range it owns now, so the world size
// and ZeRO stage may differ from the run that saved.
#include <cstdint>
#include <string>

#include "src/io/manifest.h"
#include "src/model/gpt2_model.h"

namespace gpt2 {
namespace parallel {
class RankEnv;
struct FlatLayout;
}  // namespace parallel
namespace optim {
class ShardedOptimizer;
class LossScaler;
}  // namespace optim

// Reads elements [begin, end) of the flat parameter space (end <= flat_total) from the fp32
// dataset `dataset` ("master", "exp_avg" or "exp_avg_sq") of whichever optimizer shards of `m`
// hold them, into out[0, end - begin): any world size and ZeRO stage. Throws gpt2::UserError
// naming the shard file when a range is in no shard or a file does not match the manifest.
void read_flat_range(const CheckpointManifest& m, const char* dataset, int64_t begin, int64_t end, float* out);

// Collective over env. Loads the checkpoint `checkpoint_dir` (from find_checkpoint) into the
// optimizer shards, the parameters of every rank and the loss scaler; returns its step (the next
// step to run). Verifies every file first (the ranks share the work, and all of them report the
// same named error): throws gpt2::UserError on every rank, naming the file and what is wrong, when
// any file is missing, truncated or has another checksum, or when `model` is not the one saved:
// its config's model.* keys, then each parameter's name, shape and flat offset in `layout` (the
// first that differs is named). `zero_stage` is this run's, for the log.
int64_t resume_checkpoint(const std::string& checkpoint_dir, GPT2& model, int64_t zero_stage,
                          const parallel::RankEnv& env, const parallel::FlatLayout& layout,
                          optim::ShardedOptimizer& optimizer, optim::LossScaler& scaler);

}  // namespace gpt2
