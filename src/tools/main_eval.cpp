// gpt2-eval: mean cross-entropy and perplexity of a model (a checkpoint, a model file or a Hugging
// Face directory; src/io/model_weights.h) on token files, on one rank or several.
//   [mpirun -np N] gpt2-eval MODEL --data FILES [--seq_len T] [--batch B] [--windows W]
//                  [--device auto|cpu|cuda] [--dtype auto|fp32|bf16|fp16]
// The files are read as one stream cut into windows of T + 1 tokens at multiples of T (inputs are
// the first T, targets the last T), as the trainer's validation does: window w starts at w·T, and
// the trainer's val loss is this over its first eval_steps · micro_batch · ranks windows. Windows
// go to the ranks in batches of B, round robin; the token-weighted mean is reduced over the ranks.
// Rank 0 prints one line: "loss L | perplexity P | W windows x T tokens = N tokens | MODEL".
// Exit 0 ok, 2 bad input (named), 1 anything else.
#include <torch/torch.h>
#include <boost/program_options.hpp>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "data/batch_sampler.h"
#include "data/token_stream.h"
#include "parallel/rank_env.h"
#include "src/base/errors.h"
#include "src/base/log.h"
#include "src/io/model_weights.h"
#include "src/tools/command_line.h"

namespace po = boost::program_options;

namespace {

struct Options {
  std::string model, data;
  gpt2::DeviceChoice device = gpt2::DeviceChoice::kAuto;
  gpt2::DtypeChoice dtype = gpt2::DtypeChoice::kAuto;
  gpt2::tools::QuantOptions quant;
  int64_t seq_len = 0, batch = 8, windows = 0;  // seq_len 0 = the model's block_size; windows 0 = all
};

constexpr char kUsage[] =
    "usage: gpt2-eval MODEL --data FILES [options]\n"
    "Mean cross-entropy (nats per token) and perplexity of MODEL (a checkpoint, a model file or a\n"
    "Hugging Face directory) on token files (a path, a comma list or a glob), over windows of\n"
    "seq_len + 1 tokens at multiples of seq_len: the windows the trainer's validation reads.";

std::optional<Options> parse_options(int argc, char** argv) {
  Options o;
  po::options_description named("options");
  named.add_options()("help,h", "this help")("model", po::value(&o.model),
                                             "MODEL (also the first positional argument)")(
      "data", po::value(&o.data), "token file(s): path, comma list or glob")(
      "seq_len", po::value(&o.seq_len)->default_value(o.seq_len), "tokens per window; 0 = the model's block_size")(
      "batch", po::value(&o.batch)->default_value(o.batch), "windows per forward pass")(
      "windows", po::value(&o.windows)->default_value(o.windows), "windows to evaluate from the start; 0 = all")(
      "device", gpt2::tools::choice_value("device", &o.device), "auto | cpu | cuda")(
      "dtype", gpt2::tools::choice_value("dtype", &o.dtype),
      "auto (a checkpoint's training dtype; else bf16 on cuda, fp32 on cpu) | fp32 | bf16 | fp16");
  gpt2::tools::add_quant_options(named, &o.quant);
  po::positional_options_description positional;
  positional.add("model", 1);
  po::variables_map vm;
  if (!gpt2::tools::parse_command_line(argc, argv, "gpt2-eval", kUsage, named, positional, vm)) return std::nullopt;
  if (o.model.empty()) throw gpt2::UserError("no MODEL given (see gpt2-eval --help)");
  if (o.data.empty()) throw gpt2::UserError("no --data given (see gpt2-eval --help)");
  if (o.seq_len < 0) throw gpt2::UserError("--seq_len = " + std::to_string(o.seq_len) + ": must be >= 0");
  if (o.batch < 1) throw gpt2::UserError("--batch = " + std::to_string(o.batch) + ": must be >= 1");
  if (o.windows < 0) throw gpt2::UserError("--windows = " + std::to_string(o.windows) + ": must be >= 0");
  return o;
}

int run(int argc, char** argv, const gpt2::parallel::RankEnv& env) {
  const auto parsed = parse_options(argc, argv);
  if (!parsed) return gpt2::kExitOk;
  const Options& o = *parsed;

  gpt2::InferenceModel loaded =
      gpt2::load_model_to_run(o.model, o.device, o.dtype, /*auto_trained=*/true, o.quant.quant, o.quant.group);
  const gpt2::GPT2Config& config = loaded.source.config;
  const int64_t T = o.seq_len > 0 ? o.seq_len : config.block_size;
  if (T > config.block_size) {
    throw gpt2::UserError("--seq_len = " + std::to_string(T) + ": longer than the model's block_size " +
                          std::to_string(config.block_size));
  }
  const auto stream = gpt2::data::TokenStream::open(o.data, config.vocab_size, "--data");
  int64_t windows = gpt2::data::BatchSampler(stream.size(), T, 0, "--data = " + o.data).num_windows();
  if (o.windows > windows) {
    throw gpt2::UserError("--windows = " + std::to_string(o.windows) + ": the data holds only " +
                          std::to_string(windows) + " windows of " + std::to_string(T + 1) + " tokens");
  }
  if (o.windows > 0) windows = o.windows;

  // Batches of windows, round robin over the ranks; sums in float64.
  torch::NoGradGuard no_grad;
  double loss_sum = 0, tokens = 0;
  std::vector<int64_t> buffer;
  std::string bad_id;  // a token id outside the vocabulary in this rank's windows (other ranks read others)
  try {
    for (int64_t first = o.batch * env.rank(); first < windows; first += o.batch * env.world_size()) {
      const int64_t rows = std::min(o.batch, windows - first);
      buffer.resize(static_cast<size_t>(rows * (T + 1)));
      for (int64_t r = 0; r < rows; ++r) {
        stream.read_ids((first + r) * T, T + 1, buffer.data() + r * (T + 1), config.vocab_size,
                        "the model's vocab_size");
      }
      const auto all = torch::from_blob(buffer.data(), {rows, T + 1}, torch::kLong).to(loaded.device);
      const auto x = all.narrow(1, 0, T), y = all.narrow(1, 1, T);  // (rows, T) each
      loss_sum += loaded.model->loss(x.contiguous(), y.contiguous()).item<double>() * static_cast<double>(rows * T);
      tokens += static_cast<double>(rows * T);
    }
  } catch (const gpt2::UserError& e) {
    bad_id = e.what();
  }
  const std::vector<double> sums = env.all_reduce_sum({loss_sum, tokens, bad_id.empty() ? 0.0 : 1.0});
  if (sums[2] > 0) {  // every rank exits 2; the ranks that found one say where
    if (!bad_id.empty()) std::cerr << "gpt2-eval: " << bad_id << "\n";
    return gpt2::kExitUsage;
  }
  const double loss = sums[0] / sums[1];
  if (env.is_main()) {
    std::printf("loss %.6f | perplexity %.4f | %lld windows x %lld tokens = %.0f tokens | %s\n", loss, std::exp(loss),
                (long long)windows, (long long)T, sums[1], loaded.source.describe().c_str());
    std::fflush(stdout);
  }
  return gpt2::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gpt2;
  const auto process = parallel::MpiProcess::start("gpt2-eval", &argc, &argv);
  if (!process) return kExitFailure;
  const parallel::RankEnv& env = process->env;
  // Bad input is the same on every rank: each exits 2 on its own, rank 0 says why.
  try {
    return run(argc, argv, env);
  } catch (const UserError& e) {
    if (env.is_main()) std::cerr << "gpt2-eval: " << e.what() << "\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "gpt2-eval failed on rank " << env.rank() << ": " << error_message(e) << "\n";
    parallel::RankEnv::abort(kExitFailure);
  }
}
