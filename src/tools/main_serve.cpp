// gpt2-serve: an OpenAI-compatible HTTP completion server with continuous batching.
//   gpt2-serve MODEL [--host 127.0.0.1] [--port 8000] [--device auto|cpu|cuda] [--dtype ...]
//              [--max_batch N] [--max_queue N] [--slot_attention auto|on|off] [--cuda_graphs true|false]
//              [--api_key KEY] [--model_name NAME] [...]
// MODEL as gpt2-generate takes it (a checkpoint, a model file, a Hugging Face directory). Logs
// `gpt2-serve: listening on http://HOST:PORT` once it serves; SIGTERM/SIGINT drain and exit 0.
// Exit 2 bad input (named), 1 anything else.
// defines: main. uses: Scheduler, Server (src/serve/), load_model_to_run (src/io/model_weights.h).
#include <torch/torch.h>
#include <boost/program_options.hpp>

#include <sys/resource.h>

#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>

#include "data/bpe_tokenizer.h"
#include "src/base/decimal.h"
#include "src/base/errors.h"
#include "src/base/files.h"
#include "src/base/log.h"
#include "src/io/model_weights.h"
#include "src/serve/completion_request.h"
#include "src/serve/http_server.h"
#include "src/serve/metrics.h"
#include "src/serve/scheduler.h"
#include "src/tools/command_line.h"

namespace po = boost::program_options;
namespace serve = gpt2::serve;

namespace {

constexpr char kApiKeyEnv[] = "GPT2_SERVE_API_KEY";

struct Options {
  std::string model, tokenizer_dir, model_name;
  gpt2::DeviceChoice device = gpt2::DeviceChoice::kAuto;
  gpt2::DtypeChoice dtype = gpt2::DtypeChoice::kAuto;
  gpt2::tools::QuantOptions quant;
  serve::ServerOptions server;
  serve::SchedulerOptions scheduler;
  int64_t max_prompts = 64;
  int port = 8000;
};

constexpr char kUsage[] =
    "usage: gpt2-serve MODEL [--host 127.0.0.1] [--port 8000] [options]\n"
    "Serves MODEL (a checkpoint, a model file or a Hugging Face GPT-2 directory) over HTTP:\n"
    "POST /v1/completions (OpenAI-compatible, \"stream\": true for server-sent events), GET /v1/models,\n"
    "GET /health, GET /metrics (Prometheus). Continuous batching: up to --max_batch sequences decode\n"
    "together, up to --max_queue more wait (then 503). The API key may also come from $GPT2_SERVE_API_KEY\n"
    "(better than --api_key, which other users can see in the process list).";

std::optional<Options> parse_options(int argc, char** argv) {
  Options o;
  auto& s = o.server;
  po::options_description named("options");
  named.add_options()("help,h", "this help")("model", po::value(&o.model),
                                             "MODEL (also the first positional argument)")(
      "host", po::value(&s.host)->default_value(s.host),
      "address to listen on (another than loopback exposes the server)")(
      "port", po::value(&o.port)->default_value(o.port), "TCP port; 0 = any free one (logged)")(
      "device", gpt2::tools::choice_value("device", &o.device), "auto | cpu | cuda")(
      "dtype", gpt2::tools::choice_value("dtype", &o.dtype), "auto (bf16 on cuda, fp32 on cpu) | fp32 | bf16 | fp16")(
      "max_batch", po::value(&o.scheduler.max_batch)->default_value(o.scheduler.max_batch),
      "batch slots: sequences decoded together")(
      "max_queue", po::value(&o.scheduler.max_queue)->default_value(o.scheduler.max_queue),
      "sequences waiting for a slot before 503")(
      "attend_block", po::value(&o.scheduler.attend_block)->default_value(o.scheduler.attend_block),
      "0: decode steps attend over the whole context (a request's logits are the same bits in any batch); "
      "N: over the longest active sequence rounded up to N (faster for short sequences, last-bit differences)")(
      "prefill_batch", po::value(&o.scheduler.prefill_batch)->default_value(o.scheduler.prefill_batch),
      "1: each prompt prefilled alone (its bits independent of the company; on cuda padded to a multiple of "
      "64 positions and replayed from a CUDA graph); N: up to N prompts of one length per forward (last-bit "
      "differences with the company)")(
      "slot_attention", gpt2::tools::choice_value("slot_attention", &o.scheduler.slot_attention),
      "auto | on | off. on: decode steps attend through a kernel that reads each row's own context only "
      "(the same bits in any batch; --attend_block no longer matters); off: attention over --attend_block "
      "positions of every row under a mask; auto: on")(
      "cuda_graphs", po::value(&o.scheduler.cuda_graphs)->default_value(o.scheduler.cuda_graphs, "true"),
      "true: on CUDA, decode steps and prefills replay CUDA graphs (the same tokens, less host time); false: "
      "their kernels launch one by one. Ignored on cpu")(
      "api_key", po::value(&s.api_key), "require 'Authorization: Bearer KEY' (default: $GPT2_SERVE_API_KEY)")(
      "model_name", po::value(&o.model_name), "the model's name in the API (default: MODEL's last path component)")(
      "tokenizer_dir", po::value(&o.tokenizer_dir), "encoder.json + vocab.bpe (default: data/tokenizer/gpt2)")(
      "max_body_bytes", po::value(&s.max_body_bytes)->default_value(s.max_body_bytes), "larger request bodies get 413")(
      "max_prompts", po::value(&o.max_prompts)->default_value(o.max_prompts), "prompts (choices) per request")(
      "read_timeout_s", po::value(&s.read_timeout_s)->default_value(s.read_timeout_s, gpt2::decimal(s.read_timeout_s)),
      "a request must arrive in full within this (also the keep-alive idle limit)")(
      "write_timeout_s",
      po::value(&s.write_timeout_s)->default_value(s.write_timeout_s, gpt2::decimal(s.write_timeout_s)),
      "a client must take each write within this")(
      "shutdown_timeout_s",
      po::value(&s.shutdown_timeout_s)->default_value(s.shutdown_timeout_s, gpt2::decimal(s.shutdown_timeout_s)),
      "SIGTERM: how long requests in flight may go on")(
      "io_threads", po::value(&s.io_threads)->default_value(s.io_threads), "threads serving connections")(
      "max_connections", po::value(&s.max_connections)->default_value(s.max_connections),
      "open connections; more get 503 (the descriptor limit is raised to allow them)");
  gpt2::tools::add_quant_options(named, &o.quant);
  po::positional_options_description positional;
  positional.add("model", 1);
  po::variables_map vm;
  if (!gpt2::tools::parse_command_line(argc, argv, "gpt2-serve", kUsage, named, positional, vm)) return std::nullopt;
  if (o.model.empty()) throw gpt2::UserError("no MODEL given (see gpt2-serve --help)");
  if (o.port < 0 || o.port > 65535)
    throw gpt2::UserError("--port must be in [0, 65535], got " + std::to_string(o.port));
  s.port = static_cast<uint16_t>(o.port);
  if (vm.count("api_key") == 0) {
    if (const char* key = std::getenv(kApiKeyEnv)) s.api_key = key;
  }
  if (s.max_body_bytes < 1) throw gpt2::UserError("--max_body_bytes must be >= 1");
  if (o.max_prompts < 1) throw gpt2::UserError("--max_prompts must be >= 1");
  if (s.io_threads < 1) throw gpt2::UserError("--io_threads must be >= 1");
  if (s.max_connections < 1) throw gpt2::UserError("--max_connections must be >= 1");
  for (auto [value, key] :
       {std::pair{s.read_timeout_s, "--read_timeout_s"}, std::pair{s.write_timeout_s, "--write_timeout_s"},
        std::pair{s.shutdown_timeout_s, "--shutdown_timeout_s"}}) {
    if (!(value > 0)) throw gpt2::UserError(std::string(key) + " must be > 0");
  }
  if (o.model_name.empty()) {
    std::string path = o.model;
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    o.model_name = path.substr(path.find_last_of('/') + 1);
  }
  return o;
}

// Every connection holds a descriptor: raise the soft limit (often 1024) to the hard one, and say
// when that still falls short of --max_connections.
void raise_descriptor_limit(int64_t connections) {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  if (lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);  // best effort: the check below tells what we have
    getrlimit(RLIMIT_NOFILE, &lim);
  }
  if (lim.rlim_cur != RLIM_INFINITY && static_cast<int64_t>(lim.rlim_cur) < connections + 64) {
    gpt2::log::warn("gpt2-serve: the descriptor limit is ", lim.rlim_cur, ", below --max_connections (", connections,
                    ") + 64: accepting may fail before the limit answers 503");
  }
}

int run(int argc, char** argv) {
  const auto parsed = parse_options(argc, argv);
  if (!parsed) return gpt2::kExitOk;
  const Options& o = *parsed;
  raise_descriptor_limit(o.server.max_connections);

  gpt2::InferenceModel loaded =
      gpt2::load_model_to_run(o.model, o.device, o.dtype, false, o.quant.quant, o.quant.group);
  const auto tokenizer = gpt2::data::Gpt2Tokenizer::load(
      o.tokenizer_dir.empty() ? gpt2::data::find_default_tokenizer_dir() : o.tokenizer_dir);
  const gpt2::GPT2Config& cfg = loaded.source.config;

  serve::CompletionLimits limits;
  limits.block_size = cfg.block_size;
  limits.vocab_size = cfg.vocab_size;
  limits.eot_token = tokenizer.eot_token();
  limits.max_prompts = o.max_prompts;
  limits.model_name = o.model_name;

  // Keys and values of every layer for max_batch x block_size positions (the scheduler's slots).
  const double kv_mib = 2.0 * static_cast<double>(cfg.n_layer * o.scheduler.max_batch * cfg.block_size * cfg.n_embd) *
                        static_cast<double>(loaded.model->parameters().front().element_size()) / (1 << 20);
  serve::Metrics metrics(o.scheduler.max_batch);
  serve::Scheduler scheduler(loaded.model, tokenizer, o.scheduler, metrics);
  serve::Server server(o.server, scheduler, tokenizer, limits, metrics);
  const uint16_t port = server.listen();
  const std::string weights = loaded.int8_group < 0 ? ""
                              : loaded.int8_group == 0
                                  ? " with int8 weights (a scale a row)"
                                  : gpt2::log::format(" with int8 weights (a scale per %lld columns)",
                                                      static_cast<long long>(loaded.int8_group));
  gpt2::log::info(
      "gpt2-serve: ", loaded.source.describe(), " as '", o.model_name, "', ", loaded.model->num_parameters() / 1e6,
      "M parameters, ", loaded.device.str(), " ", gpt2::choice_name(loaded.dtype), weights, ", context ",
      cfg.block_size, ", max_batch ", o.scheduler.max_batch, ", max_queue ", o.scheduler.max_queue, ", attend_block ",
      o.scheduler.attend_block, ", prefill_batch ", o.scheduler.prefill_batch, ", slot_attention ",
      gpt2::choice_name(o.scheduler.slot_attention), scheduler.slot_attention_on() ? " (on)" : " (off)",
      ", cuda_graphs ", scheduler.cuda_graphs_on() ? "on" : "off", ", fused decode step ",
      scheduler.fused_decode_on() ? "on" : "off (on CUDA with --max_batch 8 or less)", ", KV cache ",
      gpt2::log::format("%.0f", kv_mib), " MiB", o.server.api_key.empty() ? ", no API key" : ", API key required");
  gpt2::log::info("gpt2-serve: listening on http://", o.server.host, ":", port);
  gpt2::log::flush();
  server.run();
  scheduler.cancel_all();  // run() returns once nothing is in flight, or after cancelling it
  scheduler.stop();
  gpt2::log::info("gpt2-serve: stopped");
  return gpt2::kExitOk;
}

}  // namespace

int main(int argc, char** argv) { return gpt2::tools::run_main("gpt2-serve", argc, argv, run); }
