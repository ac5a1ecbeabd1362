// The training loop, top to bottom. Phases say which ranks take part.
//
// Note [Collective order]: every rank runs the same sequence of collectives (gradient reduction,
// loss and norm reductions, eval reductions) in the same order, so no rank can wait on a peer that
// took another branch. Branches that only rank 0 takes (logging, samples, metrics file) contain no
// collectives.
//
// Note [Batch layout]: optimizer step s reads global samples [s·G, (s+1)·G), G = global batch in
// sequences, numbered micro-step-major, then rank, then row (data/batch_sampler.h). N ranks with
// A micro-steps therefore see exactly what one rank with N·A micro-steps sees.
#include "src/train/trainer.h"

#include <torch/torch.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <optional>
#include <thread>

#include "data/batch_sampler.h"
#include "data/bpe_tokenizer.h"
#include "data/batch_loader.h"
#include "data/token_stream.h"
#include "data/unicode_tables.h"
#include "optim/loss_scaler.h"
#include "optim/sharded_adamw.h"
#include "optim/lr_schedule.h"
#include "parallel/communicator.h"
#include "parallel/flat_layout.h"
#include "parallel/grad_buckets.h"
#include "src/base/errors.h"
#include "src/io/checkpoint.h"
#include "src/base/log.h"
#include "src/model/generate.h"
#include "src/train/metrics.h"
#include "src/io/model_weights.h"
#include "src/train/profiler.h"

namespace gpt2 {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

torch::Device pick_device(const std::string& want, int local_rank) {
  const bool have_cuda = torch::cuda::is_available();
  if (want == "cuda" && !have_cuda) throw UserError("train.device = cuda: no CUDA device is visible");
  if (want == "cpu" || !have_cuda) return torch::Device(torch::kCPU);
  const int count = static_cast<int>(torch::cuda::device_count());
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank % count));
}

at::ScalarType dtype_named(const std::string& name) {
  return name == "bf16" ? at::kBFloat16 : name == "fp16" ? at::kHalf : at::kFloat;
}

// Host memory offload would pin on this node: all local ranks' shards. Refused with the numbers
// when it would not fit in what the machine has available (pinned pages cannot be swapped).
void check_offload_fits(int64_t bytes_per_rank, int local_ranks) {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (f == nullptr) return;
  long long available_kib = -1;
  char line[256];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "MemAvailable: %lld kB", &available_kib) == 1) break;
  }
  std::fclose(f);
  if (available_kib < 0) return;
  const double need = static_cast<double>(bytes_per_rank) * local_ranks;
  const double have = static_cast<double>(available_kib) * 1024.0;
  if (need > 0.9 * have) {
    throw UserError(log::format("parallel.offload = optimizer needs %.1f GiB of pinned host memory on this node "
                                "(%d rank(s) x %.1f GiB) but only %.1f GiB is available; use ZeRO across more "
                                "ranks (parallel.zero_stage) or more nodes",
                                need / 1073741824.0, local_ranks, bytes_per_rank / 1073741824.0, have / 1073741824.0));
  }
}

// SIGUSR1 (Slurm's warning before the time limit, forwarded by mpirun and srun) and SIGTERM
// (preemption) ask for a checkpoint at the next step boundary and a clean stop; the handler only
// sets a flag. Restored when training ends.
std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

class StopSignals {
 public:
  StopSignals() {
    g_stop_signal.store(0);
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, &old_usr1_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~StopSignals() {
    if (preempted_) {
      // Stopping for a preemption: a launcher (srun --kill-on-bad-exit, mpirun) may TERM the ranks
      // that have not exited yet once one has; dying of that would replace exit code 3 by 143.
      std::signal(SIGUSR1, SIG_IGN);
      std::signal(SIGTERM, SIG_IGN);
      return;
    }
    sigaction(SIGUSR1, &old_usr1_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  void set_preempted() { preempted_ = true; }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_usr1_ {}, old_term_ {};
  bool preempted_ = false;
};

// A rank that hangs (stopped, deadlocked, or waiting on a peer that hangs) never finishes its
// step. The watchdog ends this process when no step finished for step_timeout_s; the launcher
// (mpirun, srun --kill-on-bad-exit) then ends the others, so a hang anywhere, on CPU ranks as on
// GPUs, ends the job instead of holding the allocation. Saves and evals beat it too.
class StepWatchdog {
 public:
  explicit StepWatchdog(double timeout_s) : timeout_(timeout_s) {
    beat();
    thread_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(mutex_);
      while (!stop_) {
        cv_.wait_for(lock, std::chrono::milliseconds(500));
        const double idle = std::chrono::duration<double>(Clock::now() - Clock::time_point(Clock::duration(last_.load()))).count();
        if (!stop_ && idle > timeout_) {
          log::error(log::format("no training step finished for %.0f s (parallel.step_timeout_s): a rank died or "
                                 "hangs; ending the job", idle));
          log::flush();
          std::_Exit(kExitFailure);
        }
      }
    });
  }
  ~StepWatchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void beat() { last_.store(Clock::now().time_since_epoch().count()); }

 private:
  double timeout_;
  std::atomic<Clock::rep> last_{0};
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// Test hook: GPT2_FAULT_AT=RANK:STEP makes that rank throw at the start of that step,
// GPT2_FAULT_AT=RANK:STEP:kill kill itself with SIGKILL there, and RANK:STEP:hang sleep forever, so tests can check that one failing
// or vanished rank ends the whole job (tests/python/test_parallel_faults.py, test_checkpoint_faults.py).
struct Fault {
  int64_t step = -1;
  bool kill = false;
  bool hang = false;
};
Fault fault_for(int rank) {
  const char* spec = std::getenv("GPT2_FAULT_AT");
  if (spec == nullptr) return {};
  int fault_rank = -1;
  long long fault_step = -1;
  char mode[8] = {0};
  const int n = std::sscanf(spec, "%d:%lld:%7s", &fault_rank, &fault_step, mode);
  if (n < 2 || fault_rank != rank) return {};
  return {fault_step, n == 3 && std::string(mode) == "kill", n == 3 && std::string(mode) == "hang"};
}

std::string format_duration(double seconds) {
  const auto s = static_cast<int64_t>(std::max(0.0, seconds));
  if (s >= 3600) return log::format("%lldh%02lldm", (long long)(s / 3600), (long long)(s % 3600 / 60));
  if (s >= 60) return log::format("%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
  return log::format("%llds", (long long)s);
}

void log_settings(const Config& cfg, const parallel::RankEnv& env, torch::Device device,
                  int64_t accum, int64_t num_params) {
  log::info("gpt2-train: ", env.world_size(), " rank(s), device ", device.str(), ", ",
            num_params, " parameters (", num_params / 1e6, "M with vocab padding)");
  for (const auto& [key, value] : cfg.table()) log::info(log::format("  %-34s %s", key.c_str(), value.c_str()));
  log::info(log::format("  %-34s %lld", "(derived) grad_accum_steps", (long long)accum));
}

}  // namespace

TrainResult train(const Config& cfg, const parallel::RankEnv& env) {
  const int rank = env.rank(), world = env.world_size();
  const auto& tc = cfg.train;

  // ---- set-up (all ranks) -------------------------------------------------------------------
  const torch::Device device = pick_device(tc.device, env.local_rank());
  const int cuda_index = device.is_cuda() ? device.index() : -1;
  if (device.is_cuda()) torch::cuda::manual_seed_all(tc.seed);
  // Parameters and activations in the compute dtype; fp32 masters live in the optimizer and the
  // gradient buffer is precision.reduce_dtype. On CPU everything is fp32.
  at::ScalarType compute_dtype = at::kFloat, grad_dtype = at::kFloat;
  if (device.is_cuda()) {
    compute_dtype = dtype_named(cfg.precision.dtype);
    grad_dtype = dtype_named(cfg.precision.reduce_dtype);
  } else if (cfg.precision.dtype != "fp32") {
    log::warn("precision.dtype = ", cfg.precision.dtype, " runs as fp32 on CPU");
  }
  const int64_t accum = cfg.grad_accum_steps(world);
  const int64_t mb = tc.micro_batch, T = tc.seq_len;

  // Same seed on every rank: identical initial weights without a broadcast.
  // A checkpoint to resume (checkpoint.resume): found first, because its weights replace any
  // initial ones, so train.init_from is read only when there is none.
  std::string resume_from;
  if (cfg.checkpoint.resume != "none") {
    const bool automatic = cfg.checkpoint.resume == "auto";
    resume_from = find_checkpoint(automatic ? cfg.checkpoint.dir : cfg.checkpoint.resume);
    if (resume_from.empty() && !automatic) {
      throw UserError("config: checkpoint.resume = " + cfg.checkpoint.resume +
                      ": no checkpoint there (neither manifest.json nor latest)");
    }
  }

  GPT2 model(cfg.model);
  model->init_weights(tc.seed);
  if (!tc.init_from.empty() && resume_from.empty()) {  // fine-tuning: the weights, not the optimizer state or the step
    try {
      const WeightsSource source = find_weights(tc.init_from);
      load_weights(model, source);
      log::info("initial weights from ", source.describe());
    } catch (const UserError& e) {
      throw UserError("train.init_from = " + tc.init_from + ": " + e.what());
    }
  }
  model->set_recompute_every(cfg.checkpoint_every());  // 0 = none, 1 = every block, K = every K-th
  model->set_chunked_loss(cfg.memory.chunked_loss);
  model->set_fused_kernels(tc.fused_kernels);
  model->to(device, compute_dtype);
  const int64_t num_params = model->num_parameters(/*count_padding=*/true);
  log_settings(cfg, env, device, accum, num_params);

  std::vector<torch::Tensor> params = model->parameters();
  // Gradients live in flat buckets reduced while backward runs (parallel/grad_buckets.h); the
  // optimizer keeps AdamW state for this rank's shard of the same flat space (ZeRO 1/2) or all of
  // it (ZeRO 0), and the parameters become views into one flat buffer.
  const auto comm = parallel::make_communicator(env.comm(), device, cfg.parallel.timeout_s);
  const parallel::FlatLayout layout(params, world);
  const int64_t zero = cfg.parallel.zero_stage;
  parallel::GradBuckets buckets(params, layout, static_cast<int64_t>(cfg.parallel.bucket_mb * (1 << 20)), *comm,
                                /*shard_gradients=*/zero == 2, grad_dtype);
  optim::ShardedAdamW::Options opt_options;
  opt_options.adamw = {tc.beta1, tc.beta2, tc.eps};
  opt_options.weight_decay = tc.weight_decay;
  opt_options.sharded = zero >= 1;
  opt_options.offload = cfg.parallel.offload == "optimizer";
  opt_options.host_threads = static_cast<int>(cfg.parallel.offload_threads);
  if (opt_options.offload) {
    if (opt_options.host_threads == 0) {
      opt_options.host_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / env.local_size());
    }
    const int64_t shard = opt_options.sharded ? layout.shard_size() : layout.padded;
    check_offload_fits(optim::ShardedAdamW::host_bytes_for(shard, compute_dtype, grad_dtype), env.local_size());
  }
  optim::ShardedAdamW optimizer(params, layout, buckets.flat(), *comm, opt_options);
  log::info("data parallel: ", world, " rank(s), ", comm->backend(), ", ", buckets.num_buckets(),
            " gradient buckets of <= ", cfg.parallel.bucket_mb, " MiB, ZeRO stage ", zero, ", parameters ",
            c10::toString(compute_dtype), ", gradients ", c10::toString(grad_dtype));
  log::info(log::format("optimizer state: %.1f MiB on the device, %.1f MiB in host memory%s, on this rank "
                        "(%lld of %lld parameters)",
                        optimizer.state_bytes() / 1048576.0, optimizer.host_state_bytes() / 1048576.0,
                        opt_options.offload ? log::format(" (offload, %d CPU threads)", opt_options.host_threads).c_str() : "",
                        (long long)optimizer.shard_numel(), (long long)layout.total));
  // fp16 needs loss scaling so small gradients survive; bf16 has fp32's range and does not.
  optim::LossScaler scaler(compute_dtype == at::kHalf, device);
  const optim::WarmupCosine schedule{tc.lr, tc.min_lr, tc.warmup_steps, tc.max_steps};

  // ---- resume (all ranks): optimizer shards, parameters, loss scale; the data order needs only
  // the step (Note [Batch layout]).
  const int64_t start_step =
      resume_from.empty() ? 0 : resume_checkpoint(resume_from, cfg.model, cfg.parallel.zero_stage, env, layout, optimizer, scaler);
  if (start_step >= tc.max_steps && tc.max_steps > 0) {
    log::info("the checkpoint is at step ", start_step, " >= train.max_steps ", tc.max_steps, ": nothing to do");
  }

  // Training batch i = micro-step i % accum of step i / accum (Note [Batch layout]); prefetched.
  const auto train_stream = data::TokenStream::open(cfg.data.train, cfg.model.vocab_size, "data.train");
  const data::BatchSampler sampler(train_stream.size(), T, tc.seed);
  data::BatchLoader train_loader(
      train_stream,
      [&](int64_t i, int64_t row) {
        return sampler.window_start(data::global_sample_index(i / accum, i % accum, rank, row, mb, world, accum));
      },
      mb, T, cfg.model.vocab_size, device, static_cast<int>(cfg.data.prefetch), /*first_index=*/start_step * accum);
  // Validation: the same sequential windows at every eval, read synchronously.
  std::optional<data::TokenStream> val_stream;
  std::optional<data::BatchLoader> val_loader;
  if (!cfg.data.val.empty()) {
    val_stream.emplace(data::TokenStream::open(cfg.data.val, cfg.model.vocab_size, "data.val"));
    const int64_t val_windows = data::BatchSampler(val_stream->size(), T, 0).num_windows();
    val_loader.emplace(
        *val_stream,
        [=](int64_t e, int64_t row) {
          return data::global_sample_index(0, e, rank, row, mb, world, tc.eval_steps) % val_windows * T;
        },
        mb, T, cfg.model.vocab_size, device, /*depth=*/0);
  }
  log::info("data: train ", train_stream.describe(), " (", sampler.num_windows(), " windows/epoch)",
            val_stream ? "; val " + val_stream->describe() : "");

  std::optional<data::Gpt2Tokenizer> tokenizer;
  if (env.is_main() && tc.sample_tokens > 0) tokenizer.emplace(data::Gpt2Tokenizer::load(cfg.data.tokenizer_dir));
  MetricsWriter metrics = env.is_main() ? MetricsWriter(cfg.log.metrics, cfg.log.tensorboard_dir()) : MetricsWriter();
  const double peak_flops =
      cfg.log.peak_tflops > 0 ? cfg.log.peak_tflops * 1e12 : (device.is_cuda() ? 989e12 : 0.0);
  const double flops_tok = flops_per_token(cfg.model, num_params, T);
  const int64_t tokens_per_step = tc.batch_tokens;

  // Mean val loss over eval_steps micro-batches of every rank (all ranks; one reduction).
  auto evaluate = [&]() -> double {
    torch::NoGradGuard no_grad;
    model->eval();
    auto loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
    for (int64_t e = 0; e < tc.eval_steps; ++e) {
      const auto batch = val_loader->get(e);
      loss_sum += model->loss(batch.x, batch.y).to(torch::kFloat64);
    }
    model->train();
    return env.all_reduce_sum(loss_sum.item<double>() / tc.eval_steps) / world;
  };

  auto sample = [&](int64_t step) {
    const auto ids = sample_tokens(model, {tokenizer->eot_token()}, tc.sample_tokens, 1.0, 200, tc.seed + step);
    std::vector<int32_t> as32(ids.begin() + 1, ids.end());
    log::info("sample at step ", step, ":\n", data::unicode::to_valid_utf8(tokenizer->decode(as32)));
  };

  TrainResult result;
  auto loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  torch::Tensor grad_norm;
  auto window_start = Clock::now();
  const auto run_start = Clock::now();
  int64_t window_steps = 0;
  double data_wait = 0;  // seconds the loop blocked on the prefetcher in this logging window
  double timed_seconds = 0;
  int64_t timed_steps = 0;
  reset_peak_memory(cuda_index);
  const Fault fault = fault_for(rank);
  StopSignals stop_signals;
  result.start_step = start_step;
  const bool saving = cfg.checkpoint.every > 0;
  CheckpointWriter checkpoints({cfg.checkpoint.dir, cfg.checkpoint.keep, cfg.parallel.zero_stage, cfg.parallel.offload,
                                cfg.precision.dtype, tc.seed, cfg.table()},
                               env);
  auto save_taken = Clock::now();
  StepProfiler profiler(cfg.profile.steps, cfg.profile.dir, start_step, rank, device.is_cuda());
  StepWatchdog watchdog(cfg.parallel.step_timeout_s);

  for (int64_t step = start_step; step < tc.max_steps; ++step) {
    watchdog.beat();
    const bool last_step = step == tc.max_steps - 1;
    if (step == fault.step && fault.kill) std::raise(SIGKILL);
    while (step == fault.step && fault.hang) std::this_thread::sleep_for(std::chrono::seconds(1));
    if (step == fault.step) throw Error("injected fault (GPT2_FAULT_AT) at step " + std::to_string(step));

    // ---- eval (all ranks: one reduction) ------------------------------------------------------
    const auto pause_start = Clock::now();  // eval and sample time stays out of the step timing
    if (val_loader && ((tc.eval_every > 0 && step % tc.eval_every == 0) || last_step)) {
      const double val_loss = evaluate();
      watchdog.beat();
      result.val_losses.emplace_back(step, val_loss);
      log::info(log::format("step %lld/%lld | val loss %.4f", (long long)step, (long long)tc.max_steps, val_loss));
      metrics.write(step, {{"val_loss", val_loss}});
    }

    // ---- sample (rank 0 only; no collectives) -------------------------------------------------
    if (tokenizer && tc.sample_every > 0 && step > 0 && step % tc.sample_every == 0) sample(step);
    window_start += Clock::now() - pause_start;

    // ---- micro-steps: forward + backward (all ranks) -------------------------------------------
    // Only the last micro-step's backward reduces: buckets are all-reduced as they fill.
    profiler.step_begin(step);
    for (int64_t micro = 0; micro < accum; ++micro) {
      buckets.prepare_backward(/*reduce=*/micro == accum - 1);
      data::DeviceBatch batch;
      {
        Phase phase("data");
        batch = train_loader.next();
      }
      data_wait += batch.wait_seconds;
      torch::Tensor loss;
      {
        Phase phase("forward");
        loss = model->loss(batch.x, batch.y);  // (,) fp32, mean over this micro-batch
      }
      {
        Phase phase("backward");
        // Scale so the accumulated gradient is the mean over the global batch.
        scaler.scale_loss(loss / static_cast<double>(accum * world)).backward();
      }
      loss_sum += loss.detach();
    }

    // ---- gradient reduction (all ranks): launch the buckets backward left, wait for all ----------
    {
      Phase phase("reduce_wait");
      buckets.finish();
    }

    // ---- clip and step (all ranks) ------------------------------------------------------------
    // fp16: unscale, and skip the step on every rank if any rank saw inf/NaN (no host sync).
    const double lr = schedule.at(step);
    {
      Phase phase("optimizer");
      const auto found_inf =
          scaler.unscale_and_check(optimizer.grad_shard(), optimizer.sharded() ? comm.get() : nullptr);
      grad_norm = optimizer.clip_grad_norm(tc.grad_clip);
      optimizer.step(lr, scaler.enabled() ? found_inf : torch::Tensor());
      scaler.update(found_inf);
      optimizer.gather();  // ZeRO 1/2: every rank gets the updated shards of the others
      buckets.zero();
    }
    profiler.step_end(step);

    // ---- log (reduction on all ranks, printing on rank 0) --------------------------------------
    ++window_steps;
    const bool log_now = step % cfg.log.every == 0 || last_step;
    if (log_now) {
      // The only host synchronisation of a step: reading the loss and norm back.
      const double local_loss = loss_sum.item<double>() / static_cast<double>(accum);
      const double step_loss = env.all_reduce_sum(local_loss) / world;
      const double norm = grad_norm.item<double>();
      if (device.is_cuda()) torch::cuda::synchronize(cuda_index);
      const double elapsed = seconds_since(window_start);
      const double ms_per_step = 1000.0 * elapsed / static_cast<double>(window_steps);
      const double tok_per_sec = static_cast<double>(tokens_per_step) * window_steps / elapsed;
      const double mfu = peak_flops > 0 ? tok_per_sec * flops_tok / (peak_flops * world) : 0.0;
      const double mem = peak_memory_gib(cuda_index);
      if (step > 0) {  // step 0 carries one-time warm-up
        timed_seconds += elapsed;
        timed_steps += window_steps;
      }
      // Over the steps this process ran (a resumed run starts counting at its first step).
      const double eta = seconds_since(run_start) / static_cast<double>(step + 1 - start_step) * (tc.max_steps - step - 1);
      log::info(log::format("step %lld/%lld | loss %.4f | lr %.2e | norm %.3f | %.1f ms | %.0f tok/s | mfu %.1f%% | mem %.2f GiB | eta %s",
                            (long long)step, (long long)tc.max_steps, step_loss, lr, norm, ms_per_step,
                            tok_per_sec, 100.0 * mfu, mem, format_duration(eta).c_str()));
      metrics.write(step,
                    {{"loss", step_loss},
                     {"lr", lr},
                     {"grad_norm", norm},
                     {"tokens_per_sec", tok_per_sec},
                     {"ms_per_step", ms_per_step},
                     {"mfu", mfu},
                     {"peak_mem_gib", mem},
                     {"data_wait_frac", data_wait / elapsed},
                     {"loss_scale", scaler.enabled() ? scaler.scale() : 1.0}},
                    {{"tokens", (step + 1) * tokens_per_step}});
      if (!std::isfinite(step_loss)) throw Error("training loss is not finite at step " + std::to_string(step));
      result.losses.resize(step + 1, std::nan(""));
      result.losses[step] = step_loss;
      window_start = Clock::now();
      window_steps = 0;
      data_wait = 0;
    }
    loss_sum.zero_();

    // ---- checkpoint (all ranks) -------------------------------------------------------------
    // A stop signal on any rank stops every rank after this step (one small reduction a step).
    int stop = g_stop_signal.load();
    MPI_Allreduce(MPI_IN_PLACE, &stop, 1, MPI_INT, MPI_MAX, env.comm());
    if (checkpoints.pending()) {  // a background save finishes once every rank wrote its files
      const std::string done = checkpoints.poll();
      if (!done.empty()) {
        result.last_checkpoint = done;
        log::info(log::format("checkpoint %s complete, %.1f s after it was taken", done.c_str(), seconds_since(save_taken)));
      }
    }
    const bool due = saving && ((step + 1) % cfg.checkpoint.every == 0 || last_step);
    if (due || stop != 0) {
      const auto save_start = Clock::now();
      // A stop or the end of the run waits for the files; otherwise they may go in the background.
      const bool async = cfg.checkpoint.async && stop == 0 && !last_step;
      watchdog.beat();
      const std::string done = checkpoints.save(step + 1, model, layout, optimizer, scaler, async);
      watchdog.beat();
      if (!done.empty()) result.last_checkpoint = done;
      save_taken = save_start;
      log::info(log::format("checkpoint of step %lld: training paused %.2f s%s", (long long)(step + 1),
                            seconds_since(save_start), async ? " (files are written in the background)" : ""));
      window_start += Clock::now() - save_start;
    }
    if (stop != 0) {
      log::warn("preempted by signal ", stop, " after step ", step, ": saved ", result.last_checkpoint,
                "; exiting with code ", kExitPreempted, " so the job can be requeued");
      result.preempted = true;
      stop_signals.set_preempted();
      break;
    }
  }

  if (checkpoints.pending()) result.last_checkpoint = checkpoints.wait();

  // ---- summary (rank 0 prints) ------------------------------------------------------------------
  result.tokens_per_sec = timed_steps > 0 ? static_cast<double>(tokens_per_step) * timed_steps / timed_seconds : 0.0;
  result.peak_mem_gib = peak_memory_gib(cuda_index);
  result.optimizer_state_bytes = optimizer.state_bytes();
  result.optimizer_host_bytes = optimizer.host_state_bytes();
  if (tokenizer && !result.preempted) sample(tc.max_steps);
  const std::string val_text =
      result.val_losses.empty() ? "" : log::format(" | val loss %.4f -> %.4f", result.val_losses.front().second,
                                                   result.val_losses.back().second);
  const int64_t steps_run = result.losses.empty() ? start_step : static_cast<int64_t>(result.losses.size());
  const std::string loss_text = result.losses.empty() ? "" : log::format(" | loss %.4f", result.losses.back());
  log::info(log::format("%s: steps %lld-%lld of %lld in %s%s | %.0f tok/s | peak mem %.2f GiB",
                        result.preempted ? "stopped (preempted)" : "done", (long long)start_step,
                        (long long)steps_run - 1, (long long)tc.max_steps, format_duration(seconds_since(run_start)).c_str(),
                        loss_text.c_str(), result.tokens_per_sec, result.peak_mem_gib) + val_text);
  result.model = model;
  return result;
}

}  // namespace gpt2
