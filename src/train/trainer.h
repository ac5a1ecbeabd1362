#pragma once
// The training job: builds the model, data and optimizer from a Config, runs the loop (eval,
// sample, micro-steps, clip, step, log) and returns what it measured. Every rank calls train();
// collectives inside happen in the same order on all ranks (Note [Collective order] in trainer.cpp).
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/rank_env.h"
#include "src/model/gpt2_model.h"
#include "src/train/config.h"

namespace gpt2 {

struct TrainResult {
  std::vector<double> losses;                          // training loss of every step (mean over the global batch)
  std::vector<std::pair<int64_t, double>> val_losses;  // (step, val loss) of every eval
  double tokens_per_sec = 0;                           // over the steps after the first (which includes warm-up)
  double peak_mem_gib = 0;
  int64_t optimizer_state_bytes = 0;  // on this rank's device
  int64_t optimizer_host_bytes = 0;   // on this rank's host (offload)
  int64_t gradient_bytes = 0;         // the gradient buffers on this rank's device (GradBuckets::bytes)
  int64_t start_step = 0;             // > 0 when the run resumed from a checkpoint
  int64_t end_step = 0;               // steps done when it stopped (max_steps, or fewer when preempted)
  bool preempted = false;             // stopped early on SIGUSR1/SIGTERM after saving a checkpoint
  std::string last_checkpoint;        // directory of the last checkpoint saved ("" = none)
  double loss_scale = 1;              // fp16's loss scale at the end (halved by every skipped step); 1 otherwise
  GPT2 model{nullptr};                // the trained model (on the training device)
};

TrainResult train(const Config& cfg, const parallel::RankEnv& env);

}  // namespace gpt2
