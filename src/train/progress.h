#pragma once
// The progress of a run: step timing, throughput, MFU, ETA and the metric lines.
// Contract: every rank keeps the timing and calls step_done() after every step; on logging steps
// (log.every, and the last) step_done() reduces the loss over the ranks (a collective: all ranks
// reach it on the same steps) and rank 0 prints the step line and writes the metrics (metrics.h).
// Time spent outside the steps (eval, samples, saves) is excluded from the step timing.
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>

#include "parallel/rank_env.h"
#include "src/train/config.h"
#include "src/train/metrics.h"

namespace gpt2 {

// The recent speed for the ETA: wall-clock seconds per step over the last kPoints logged steps
// (pauses for eval, samples and saves included, since they recur), so a run whose speed changes
// (warm caches, another job on the node) is judged by what it does now.
class RecentRate {
 public:
  static constexpr size_t kPoints = 8;
  void add(int64_t step, double seconds);  // the wall clock (any origin) after `step`
  // Seconds per step over the window; NaN until two points.
  double seconds_per_step() const;

 private:
  std::deque<std::pair<int64_t, double>> points_;
};

class ProgressLog {
 public:
  using Clock = std::chrono::steady_clock;

  ProgressLog(const Config& cfg, const parallel::RankEnv& env, torch::Device device, int64_t num_params);

  void exclude_since(Clock::time_point t);  // the time since t was not training
  void add_data_wait(double seconds) { data_wait_ += seconds; }
  // After step `step`: on a logging step reads the loss sum (this rank's, over `accum` micro-steps)
  // and the gradient norm back (the only host synchronisation of a step), reduces, prints and
  // writes metrics, and returns the mean loss over the global batch; NaN on other steps. Throws
  // gpt2::Error when the loss is not finite.
  double step_done(int64_t step, const torch::Tensor& loss_sum, int64_t accum, const torch::Tensor& grad_norm,
                   double lr, double loss_scale);
  void val_loss(int64_t step, double loss);  // rank 0 prints and writes it

  double tokens_per_sec() const;  // over the logged steps after the first (which carries warm-up)
  double seconds() const;         // since the run started

 private:
  const parallel::RankEnv& env_;
  const int64_t max_steps_, log_every_, tokens_per_step_;
  const bool cuda_;
  const int cuda_index_;
  double flops_per_token_ = 0, peak_flops_ = 0;
  MetricsWriter metrics_;
  const Clock::time_point run_start_ = Clock::now();
  RecentRate rate_;  // the ETA's
  Clock::time_point window_start_ = Clock::now();
  int64_t window_steps_ = 0;
  double data_wait_ = 0;  // seconds the loop blocked on the prefetcher in this window
  double timed_seconds_ = 0;
  int64_t timed_steps_ = 0;
};

// "45s", "3m05s", "2h07m".
std::string format_duration(double seconds);

}  // namespace gpt2
