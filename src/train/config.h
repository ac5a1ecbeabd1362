#pragma once
// The run configuration: one struct of nested sections, read from an INI file whose
// `[section] key = value` lines become options `section.key`, overridable on the command line as
// `--section.key=value`. parse_config() validates everything in one place and throws
// gpt2::UserError naming the key for unknown keys, bad values and inconsistent combinations.
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "optim/lr_schedule.h"
#include "optim/moment_format.h"
#include "optim/update_rule.h"
#include "parallel/backend.h"
#include "src/base/choices.h"
#include "src/model/model_config.h"

namespace gpt2 {

// parallel.offload: none, or the optimizer's state and update in host memory.
enum class Offload { kNone, kOptimizer };
template <>
struct ChoiceNames<Offload> {
  static constexpr std::array<std::pair<Offload, const char*>, 2> names{
      {{Offload::kNone, "none"}, {Offload::kOptimizer, "optimizer"}}};
};

// precision.fp8: the blocks' linear layers in FP8. auto = on where the run can (a CUDA GPU with FP8
// tensor cores and precision.dtype bf16), off elsewhere; true where it cannot is an error.
enum class Fp8Choice { kFalse, kTrue, kAuto };
template <>
struct ChoiceNames<Fp8Choice> {
  static constexpr std::array<std::pair<Fp8Choice, const char*>, 3> names{
      {{Fp8Choice::kFalse, "false"}, {Fp8Choice::kTrue, "true"}, {Fp8Choice::kAuto, "auto"}}};
};

struct DataConfig {
  std::string train;                   // token file(s): path, comma list or glob
  std::string val;                     // "" or "none": no eval
  std::string tokenizer_dir = "auto";  // for samples; auto = data::find_default_tokenizer_dir(), as every tool
  int64_t prefetch = 4;                // batches read ahead by the loader thread
};

struct TrainConfig {
  int64_t micro_batch = 8;        // sequences per rank per micro-step
  int64_t seq_len = 1024;         // tokens per sequence (<= model.block_size)
  int64_t batch_tokens = 524288;  // tokens per optimizer step over all ranks (2^19, GPT-2 paper's 0.5M)
  int64_t max_steps = 1000;
  double lr = 6e-4;      // peak learning rate after warmup
  double min_lr = 6e-5;  // cosine floor (10% of lr, as in the GPT-3 paper)
  int64_t warmup_steps = 100;
  LrShape lr_schedule = LrShape::kCosine;  // cosine | wsd (warmup-stable-decay, optim/lr_schedule.h)
  double decay_frac = 0.2;                 // wsd: the last share of the steps, decayed linearly to min_lr
  double weight_decay = 0.1;               // 2-D weights only (matmuls, embeddings)
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // global L2 norm; 0 = off
  uint64_t seed = 1337;
  int64_t eval_every = 250;                   // 0 = only at the end
  int64_t eval_steps = 20;                    // val micro-batches per eval
  int64_t sample_every = 0;                   // 0 = only at the end
  int64_t sample_tokens = 64;                 // tokens per sample
  DeviceChoice device = DeviceChoice::kAuto;  // auto | cpu | cuda
  bool fused_kernels = true;                  // CUDA: src/kernels' cross-entropy and LayerNorm instead of LibTorch's
  bool gemm_tuning = true;     // CUDA bf16/fp16/FP8: time each GEMM shape's algorithms once, keep the fastest
  bool deterministic = false;  // CUDA: the same bits from run to run and across a resume (Note [Deterministic mode])
  std::string init_from;  // weights to start from (model_weights.h): checkpoint, model file, HF dir; "" = GPT-2 init
};

struct PrecisionConfig {
  DtypeChoice dtype = DtypeChoice::kBf16;  // bf16 | fp16 | fp32 | auto (Note [bf16 on CPU]); CPU runs honour it too
  DtypeChoice reduce_dtype = DtypeChoice::kFp32;  // gradient buffer: fp32, or dtype itself (half the all-reduce bytes)
  Fp8Choice fp8 = Fp8Choice::kFalse;  // the blocks' linear layers in FP8 (GPT2Impl::set_fp8): CUDA sm_89+, dtype bf16
  int64_t fp8_amax_history = 16;  // 0: current scaling; N >= 2: delayed scaling over N steps' amaxes (measured faster)
};

struct ParallelConfig {
  parallel::Backend backend = parallel::Backend::kAuto;  // auto (NCCL for several CUDA ranks, else MPI) | nccl | mpi
                                                         // (stages CUDA tensors through host memory)
  double bucket_mb = 25;                                 // gradient bucket size (PyTorch DDP's default)
  int64_t zero_stage = 0;                                // 0 | 1 | 2
  Offload offload = Offload::kNone;  // none | optimizer (AdamW state in host memory, updated by the CPU)
  int64_t offload_threads = 0;       // CPU AdamW threads per rank; 0 = hardware threads / ranks on the node
  double timeout_s = 600;       // a collective older than this ends the job (dead or hung peer); PyTorch NCCL's default
  double step_timeout_s = 900;  // no step finished for this long on a rank (CPU or GPU, any phase): end the job
};

struct MemoryConfig {
  std::string activation_checkpointing = "none";  // none | full | every_k=K
  bool chunked_loss = false;  // head + cross-entropy in row chunks, no batch logits (less memory, slower today)
  optim::MomentFormat optimizer_moments =
      optim::MomentFormat::kFp32;  // fp32 | 8bit (block-wise quantized AdamW moments, optim/moment_layout.h)
  bool recompute_gelu = false;     // the fused MLP recomputes its GELU output in backward (B x T x 4C less per block)
};

// optim.name = muon: Muon for the blocks' weight matrices (optim/muon.h), AdamW with train.lr and
// friends for the rest. Any ZeRO stage, offload (AdamW's state) and moment format; under ZeRO 1/2
// each matrix has one owner rank (optim/muon_owners.h).
struct OptimConfig {
  optim::UpdateRule name = optim::UpdateRule::kAdamW;  // adamw | muon
  double muon_lr = 0.02;                               // Muon's peak learning rate (the schedule scales it as train.lr)
  double muon_momentum = 0.95;                         // Nesterov momentum
};

struct CheckpointConfig {
  std::string dir = "runs/checkpoints";
  int64_t every = 0;  // steps between saves; 0 = off
  int64_t keep = 3;
  std::string resume = "auto";  // auto | none | PATH
  bool async = false;           // write the files on a background thread while training goes on
};

struct LogConfig {
  std::string metrics = "runs/metrics.jsonl";  // one JSON object per logged step; "none" = no file
  std::string tensorboard = "auto";            // TensorBoard event files (the same scalars); see tensorboard_dir()
  int64_t every = 10;                          // steps between metric lines
  double peak_tflops = 0;                      // MFU denominator; 0 = 989 on CUDA (H100/H200 dense bf16), none on CPU

  // The event directory: `tensorboard`, or for "auto" the tensorboard/ folder beside the metrics
  // file, so a run without a metrics file (as the tests) writes no events either and runs never
  // share a folder by default; "" = off.
  std::string tensorboard_dir() const;
};

struct ProfileConfig {
  int64_t steps = 0;  // >0: trace this many steps
  std::string dir = "runs/profile";
};

struct Config {
  GPT2Config model;
  DataConfig data;
  TrainConfig train;
  PrecisionConfig precision;
  ParallelConfig parallel;
  MemoryConfig memory;
  OptimConfig optim;
  CheckpointConfig checkpoint;
  LogConfig log;
  ProfileConfig profile;
  std::string config_file;  // where it came from ("" = defaults + command line)

  // Checks everything that does not depend on the world size.
  void validate() const;
  // Gradient-accumulation micro-steps per optimizer step for `world_size` ranks; throws
  // gpt2::UserError naming train.batch_tokens when it does not divide.
  int64_t grad_accum_steps(int world_size) const;
  // memory.activation_checkpointing as GPT2::set_recompute_every takes it: 0 = none,
  // 1 = full, K = every_k=K; throws gpt2::UserError naming the key for any other value.
  int64_t recompute_every() const;
  // The resolved settings as `section.key = value` lines, for the start-of-run table.
  std::vector<std::pair<std::string, std::string>> table() const;
};

// What parse_config() found on the command line besides the options.
struct ParseResult {
  Config config;
  bool help = false;
  std::string help_text;
};

// Parses `--config FILE` and `--section.key=value` overrides (command line wins over the file).
ParseResult parse_config(int argc, const char* const argv[]);

}  // namespace gpt2
