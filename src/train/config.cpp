#include "src/train/config.h"

#include <boost/program_options.hpp>

#include <fstream>
#include <functional>
#include <sstream>
#include <type_traits>

#include "src/base/decimal.h"
#include "src/base/errors.h"
#include "src/base/files.h"
#include "src/train/choice_option.h"

namespace po = boost::program_options;

namespace gpt2 {
namespace {

template <typename T>
std::string to_text(const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";  // as the INI files spell them (the help and the table alike)
  } else if constexpr (std::is_enum_v<T>) {
    return choice_name(v);
  } else if constexpr (std::is_floating_point_v<T>) {
    return decimal(v);  // as written in the code: 6e-4 shows as 0.0006, not its binary expansion
  } else {
    std::ostringstream os;
    os << v;
    return os.str();
  }
}

// Every option once: its name, help, the field it binds to and how to print it. Options are bound
// to one Config instance, so the same list serves parsing, --help and the resolved table.
struct OptionList {
  po::options_description desc{"Options (INI `[section] key = value`, or --section.key=value)"};
  std::vector<std::pair<std::string, std::function<std::string()>>> shown;

  template <typename T>
  void add(const char* name, T* field, const char* help) {
    if constexpr (std::is_enum_v<T>) {  // one of a few words (src/base/choices.h), parsed here once
      desc.add_options()(name, choice_option(std::string("config: ") + name, field), help);
    } else {
      desc.add_options()(name, po::value<T>(field)->default_value(*field, to_text(*field)), help);
    }
    shown.emplace_back(name, [field] { return to_text(*field); });
  }
};

OptionList bind_options(Config& c) {
  OptionList o;
  o.add("model.n_layer", &c.model.n_layer, "transformer blocks");
  o.add("model.n_head", &c.model.n_head, "attention heads");
  o.add("model.n_embd", &c.model.n_embd, "embedding width");
  o.add("model.vocab_size", &c.model.vocab_size, "vocabulary (padded to a multiple of 64 inside)");
  o.add("model.block_size", &c.model.block_size, "longest context");
  o.add("data.train", &c.data.train, "training token file(s): path, comma list or glob");
  o.add("data.val", &c.data.val, "validation token file(s); none = no eval");
  o.add("data.prefetch", &c.data.prefetch, "micro-batches the loader thread reads ahead (>= 1)");
  o.add("data.tokenizer_dir", &c.data.tokenizer_dir,
        "GPT-2 encoder.json + vocab.bpe (for samples); auto = the repo's data/tokenizer/gpt2, found from the "
        "executable, the working directory or the source tree");
  o.add("train.micro_batch", &c.train.micro_batch, "sequences per rank per micro-step");
  o.add("train.seq_len", &c.train.seq_len, "tokens per sequence");
  o.add("train.batch_tokens", &c.train.batch_tokens, "tokens per optimizer step, all ranks");
  o.add("train.max_steps", &c.train.max_steps, "optimizer steps");
  o.add("train.lr", &c.train.lr, "peak learning rate");
  o.add("train.min_lr", &c.train.min_lr, "learning rate at the end of the schedule");
  o.add("train.warmup_steps", &c.train.warmup_steps, "linear warmup steps");
  o.add("train.lr_schedule", &c.train.lr_schedule,
        "after warmup: cosine (down to min_lr at max_steps) | wsd (lr, then linear down to min_lr over the last "
        "train.decay_frac of the steps)");
  o.add("train.decay_frac", &c.train.decay_frac, "wsd: the share of train.max_steps spent decaying (0..1)");
  o.add("train.weight_decay", &c.train.weight_decay, "AdamW decay on 2-D weights");
  o.add("train.beta1", &c.train.beta1, "AdamW beta1");
  o.add("train.beta2", &c.train.beta2, "AdamW beta2");
  o.add("train.eps", &c.train.eps, "AdamW epsilon");
  o.add("train.grad_clip", &c.train.grad_clip, "global gradient-norm clip; 0 = off");
  o.add("train.seed", &c.train.seed, "seed for init and data order");
  o.add("train.eval_every", &c.train.eval_every, "steps between evals; 0 = at the end only");
  o.add("train.eval_steps", &c.train.eval_steps, "val micro-batches per eval");
  o.add("train.sample_every", &c.train.sample_every, "steps between samples; 0 = at the end only");
  o.add("train.sample_tokens", &c.train.sample_tokens, "tokens per sample; 0 = no samples");
  o.add("train.device", &c.train.device, "auto | cpu | cuda");
  o.add("train.fused_kernels", &c.train.fused_kernels,
        "fused head + cross-entropy (CPU and CUDA), LayerNorm and linear kernels (CUDA) (src/kernels); false = "
        "LibTorch's ops");
  o.add("train.gemm_tuning", &c.train.gemm_tuning,
        "CUDA bf16/fp16 and FP8: time ATen's and cuBLASLt's algorithms for each GEMM shape in the first step and "
        "keep the fastest (src/kernels/gemm.h); false = ATen's GEMMs");
  o.add("train.deterministic", &c.train.deterministic,
        "CUDA: bitwise-reproducible runs (deterministic attention backward and ATen ops, cuBLAS workspace and NCCL "
        "ring pinned, tuned GEMM choices shared through GPT2_CACHE_DIR); the CPU always is");
  o.add("train.init_from", &c.train.init_from,
        "none | weights to fine-tune: a checkpoint, a model file (gpt2-ckpt consolidate/import-hf) or a Hugging Face "
        "dir");
  o.add("precision.dtype", &c.precision.dtype,
        "bf16 | fp16 | fp32 | auto (bf16 on CUDA and on CPUs with fast bf16 GEMMs, else fp32)");
  o.add("precision.reduce_dtype", &c.precision.reduce_dtype,
        "fp32 | bf16 | fp16: gradient accumulation and all-reduce");
  o.add("precision.fp8", &c.precision.fp8,
        "false | true | auto: the blocks' linear layers (qkv, proj, fc, fc2) in FP8, forward and backward (e4m3, "
        "e5m2 gradients, per-tensor scales); true needs a CUDA GPU of compute capability 8.9+ and precision.dtype = "
        "bf16, auto turns it on where those hold and off elsewhere");
  o.add("precision.fp8_amax_history", &c.precision.fp8_amax_history,
        "with precision.fp8: 0 = current scaling (each FP8 cast scaled by its own amax) | N >= 2 = delayed scaling, "
        "each tensor scaled by the largest amax of its last N steps (the first step current; one read of a tensor "
        "instead of two, 1.09-1.10x the tokens/s of current scaling on an H100); checkpoints keep the histories");
  o.add("parallel.backend", &c.parallel.backend,
        "auto | nccl | mpi: collectives; auto = nccl for several CUDA ranks, mpi otherwise (mpi stages CUDA "
        "tensors through host memory: slow, lets ranks share a GPU)");
  o.add("parallel.bucket_mb", &c.parallel.bucket_mb, "gradient bucket size in MiB");
  o.add("parallel.zero_stage", &c.parallel.zero_stage, "0 | 1 | 2");
  o.add("parallel.offload", &c.parallel.offload, "none | optimizer");
  o.add("parallel.offload_threads", &c.parallel.offload_threads, "CPU AdamW threads per rank; 0 = cores / local ranks");
  o.add("parallel.timeout_s", &c.parallel.timeout_s, "seconds before a stuck collective ends the job");
  o.add("parallel.step_timeout_s", &c.parallel.step_timeout_s,
        "seconds without a finished step (a hung rank anywhere) before the job ends");
  o.add("memory.activation_checkpointing", &c.memory.activation_checkpointing, "none | full | every_k=K");
  o.add("memory.chunked_loss", &c.memory.chunked_loss, "true: head + loss in row chunks without the batch's logits");
  o.add("memory.recompute_gelu", &c.memory.recompute_gelu,
        "true: the MLP keeps only its GELU input for backward, recomputing the output (less memory, 1-2% slower)");
  o.add("memory.optimizer_moments", &c.memory.optimizer_moments,
        "fp32 | 8bit: AdamW moments block-wise quantized to 8 bits (a quarter of the memory)");
  o.add("optim.name", &c.optim.name,
        "adamw | muon: Muon for the blocks' weight matrices, AdamW (train.lr, ...) for the rest");
  o.add("optim.muon_lr", &c.optim.muon_lr, "Muon's peak learning rate (train.lr_schedule scales it)");
  o.add("optim.muon_momentum", &c.optim.muon_momentum, "Muon's Nesterov momentum");
  o.add("checkpoint.dir", &c.checkpoint.dir, "checkpoint directory");
  o.add("checkpoint.every", &c.checkpoint.every, "steps between checkpoints; 0 = off");
  o.add("checkpoint.keep", &c.checkpoint.keep, "checkpoints kept");
  o.add("checkpoint.resume", &c.checkpoint.resume, "auto | none | PATH");
  o.add("checkpoint.async", &c.checkpoint.async, "true: snapshot to host memory, write in the background");
  o.add("log.metrics", &c.log.metrics, "metrics.jsonl path; none = no file");
  o.add("log.tensorboard", &c.log.tensorboard,
        "TensorBoard event directory; auto = beside log.metrics (DIR/tensorboard, off when it is none); none = off");
  o.add("log.every", &c.log.every, "steps between metric lines");
  o.add("log.peak_tflops", &c.log.peak_tflops, "MFU denominator in TFLOP/s; 0 = 989 on CUDA");
  o.add("profile.steps", &c.profile.steps, "steps to trace; 0 = off");
  o.add("profile.dir", &c.profile.dir, "trace output directory");
  return o;
}

[[noreturn]] void bad(const std::string& key, const std::string& value, const std::string& why) {
  throw UserError("config: " + key + " = " + value + ": " + why);
}

template <typename T>
void require(bool ok, const std::string& key, const T& value, const std::string& why) {
  if (!ok) bad(key, to_text(value), why);
}

// memory.activation_checkpointing -> 0 (none), 1 (full: every block) or K (every_k=K: every K-th).
int64_t parse_checkpointing(const std::string& value) {
  const std::string key = "memory.activation_checkpointing";
  const std::string why = "must be none | full | every_k=K with an integer K >= 1";
  if (value == "none") return 0;
  if (value == "full") return 1;
  const std::string prefix = "every_k=";
  if (value.compare(0, prefix.size(), prefix) != 0) bad(key, value, why);
  const std::string digits = value.substr(prefix.size());
  // Digits only (no sign, spaces or suffix), and few enough that stoll cannot overflow.
  if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) {
    bad(key, value, why);
  }
  const int64_t k = std::stoll(digits);
  if (k < 1) bad(key, value, why);
  return k;
}

}  // namespace

void Config::validate() const {
  model.validate();
  const auto& t = train;
  require(!data.train.empty(), "data.train", data.train, "is required (a token file made by gpt2-data)");
  require(data.prefetch >= 1, "data.prefetch", data.prefetch, "must be at least 1");
  require(t.micro_batch > 0, "train.micro_batch", t.micro_batch, "must be positive");
  require(t.seq_len > 0 && t.seq_len <= model.block_size, "train.seq_len", t.seq_len,
          "must be in 1..model.block_size (" + to_text(model.block_size) + ")");
  require(t.batch_tokens > 0, "train.batch_tokens", t.batch_tokens, "must be positive");
  grad_accum_steps(1);
  require(t.max_steps > 0, "train.max_steps", t.max_steps, "must be positive");
  require(t.lr > 0, "train.lr", t.lr, "must be positive");
  require(t.min_lr >= 0 && t.min_lr <= t.lr, "train.min_lr", t.min_lr, "must be in 0..train.lr");
  require(t.warmup_steps >= 0, "train.warmup_steps", t.warmup_steps, "must be >= 0");
  require(t.decay_frac >= 0 && t.decay_frac <= 1, "train.decay_frac", t.decay_frac, "must be in 0..1");
  require(t.weight_decay >= 0, "train.weight_decay", t.weight_decay, "must be >= 0");
  require(t.beta1 >= 0 && t.beta1 < 1, "train.beta1", t.beta1, "must be in [0, 1)");
  require(t.beta2 >= 0 && t.beta2 < 1, "train.beta2", t.beta2, "must be in [0, 1)");
  require(t.eps > 0, "train.eps", t.eps, "must be positive");
  require(t.grad_clip >= 0, "train.grad_clip", t.grad_clip, "must be >= 0 (0 = off)");
  require(t.eval_every >= 0, "train.eval_every", t.eval_every, "must be >= 0");
  require(t.eval_steps > 0, "train.eval_steps", t.eval_steps, "must be positive");
  require(t.sample_every >= 0, "train.sample_every", t.sample_every, "must be >= 0");
  require(t.sample_tokens >= 0, "train.sample_tokens", t.sample_tokens, "must be >= 0");
  require(precision.fp8_amax_history == 0 || (precision.fp8_amax_history >= 2 && precision.fp8_amax_history <= 1024),
          "precision.fp8_amax_history", precision.fp8_amax_history, "must be 0 (current scaling) or 2..1024 steps");
  require(precision.reduce_dtype == DtypeChoice::kFp32 ||
              (precision.reduce_dtype == precision.dtype && precision.dtype != DtypeChoice::kAuto),
          "precision.reduce_dtype", precision.reduce_dtype,
          "must be fp32 or precision.dtype (" + to_text(precision.dtype) + ")");
  require(parallel.backend != parallel::Backend::kNccl || train.device != DeviceChoice::kCpu, "parallel.backend",
          parallel.backend, "needs CUDA tensors (train.device = cpu)");
  require(parallel.bucket_mb > 0, "parallel.bucket_mb", parallel.bucket_mb, "must be positive");
  require(parallel.zero_stage >= 0 && parallel.zero_stage <= 2, "parallel.zero_stage", parallel.zero_stage,
          "must be 0, 1 or 2");
  require(parallel.offload == Offload::kNone || precision.reduce_dtype != DtypeChoice::kFp16, "parallel.offload",
          parallel.offload, "takes fp32 or bf16 gradients (set precision.reduce_dtype = fp32)");
  require(parallel.offload_threads >= 0, "parallel.offload_threads", parallel.offload_threads, "must be >= 0");
  require(parallel.timeout_s > 0, "parallel.timeout_s", parallel.timeout_s, "must be positive");
  require(parallel.step_timeout_s > 0, "parallel.step_timeout_s", parallel.step_timeout_s, "must be positive");
  require(optim.muon_lr > 0, "optim.muon_lr", optim.muon_lr, "must be positive");
  require(optim.muon_momentum >= 0 && optim.muon_momentum < 1, "optim.muon_momentum", optim.muon_momentum,
          "must be in [0, 1)");
  require(checkpoint.every >= 0, "checkpoint.every", checkpoint.every, "must be >= 0");
  require(checkpoint.keep > 0, "checkpoint.keep", checkpoint.keep, "must be positive");
  require(log.every > 0, "log.every", log.every, "must be positive");
  require(log.peak_tflops >= 0, "log.peak_tflops", log.peak_tflops, "must be >= 0");
  require(profile.steps >= 0, "profile.steps", profile.steps, "must be >= 0");
  recompute_every();  // throws naming memory.activation_checkpointing
}

int64_t Config::recompute_every() const { return parse_checkpointing(memory.activation_checkpointing); }

int64_t Config::grad_accum_steps(int world_size) const {
  const int64_t per_micro = train.micro_batch * train.seq_len * world_size;
  if (per_micro <= 0 || train.batch_tokens % per_micro != 0) {
    bad("train.batch_tokens", to_text(train.batch_tokens),
        "must be a positive multiple of train.micro_batch x train.seq_len x ranks = " + to_text(train.micro_batch) +
            " x " + to_text(train.seq_len) + " x " + to_text(world_size) + " = " + to_text(per_micro));
  }
  return train.batch_tokens / per_micro;
}

std::vector<std::pair<std::string, std::string>> Config::table() const {
  Config copy = *this;
  auto options = bind_options(copy);
  std::vector<std::pair<std::string, std::string>> rows;
  for (auto& [name, show] : options.shown) rows.emplace_back(name, show());
  return rows;
}

ParseResult parse_config(int argc, const char* const argv[]) {
  ParseResult result;
  Config& cfg = result.config;
  OptionList options = bind_options(cfg);
  po::options_description generic("General");
  generic.add_options()("help,h", "print this help and exit")("config", po::value<std::string>(&cfg.config_file),
                                                              "INI file with [section] key = value lines");
  // Words that are not options are collected so the error can name them.
  std::vector<std::string> stray;
  po::options_description hidden;
  hidden.add_options()("gpt2-stray-args", po::value(&stray));
  po::positional_options_description positional;
  positional.add("gpt2-stray-args", -1);
  po::options_description all;
  all.add(generic).add(options.desc);
  po::options_description parsed_options;
  parsed_options.add(all).add(hidden);

  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(parsed_options).positional(positional).run(), vm);
  } catch (const po::error& e) {
    throw UserError(std::string("command line: ") + e.what() + " (see --help)");
  }
  if (vm.count("gpt2-stray-args")) {
    throw UserError("command line: unexpected argument '" +
                    vm["gpt2-stray-args"].as<std::vector<std::string>>().front() +
                    "' (options are --section.key=value; see --help)");
  }
  if (vm.count("help")) {
    std::ostringstream os;
    os << all;
    result.help = true;
    result.help_text = os.str();
    return result;
  }
  if (vm.count("config")) {
    const auto path = vm["config"].as<std::string>();
    // An ifstream opens a directory and reads it as empty: the defaults would train unasked.
    if (files::is_directory(path)) throw UserError("config file " + path + ": is a directory (give an .ini file)");
    std::ifstream in(path);
    if (!in) throw UserError("config file " + path + ": cannot open");
    try {
      // Values already stored from the command line win over the file.
      po::store(po::parse_config_file(in, options.desc, /*allow_unregistered=*/false), vm);
    } catch (const po::error& e) {
      throw UserError("config file " + path + ": " + e.what() + " (see --help for the keys)");
    }
  }
  try {
    po::notify(vm);
  } catch (const po::error& e) {
    throw UserError(std::string("config: ") + e.what());
  }
  // "none" spells an empty value (an option cannot be given an empty argument).
  for (std::string* optional : {&cfg.data.val, &cfg.log.metrics, &cfg.log.tensorboard, &cfg.train.init_from}) {
    if (*optional == "none") optional->clear();
  }
  cfg.validate();
  return result;
}

std::string LogConfig::tensorboard_dir() const {
  if (tensorboard != "auto") return tensorboard;
  return metrics.empty() ? "" : files::join(files::parent_path(metrics), "tensorboard");
}

}  // namespace gpt2
