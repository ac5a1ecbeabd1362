#pragma once
// The body of an OpenAI-compatible `POST /v1/completions`, parsed and checked before anything is
// queued. Contract: parse_completion_request() returns every field resolved (defaults filled in,
// prompts as token ids) or throws RequestError whose `param` names the offending field, e.g.
// {"max_tokens", "max_tokens must be an integer >= 1, got -5"}; nothing it accepts can fail later
// for a reason the client controls. Prompts: a string, a list of strings, a list of token ids or a
// list of such lists (one choice each); prompt + max_tokens must fit the model's block_size (no
// window restart, unlike gpt2-generate: a client asking for more gets 400 rather than a sample
// that silently forgot its prompt).
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace gpt2::data {
class Gpt2Tokenizer;
}

namespace gpt2::serve {

// A request the server refuses: HTTP status, the field (empty: the body as a whole) and why.
class RequestError : public std::runtime_error {
 public:
  RequestError(int status, std::string param, const std::string& message)
      : std::runtime_error(message), status_(status), param_(std::move(param)) {}
  int status() const { return status_; }
  const std::string& param() const { return param_; }

 private:
  int status_;
  std::string param_;
};

struct CompletionLimits {
  int64_t block_size = 1024;   // prompt + max_tokens must fit (the model's context)
  int64_t vocab_size = 50257;  // token ids in prompts must be below it
  int64_t eot_token = 50256;   // ends a choice (finish_reason "stop") unless ignore_eos
  int64_t max_prompts = 64;    // choices per request
  std::string model_name;      // the one model served: `model` must name it when given
};

struct CompletionRequest {
  std::vector<std::vector<int64_t>> prompts;  // one per choice, token ids, each non-empty
  int64_t max_tokens = 16;                    // OpenAI's default
  double temperature = 1.0;                   // 0 = greedy
  double top_p = 1.0;
  int64_t top_k = 0;  // extension (vLLM): 0 or -1 = off
  bool has_seed = false;
  uint64_t seed = 0;
  std::vector<std::string> stop;  // up to 4 non-empty strings; the text ends before one
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  bool ignore_eos = false;        // extension (vLLM): go on past <|endoftext|>
  bool return_token_ids = false;  // extension (vLLM): choices[].token_ids, prompt_token_ids
  int64_t stop_token = -1;        // resolved: eot_token, or -1 with ignore_eos
};

CompletionRequest parse_completion_request(std::string_view body, const data::Gpt2Tokenizer& tokenizer,
                                           const CompletionLimits& limits);

}  // namespace gpt2::serve
