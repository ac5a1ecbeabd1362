// Tests for data/corpus.h: document splitting, directory walking with skips, input errors, and
// parallel tokenization equal to serial. (The train/val split is tested with DatasetWriter.)
#include "data/corpus.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include "src/base/files.h"
#include "tests/test_util.h"

namespace gpt2::data {
namespace {

using gpt2::test::TempDir;
using test::user_error;
using test::write_file;

std::vector<std::string> docs_of(std::string_view text, const std::optional<std::string>& sep) {
  std::vector<std::string> out;
  for (const auto& [off, len] : split_documents(text, sep)) out.emplace_back(text.substr(off, len));
  return out;
}

TEST(Corpus, SplitDocuments) {
  EXPECT_EQ(docs_of("a\nb\n", std::nullopt), (std::vector<std::string>{"a\nb\n"}));
  EXPECT_EQ(docs_of(" \n\t", std::nullopt), std::vector<std::string>{});
  EXPECT_EQ(docs_of("one\n%\ntwo\nlines\n%\n", "%"), (std::vector<std::string>{"one\n", "two\nlines\n"}));
  // CRLF separator lines, blank documents dropped, text after the last separator kept, "%%" and
  // " %" are not separators.
  EXPECT_EQ(docs_of("a\r\n%\r\n\n%\nb %\n%%\nc", "%"), (std::vector<std::string>{"a\r\n", "b %\n%%\nc"}));
  EXPECT_EQ(docs_of("%\nx\n%", "%"), (std::vector<std::string>{"x\n"}));
}

TEST(Corpus, WalksDirectoriesAndSkipsNonText) {
  TempDir dir;
  files::create_directories(dir.file("sub"));
  files::create_directories(dir.file(".hidden"));
  write_file(dir.file("b.txt"), "second\n%\nthird\n");
  write_file(dir.file("a"), "first\n");
  write_file(dir.file("sub/c"), "fourth\n");
  write_file(dir.file("a.dat"), "index");
  write_file(dir.file("bin"), std::string("\x00\x01\x02", 3));
  write_file(dir.file("latin1"), "caf\xE9\n");
  write_file(dir.file(".hidden/x"), "hidden\n");
  ASSERT_EQ(::symlink(dir.file("a").c_str(), dir.file("a.u8").c_str()), 0);
  const Corpus c = Corpus::load({dir.path()}, std::string("%"));
  std::vector<std::string> texts;
  for (const auto& d : c.documents()) texts.emplace_back(c.text(d));
  EXPECT_EQ(texts, (std::vector<std::string>{"first\n", "second\n", "third\n", "fourth\n"}));
  ASSERT_EQ(c.skipped().size(), 3u);
  EXPECT_EQ(c.skipped()[0].path, dir.file("a.dat"));
  EXPECT_EQ(c.skipped()[0].reason, kSkippedDat);
  EXPECT_EQ(c.skipped()[1].path, dir.file("bin"));
  EXPECT_EQ(c.skipped()[1].reason, "not UTF-8 text (byte offset 0)");
  EXPECT_EQ(c.skipped()[2].path, dir.file("latin1"));
  EXPECT_EQ(c.skipped()[2].reason, "not UTF-8 text (byte offset 3)");
  EXPECT_EQ(c.document_bytes(), 6 + 7 + 6 + 7);
}

TEST(Corpus, InputErrors) {
  TempDir dir;
  EXPECT_EQ(user_error([&] { Corpus::load({dir.file("nope.txt")}, std::nullopt); }),
            dir.file("nope.txt") + ": no such file or directory");
  write_file(dir.file("latin1.txt"), "na\xEFve");
  EXPECT_EQ(user_error([&] { Corpus::load({dir.file("latin1.txt")}, std::nullopt); }),
            dir.file("latin1.txt") + ": not UTF-8 text (invalid byte at offset 2)");
  EXPECT_HAS(user_error([&] { Corpus::load({}, std::nullopt); }), "no INPUT");
}

TEST(Corpus, ParallelTokenizationMatchesSerial) {
  TempDir dir;
  const std::string fortunes = test::read_file(test::golden_dir() + "/fortunes_computers.txt");
  // A long single document too, so it is cut into segments and tokenized in parallel.
  std::string big;
  while (big.size() < 3 * 1024 * 1024) big += fortunes;
  write_file(dir.file("f.txt"), fortunes);
  write_file(dir.file("big.txt"), big);
  const auto tok = Gpt2Tokenizer::load(test::tokenizer_dir());
  const Corpus per_fortune = Corpus::load({dir.file("f.txt")}, std::string("%"));
  const auto serial = tokenize_documents(tok, per_fortune, 1);
  EXPECT_EQ(tokenize_documents(tok, per_fortune, 4), serial);
  ASSERT_GT(serial.size(), 100u);
  EXPECT_EQ(serial[0], tok.encode(per_fortune.text(per_fortune.documents()[0])));
  const Corpus whole = Corpus::load({dir.file("big.txt")}, std::nullopt);
  const auto parallel = tokenize_documents(tok, whole, 3);
  ASSERT_EQ(parallel.size(), 1u);
  EXPECT_EQ(parallel[0], tok.encode(big));
}

}  // namespace
}  // namespace gpt2::data
