// Tests for gpt2-data's inputs and outputs: .bin shards (data/bin_shard.h), JSON lines
// (data/jsonl.h), input expansion and globs (data/inputs.h), the streaming CorpusReader and the
// sharded writer (data/shard_writer.h). Each malformed input must be a UserError naming the file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "data/bin_shard.h"
#include "data/corpus.h"
#include "data/inputs.h"
#include "data/jsonl.h"
#include "data/shard_writer.h"
#include "data/token_file.h"
#include "src/base/files.h"
#include "tests/test_util.h"

namespace gpt2::data {
namespace {

using gpt2::test::TempDir;
using test::user_error;
using test::write_file;

constexpr int32_t kEot = 50256;

std::string u16_bytes(const std::vector<int32_t>& tokens) {
  std::string out;
  for (const int32_t t : tokens) {
    out += static_cast<char>(t & 0xFF);
    out += static_cast<char>((t >> 8) & 0xFF);
  }
  return out;
}

std::string llmc_bytes(const std::vector<int32_t>& tokens, int32_t magic = kLlmcMagic, int32_t version = 1,
                       int64_t count = -1) {
  std::string header(1024, '\0');
  const int32_t h[3] = {magic, version, static_cast<int32_t>(count >= 0 ? count : static_cast<int64_t>(tokens.size()))};
  std::memcpy(header.data(), h, sizeof h);
  return header + u16_bytes(tokens);
}

std::vector<int32_t> read_shard(const std::string& path, BinFormat format = BinFormat::kAuto, size_t block = 3) {
  BinShardReader r(path, format, 50257);
  std::vector<int32_t> out;
  while (r.read(out, block) > 0) {
  }
  return out;
}

std::vector<int64_t> read_h5(const std::string& path) {
  TokenFile f = TokenFile::open(path);
  std::vector<int64_t> out(static_cast<size_t>(f.size()));
  f.read(0, f.size(), out.data());
  return out;
}

// ---------------------------------------------------------------- .bin shards

TEST(BinShard, ReadsLlmcAndRaw) {
  TempDir dir;
  const std::vector<int32_t> tokens = {kEot, 15496, 995, kEot, 1, 2, 3, 50255};
  write_file(dir.file("a.bin"), llmc_bytes(tokens));
  write_file(dir.file("b.bin"), u16_bytes(tokens));
  EXPECT_EQ(read_shard(dir.file("a.bin")), tokens);
  EXPECT_EQ(read_shard(dir.file("b.bin")), tokens);
  EXPECT_EQ(read_shard(dir.file("b.bin"), BinFormat::kRaw, 100), tokens);
  EXPECT_EQ(read_shard(dir.file("a.bin"), BinFormat::kLlmc), tokens);
  BinShardReader r(dir.file("a.bin"), BinFormat::kAuto, 50257);
  EXPECT_TRUE(r.info().llmc_header);
  EXPECT_EQ(r.info().num_tokens, 8);
  write_file(dir.file("empty_llmc.bin"), llmc_bytes({}));
  EXPECT_TRUE(read_shard(dir.file("empty_llmc.bin")).empty());
}

TEST(BinShard, MalformedShards) {
  TempDir dir;
  auto err = [&](const std::string& name, const std::string& bytes, BinFormat format = BinFormat::kAuto) {
    write_file(dir.file(name), bytes);
    return user_error([&] { read_shard(dir.file(name), format); });
  };
  const std::vector<int32_t> t = {1, 2, 3, 4};
  EXPECT_EQ(err("v2.bin", llmc_bytes(t, kLlmcMagic, 2)),
            dir.file("v2.bin") + ": llm.c header version 2 is not supported (expected 1 = uint16 GPT-2 tokens)");
  EXPECT_EQ(err("count.bin", llmc_bytes(t, kLlmcMagic, 1, 6)),
            dir.file("count.bin") +
                ": llm.c header says 6 tokens (1036 bytes with the header) but the file has 1032 "
                "bytes (truncated?)");
  EXPECT_HAS(err("fewer.bin", llmc_bytes(t, kLlmcMagic, 1, 2)), "llm.c header says 2 tokens (1028 bytes");
  EXPECT_EQ(err("neg.bin", llmc_bytes(t, kLlmcMagic, 1, 0xFFFFFFFFll)),
            dir.file("neg.bin") + ": llm.c header token count -1 is negative");
  EXPECT_EQ(err("magic.bin", llmc_bytes(t, 12345), BinFormat::kLlmc),
            dir.file("magic.bin") +
                ": no llm.c header: the first int32 is 12345, expected magic 20240520 (for "
                "headerless nanoGPT uint16 files use --bin_format=raw)");
  EXPECT_HAS(err("llama.bin", llmc_bytes(t, kLlmcLlama3Magic, 7)), "an llm.c LLaMA-3 shard (magic 20240801");
  EXPECT_EQ(err("cut.bin", llmc_bytes(t).substr(0, 100)),
            dir.file("cut.bin") + ": truncated llm.c header: the file has 100 bytes, the header alone needs 1024");
  EXPECT_EQ(err("odd.bin", u16_bytes(t) + "x"),
            dir.file("odd.bin") +
                ": 9 bytes is an odd size: no llm.c header (magic 20240520) and not raw uint16 "
                "tokens (nanoGPT)");
  EXPECT_EQ(err("empty.bin", ""), dir.file("empty.bin") + ": empty .bin file (no header, no tokens)");
  EXPECT_EQ(err("ids.bin", u16_bytes({1, 2, 3, 60000, 5})),
            dir.file("ids.bin") + ": token at position 3 is 60000, not below vocab_size 50257 (not GPT-2 tokens?)");
  EXPECT_HAS(err("ids2.bin", llmc_bytes({1, 2, 3, 4, 5, 50257})), "token at position 5 is 50257");
  files::create_directories(dir.file("dir.bin"));
  EXPECT_HAS(user_error([&] { read_shard(dir.file("dir.bin")); }), dir.file("dir.bin") + ": ");
  EXPECT_HAS(user_error([&] { parse_bin_format("nanogpt"); }), "--bin_format nanogpt: expected auto, llmc or raw");
}

// ---------------------------------------------------------------- JSON lines

TEST(Jsonl, DocumentsAndErrors) {
  EXPECT_EQ(jsonl_document(R"({"text": "hi \u00e9\n", "id": 3})", "f:1"), std::optional<std::string>("hi \xC3\xA9\n"));
  EXPECT_EQ(jsonl_document("  \r", "f:1"), std::nullopt);
  EXPECT_EQ(user_error([] { jsonl_document(R"({"text": "a")", "c.jsonl:7"); }),
            "c.jsonl:7: column 13: syntax error while parsing object - unexpected end of input; expected '}' (not a "
            "JSON line)");
  EXPECT_EQ(user_error([] { jsonl_document(R"(["text"])", "c.jsonl:2"); }),
            "c.jsonl:2: expected a JSON object with a \"text\" string, got an array");
  EXPECT_EQ(user_error([] { jsonl_document(R"({"content": "x"})", "c.jsonl:3"); }),
            "c.jsonl:3: the object has no \"text\" member");
  EXPECT_EQ(user_error([] { jsonl_document(R"({"text": 5})", "c.jsonl:4"); }), "c.jsonl:4: \"text\" is not a string");
  EXPECT_HAS(user_error([] { jsonl_document("{\"text\": \"caf\xE9\"}", "c.jsonl:5"); }),
             "c.jsonl:5: column 15: syntax error while parsing value - invalid string: ill-formed UTF-8 byte");
  EXPECT_HAS(user_error([] { jsonl_document(R"({"text": "a"} {"text": "b"})", "c.jsonl:6"); }),
             "c.jsonl:6: column 15: syntax error while parsing value - unexpected '{'; expected end of input");
}

TEST(Jsonl, ReaderCountsLines) {
  TempDir dir;
  write_file(dir.file("c.jsonl"), "{\"text\": \"one\"}\n\n{\"text\": \"two\"}\r\n{\"text\": 1}\n");
  JsonlReader r(dir.file("c.jsonl"));
  std::string doc;
  ASSERT_TRUE(r.next(&doc));
  EXPECT_EQ(doc, "one");
  ASSERT_TRUE(r.next(&doc));
  EXPECT_EQ(doc, "two");
  // The blank line counts: the fourth line's error names line 4.
  EXPECT_EQ(user_error([&] { r.next(&doc); }), dir.file("c.jsonl") + ":4: \"text\" is not a string");
}

// ---------------------------------------------------------------- inputs and globs

TEST(Inputs, GlobsDirectoriesKindsAndDuplicates) {
  TempDir dir;
  files::create_directories(dir.file("d/sub"));
  write_file(dir.file("d/b.txt"), "b");
  write_file(dir.file("d/a.txt"), "a");
  write_file(dir.file("d/c.jsonl"), "{}");
  write_file(dir.file("d/sub/x.bin"), "");
  write_file(dir.file("d/i.dat"), "");
  const ExpandedInputs e = expand_inputs({dir.file("d/*.txt"), dir.file("d/s*"), dir.file("d"), dir.file("d/a.txt")});
  std::vector<std::string> paths;
  for (const InputFile& f : e.files) paths.push_back(f.path);
  EXPECT_EQ(paths, (std::vector<std::string>{dir.file("d/a.txt"), dir.file("d/b.txt"), dir.file("d/sub/x.bin"),
                                             dir.file("d/c.jsonl")}));
  EXPECT_EQ(e.files[2].kind, InputKind::kTokenShard);
  EXPECT_EQ(e.files[3].kind, InputKind::kJsonLines);
  EXPECT_EQ(e.files[0].kind, InputKind::kText);
  EXPECT_FALSE(e.files[0].named);  // found by a pattern
  // Skipped: the directory walk meets a.txt, b.txt, x.bin again, and i.dat; a.txt named again.
  ASSERT_EQ(e.skipped.size(), 5u);
  EXPECT_EQ(e.skipped[2].reason, kSkippedDat);
  EXPECT_HAS(e.skipped[4].reason, "already read");
}

TEST(Inputs, BadPatternsAndPaths) {
  TempDir dir;
  EXPECT_EQ(user_error([&] { expand_inputs({dir.file("*.txt")}); }),
            "'" + dir.file("*.txt") +
                "': the pattern matches no files (a glob is expanded by gpt2-data; check the "
                "directory and the quotes)");
  EXPECT_EQ(user_error([&] { expand_inputs({dir.file("nope/[ab].txt")}); }),
            "'" + dir.file("nope/[ab].txt") +
                "': the pattern matches no files (a glob is expanded by gpt2-data; "
                "check the directory and the quotes)");
  EXPECT_EQ(user_error([&] { expand_inputs({dir.file("missing.txt")}); }),
            dir.file("missing.txt") + ": no such file or directory");
  EXPECT_HAS(user_error([&] { expand_inputs({""}); }), "an INPUT is an empty string");
  EXPECT_HAS(user_error([&] { expand_inputs({}); }), "no INPUT given");
  // A file whose name has glob characters is read as named.
  write_file(dir.file("[x].txt"), "hi");
  EXPECT_EQ(expand_inputs({dir.file("[x].txt")}).files.at(0).path, dir.file("[x].txt"));
}

// ---------------------------------------------------------------- streaming reader

// Every document of the inputs: text, or "#<ids>" for .bin runs, read in batches of `target` bytes.
std::vector<std::string> stream_documents(const std::vector<std::string>& inputs, int64_t target, int64_t* batches,
                                          int64_t* input_bytes = nullptr) {
  CorpusOptions options;
  options.separator = "%";
  CorpusReader reader(inputs, options);
  std::vector<std::string> docs;
  Corpus batch;
  *batches = 0;
  int64_t bytes = 0;
  while (reader.next(&batch, target)) {
    ++*batches;
    bytes += batch.input_bytes();
    for (const DocumentRef& d : batch.documents()) {
      if (d.token_run < 0) {
        docs.emplace_back(batch.text(d));
      } else {
        std::string s = "#";
        for (const int32_t t : batch.token_run(d)) s += std::to_string(t) + ",";
        docs.push_back(s);
      }
    }
  }
  EXPECT_EQ(bytes, reader.total_bytes());
  if (input_bytes != nullptr) *input_bytes = bytes;
  return docs;
}

TEST(CorpusReader, MixedInputsInOrderWhateverTheBatchSize) {
  TempDir dir;
  write_file(dir.file("a.txt"), "one\n%\ntwo\n");
  write_file(dir.file("b.jsonl"), "{\"text\": \"three\"}\n{\"text\": \"  \"}\n{\"text\": \"four\"}\n");
  // llm.c style: EOT before each document; two shards form one stream.
  write_file(dir.file("c1.bin"), llmc_bytes({kEot, 10, 11, kEot, 12}));
  write_file(dir.file("c2.bin"), llmc_bytes({13, kEot, 14}));
  write_file(dir.file("d.txt"), "five");
  const std::vector<std::string> inputs = {dir.file("a.txt"), dir.file("b.jsonl"), dir.file("c1.bin"),
                                           dir.file("c2.bin"), dir.file("d.txt")};
  const std::string eot = std::to_string(kEot);
  const std::vector<std::string> expected = {"one\n",
                                             "two\n",
                                             "three",
                                             "four",
                                             "#" + eot + ",",
                                             "#10,11," + eot + ",",
                                             "#12,13," + eot + ",",
                                             "#14," + eot + ",",
                                             "five"};
  int64_t one_batch = 0, many = 0;
  EXPECT_EQ(stream_documents(inputs, INT64_MAX, &one_batch), expected);
  EXPECT_EQ(one_batch, 1);
  EXPECT_EQ(stream_documents(inputs, 1, &many), expected);
  EXPECT_GT(many, 5);
}

TEST(CorpusReader, RawShardEndingWithEotAddsNothing) {
  TempDir dir;
  write_file(dir.file("n.bin"), u16_bytes({1, 2, kEot, 3, kEot}));
  CorpusReader reader({dir.file("n.bin")}, CorpusOptions{});
  Corpus batch;
  ASSERT_TRUE(reader.next(&batch, INT64_MAX));
  EXPECT_EQ(batch.documents().size(), 2u);
  EXPECT_EQ(batch.shard_tokens(), 5);
  EXPECT_EQ(reader.added_eot(), 0);
  EXPECT_FALSE(reader.next(&batch, INT64_MAX));
}

TEST(CorpusReader, BadInputsNameTheFileAndLine) {
  TempDir dir;
  write_file(dir.file("bad.jsonl"), "{\"text\": \"ok\"}\n{\"text\": \"ok\"}\n{\"text\" \"no colon\"}\n");
  EXPECT_EQ(user_error([&] { Corpus::load({dir.file("bad.jsonl")}, std::nullopt); }),
            dir.file("bad.jsonl") +
                ":3: column 18: syntax error while parsing object separator - unexpected string "
                "literal; expected ':' (not a JSON line)");
  write_file(dir.file("bad.bin"), llmc_bytes({1, 2}, kLlmcMagic, 3));
  EXPECT_HAS(user_error([&] { Corpus::load({dir.file("bad.bin")}, std::nullopt); }),
             dir.file("bad.bin") + ": llm.c header version 3 is not supported");
}

// ---------------------------------------------------------------- sharded output

TEST(ShardWriter, ShardsConcatenateToTheStream) {
  TempDir dir;
  std::vector<int32_t> stream(25);
  std::iota(stream.begin(), stream.end(), 100);
  ShardWriter w(dir.path(), "train", 10, TokenFileAttrs{});
  w.append(stream.data(), 7);
  w.append(stream.data() + 7, 18);
  const auto paths = w.finish();
  ASSERT_EQ(paths, (std::vector<std::string>{dir.file("train_000000.h5"), dir.file("train_000001.h5"),
                                             dir.file("train_000002.h5")}));
  std::vector<int64_t> all;
  for (const auto& p : paths) {
    const auto part = read_h5(p);
    all.insert(all.end(), part.begin(), part.end());
  }
  EXPECT_EQ(all, std::vector<int64_t>(stream.begin(), stream.end()));
  EXPECT_EQ(read_h5(paths[0]).size(), 10u);
  EXPECT_EQ(read_h5(paths[2]).size(), 5u);
}

TEST(ShardWriter, ExactlyOneShardKeepsTheSingleName) {
  TempDir dir;
  std::vector<int32_t> stream(10, 5);
  ShardWriter w(dir.path(), "val", 10, TokenFileAttrs{});
  w.append(stream.data(), stream.size());
  EXPECT_EQ(w.finish(), std::vector<std::string>{dir.file("val.h5")});
  ShardWriter empty(dir.path(), "none", 10, TokenFileAttrs{});
  EXPECT_TRUE(empty.finish().empty());
  EXPECT_HAS(user_error([&] { ShardWriter(dir.path(), "x", 0, TokenFileAttrs{}); }),
             "--shard_tokens 0 must be positive");
  ShardWriter bad(dir.path(), "bad", 10, TokenFileAttrs{});
  const int32_t ids[2] = {1, 70000};
  EXPECT_HAS(user_error([&] { bad.append(ids, 2); }), "bad: token id 70000 is outside [0, vocab_size 50257)");
}

// The split DatasetWriter makes as documents stream in, computed over all of them at once (the
// reference for the test below): document i goes to val when validation_draw(seed, i) <
// val_fraction; when val_fraction > 0 and there are at least two documents, at least one goes to
// val (the lowest draw) and at least one stays in train (the highest).
std::vector<bool> assign_validation(size_t num_documents, double val_fraction, uint64_t seed) {
  std::vector<bool> val(num_documents, false);
  if (val_fraction <= 0 || num_documents == 0) return val;
  std::vector<double> u(num_documents);
  size_t num_val = 0;
  for (size_t i = 0; i < num_documents; ++i) {
    u[i] = validation_draw(seed, i);
    val[i] = u[i] < val_fraction;
    num_val += val[i] ? 1 : 0;
  }
  if (num_documents >= 2) {
    if (num_val == 0) val[static_cast<size_t>(std::min_element(u.begin(), u.end()) - u.begin())] = true;
    if (num_val == num_documents) val[static_cast<size_t>(std::max_element(u.begin(), u.end()) - u.begin())] = false;
  }
  return val;
}

TEST(DatasetWriter, ReferenceSplitRule) {
  const auto a = assign_validation(1000, 0.1, 7);
  EXPECT_EQ(a, assign_validation(1000, 0.1, 7));  // deterministic
  EXPECT_NE(a, assign_validation(1000, 0.1, 8));  // seeded
  const auto n = std::count(a.begin(), a.end(), true);
  EXPECT_GT(n, 60);
  EXPECT_LT(n, 140);
  // Few documents: still one in val (and one in train).
  const auto b = assign_validation(3, 0.001, 1);
  EXPECT_EQ(std::count(b.begin(), b.end(), true), 1);
  const auto c = assign_validation(2, 0.999, 1);
  EXPECT_EQ(std::count(c.begin(), c.end(), true), 1);
  EXPECT_EQ(assign_validation(1, 0.5, 1), std::vector<bool>{false});  // one document: train only
  const auto z = assign_validation(50, 0.0, 1);
  EXPECT_EQ(std::count(z.begin(), z.end(), true), 0);
}

TEST(DatasetWriter, MatchesAssignValidationAndRemovesStaleOutputs) {
  TempDir dir;
  write_file(dir.file("train_000003.h5"), "stale");
  write_file(dir.file("val.h5"), "stale");
  write_file(dir.file("train_notes.txt"), "kept");
  for (const double fraction : {0.0, 0.2, 0.001, 0.999}) {
    const int n = 30;
    DatasetWriter w(dir.path(), 1000, TokenFileAttrs{}, fraction, 42);
    std::vector<int64_t> expected[2];
    const std::vector<bool> val = assign_validation(n, fraction, 42);
    for (int d = 0; d < n; ++d) {
      const std::vector<int32_t> doc(static_cast<size_t>(d % 3 + 1), d);
      w.add_document(doc, true);
      auto& e = expected[val[static_cast<size_t>(d)] ? 1 : 0];
      e.insert(e.end(), doc.begin(), doc.end());
      e.push_back(kEot);
    }
    const DatasetSummary s = w.finish();
    EXPECT_TRUE(s.notes.empty());
    EXPECT_EQ(s.paths[0], std::vector<std::string>{dir.file("train.h5")}) << fraction;
    EXPECT_EQ(read_h5(dir.file("train.h5")), expected[0]) << fraction;
    if (fraction == 0.0) {
      EXPECT_TRUE(s.paths[1].empty());
      EXPECT_FALSE(files::exists(dir.file("val.h5")));
    } else {
      EXPECT_EQ(read_h5(dir.file("val.h5")), expected[1]) << fraction;
    }
    EXPECT_EQ(s.documents[0] + s.documents[1], n);
  }
  EXPECT_FALSE(files::exists(dir.file("train_000003.h5")));
  EXPECT_TRUE(files::exists(dir.file("train_notes.txt")));
}

TEST(DatasetWriter, OneDocumentGoesToTrain) {
  TempDir dir;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    DatasetWriter w(dir.path(), 1000, TokenFileAttrs{}, 0.5, seed);
    w.add_document({1, 2}, true);
    const DatasetSummary s = w.finish();
    EXPECT_EQ(s.documents[0], 1);
    EXPECT_EQ(read_h5(dir.file("train.h5")), (std::vector<int64_t>{1, 2, kEot}));
    EXPECT_FALSE(files::exists(dir.file("val.h5")));
  }
}

}  // namespace
}  // namespace gpt2::data
