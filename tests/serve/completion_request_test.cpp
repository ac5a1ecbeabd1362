// parse_completion_request and TextStream on their own (tests/python/test_serve.py reaches them
// only through the HTTP server). References: GPT-2's ids for short strings as tiktoken's "gpt2"
// gives them ("Hello" = 15496, " world" = 995; tests/python/test_tokenizer_tiktoken.py checks our
// tokenizer against it), hand-written expected texts, and the request's own limits.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "data/bpe_tokenizer.h"
#include "src/serve/completion_request.h"
#include "src/serve/text_stream.h"
#include "tests/test_util.h"

namespace gpt2::serve {
namespace {

const data::Gpt2Tokenizer& tokenizer() {
  static const data::Gpt2Tokenizer t = data::Gpt2Tokenizer::load(test::tokenizer_dir());
  return t;
}

CompletionLimits limits(int64_t block_size = 1024) {
  CompletionLimits l;
  l.block_size = block_size;
  l.model_name = "tiny";
  return l;
}

CompletionRequest parse(const std::string& body, int64_t block_size = 1024) {
  return parse_completion_request(body, tokenizer(), limits(block_size));
}

// The status, field and a piece of the message of the refusal of `body`.
struct Refusal {
  std::string body;
  int status;
  std::string param, says;
};

void expect_refused(const Refusal& c, int64_t block_size = 1024) {
  try {
    parse(c.body, block_size);
    ADD_FAILURE() << c.body << ": accepted";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.status(), c.status) << c.body;
    EXPECT_EQ(e.param(), c.param) << c.body;
    EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << c.body << ": " << e.what();
  }
}

TEST(CompletionRequest, DefaultsAreOpenAIs) {
  const auto r = parse(R"({"prompt": "Hello"})");
  EXPECT_EQ(r.prompts, (std::vector<std::vector<int64_t>>{{15496}}));
  EXPECT_EQ(r.max_tokens, 16);
  EXPECT_EQ(r.temperature, 1.0);
  EXPECT_EQ(r.top_p, 1.0);
  EXPECT_EQ(r.top_k, 0);
  EXPECT_FALSE(r.has_seed);
  EXPECT_TRUE(r.stop.empty());
  EXPECT_FALSE(r.stream || r.include_usage || r.ignore_eos || r.return_token_ids);
  EXPECT_EQ(r.stop_token, 50256);
}

TEST(CompletionRequest, EveryPromptFormIsOneChoiceEach) {
  using Prompts = std::vector<std::vector<int64_t>>;
  EXPECT_EQ(parse(R"({"prompt": "Hello world"})").prompts, (Prompts{{15496, 995}}));
  EXPECT_EQ(parse(R"({"prompt": ["Hello", " world"]})").prompts, (Prompts{{15496}, {995}}));
  EXPECT_EQ(parse(R"({"prompt": [15496, 995]})").prompts, (Prompts{{15496, 995}}));
  EXPECT_EQ(parse(R"({"prompt": [[15496], [995, 15496]]})").prompts, (Prompts{{15496}, {995, 15496}}));
  EXPECT_EQ(parse(R"({"prompt": ["Hello", [995]]})").prompts, (Prompts{{15496}, {995}}));
}

TEST(CompletionRequest, ValuesAreReadAndNullMeansTheDefault) {
  const auto r = parse(R"({"model": "tiny", "prompt": [1], "max_tokens": 5, "temperature": 0, "top_p": 0.5,
                           "top_k": -1, "seed": 18446744073709551615, "stop": ["\n", "END"], "stream": true,
                           "stream_options": {"include_usage": true}, "ignore_eos": true,
                           "return_token_ids": true, "n": 1, "best_of": 1, "echo": false,
                           "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}})");
  EXPECT_EQ(r.max_tokens, 5);
  EXPECT_EQ(r.temperature, 0.0);
  EXPECT_EQ(r.top_p, 0.5);
  EXPECT_EQ(r.top_k, 0);  // -1 is vLLM's "off", as 0
  EXPECT_TRUE(r.has_seed);
  EXPECT_EQ(r.seed, UINT64_MAX);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_TRUE(r.stream && r.include_usage && r.ignore_eos && r.return_token_ids);
  EXPECT_EQ(r.stop_token, -1);  // ignore_eos
  const auto nulls = parse(R"({"prompt": [1], "max_tokens": null, "temperature": null, "stop": null})");
  EXPECT_EQ(nulls.max_tokens, 16);
  EXPECT_EQ(nulls.temperature, 1.0);
  EXPECT_TRUE(nulls.stop.empty());
}

TEST(CompletionRequest, RefusalsNameTheField) {
  const std::vector<Refusal> cases = {
      {R"([1, 2])", 400, "", "must be a JSON object"},
      {R"({"prompt": )", 400, "", "request body"},
      {R"({})", 400, "prompt", "prompt is required"},
      {R"({"prompt": ""})", 400, "prompt", "prompt is empty"},
      {R"({"prompt": []})", 400, "prompt", "empty list"},
      {R"({"prompt": ["a", ""]})", 400, "prompt", "prompt[1] is empty"},
      {R"({"prompt": [1, 50257]})", 400, "prompt", "token id 50257 is outside [0, 50257)"},
      {R"({"prompt": [[1], [-1]]})", 400, "prompt[1]", "token id -1"},
      {R"({"prompt": [{"a": 1}]})", 400, "prompt", "prompt[0]: expected a string or a list of token ids"},
      {R"({"prompt": 7})", 400, "prompt", "expected a string, a list of strings or a list of token ids"},
      {R"({"prompt": "a", "model": "other"})", 404, "model", "model 'other' is not served here"},
      {R"({"prompt": "a", "max_tokens": 0})", 400, "max_tokens", "max_tokens must be >= 1, got 0"},
      {R"({"prompt": "a", "max_tokens": "many"})", 400, "max_tokens", "max_tokens"},
      {R"({"prompt": "a", "temperature": 2.5})", 400, "temperature", "temperature must be in [0, 2]"},
      {R"({"prompt": "a", "top_p": 0})", 400, "top_p", "top_p must be in (0, 1]"},
      {R"({"prompt": "a", "top_k": -2})", 400, "top_k", "top_k must be >= 0"},
      {R"({"prompt": "a", "stop": 3})", 400, "stop", "expected a string or a list of strings"},
      {R"({"prompt": "a", "stop": ["a", "b", "c", "d", "e"]})", 400, "stop", "at most 4"},
      {R"({"prompt": "a", "stop": [""]})", 400, "stop", "must not be empty"},
      {R"({"prompt": "a", "stream_options": {"include_usage": true}})", 400, "stream_options",
       "only allowed with stream"},
      {R"({"prompt": "a", "stream": true, "stream_options": 1})", 400, "stream_options", "expected an object"},
      {R"({"prompt": "a", "n": 2})", 400, "n", "n must be 1"},
      {R"({"prompt": "a", "best_of": 3})", 400, "best_of", "best_of must be 1"},
      {R"({"prompt": "a", "echo": true})", 400, "echo", "echo is not supported"},
      {R"({"prompt": "a", "logprobs": 1})", 400, "logprobs", "not supported"},
      {R"({"prompt": "a", "suffix": "x"})", 400, "suffix", "not supported"},
      {R"({"prompt": "a", "presence_penalty": 0.5})", 400, "presence_penalty", "0 only"},
      {R"({"prompt": "a", "logit_bias": {"1": 5}})", 400, "logit_bias", "not supported"},
  };
  for (const auto& c : cases) expect_refused(c);
}

TEST(CompletionRequest, PromptAndNewTokensMustFitTheContext) {
  // block_size 8: a prompt of 5 leaves room for 3 new tokens.
  EXPECT_EQ(parse(R"({"prompt": [1, 2, 3, 4, 5], "max_tokens": 3})", 8).max_tokens, 3);
  expect_refused({R"({"prompt": [1, 2, 3, 4, 5], "max_tokens": 4})", 400, "max_tokens", "ask for at most 3"}, 8);
  expect_refused(
      {R"({"prompt": [[1], [1, 2, 3, 4, 5, 6, 7, 8]], "max_tokens": 1})", 400, "prompt", "prompt[1] has 8 tokens"}, 8);
}

// Every push() and the finish() of a stream, concatenated.
std::string stream_text(TextStream& s, const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) out += s.push(id);
  return out + s.finish();
}

TEST(TextStream, WithoutStopStringsItIsTheDecodedText) {
  const std::string text = "Hello world. Caf\u00e9 \u2603 \U0001F642 end";
  const auto ids = tokenizer().encode(text);
  TextStream s(tokenizer(), {});
  EXPECT_EQ(stream_text(s, ids), text);
  EXPECT_FALSE(s.stopped());
}

TEST(TextStream, PiecesAreWholeCharacters) {
  // U+1F642 is four bytes that GPT-2's byte-level BPE spreads over several tokens: no piece may
  // end inside it, and it comes out whole once its last byte is in.
  const auto ids = tokenizer().encode("\U0001F642");
  ASSERT_GT(ids.size(), 1u);
  TextStream s(tokenizer(), {});
  for (size_t i = 0; i + 1 < ids.size(); ++i) EXPECT_EQ(s.push(ids[i]), "") << "token " << i;
  EXPECT_EQ(s.push(ids.back()), "\U0001F642");
  // Cut short inside the character: finish() gives what is held as U+FFFD.
  TextStream cut(tokenizer(), {});
  cut.push(ids[0]);
  EXPECT_EQ(cut.finish(), "\uFFFD");
}

TEST(TextStream, StopsBeforeTheFirstStopStringEvenAcrossTokens) {
  const auto ids = tokenizer().encode("Hello world. Bye now");
  TextStream s(tokenizer(), {"ld. B", "now"});  // the first spans tokens " world", ".", " Bye"
  std::string out;
  for (int32_t id : ids) {
    out += s.push(id);
    if (s.stopped()) break;
  }
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(out + s.finish(), "Hello wor");
  EXPECT_EQ(s.push(ids.back()), "");  // nothing after a stop
}

TEST(TextStream, HoldsBackOnlyWhatMayStartAStopString) {
  const auto hello = tokenizer().encode("Hello"), world = tokenizer().encode(" world");
  ASSERT_EQ(hello.size(), 1u);
  ASSERT_EQ(world.size(), 1u);
  TextStream s(tokenizer(), {"lo!"});  // "Hello" ends with "lo", a prefix of the stop string
  EXPECT_EQ(s.push(hello[0]), "Hel");
  EXPECT_EQ(s.push(world[0]), "lo world");  // not the stop string after all: released
  EXPECT_FALSE(s.stopped());
  EXPECT_EQ(s.finish(), "");
}

}  // namespace
}  // namespace gpt2::serve
