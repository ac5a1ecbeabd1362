// Tests for data/bpe_tokenizer.h: golden ids, known cases checked against tiktoken, round trips,
// thread safety, and named errors for bad vocab files and bad input.
#include "data/bpe_tokenizer.h"

#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "data/unicode_tables.h"
#include "src/base/files.h"
#include "src/base/json.h"
#include "tests/test_util.h"

namespace gpt2::data {
namespace {

using gpt2::test::TempDir;
using test::read_file;
using test::tokenizer_dir;
using test::user_error;
using test::write_file;

class TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tok_ = std::make_unique<Gpt2Tokenizer>(Gpt2Tokenizer::load(tokenizer_dir())); }
  static void TearDownTestSuite() { tok_.reset(); }
  static const Gpt2Tokenizer& tok() { return *tok_; }
  static std::unique_ptr<Gpt2Tokenizer> tok_;
};
std::unique_ptr<Gpt2Tokenizer> TokenizerTest::tok_;

std::vector<int32_t> golden_ids(const std::string& path) {
  std::vector<int32_t> ids;
  const json::Value doc = json::parse(read_file(path), path);
  for (const json::Value& v : json::as_array(doc, "value"))
    ids.push_back(static_cast<int32_t>(json::as_int(v, "value")));
  return ids;
}

TEST_F(TokenizerTest, Sizes) {
  EXPECT_EQ(tok().vocab_size(), 50257);
  EXPECT_EQ(tok().eot_token(), 50256);
}

// The golden ids were made by a reference tokenizer that treats "<|endoftext|>" in the text as
// the special token; our encode() does not (encode_ordinary semantics), so the test splits there.
TEST_F(TokenizerTest, GoldenFiles) {
  int checked = 0;
  for (const std::string& name : files::list_directory(test::golden_dir())) {
    const std::string path = files::join(test::golden_dir(), name);
    if (files::extension(name) != ".txt") continue;
    const std::string text = read_file(path);
    std::vector<int32_t> ids;
    const std::string eot = "<|endoftext|>";
    size_t start = 0;
    for (size_t at = text.find(eot); at != std::string::npos; at = text.find(eot, start)) {
      tok().encode_append(std::string_view(text).substr(start, at - start), ids, path);
      ids.push_back(tok().eot_token());
      start = at + eot.size();
    }
    tok().encode_append(std::string_view(text).substr(start), ids, path);
    const std::vector<int32_t> want = golden_ids(path + ".gpt2.json");
    ASSERT_EQ(ids.size(), want.size()) << path;
    EXPECT_EQ(ids, want) << path;
    EXPECT_EQ(tok().decode(ids), text) << path;
    ++checked;
  }
  EXPECT_GE(checked, 2);
}

TEST_F(TokenizerTest, KnownCasesMatchTiktoken) {
  // Expected ids from tiktoken's gpt2 encode_ordinary on the same vocabulary.
  const std::vector<std::pair<std::string, std::vector<int32_t>>> cases = {
      {"Hello world", {15496, 995}},
      {"<|endoftext|>", {27, 91, 437, 1659, 5239, 91, 29}},
      {"  hello   world  \n\n x", {220, 23748, 220, 220, 995, 220, 220, 628, 2124}},
      {"I'm here, they'll go; WE'LL 'Ve", {40, 1101, 994, 11, 484, 1183, 467, 26, 12887, 6, 3069, 705, 26979}},
      {"na\xC3\xAFve caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x9A\x80",
       {2616, 38776, 40304, 10545, 245, 98, 17312, 105, 45739, 252, 12520, 248, 222}},
      {"a\xC2\xA0"
       "b\xE3\x80\x80\xE3\x80\x80"
       "c\r\n\tz",
       {64, 1849, 65, 5099, 222, 5099, 222, 66, 201, 198, 197, 89}},
      {"1234567 3.14", {10163, 2231, 3134, 513, 13, 1415}},
      {"   ", {220, 220, 220}},
      {"\n", {198}},
      {" 's", {705, 82}},
  };
  for (const auto& [text, want] : cases) EXPECT_EQ(tok().encode(text), want) << text;
  EXPECT_EQ(tok().encode(std::string(300, 'x')).size(), 38u);  // long piece: heap merge path
}

TEST_F(TokenizerTest, EmptyInput) {
  EXPECT_TRUE(tok().encode("").empty());
  EXPECT_EQ(tok().decode({}), "");
}

TEST_F(TokenizerTest, RoundTrip) {
  const std::vector<std::string> texts = {"plain ascii text.",
                                          "  leading and trailing  ",
                                          "\t\ttabs\r\nand CRLF\r\n",
                                          "a\xC2\xA0nbsp\xE2\x80\x89thin",
                                          "\xE2\x80\x8B zero width, \xCC\x81 lone combining mark",
                                          "emoji \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9",
                                          std::string(5000, ' ') + "x",
                                          std::string(1000, '=') + "\n",
                                          "\x01\x02\x7F control bytes",
                                          std::string("nul\0byte", 8)};
  for (const std::string& t : texts) EXPECT_EQ(tok().decode(tok().encode(t)), t);
}

TEST_F(TokenizerTest, LongPiecesMatchShortPath) {
  // merge_large (heap) must give what merging the same bytes piecewise-identically gives: a long
  // letter run is one piece, so compare against a run that repeats a known short encoding.
  const std::string word = "abcdefgh";
  std::string long_run;
  for (int i = 0; i < 40; ++i) long_run += word;  // 320 bytes, one pre-tokenizer piece
  const auto ids = tok().encode(long_run);
  EXPECT_EQ(tok().decode(ids), long_run);
  EXPECT_LT(ids.size(), long_run.size() / 2);
}

TEST_F(TokenizerTest, ConcurrentEncodeIsConsistent) {
  const std::string text = read_file(test::golden_dir() + "/fortunes_computers.txt");
  const auto want = tok().encode(text);
  std::vector<std::vector<int32_t>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([&, t] { got[static_cast<size_t>(t)] = tok().encode(text); });
  for (auto& th : threads) th.join();
  for (const auto& g : got) EXPECT_EQ(g, want);
}

TEST_F(TokenizerTest, InvalidUtf8NamesSourceAndOffset) {
  EXPECT_EQ(user_error([&] {
              tok().encode(
                  "abc\xFF"
                  "def",
                  "input.txt");
            }),
            "input.txt: invalid UTF-8 at byte offset 3");
  EXPECT_EQ(user_error([&] { tok().encode("ok \xE6\x97", "t"); }), "t: invalid UTF-8 at byte offset 3");  // truncated
  EXPECT_EQ(user_error([&] { tok().encode("\xC0\xAF"); }), "text: invalid UTF-8 at byte offset 0");       // overlong
  EXPECT_EQ(user_error([&] { tok().encode("x\xED\xA0\x80"); }), "text: invalid UTF-8 at byte offset 1");  // surrogate
  EXPECT_EQ(user_error([&] { tok().encode("  \x80"); }), "text: invalid UTF-8 at byte offset 2");
}

TEST_F(TokenizerTest, DecodeRejectsUnknownIds) {
  EXPECT_HAS(user_error([&] { tok().decode({1, 50257}); }), "token id 50257 is outside the vocabulary");
  EXPECT_HAS(user_error([&] { tok().decode({-1}); }), "token id -1");
  EXPECT_EQ(tok().decode({50256}), "<|endoftext|>");
}

TEST(UnicodeTables, Classes) {
  using unicode::classify;
  using unicode::CpClass;
  EXPECT_EQ(classify('a'), CpClass::kLetter);
  EXPECT_EQ(classify(0x65E5), CpClass::kLetter);  // 日
  EXPECT_EQ(classify('7'), CpClass::kNumber);
  EXPECT_EQ(classify(0x00BD), CpClass::kNumber);  // ½ (No)
  EXPECT_EQ(classify(0x2163), CpClass::kNumber);  // Ⅳ (Nl)
  EXPECT_EQ(classify(0x00A0), CpClass::kSpace);
  EXPECT_EQ(classify(0x3000), CpClass::kSpace);
  EXPECT_EQ(classify(0x0085), CpClass::kSpace);
  EXPECT_EQ(classify(0x001C), CpClass::kOther);   // isspace() in Python, not White_Space
  EXPECT_EQ(classify(0x200B), CpClass::kOther);   // zero width space is not White_Space
  EXPECT_EQ(classify(0x0301), CpClass::kOther);   // combining mark
  EXPECT_EQ(classify(0x1F680), CpClass::kOther);  // emoji
  EXPECT_EQ(classify(0x10FFFF), CpClass::kOther);
}

// ---- malformed vocabulary files

class BadVocabTest : public ::testing::Test {
 protected:
  void SetUp() override {
    write_file(dir_.file("encoder.json"), read_file(tokenizer_dir() + "/encoder.json"));
    write_file(dir_.file("vocab.bpe"), read_file(tokenizer_dir() + "/vocab.bpe"));
  }
  std::string load_error() {
    return user_error([&] { Gpt2Tokenizer::load(dir_.path()); });
  }
  TempDir dir_;
};

TEST_F(BadVocabTest, CopiedVocabLoads) { EXPECT_EQ(Gpt2Tokenizer::load(dir_.path()).vocab_size(), 50257); }

TEST_F(BadVocabTest, MissingFiles) {
  ASSERT_TRUE(files::remove_file(dir_.file("vocab.bpe")));
  EXPECT_HAS(load_error(), "cannot open " + dir_.file("vocab.bpe"));
  ASSERT_TRUE(files::remove_file(dir_.file("encoder.json")));
  EXPECT_HAS(load_error(), "cannot open " + dir_.file("encoder.json"));
}

TEST_F(BadVocabTest, BadJson) {
  write_file(dir_.file("encoder.json"), "{\"a\": 0,\n \"b\": }");
  EXPECT_EQ(
      load_error(),
      dir_.file("encoder.json") +
          ": line 2, column 7: syntax error while parsing value - unexpected '}'; expected '[', '{', or a literal");
  write_file(dir_.file("encoder.json"), "[1, 2]");
  EXPECT_HAS(load_error(), dir_.file("encoder.json") + ": expected an object");
  write_file(dir_.file("encoder.json"), "{\"a\": \"zero\"}");
  EXPECT_HAS(load_error(), "id of token 'a'");
  write_file(dir_.file("encoder.json"), "{\"a\": 0, \"b\": 0}");
  EXPECT_HAS(load_error(), "id 0 is used twice");
  write_file(dir_.file("encoder.json"), "{\"a\": 5}");
  EXPECT_HAS(load_error(), "outside [0, 1)");
}

TEST_F(BadVocabTest, BadMerges) {
  const std::string path = dir_.file("vocab.bpe");
  write_file(path, "#version: 0.2\n\xC4\xA0 t\nnot-a-pair\n");
  EXPECT_EQ(load_error(), path + ": line 3: expected two tokens separated by one space, got 'not-a-pair'");
  write_file(path, "#version: 0.2\na  b\n");
  EXPECT_HAS(load_error(), path + ": line 2: expected two tokens");
  write_file(path, "#version: 0.2\n\xC4\xA0 t\nxyz q\n");
  EXPECT_HAS(load_error(), path + ": line 3: 'xyz q' uses a token no earlier merge made");
  write_file(path, "#version: 0.2\n\xC4\xA0 t\n\xC4\xA0 t\n");
  EXPECT_HAS(load_error(), path + ": line 3: '\xC4\xA0 t' repeats an earlier merge");
  write_file(path, "#version: 0.2\na \xE2\x82\xAC\n");
  EXPECT_HAS(load_error(), path + ": line 2: U+20AC is not in GPT-2's byte alphabet");
  // A merge whose result is not in encoder.json.
  write_file(dir_.file("encoder.json"), read_file(tokenizer_dir() + "/encoder.json"));
  write_file(path, "#version: 0.2\n\xC4\xA0 t\nq z\n");
  EXPECT_HAS(load_error(), path + ": line 3: the result of 'q z' is missing from");
}

TEST(TokenizerDir, DefaultIsFound) {
  const std::string dir = find_default_tokenizer_dir();
  EXPECT_TRUE(files::exists(dir + "/vocab.bpe")) << dir;
}

}  // namespace
}  // namespace gpt2::data

namespace gpt2::data {
namespace {

TEST(UnicodeTables, ToValidUtf8ReplacesBrokenSequences) {
  EXPECT_EQ(unicode::to_valid_utf8("caf\xC3\xA9"), "caf\xC3\xA9");  // valid: unchanged
  EXPECT_EQ(unicode::to_valid_utf8("ab\xC3"), "ab\xEF\xBF\xBD");    // truncated at the end
  EXPECT_EQ(unicode::to_valid_utf8("\x80x"),
            "\xEF\xBF\xBD"
            "x");  // stray continuation
  EXPECT_EQ(unicode::to_valid_utf8(""), "");
  // One U+FFFD per maximal subpart: the example of Unicode 15 section 3.9 (U+FFFD Substitution of
  // Maximal Subparts), 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 -> a FFFD FFFD FFFD b FFFD c FFFD FFFD d,
  // and a character cut short after two of its four bytes, which is one.
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(unicode::to_valid_utf8("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64"),
            "a" + r + r + r + "b" + r + "c" + r + r + "d");
  EXPECT_EQ(unicode::to_valid_utf8("\xF0\x9F"), r);
  EXPECT_EQ(unicode::to_valid_utf8("\xED\xA0\x80"), r + r + r);  // a surrogate: ED then A0 is out of range
  EXPECT_EQ(unicode::to_valid_utf8("\xF0\x9F\x99\x82"), "\xF0\x9F\x99\x82");
}

}  // namespace
}  // namespace gpt2::data
