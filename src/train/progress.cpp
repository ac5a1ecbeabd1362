// Step timing and the metric lines (see progress.h).
#include "src/train/progress.h"

#include <torch/cuda.h>

#include <algorithm>
#include <cmath>

#include "src/base/errors.h"
#include "src/base/log.h"
#include "src/kernels/target_check.h"

namespace gpt2 {

ProgressLog::ProgressLog(const Config& cfg, const parallel::RankEnv& env, torch::Device device, int64_t num_params)
    : env_(env),
      max_steps_(cfg.train.max_steps),
      log_every_(cfg.log.every),
      tokens_per_step_(cfg.train.batch_tokens),
      cuda_(device.is_cuda()),
      cuda_index_(device.is_cuda() ? device.index() : -1),
      flops_per_token_(flops_per_token(cfg.model, num_params, cfg.train.seq_len)),
      peak_flops_(cfg.log.peak_tflops > 0 ? cfg.log.peak_tflops * 1e12 : (device.is_cuda() ? 989e12 : 0.0)),
      metrics_(env.is_main() ? MetricsWriter(cfg.log.metrics, cfg.log.tensorboard_dir()) : MetricsWriter()) {
  reset_peak_memory(cuda_index_);
}

void RecentRate::add(int64_t step, double seconds) {
  points_.emplace_back(step, seconds);
  if (points_.size() > kPoints) points_.pop_front();
}

double RecentRate::seconds_per_step() const {
  if (points_.size() < 2) return std::nan("");
  const auto& [s0, t0] = points_.front();
  const auto& [s1, t1] = points_.back();
  return (t1 - t0) / static_cast<double>(s1 - s0);
}

void ProgressLog::exclude_since(Clock::time_point t) { window_start_ += Clock::now() - t; }

double ProgressLog::step_done(int64_t step, const torch::Tensor& loss_sum, int64_t accum,
                              const torch::Tensor& grad_norm, double lr, double loss_scale) {
  ++window_steps_;
  const bool last_step = step == max_steps_ - 1;
  if (step % log_every_ != 0 && !last_step) return std::nan("");
  const int world = env_.world_size();
  const double local_loss = loss_sum.item<double>() / static_cast<double>(accum);
  const double step_loss = env_.all_reduce_sum(local_loss) / world;
  // The loss has just been read, so this waits for nothing more: a target id outside the vocabulary
  // that a CUDA loss noted stops this rank here by name; the others stop on the NaN loss below
  // (Note [Target check] in src/kernels/target_check.h).
  kernels::raise_noted_bad_target();
  const double norm = grad_norm.item<double>();
  if (cuda_) torch::cuda::synchronize(cuda_index_);
  const double elapsed = std::chrono::duration<double>(Clock::now() - window_start_).count();
  const double ms_per_step = 1000.0 * elapsed / static_cast<double>(window_steps_);
  const double tok_per_sec = static_cast<double>(tokens_per_step_) * window_steps_ / elapsed;
  // No peak to divide by on a CPU (log.peak_tflops unset): n/a rather than 0%.
  const double mfu = peak_flops_ > 0 ? tok_per_sec * flops_per_token_ / (peak_flops_ * world) : std::nan("");
  const double mem = peak_memory_gib(cuda_index_);
  if (step > 0) {  // step 0 carries one-time warm-up
    timed_seconds_ += elapsed;
    timed_steps_ += window_steps_;
  }
  // Between logged steps, so never over this process's first step, which carries warm-up;
  // unknown until the second logged step.
  rate_.add(step, std::chrono::duration<double>(Clock::now() - run_start_).count());
  const double per_step = rate_.seconds_per_step();
  const std::string eta =
      std::isnan(per_step) ? "--" : format_duration(per_step * static_cast<double>(max_steps_ - step - 1));
  const std::string mfu_text = std::isnan(mfu) ? "n/a" : log::format("%.1f%%", 100.0 * mfu);
  log::info(
      log::format("step %lld/%lld | loss %.4f | lr %.2e | norm %.3f | %.1f ms | %.0f tok/s | mfu %s | "
                  "mem %.2f GiB | eta %s",
                  (long long)step, (long long)max_steps_, step_loss, lr, norm, ms_per_step, tok_per_sec,
                  mfu_text.c_str(), mem, eta.c_str()));
  metrics_.write(step,
                 {{"loss", step_loss},
                  {"lr", lr},
                  {"grad_norm", norm},
                  {"tokens_per_sec", tok_per_sec},
                  {"ms_per_step", ms_per_step},
                  {"mfu", mfu},
                  {"peak_mem_gib", mem},
                  {"data_wait_frac", data_wait_ / elapsed},
                  {"loss_scale", loss_scale}},
                 {{"tokens", (step + 1) * tokens_per_step_}});
  if (!std::isfinite(step_loss)) throw Error("training loss is not finite at step " + std::to_string(step));
  window_start_ = Clock::now();
  window_steps_ = 0;
  data_wait_ = 0;
  return step_loss;
}

void ProgressLog::val_loss(int64_t step, double loss) {
  log::info(log::format("step %lld/%lld | val loss %.4f", (long long)step, (long long)max_steps_, loss));
  metrics_.write(step, {{"val_loss", loss}});
}

double ProgressLog::tokens_per_sec() const {
  return timed_steps_ > 0 ? static_cast<double>(tokens_per_step_) * timed_steps_ / timed_seconds_ : 0.0;
}

double ProgressLog::seconds() const { return std::chrono::duration<double>(Clock::now() - run_start_).count(); }

std::string format_duration(double seconds) {
  const auto s = static_cast<int64_t>(std::max(0.0, seconds));
  if (s >= 3600) return log::format("%lldh%02lldm", (long long)(s / 3600), (long long)(s % 3600 / 60));
  if (s >= 60) return log::format("%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
  return log::format("%llds", (long long)s);
}

}  // namespace gpt2
