// gpt2-generate: sample text from a trained model (a checkpoint, a model file, or a Hugging Face
// directory; src/io/model_weights.h) with a KV cache, on CPU or GPU, a batch of prompts at a time.
//   gpt2-generate MODEL [--prompt TEXT]... [--prompt_file FILE] [--max_new_tokens N]
//                 [--temperature T] [--top_k K] [--top_p P] [--seed S] [--device auto|cpu|cuda]
//                 [--dtype auto|fp32|bf16|fp16] [--ids] [--no_kv_cache] [--ignore_eot] [--cuda_graphs BOOL]
//                 [--fused_decode BOOL] [--one_kernel_decode BOOL]
// One prompt streams its tokens to stdout as they come; on CUDA it is decoded on the server's
// one-row slot path (src/serve/generate_one.h: CUDA graphs), elsewhere, and for several prompts (one
// batch, printed when done), by src/model/generate.h (on the CPU that path measured faster). Text
// stops before the <|endoftext|> that ended a sample (--ids prints it). Speed goes to stderr. Exit 0 ok, 2 bad input
// (named), 1 anything else. defines: main. uses: generate, serve::generate_one, Gpt2Tokenizer (data/).
#include <torch/torch.h>
#include <boost/program_options.hpp>

#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "data/bpe_tokenizer.h"
#include "data/unicode_tables.h"
#include "src/base/decimal.h"
#include "src/base/errors.h"
#include "src/base/log.h"
#include "src/io/model_weights.h"
#include "src/model/generate.h"
#include "src/serve/generate_one.h"
#include "src/tools/command_line.h"

namespace po = boost::program_options;
namespace data = gpt2::data;

namespace {

struct Options {
  std::string model;
  std::vector<std::string> prompts;
  std::string prompt_file;
  gpt2::SamplingOptions sampling;
  gpt2::DeviceChoice device = gpt2::DeviceChoice::kAuto;
  gpt2::DtypeChoice dtype = gpt2::DtypeChoice::kAuto;
  gpt2::tools::QuantOptions quant;
  std::string tokenizer_dir;
  bool ids = false, ignore_eot = false, cuda_graphs = true, fused_decode = true, one_kernel_decode = false;
};

constexpr char kUsage[] =
    "usage: gpt2-generate MODEL [--prompt TEXT]... [--prompt_file FILE] [options]\n"
    "Samples from MODEL: a checkpoint directory or root (checkpoint.dir), a model file (gpt2-ckpt\n"
    "consolidate / import-hf) or a Hugging Face GPT-2 directory (config.json + model.safetensors).\n"
    "No prompt: one unconditional sample (starting from <|endoftext|>). --prompt_file: one prompt\n"
    "per line (\\n inside a line stands for a newline). All prompts run as one batch.";

std::optional<Options> parse_options(int argc, char** argv) {
  Options o;
  auto& s = o.sampling;
  s.max_new_tokens = 128;
  s.temperature = 0.8;
  s.top_k = 200;
  s.seed = 1337;
  po::options_description named("options");
  named.add_options()("help,h", "this help")("model", po::value(&o.model),
                                             "MODEL (also the first positional argument)")(
      "prompt", po::value(&o.prompts), "a prompt (repeat for a batch)")("prompt_file", po::value(&o.prompt_file),
                                                                        "prompts, one per line")(
      "max_new_tokens", po::value(&s.max_new_tokens)->default_value(s.max_new_tokens), "tokens to sample per prompt")(
      "temperature", po::value(&s.temperature)->default_value(s.temperature, gpt2::decimal(s.temperature)),
      "0 = greedy")("top_k", po::value(&s.top_k)->default_value(s.top_k), "keep the k most likely ids; 0 = all")(
      "top_p", po::value(&s.top_p)->default_value(s.top_p, gpt2::decimal(s.top_p)),
      "nucleus: keep ids until their mass reaches p; 1 = off")("seed", po::value(&s.seed)->default_value(s.seed),
                                                               "sampling seed")(
      "device", gpt2::tools::choice_value("device", &o.device), "auto | cpu | cuda")(
      "dtype", gpt2::tools::choice_value("dtype", &o.dtype), "auto (bf16 on cuda, fp32 on cpu) | fp32 | bf16 | fp16")(
      "tokenizer_dir", po::value(&o.tokenizer_dir), "encoder.json + vocab.bpe (default: data/tokenizer/gpt2)")(
      "ids", po::bool_switch(&o.ids), "prompts and output are token ids separated by spaces (no tokenizer)")(
      "no_kv_cache", "recompute the whole context for every token (slow; the reference)")(
      "ignore_eot", po::bool_switch(&o.ignore_eot), "keep sampling after <|endoftext|>")(
      "cuda_graphs", po::value(&o.cuda_graphs)->default_value(true, "true"),
      "one prompt on CUDA: replay each decode step (and the prefill) from a CUDA graph")(
      "fused_decode", po::value(&o.fused_decode)->default_value(true, "true"),
      "on CUDA: decode steps of up to 8 rows through the fused kernels (false: the blocks' ops)")(
      "one_kernel_decode", po::value(&o.one_kernel_decode)->default_value(false, "false"),
      "with --fused_decode: the whole step as one cooperative kernel (false: five kernels a block; the same bits)");
  gpt2::tools::add_quant_options(named, &o.quant);
  po::positional_options_description positional;
  positional.add("model", 1);
  po::variables_map vm;
  if (!gpt2::tools::parse_command_line(argc, argv, "gpt2-generate", kUsage, named, positional, vm)) return std::nullopt;
  if (o.model.empty()) throw gpt2::UserError("no MODEL given (see gpt2-generate --help)");
  s.kv_cache = vm.count("no_kv_cache") == 0;
  return o;
}

std::vector<std::string> read_prompt_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw gpt2::UserError("--prompt_file = " + path + ": cannot open");
  std::vector<std::string> prompts;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    std::string text;  // "\n" in a line stands for a newline
    for (size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '\\' && i + 1 < line.size() && line[i + 1] == 'n') {
        text += '\n';
        ++i;
      } else {
        text += line[i];
      }
    }
    prompts.push_back(text);
  }
  if (prompts.empty()) throw gpt2::UserError("--prompt_file = " + path + ": no prompts in it");
  return prompts;
}

std::vector<int64_t> parse_ids(const std::string& text, int64_t vocab) {
  std::istringstream in(text);
  std::vector<int64_t> ids;
  std::string word;
  while (in >> word) {
    size_t used = 0;
    int64_t id = -1;
    try {
      id = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size() || id < 0 || id >= vocab) {
      throw gpt2::UserError("--ids prompt '" + text + "': '" + word + "' is not a token id in [0, " +
                            std::to_string(vocab) + ")");
    }
    ids.push_back(id);
  }
  return ids;
}

int run(int argc, char** argv) {
  const auto parsed = parse_options(argc, argv);
  if (!parsed) return gpt2::kExitOk;
  Options o = *parsed;

  gpt2::InferenceModel loaded =
      gpt2::load_model_to_run(o.model, o.device, o.dtype, false, o.quant.quant, o.quant.group);
  gpt2::GPT2& model = loaded.model;
  model->set_fused_decode(o.fused_decode);
  model->set_one_kernel_decode(o.one_kernel_decode);
  const gpt2::WeightsSource& source = loaded.source;
  const torch::Device device = loaded.device;
  const char* dtype = gpt2::choice_name(loaded.dtype);
  const int64_t vocab = source.config.vocab_size;

  std::optional<data::Gpt2Tokenizer> tokenizer;
  if (!o.ids) {
    tokenizer.emplace(
        data::Gpt2Tokenizer::load(o.tokenizer_dir.empty() ? data::find_default_tokenizer_dir() : o.tokenizer_dir));
  }
  const int64_t eot = tokenizer ? tokenizer->eot_token() : 50256;
  o.sampling.stop_token = o.ignore_eot || eot >= vocab ? -1 : eot;

  std::vector<std::string> texts = o.prompts;
  if (!o.prompt_file.empty()) {
    for (auto& p : read_prompt_file(o.prompt_file)) texts.push_back(p);
  }
  std::vector<std::vector<int64_t>> prompts;
  for (const auto& text : texts) {
    if (o.ids) {
      prompts.push_back(parse_ids(text, vocab));
    } else {
      const auto ids = tokenizer->encode(text, "--prompt");
      prompts.emplace_back(ids.begin(), ids.end());
    }
    if (prompts.back().empty()) prompts.back().push_back(eot);  // "" = unconditional
  }
  if (prompts.empty()) prompts.push_back({eot});

  auto decode = [&](const std::vector<int64_t>& ids) {
    if (!tokenizer) {
      std::string s;
      for (size_t i = 0; i < ids.size(); ++i) s += (i ? " " : "") + std::to_string(ids[i]);
      return s;
    }
    return tokenizer->decode(std::vector<int32_t>(ids.begin(), ids.end()));
  };

  gpt2::validate_generation(source.config, prompts, o.sampling);  // before anything is printed
  // Weights as held on the device: parameters (emptied where int8 replaced them) plus int8 codes and scales.
  int64_t weight_bytes = 0;
  for (const auto& p : model->parameters()) weight_bytes += static_cast<int64_t>(p.nbytes());
  for (const auto& [name, w] : model->int8_weights()) weight_bytes += w->bytes();
  gpt2::log::info("gpt2-generate: ", source.describe(), ", ", model->num_parameters() / 1e6, "M parameters, ",
                  device.str(), " ", dtype, ", weights ", gpt2::log::format("%.1f", weight_bytes / 1048576.0), " MiB, ",
                  prompts.size(), " prompt(s), ",
                  o.sampling.kv_cache ? "KV cache" : "no KV cache (full recomputation)");
  // One prompt streams: its text, then every token as it comes (whole UTF-8 characters only).
  const bool stream = prompts.size() == 1;
  std::string pending;
  gpt2::TokenCallback on_tokens;
  if (stream) {
    std::cout << (o.ids ? decode(prompts[0]) : data::unicode::to_valid_utf8(decode(prompts[0]))) << std::flush;
    on_tokens = [&](const std::vector<int64_t>& ids) {
      if (ids[0] < 0 || (!o.ids && ids[0] == o.sampling.stop_token)) return;  // text ends at <|endoftext|>
      pending += o.ids ? " " + std::to_string(ids[0]) : decode({ids[0]});
      const size_t n = o.ids ? pending.size() : data::unicode::complete_utf8_prefix(pending);
      std::cout << pending.substr(0, n) << std::flush;
      pending.erase(0, n);
    };
  }
  gpt2::GenerationStats stats;
  const auto outputs = prompts.size() == 1 && o.sampling.kv_cache && device.is_cuda()
                           ? std::vector<std::vector<int64_t>>{gpt2::serve::generate_one(
                                 model, prompts[0], o.sampling, o.cuda_graphs, on_tokens, &stats)}
                           : gpt2::generate(model, prompts, o.sampling, on_tokens, &stats);
  if (stream) {
    std::cout << data::unicode::to_valid_utf8(pending) << "\n";
  } else {
    for (size_t i = 0; i < outputs.size(); ++i) {
      std::vector<int64_t> all = prompts[i];
      all.insert(all.end(), outputs[i].begin(), outputs[i].end());
      if (!o.ids && all.size() > prompts[i].size() && all.back() == o.sampling.stop_token) all.pop_back();
      std::cout << "=== sample " << i << " ===\n"
                << (o.ids ? decode(all) : data::unicode::to_valid_utf8(decode(all))) << "\n";
    }
  }
  std::cout.flush();
  const double seconds = stats.prefill_s + stats.decode_s;
  // The steps after the first: the first pays one-time work (a CUDA graph's capture), reported apart.
  const double later_ms = stats.steps > 1   ? 1000.0 * (stats.decode_s - stats.first_step_s) / (stats.steps - 1.0)
                          : stats.steps > 0 ? 1000.0 * stats.decode_s
                                            : 0.0;
  gpt2::log::info(gpt2::log::format(
      "generated %lld tokens for %zu prompt(s) in %.3f s: %.1f tokens/s (prefill of %lld tokens %.1f ms, "
      "then %.3f ms per step of the batch after the first, which took %.1f ms; %lld window restart(s))",
      (long long)stats.new_tokens, prompts.size(), seconds, seconds > 0 ? stats.new_tokens / seconds : 0.0,
      (long long)stats.prompt_tokens, 1000.0 * stats.prefill_s, later_ms, 1000.0 * stats.first_step_s,
      (long long)stats.rebuilds));
  return gpt2::kExitOk;
}

}  // namespace

int main(int argc, char** argv) { return gpt2::tools::run_main("gpt2-generate", argc, argv, run); }
