// Parsing and checking a completion request (see completion_request.h).
#include "src/serve/completion_request.h"

#include <cmath>

#include "data/bpe_tokenizer.h"
#include "src/base/errors.h"
#include "src/base/json.h"

namespace gpt2::serve {
namespace {

using json::Value;

[[noreturn]] void bad(const std::string& param, const std::string& message) { throw RequestError(400, param, message); }

// Runs a typed getter, turning its UserError ("max_tokens: expected an integer, got ...") into a
// RequestError that names the field.
template <typename Fn>
auto typed(const std::string& param, Fn&& get) {
  try {
    return get();
  } catch (const UserError& e) {
    bad(param, e.what());
  }
}

// A present, non-null member (null means "default", as the OpenAI API treats it).
const Value* member(const Value& body, const char* key) {
  const Value* v = json::find(body, key);
  return v == nullptr || v->is_null() ? nullptr : v;
}

std::vector<int64_t> token_ids(const Value& list, const std::string& param, const CompletionLimits& limits) {
  std::vector<int64_t> ids;
  ids.reserve(list.size());
  for (const Value& v : list) {
    const int64_t id = typed(param, [&] { return json::as_int(v, param); });
    if (id < 0 || id >= limits.vocab_size) {
      bad(param,
          param + ": token id " + std::to_string(id) + " is outside [0, " + std::to_string(limits.vocab_size) + ")");
    }
    ids.push_back(id);
  }
  return ids;
}

std::vector<int64_t> encode(const std::string& text, const std::string& param, const data::Gpt2Tokenizer& tokenizer) {
  const auto ids = typed(param, [&] { return tokenizer.encode(text, param); });
  return {ids.begin(), ids.end()};
}

// prompt: "text" | ["text", ...] | [id, ...] | [[id, ...], ...]
std::vector<std::vector<int64_t>> prompts_of(const Value& body, const data::Gpt2Tokenizer& tokenizer,
                                             const CompletionLimits& limits) {
  const Value* p = member(body, "prompt");
  if (p == nullptr) bad("prompt", "prompt is required");
  std::vector<std::vector<int64_t>> prompts;
  if (p->is_string()) {
    prompts.push_back(encode(p->get_ref<const std::string&>(), "prompt", tokenizer));
  } else if (p->is_array()) {
    if (p->empty()) bad("prompt", "prompt is an empty list");
    if (p->front().is_number()) {
      prompts.push_back(token_ids(*p, "prompt", limits));
    } else {
      if (static_cast<int64_t>(p->size()) > limits.max_prompts) {
        bad("prompt", "prompt holds " + std::to_string(p->size()) + " prompts, at most " +
                          std::to_string(limits.max_prompts) + " are served in one request");
      }
      for (size_t i = 0; i < p->size(); ++i) {
        const Value& item = (*p)[i];
        const std::string name = "prompt[" + std::to_string(i) + "]";
        if (item.is_string()) {
          prompts.push_back(encode(item.get_ref<const std::string&>(), name, tokenizer));
        } else if (item.is_array()) {
          prompts.push_back(token_ids(item, name, limits));
        } else {
          bad("prompt", name + ": expected a string or a list of token ids, got " + json::dump(item));
        }
      }
    }
  } else {
    bad("prompt", "prompt: expected a string, a list of strings or a list of token ids, got " + json::dump(*p));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) {
      bad("prompt", prompts.size() == 1 ? "prompt is empty" : "prompt[" + std::to_string(i) + "] is empty");
    }
  }
  return prompts;
}

}  // namespace

CompletionRequest parse_completion_request(std::string_view text, const data::Gpt2Tokenizer& tokenizer,
                                           const CompletionLimits& limits) {
  const Value body = typed("", [&] { return json::parse(text, "request body"); });
  if (!body.is_object()) bad("", "the request body must be a JSON object, got " + std::string(body.type_name()));
  CompletionRequest r;

  if (const Value* v = member(body, "model")) {
    const auto& name = typed("model", [&] { return json::as_string(*v, "model"); });
    if (name != limits.model_name) {
      throw RequestError(
          404, "model",
          "model '" + name + "' is not served here; this server serves '" + limits.model_name + "' (GET /v1/models)");
    }
  }
  r.prompts = prompts_of(body, tokenizer, limits);

  if (const Value* v = member(body, "max_tokens")) {
    r.max_tokens = typed("max_tokens", [&] { return json::as_int(*v, "max_tokens"); });
    if (r.max_tokens < 1) bad("max_tokens", "max_tokens must be >= 1, got " + std::to_string(r.max_tokens));
  }
  if (const Value* v = member(body, "temperature")) {
    r.temperature = typed("temperature", [&] { return json::as_double(*v, "temperature"); });
    if (!(r.temperature >= 0.0 && r.temperature <= 2.0)) {
      bad("temperature", "temperature must be in [0, 2] (0 = greedy), got " + json::dump(*v));
    }
  }
  if (const Value* v = member(body, "top_p")) {
    r.top_p = typed("top_p", [&] { return json::as_double(*v, "top_p"); });
    if (!(r.top_p > 0.0 && r.top_p <= 1.0)) bad("top_p", "top_p must be in (0, 1], got " + json::dump(*v));
  }
  if (const Value* v = member(body, "top_k")) {
    r.top_k = typed("top_k", [&] { return json::as_int(*v, "top_k"); });
    if (r.top_k < -1) bad("top_k", "top_k must be >= 0, or -1 or 0 for the whole vocabulary, got " + json::dump(*v));
    if (r.top_k == -1) r.top_k = 0;
  }
  if (const Value* v = member(body, "seed")) {
    r.has_seed = true;
    r.seed = v->is_number_unsigned() ? v->get<uint64_t>()
                                     : static_cast<uint64_t>(typed("seed", [&] { return json::as_int(*v, "seed"); }));
  }
  if (const Value* v = member(body, "stop")) {
    if (v->is_string()) {
      r.stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      for (const Value& s : *v) r.stop.push_back(typed("stop", [&] { return json::as_string(s, "stop"); }));
    } else {
      bad("stop", "stop: expected a string or a list of strings, got " + json::dump(*v));
    }
    if (r.stop.size() > 4) bad("stop", "stop holds " + std::to_string(r.stop.size()) + " strings, at most 4");
    for (const auto& s : r.stop) {
      if (s.empty()) bad("stop", "stop strings must not be empty");
    }
  }
  if (const Value* v = member(body, "stream")) r.stream = typed("stream", [&] { return json::as_bool(*v, "stream"); });
  if (const Value* v = member(body, "stream_options")) {
    if (!v->is_object()) bad("stream_options", "stream_options: expected an object, got " + json::dump(*v));
    if (!r.stream) bad("stream_options", "stream_options is only allowed with stream = true");
    if (const Value* u = member(*v, "include_usage")) {
      r.include_usage = typed("stream_options", [&] { return json::as_bool(*u, "stream_options.include_usage"); });
    }
  }
  if (const Value* v = member(body, "ignore_eos"))
    r.ignore_eos = typed("ignore_eos", [&] { return json::as_bool(*v, "ignore_eos"); });
  if (const Value* v = member(body, "return_token_ids")) {
    r.return_token_ids = typed("return_token_ids", [&] { return json::as_bool(*v, "return_token_ids"); });
  }
  // OpenAI parameters this server does not implement: refused when they ask for something.
  if (const Value* v = member(body, "n")) {
    if (typed("n", [&] { return json::as_int(*v, "n"); }) != 1) bad("n", "n must be 1 (send several prompts instead)");
  }
  if (const Value* v = member(body, "best_of")) {
    if (typed("best_of", [&] { return json::as_int(*v, "best_of"); }) != 1) bad("best_of", "best_of must be 1");
  }
  if (const Value* v = member(body, "echo")) {
    if (typed("echo", [&] { return json::as_bool(*v, "echo"); })) bad("echo", "echo is not supported");
  }
  if (member(body, "logprobs") != nullptr) bad("logprobs", "logprobs are not supported");
  if (member(body, "suffix") != nullptr) bad("suffix", "suffix is not supported");
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    if (const Value* v = member(body, key)) {
      if (typed(key, [&] { return json::as_double(*v, key); }) != 0.0)
        bad(key, std::string(key) + " is not supported (0 only)");
    }
  }
  if (const Value* v = member(body, "logit_bias")) {
    if (!v->is_object() || !v->empty()) bad("logit_bias", "logit_bias is not supported");
  }

  // The context: every prompt and its new tokens must fit block_size (positions are absolute).
  for (size_t i = 0; i < r.prompts.size(); ++i) {
    const int64_t n = static_cast<int64_t>(r.prompts[i].size());
    const std::string which = r.prompts.size() == 1 ? "the prompt" : "prompt[" + std::to_string(i) + "]";
    if (n >= limits.block_size) {
      bad("prompt", which + " has " + std::to_string(n) + " tokens; this model's context is " +
                        std::to_string(limits.block_size) + " tokens, so at most " +
                        std::to_string(limits.block_size - 1) + " fit with one new token");
    }
    if (n + r.max_tokens > limits.block_size) {
      bad("max_tokens", "max_tokens = " + std::to_string(r.max_tokens) + " and " + which + "'s " + std::to_string(n) +
                            " tokens exceed this model's context of " + std::to_string(limits.block_size) +
                            " tokens: ask for at most " + std::to_string(limits.block_size - n));
    }
  }
  r.stop_token = r.ignore_eos || limits.eot_token >= limits.vocab_size ? -1 : limits.eot_token;
  return r;
}

}  // namespace gpt2::serve
