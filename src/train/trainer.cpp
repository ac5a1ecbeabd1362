// The training job: set-up functions named for what they build, then train(), which reads top to
// bottom in phases that say which ranks take part.
//
// Note [Collective order]: every rank runs the same sequence of collectives (gradient reduction,
// loss and norm reductions, eval reductions, the stop-flag reduction, checkpoint saves) in the same
// order, so no rank can wait on a peer that took another branch. Branches that only rank 0 takes
// (logging, samples, metrics file) contain no collectives.
//
// Note [Rank-0 work]: a collective's timeout (parallel.timeout_s) counts from its enqueue on each
// rank, so a rank that reaches a device collective while rank 0 alone samples, writes metrics or
// a checkpoint's extra files would take rank 0 for dead once that work outlasts the timeout. After
// each such section the ranks meet on the host (env.barrier(): MPI, no timeout; the step watchdog,
// parallel.step_timeout_s, still ends a real hang) before the next device collective, and only
// where that work happened. The step line and metrics that progress.step_done() writes are
// followed by the stop-flag reduction of every step, which is such a meeting already.
//
// Note [Batch layout]: optimizer step s reads global samples [s·G, (s+1)·G), G = global batch in
// sequences, numbered micro-step-major, then rank, then row (data/batch_sampler.h). N ranks with
// A micro-steps therefore see exactly what one rank with N·A micro-steps sees.
#include "src/train/trainer.h"

#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <thread>

#include "data/batch_loader.h"
#include "data/batch_sampler.h"
#include "data/bpe_tokenizer.h"
#include "data/token_stream.h"
#include "data/unicode_tables.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/sharded_optimizer.h"
#include "parallel/communicator.h"
#include "parallel/flat_layout.h"
#include "parallel/grad_buckets.h"
#include "src/base/clock.h"
#include "src/base/errors.h"
#include "src/base/files.h"
#include "src/base/log.h"
#include "src/io/checkpoint.h"
#include "src/io/model_weights.h"
#include "src/kernels/dtype.h"
#include "src/kernels/fp8_gemm.h"
#include "src/kernels/gemm.h"
#include "src/model/generate.h"
#include "src/train/fault_injection.h"
#include "src/train/memory_estimate.h"
#include "src/train/profiler.h"
#include "src/train/progress.h"
#include "src/train/run_guard.h"

namespace gpt2 {
namespace {

using Clock = std::chrono::steady_clock;

torch::Device pick_device(DeviceChoice want, int local_rank) {
  const bool have_cuda = torch::cuda::is_available();
  if (want == DeviceChoice::kCuda && !have_cuda) throw UserError("train.device = cuda: no CUDA device is visible");
  if (want == DeviceChoice::kCpu || !have_cuda) return torch::Device(torch::kCPU);
  const int count = static_cast<int>(torch::cuda::device_count());
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank % count));
}

// What precision.fp8 needs that this run lacks ("" when FP8 can run): a GPU with FP8 tensor cores,
// then bf16. auto is off for the same reasons that make an explicit true an error.
std::string fp8_missing(torch::Device device, DtypeChoice dtype) {
  if (!device.is_cuda() || !kernels::fp8_supported(device)) {
    return "needs a CUDA GPU with FP8 tensor cores (compute capability 8.9 or newer); this run trains on " +
           device.str();
  }
  if (dtype != DtypeChoice::kBf16) {
    return std::string("needs precision.dtype = bf16 (the FP8 GEMMs write bf16), not ") + choice_name(dtype);
  }
  return "";
}

// precision.dtype = auto made concrete for the device (Note [bf16 on CPU] in src/kernels/dtype.h);
// an explicit bf16 on a CPU without fast bf16 GEMMs is kept, with a warning (from rank 0: every rank
// decides alike) that says what it costs. precision.fp8 = auto then becomes true where FP8 can run,
// false elsewhere (fp8_missing says why); an explicit true is checked in build_model.
Config with_precision_for(const Config& requested, torch::Device device, bool warn) {
  Config cfg = requested;
  PrecisionConfig& p = cfg.precision;
  const bool bf16_fast = device.is_cuda() || kernels::cpu_has_fast_bf16_gemm();
  if (p.dtype == DtypeChoice::kAuto) {
    p.dtype = bf16_fast ? DtypeChoice::kBf16 : DtypeChoice::kFp32;
  } else if (p.dtype == DtypeChoice::kBf16 && !bf16_fast && warn) {
    log::warn(
        "precision.dtype = bf16 on a CPU without fast bf16 GEMMs: LibTorch multiplies bf16 in a portable "
        "loop here (configs/tiny.ini: 61 s a step in bf16 against 1.0 s in fp32 on an AVX2 CPU); "
        "precision.dtype = auto picks fp32 on such a CPU");
  }
  if (p.fp8 == Fp8Choice::kAuto) {
    const std::string missing = fp8_missing(device, p.dtype);
    p.fp8 = missing.empty() ? Fp8Choice::kTrue : Fp8Choice::kFalse;
    if (warn && !missing.empty()) log::info("precision.fp8 = auto: off (it ", missing, ")");
  }
  return cfg;
}

// Ranks that share this rank's GPU: local ranks map onto the node's devices round robin (pick_device).
int ranks_per_device(const parallel::RankEnv& env, torch::Device device) {
  if (!device.is_cuda()) return 1;
  const int count = std::max(1, static_cast<int>(torch::cuda::device_count()));
  const int local = env.local_size(), index = env.local_rank() % count;
  return local / count + (index < local % count ? 1 : 0);
}

// Parameters and activations in `compute`; fp32 masters live in the optimizer; the gradient buffer
// (accumulation and reduction) is `grads`. The same on CPU as on GPUs (slow on CPU, but the CPU
// tests then cover the mixed-precision bookkeeping).
struct Precision {
  at::ScalarType compute = at::kFloat, grads = at::kFloat;
  bool grads_kept_bf16 = false;  // reduce_dtype fp32 not needed (Note [bf16 gradients on one rank])
};

// Note [bf16 gradients on one rank]
// An fp32 gradient buffer (precision.reduce_dtype = fp32) is there to accumulate micro-steps and
// to sum ranks in fp32. With one rank, one micro-step and bf16 parameters it only holds each bf16
// gradient converted, which costs the bucket hook's convert copy, zeroing 4 bytes per parameter
// every step and 2 bytes per parameter of memory. Where the optimizer's update is the GPU kernel
// (optim::gpu_adamw_updates: CUDA, no offload) it reads bf16 gradients as they are and
// multiplies them by the clip coefficient in fp32, so the buffer stays bf16: the update takes the
// same numbers (the gradient norm, summed over another dtype, may differ in its last bits).
Precision precision_for(const Config& cfg, int world, int64_t accum, torch::Device device) {
  // precision.dtype = auto is resolved first (with_precision_for).
  Precision p{kernels::scalar_type_of(cfg.precision.dtype), kernels::scalar_type_of(cfg.precision.reduce_dtype)};
  p.grads_kept_bf16 = world == 1 && accum == 1 && p.compute == at::kBFloat16 && p.grads == at::kFloat &&
                      optim::gpu_adamw_updates(device, /*offload=*/cfg.parallel.offload != Offload::kNone);
  if (p.grads_kept_bf16) p.grads = at::kBFloat16;
  return p;
}

// The checkpoint to resume (checkpoint.resume), "" for a fresh start. Found before the model is
// built: its weights replace any initial ones, so train.init_from is read only when there is none.
// Rank 0 warns about what it skips (every rank sees the same directory).
std::string checkpoint_to_resume(const CheckpointConfig& cc, bool warn) {
  if (cc.resume == "none") return "";
  const bool automatic = cc.resume == "auto";
  const std::string found = find_checkpoint(automatic ? cc.dir : cc.resume, warn);
  if (found.empty() && !automatic) {
    throw UserError("config: checkpoint.resume = " + cc.resume +
                    ": no checkpoint there (neither manifest.json nor latest)");
  }
  return found;
}

// Note [GEMM tuning table]
// With train.gemm_tuning each rank times its GEMM shapes in its first step and keeps the fastest
// algorithms (src/kernels/gemm.h). Another process could time other winners, and another algorithm
// sums in another order, so a resumed run would differ in the last bits from the run it continues.
// Each rank therefore keeps its table in checkpoint.dir/gemm_choices.rank<R> (rewritten, durably,
// after any step that tuned new shapes) and loads it at start: a run resumed from that directory
// multiplies as the first one did. With train.deterministic the table is also kept in the machine's
// cache (gemm_cache_dir()) and a run without one in checkpoint.dir starts from it, so a fresh run
// multiplies as the first deterministic run on this machine did. The table is a cache: one from
// another GPU model or cuBLASLt is ignored (shapes are timed afresh).
class GemmTuningTable {
 public:
  GemmTuningTable(const Config& cfg, int rank, torch::Device device) {
    kernels::set_gemm_tuning(cfg.train.gemm_tuning);
    if (!cfg.train.gemm_tuning || !device.is_cuda()) return;
    const std::string name = "gemm_choices.rank" + std::to_string(rank);
    if (!cfg.checkpoint.dir.empty()) paths_.push_back(files::join(cfg.checkpoint.dir, name));
    if (cfg.train.deterministic) paths_.push_back(files::join(gemm_cache_dir(), name));
    for (const std::string& path : paths_) {  // the run's own table first
      if (!files::exists(path)) continue;
      const int64_t n = kernels::load_gemm_choices(files::read_file(path), path);
      log::info(n > 0 ? log::format("GEMM algorithms of %lld shapes from %s", (long long)n, path.c_str())
                      : "GEMM tuning table " + path + " is from another GPU or cuBLASLt: timing afresh");
      if (n > 0) break;
    }
    saved_ = kernels::gemm_choices_count();
  }

  // After a step: writes the table when the step tuned new shapes.
  void save_new() {
    if (paths_.empty() || kernels::gemm_choices_count() == saved_) return;
    for (const std::string& path : paths_) {
      files::create_directories(files::parent_path(path));
      files::write_file_durably(path, kernels::gemm_choices_bytes());
    }
    saved_ = kernels::gemm_choices_count();
  }

 private:
  // GPT2_CACHE_DIR, else $XDG_CACHE_HOME/gpt2-dist, else $HOME/.cache/gpt2-dist.
  static std::string gemm_cache_dir() {
    auto env = [](const char* name) {
      const char* v = std::getenv(name);
      return std::string(v != nullptr ? v : "");
    };
    if (!env("GPT2_CACHE_DIR").empty()) return env("GPT2_CACHE_DIR");
    if (!env("XDG_CACHE_HOME").empty()) return files::join(env("XDG_CACHE_HOME"), "gpt2-dist");
    return files::join(env("HOME").empty() ? "/tmp" : env("HOME"), ".cache/gpt2-dist");
  }

  std::vector<std::string> paths_;
  int64_t saved_ = 0;
};

// Note [Deterministic mode]
// train.deterministic = true makes a CUDA run give the same bits from run to run and across a kill
// and resume on the same world size (the CPU always does: Note [Partition-free arithmetic]). It
// removes each source of run-to-run variation:
//  - ATen's deterministic algorithms (at::Context::setDeterministicAlgorithms): PyTorch documents
//    that SDPA's backward then leaves cuDNN's attention for a deterministic kernel, and an ATen op
//    without a deterministic form throws instead of varying.
//  - cuBLAS: a fixed workspace per stream (CUBLAS_WORKSPACE_CONFIG=:4096:8, what ATen's check
//    asks for), cuDNN deterministic and not benchmarking.
//  - GEMM algorithms: the tuned table is shared through the machine's cache (Note [GEMM tuning
//    table]); a resumed run reads its checkpoint.dir's.
//  - NCCL: one algorithm and protocol (NCCL_ALGO=Ring, NCCL_PROTO=Simple, as Megatron's
//    deterministic mode sets them), so a sum's order is fixed for a world size; the MPI backend
//    sums in rank order (Note [Rank-order sums]).
// Our own kernels (cross-entropy, LayerNorm, bias gradients, AdamW, the norm) have no atomics: their
// reduction order depends only on the shapes. A variable the user set already is left as it is.
// (Every run seeds the CPU generator from train.seed too, so checkpoints are equal byte for byte.)
// Measured on an H200: 0.946x the default's tokens/s at gpt2-124m B=32, 0.940x at gpt2-1558m B=8
// (bench/deterministic.sh).
// For the length of one train() on CUDA (the CPU needs none of it): the process's earlier
// settings come back after it. ATen's filling of new
// tensors with NaN, which deterministic mode also turns on, is left off: it costs a pass over
// every new tensor and only matters to code that reads memory it never wrote.
class DeterministicMode {
 public:
  DeterministicMode(bool on, const torch::Device& device) : on_(on && device.is_cuda()) {
    if (on && !on_)
      log::info("train.deterministic: a CPU run is deterministic as it is (Note [Partition-free arithmetic])");
    if (!on_) return;
    auto& ctx = at::globalContext();
    algorithms_ = ctx.deterministicAlgorithms();
    warn_only_ = ctx.deterministicAlgorithmsWarnOnly();
    fill_ = ctx.deterministicFillUninitializedMemory();
    cudnn_deterministic_ = ctx.deterministicCuDNN();
    cudnn_benchmark_ = ctx.benchmarkCuDNN();
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    setenv("NCCL_ALGO", "Ring", 0);
    setenv("NCCL_PROTO", "Simple", 0);
    ctx.setDeterministicAlgorithms(true, /*warn_only=*/false);
    ctx.setDeterministicFillUninitializedMemory(false);
    ctx.setDeterministicCuDNN(true);
    ctx.setBenchmarkCuDNN(false);
  }
  ~DeterministicMode() {
    if (!on_) return;
    auto& ctx = at::globalContext();
    ctx.setDeterministicAlgorithms(algorithms_, warn_only_);
    ctx.setDeterministicFillUninitializedMemory(fill_);
    ctx.setDeterministicCuDNN(cudnn_deterministic_);
    ctx.setBenchmarkCuDNN(cudnn_benchmark_);
  }
  DeterministicMode(const DeterministicMode&) = delete;
  DeterministicMode& operator=(const DeterministicMode&) = delete;

 private:
  bool on_;
  bool algorithms_ = false, warn_only_ = false, fill_ = true, cudnn_deterministic_ = false, cudnn_benchmark_ = false;
};

// GPT-2 init from train.seed (the same on every rank: identical weights without a broadcast), or
// train.init_from's weights when not resuming; recompute, loss and kernel choices from the config.
GPT2 build_model(const Config& cfg, torch::Device device, at::ScalarType dtype, bool resuming) {
  GPT2 model(cfg.model);
  model->init_weights(cfg.train.seed);
  if (!cfg.train.init_from.empty() && !resuming) {  // fine-tuning: the weights, not the optimizer state or the step
    try {
      const WeightsSource source = find_weights(cfg.train.init_from);
      load_weights(model, source);
      log::info("initial weights from ", source.describe());
    } catch (const UserError& e) {
      throw UserError("train.init_from = " + cfg.train.init_from + ": " + e.what());
    }
  }
  model->set_recompute_every(cfg.recompute_every());  // 0 = none, 1 = every block, K = every K-th
  model->set_chunked_loss(cfg.memory.chunked_loss);
  model->set_recompute_gelu(cfg.memory.recompute_gelu);
  model->set_fused_kernels(cfg.train.fused_kernels);
  if (cfg.precision.fp8 == Fp8Choice::kTrue) {
    const std::string missing = fp8_missing(device, cfg.precision.dtype);
    if (!missing.empty()) throw UserError("precision.fp8 = true: " + missing);
  }
  model->to(device, dtype);
  if (cfg.precision.fp8 == Fp8Choice::kTrue) {
    model->set_fp8(true, cfg.precision.fp8_amax_history);  // after the move: the histories live on the device
    log::info("precision.fp8: the blocks' linear layers in FP8 (e4m3, e5m2 gradients, ",
              cfg.precision.fp8_amax_history > 0
                  ? "delayed scaling over " + std::to_string(cfg.precision.fp8_amax_history) + " steps' amaxes)"
                  : std::string("current per-tensor scaling)"));
  }
  return model;
}

// The communicator parallel.backend names; its errors name the settings.
std::unique_ptr<parallel::Communicator> make_communicator(const Config& cfg, const parallel::RankEnv& env,
                                                          torch::Device device) {
  try {
    return parallel::make_communicator(env.comm(), device, cfg.parallel.backend,
                                       {cfg.parallel.timeout_s, "parallel.timeout_s"});
  } catch (const UserError& e) {
    throw UserError(std::string("parallel.backend = ") + choice_name(cfg.parallel.backend) + ": " + e.what());
  }
}

// AdamW over this rank's shard of the flat parameter space (ZeRO 1/2) or all of it (ZeRO 0), on
// the device or, with parallel.offload = optimizer, in pinned host memory.
// Muon's matrices (optim.name = muon): the blocks' 2-D weights, qkv, proj, fc and fc2. The
// embeddings, the head (tied to wte), biases and LayerNorms stay on AdamW.
std::vector<int> muon_matrices(GPT2& model) {
  std::vector<int> out;
  const auto named = model->named_parameters();
  for (size_t i = 0; i < named.size(); ++i) {
    const std::string& name = named[i].key();
    if (named[i].value().dim() == 2 && name.rfind("transformer.h.", 0) == 0) out.push_back(static_cast<int>(i));
  }
  return out;
}

optim::ShardedOptimizer::Options optimizer_options(const Config& cfg, const parallel::RankEnv& env,
                                                   const parallel::FlatLayout& layout, Precision precision,
                                                   GPT2& model) {
  const auto& tc = cfg.train;
  optim::ShardedOptimizer::Options o;
  if (cfg.optim.name == optim::UpdateRule::kMuon) {
    o.muon_params = muon_matrices(model);
    o.muon.momentum = cfg.optim.muon_momentum;
    o.muon.weight_decay = tc.weight_decay;
    o.muon_lr_ratio = cfg.optim.muon_lr / tc.lr;
  }
  o.adamw.beta1 = tc.beta1;
  o.adamw.beta2 = tc.beta2;
  o.adamw.eps = tc.eps;
  o.adamw.weight_decay = tc.weight_decay;
  o.adamw.moments_8bit = cfg.memory.optimizer_moments == optim::MomentFormat::k8bit;
  o.sharded = cfg.parallel.zero_stage >= 1;
  o.offload = cfg.parallel.offload == Offload::kOptimizer;
  o.adamw.host_threads = static_cast<int>(cfg.parallel.offload_threads);
  if (o.offload && o.adamw.host_threads == 0) {
    o.adamw.host_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / env.local_size());
  }
  return o;
}

CheckpointSettings checkpoint_settings(const Config& cfg) {
  return {cfg.checkpoint.dir,
          cfg.checkpoint.keep,
          cfg.parallel.zero_stage,
          choice_name(cfg.parallel.offload),
          choice_name(cfg.precision.dtype),
          cfg.train.seed,
          cfg.table()};
}

void log_settings(const Config& cfg, const parallel::RankEnv& env, torch::Device device, int64_t accum) {
  log::info("gpt2-train: ", env.world_size(), " rank(s) on ", env.num_nodes(), " node(s), device ", device.str());
  for (const auto& [key, value] : cfg.table()) log::info(log::format("  %-34s %s", key.c_str(), value.c_str()));
  log::info(log::format("  %-34s %lld", "(derived) grad_accum_steps", (long long)accum));
}

// Each rank's node, node-local rank and device, one line per node (Note [Node-local rank]):
//   node n2 (2 of 2): rank 2 = local 0 (cuda:0), rank 3 = local 1 (cuda:1)
// Every rank takes part in the gather; rank 0 logs.
void log_placement(const parallel::RankEnv& env, torch::Device device) {
  // "node index <TAB> node name <TAB> this rank's part of the line"
  const auto all =
      env.gather_to_main(log::format("%d\t%s\trank %d = local %d (%s)", env.node_index(), env.node_name().c_str(),
                                     env.rank(), env.local_rank(), device.str().c_str()));
  if (all.empty()) return;
  std::vector<std::string> names(env.num_nodes()), ranks(env.num_nodes());
  for (const std::string& text : all) {
    const size_t tab1 = text.find('\t'), tab2 = text.find('\t', tab1 + 1);
    const int node = std::stoi(text.substr(0, tab1));
    names.at(node) = text.substr(tab1 + 1, tab2 - tab1 - 1);
    ranks.at(node) += (ranks[node].empty() ? "" : ", ") + text.substr(tab2 + 1);
  }
  log::info("ranks by node (node names from ", parallel::RankEnv::node_name_source(),
            "; a rank's GPU is its node-local rank):");
  for (int n = 0; n < env.num_nodes(); ++n) {
    log::info(log::format("  node %s (%d of %d): %s", names[n].c_str(), n + 1, env.num_nodes(), ranks[n].c_str()));
  }
}

void log_parallel_setup(const Config& cfg, const parallel::RankEnv& env, const parallel::Communicator& comm,
                        const parallel::GradBuckets& buckets, const optim::ShardedOptimizer& optimizer,
                        const optim::ShardedOptimizer::Options& options, const parallel::FlatLayout& layout,
                        Precision precision) {
  log::info("data parallel: ", env.world_size(), " rank(s), ", comm.backend(), ", ", buckets.num_buckets(),
            " gradient buckets of <= ", cfg.parallel.bucket_mb, " MiB, ZeRO stage ", cfg.parallel.zero_stage,
            ", parameters ", c10::toString(precision.compute), ", gradients ", c10::toString(precision.grads),
            log::format(" (%.1f MiB on this rank)", buckets.bytes() / 1048576.0));
  if (const optim::MuonOwners* muon = optimizer.muon_owners()) {
    log::info(
        "optimizer: Muon for ", muon->matrices().size(), " weight matrices (lr ", cfg.optim.muon_lr, ", momentum ",
        cfg.optim.muon_momentum, "), AdamW for the other parameters (lr ", cfg.train.lr, "); this rank owns ",
        muon->owned().size(), " of the matrices, ", muon->owned_numel(), " parameters",
        options.sharded && env.world_size() > 1 ? " (owners balanced by Newton-Schulz FLOPs)" : "",
        log::format(
            "; Muon's momentum %.1f MiB, %.0f bytes a parameter (AdamW's moments: 8)",
            optimizer.muon_momentum_bytes() / 1048576.0,
            muon->owned_numel() > 0 ? static_cast<double>(optimizer.muon_momentum_bytes()) / muon->owned_numel() : 0.0),
        // Sharded, an owner's matrices lie in other ranks' shards: it keeps their masters too.
        optimizer.muon_master_bytes() > 0
            ? log::format(", and fp32 masters of its matrices %.1f MiB", optimizer.muon_master_bytes() / 1048576.0)
            : std::string());
  }
  log::info(
      log::format("optimizer state: %.1f MiB on the device, %.1f MiB in host memory%s, on this rank "
                  "(%lld of %lld parameters)",
                  optimizer.state_bytes() / 1048576.0, optimizer.host_state_bytes() / 1048576.0,
                  options.offload ? log::format(" (offload, %d CPU threads)", options.adamw.host_threads).c_str() : "",
                  (long long)optimizer.shard_numel(), (long long)layout.total));
}

// The batches of a run (Note [Batch layout]). Training batch i is micro-step i % accum of step
// i / accum, prefetched on a thread; validation reads the same sequential windows at every eval,
// synchronously. Not movable: the loaders refer to the streams and the sampler.
struct RunData {
  RunData(const Config& cfg, const parallel::RankEnv& env, torch::Device device, int64_t accum, int64_t start_step)
      : train_stream(data::TokenStream::open(cfg.data.train, cfg.model.vocab_size, "data.train")),
        sampler(train_stream.size(), cfg.train.seq_len, cfg.train.seed, "data.train = " + cfg.data.train),
        train(
            train_stream,
            [this, accum, rank = env.rank(), world = env.world_size(), mb = cfg.train.micro_batch](int64_t i,
                                                                                                   int64_t row) {
              return sampler.window_start(data::global_sample_index(i / accum, i % accum, rank, row, mb, world, accum));
            },
            cfg.train.micro_batch, cfg.train.seq_len, cfg.model.vocab_size, device, static_cast<int>(cfg.data.prefetch),
            /*first_index=*/start_step * accum) {
    const int64_t T = cfg.train.seq_len, mb = cfg.train.micro_batch, eval_steps = cfg.train.eval_steps;
    if (!cfg.data.val.empty()) {
      val_stream.emplace(data::TokenStream::open(cfg.data.val, cfg.model.vocab_size, "data.val"));
      const int64_t windows = data::BatchSampler(val_stream->size(), T, 0, "data.val = " + cfg.data.val).num_windows();
      val.emplace(
          *val_stream,
          [=, rank = env.rank(), world = env.world_size()](int64_t e, int64_t row) {
            return data::global_sample_index(0, e, rank, row, mb, world, eval_steps) % windows * T;
          },
          mb, T, cfg.model.vocab_size, device, /*depth=*/0);
    }
    log::info("data: train ", train_stream.describe(), " (", sampler.num_windows(), " windows/epoch)",
              val_stream ? "; val " + val_stream->describe() : "");
  }
  RunData(const RunData&) = delete;
  RunData& operator=(const RunData&) = delete;

  data::TokenStream train_stream;
  data::BatchSampler sampler;
  data::BatchLoader train;
  std::optional<data::TokenStream> val_stream;
  std::optional<data::BatchLoader> val;
};

// Mean val loss over eval_steps micro-batches of every rank (all ranks; one reduction).
double evaluate(GPT2& model, data::BatchLoader& val, int64_t eval_steps, const parallel::RankEnv& env,
                torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  for (int64_t e = 0; e < eval_steps; ++e) {
    const auto batch = val.get(e);
    loss_sum += model->loss(batch.x, batch.y).to(torch::kFloat64);
  }
  model->train();
  return env.all_reduce_sum(loss_sum.item<double>() / eval_steps) / env.world_size();
}

// A sample from <|endoftext|> in the log (rank 0 only; no collectives).
void log_sample(GPT2& model, const data::Gpt2Tokenizer& tokenizer, const TrainConfig& tc, int64_t step) {
  const auto ids = sample_tokens(model, {tokenizer.eot_token()}, tc.sample_tokens, 1.0, 200, tc.seed + step);
  const std::vector<int32_t> as32(ids.begin() + 1, ids.end());
  log::info("sample at step ", step, ":\n", data::unicode::to_valid_utf8(tokenizer.decode(as32)));
}

void log_summary(const TrainResult& r, int64_t max_steps, double seconds) {
  const std::string val_text =
      r.val_losses.empty()
          ? ""
          : log::format(" | val loss %.4f -> %.4f", r.val_losses.front().second, r.val_losses.back().second);
  const std::string loss_text = r.losses.empty() ? "" : log::format(" | loss %.4f", r.losses.back());
  const std::string steps_text =
      r.end_step > r.start_step
          ? log::format("steps %lld-%lld of %lld", (long long)r.start_step, (long long)r.end_step - 1,
                        (long long)max_steps)
          : log::format("no steps (at step %lld of %lld)", (long long)r.start_step, (long long)max_steps);
  // The speed leaves out each process's first step (warm-up): unknown when that was the only one.
  const std::string speed_text = r.tokens_per_sec > 0 ? log::format("%.0f tok/s", r.tokens_per_sec) : "tok/s n/a";
  log::info(log::format("%s: %s in %s%s | %s | peak mem %.2f GiB", r.preempted ? "stopped (preempted)" : "done",
                        steps_text.c_str(), format_duration(seconds).c_str(), loss_text.c_str(), speed_text.c_str(),
                        r.peak_mem_gib) +
            val_text);
}

}  // namespace

TrainResult train(const Config& requested, const parallel::RankEnv& env) {
  const int rank = env.rank(), world = env.world_size();

  // ---- set-up (all ranks) -------------------------------------------------------------------
  const torch::Device device = pick_device(requested.train.device, env.local_rank());
  const Config cfg =
      with_precision_for(requested, device, env.is_main());  // the table, the manifest and the run see no "auto"
  const auto& tc = cfg.train;
  const DeterministicMode deterministic(tc.deterministic, device);  // before cuBLAS and NCCL read their variables
  // Every generator from the seed, the CPU's too: checkpoints hold its state, and LibTorch seeds it
  // differently in every process otherwise.
  torch::manual_seed(tc.seed);
  if (device.is_cuda()) torch::cuda::manual_seed_all(tc.seed);
  const int64_t accum = cfg.grad_accum_steps(world);
  const Precision precision = precision_for(cfg, world, accum, device);
  // What was asked and what it needs, before anything is allocated (Note [Memory estimate]).
  log_settings(cfg, env, device, accum);
  const MemoryEstimate memory = estimate_memory(cfg, world, precision.compute, precision.grads);
  const int64_t num_params = memory.parameters;
  log::info(num_params, " parameters (", num_params / 1e6,
            "M with vocab padding); memory (estimate, per rank): ", memory.describe());
  check_memory_fits(memory, device, ranks_per_device(env, device), env.local_size());
  log_placement(env, device);
  const std::string resume_from = checkpoint_to_resume(cfg.checkpoint, env.is_main());
  GPT2 model = build_model(cfg, device, precision.compute, /*resuming=*/!resume_from.empty());
  GemmTuningTable gemm_table(cfg, rank, device);  // Note [GEMM tuning table]
  if (precision.grads_kept_bf16) log::info("gradients kept in bf16: one rank, no accumulation");

  // Gradients live in flat buckets reduced while backward runs (parallel/grad_buckets.h); the
  // parameters become views into one flat buffer whose shards the optimizer owns.
  std::vector<torch::Tensor> params = model->parameters();
  const auto comm = make_communicator(cfg, env, device);
  // 8-bit moments: every shard is whole quantization blocks (Note [Moment blocks]). ZeRO 2's
  // buckets are the layout's blocks, each reduce-scattered (Note [Interleaved shards]).
  const auto bucket_bytes = static_cast<int64_t>(cfg.parallel.bucket_mb * (1 << 20));
  const int64_t zero2_block =
      cfg.parallel.zero_stage == 2 ? bucket_bytes / static_cast<int64_t>(c10::elementSize(precision.grads)) : 0;
  const parallel::FlatLayout layout(params, world, zero2_block);
  parallel::GradBuckets buckets(params, layout, bucket_bytes, *comm, precision.grads);
  const auto opt_options = optimizer_options(cfg, env, layout, precision, model);
  optim::ShardedOptimizer optimizer(params, layout, buckets.grads(), *comm, opt_options);
  log_parallel_setup(cfg, env, *comm, buckets, optimizer, opt_options, layout, precision);
  // fp16 needs it (bf16 has fp32's range); precision.fp8 skips a step whose gradients came out non-finite.
  optim::LossScaler scaler(precision.compute == at::kHalf, device, {},
                           /*skip_non_finite=*/cfg.precision.fp8 == Fp8Choice::kTrue);
  const optim::LrSchedule schedule{tc.lr, tc.min_lr, tc.warmup_steps, tc.max_steps, tc.lr_schedule, tc.decay_frac};

  // ---- resume (all ranks): optimizer shards, parameters, loss scale; the data order needs only
  // the step (Note [Batch layout]).
  const int64_t start_step = resume_from.empty() ? 0
                                                 : resume_checkpoint(resume_from, model, cfg.parallel.zero_stage, env,
                                                                     layout, optimizer, scaler);
  if (start_step >= tc.max_steps && tc.max_steps > 0) {
    log::info("the checkpoint is at step ", start_step, " >= train.max_steps ", tc.max_steps, ": nothing to do");
  }
  RunData data(cfg, env, device, accum, start_step);
  std::optional<data::Gpt2Tokenizer> tokenizer;  // rank 0 samples
  if (env.is_main() && tc.sample_tokens > 0) {
    const std::string& dir = cfg.data.tokenizer_dir;
    tokenizer.emplace(data::Gpt2Tokenizer::load(dir == "auto" ? data::find_default_tokenizer_dir() : dir));
  }

  TrainResult result;
  result.start_step = result.end_step = start_step;
  CheckpointWriter checkpoints(checkpoint_settings(cfg), env);
  StepProfiler profiler(cfg.profile.steps, cfg.profile.dir, start_step, rank, device.is_cuda());
  const StepFault fault = StepFault::from_environment(rank);
  StopSignals stop_signals;
  StepWatchdog watchdog(cfg.parallel.step_timeout_s);
  ProgressLog progress(cfg, env, device, num_params);
  auto loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  torch::Tensor grad_norm;
  Clock::time_point save_taken;  // of the save in flight
  // Rank 0 alone loaded the tokenizer and opened the metrics files (Note [Rank-0 work]).
  env.barrier();

  for (int64_t step = start_step; step < tc.max_steps; ++step) {
    watchdog.beat();
    fault.at_step_start(step);
    const bool last_step = step == tc.max_steps - 1;

    // ---- eval (all ranks: one reduction) ------------------------------------------------------
    const auto paused = Clock::now();  // eval and sample time stays out of the step timing
    // The run's last eval comes after its last update (below): the model that is saved.
    const bool eval_due = data.val && tc.eval_every > 0 && step % tc.eval_every == 0;
    if (eval_due) {
      const double val_loss = evaluate(model, *data.val, tc.eval_steps, env, device);
      watchdog.beat();
      result.val_losses.emplace_back(step, val_loss);
      progress.val_loss(step, val_loss);  // rank 0 prints and writes the metric
    }

    // ---- sample (rank 0 only; no collectives) -------------------------------------------------
    // Due by the config, so every rank knows when rank 0 is busy with one.
    const bool sample_due = tc.sample_tokens > 0 && tc.sample_every > 0 && step > 0 && step % tc.sample_every == 0;
    if (tokenizer && sample_due) {
      fault.before_sample(step);
      log_sample(model, *tokenizer, tc, step);
    }
    if (eval_due || sample_due) {  // Note [Rank-0 work]
      env.barrier();
      watchdog.beat();
    }
    progress.exclude_since(paused);

    // ---- micro-steps: forward + backward (all ranks) -------------------------------------------
    // Only the last micro-step's backward all-reduces its buckets as they fill (ZeRO 0/1); ZeRO 2
    // reduce-scatters them in every micro-step's, as no rank holds the whole gradient.
    profiler.step_begin(step);
    for (int64_t micro = 0; micro < accum; ++micro) {
      buckets.prepare_backward(/*reduce=*/micro == accum - 1);
      data::DeviceBatch batch;
      {
        Phase phase("data");
        batch = data.train.next();
      }
      progress.add_data_wait(batch.wait_seconds);
      torch::Tensor loss;
      {
        Phase phase("forward");
        loss = model->loss(batch.x, batch.y);  // (,) fp32, mean over this micro-batch
      }
      {
        Phase phase("backward");
        // Scale so the accumulated gradient is the mean over the global batch.
        auto scaled = scaler.scale_loss(loss / static_cast<double>(accum * world));
        if (micro == 0 && fault.overflows_at(step)) scaled = scaled * std::numeric_limits<float>::infinity();
        scaled.backward();
      }
      loss_sum += loss.detach();
    }

    // ---- gradient reduction (all ranks): launch the buckets backward left, wait for all ----------
    {
      Phase phase("reduce_wait");
      buckets.finish();
    }

    // ---- clip and step (all ranks) ------------------------------------------------------------
    // fp16: unscale, and skip the step on every rank if any rank saw inf/NaN (no host sync); fp8: the
    // same check and skip, unscaled.
    const double lr = schedule.at(step);
    {
      Phase phase("optimizer");
      const auto found_inf =
          scaler.unscale_and_check(optimizer.grad_shard(), optimizer.sharded() ? comm.get() : nullptr);
      grad_norm = optimizer.clip_grad_norm(tc.grad_clip);
      optimizer.step(lr, scaler.checks() ? found_inf : torch::Tensor());
      scaler.update(found_inf);
      optimizer.gather();  // ZeRO 1/2: every rank gets the updated shards of the others
      buckets.zero();
      // FP8 delayed scaling: the step's amaxes, made equal on every rank, move into the histories.
      if (model->fp8_amax_history().defined()) {
        if (world > 1) comm->all_reduce(model->fp8_amax_history(), parallel::ReduceOp::kMax)->wait();
        model->fp8_step_done();
      }
    }
    profiler.step_end(step);
    gemm_table.save_new();
    result.end_step = step + 1;

    // ---- log (the loss reduction on all ranks, printing on rank 0) -----------------------------
    const double step_loss =
        progress.step_done(step, loss_sum, accum, grad_norm, lr, scaler.enabled() ? scaler.scale() : 1.0);
    if (!std::isnan(step_loss)) {
      result.losses.resize(step + 1, std::nan(""));
      result.losses[step] = step_loss;
    }
    loss_sum.zero_();

    // ---- checkpoint (all ranks) -------------------------------------------------------------
    // A stop signal on any rank stops every rank after this step (one small reduction a step; it
    // is also the meeting after the step line and metrics rank 0 just wrote, Note [Rank-0 work]).
    const int stop = env.all_reduce_max(stop_signals.received());
    if (checkpoints.pending()) {  // a background save finishes once every rank wrote its files
      const std::string done = checkpoints.poll();
      if (!done.empty()) {  // rank 0 wrote the manifest, renamed and pruned (Note [Rank-0 work])
        env.barrier();
        watchdog.beat();
        result.last_checkpoint = done;
        log::info(
            log::format("checkpoint %s complete, %.1f s after it was taken", done.c_str(), seconds_since(save_taken)));
      }
    }
    const bool due = cfg.checkpoint.every > 0 && ((step + 1) % cfg.checkpoint.every == 0 || last_step);
    if (due || stop != 0) {
      const auto save_start = save_taken = Clock::now();
      // A stop or the end of the run waits for the files; otherwise they may go in the background.
      const bool async = cfg.checkpoint.async && stop == 0 && !last_step;
      watchdog.beat();
      const std::string done = checkpoints.save(step + 1, model, layout, optimizer, scaler, async);
      env.barrier();  // rank 0 copied and wrote the model and the manifest alone (Note [Rank-0 work])
      watchdog.beat();
      if (!done.empty()) result.last_checkpoint = done;
      log::info(log::format("checkpoint of step %lld: training paused %.2f s%s", (long long)(step + 1),
                            seconds_since(save_start), async ? " (files are written in the background)" : ""));
      progress.exclude_since(save_start);
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

  // ---- final eval (all ranks): the weights after the last update, which the last checkpoint holds
  if (data.val && !result.preempted && start_step < tc.max_steps) {
    const double val_loss = evaluate(model, *data.val, tc.eval_steps, env, device);
    result.val_losses.emplace_back(tc.max_steps, val_loss);
    progress.val_loss(tc.max_steps, val_loss);
  }

  // ---- summary (rank 0 prints) ------------------------------------------------------------------
  result.tokens_per_sec = progress.tokens_per_sec();
  result.peak_mem_gib = peak_memory_gib(device.is_cuda() ? device.index() : -1);
  result.optimizer_state_bytes = optimizer.state_bytes();
  result.optimizer_host_bytes = optimizer.host_state_bytes();
  result.gradient_bytes = buckets.bytes();
  result.loss_scale = scaler.enabled() ? scaler.scale() : 1.0;
  if (tokenizer && !result.preempted) log_sample(model, *tokenizer, tc, tc.max_steps);
  if (tc.sample_tokens > 0 && !result.preempted)
    env.barrier();  // before a caller's next collective (Note [Rank-0 work])
  log_summary(result, tc.max_steps, progress.seconds());
  // Each rank's own peak (its allocator's), since ZeRO 2 and offload make them differ from rank 0's.
  const std::vector<double> peaks = env.gather_to_main(result.peak_mem_gib);
  if (world > 1 && device.is_cuda() && env.is_main()) {
    std::string line = "peak mem per rank (GiB):";
    for (double p : peaks) line += log::format(" %.2f", p);
    log::info(line);
  }
  result.model = model;
  return result;
}

}  // namespace gpt2
