// safetensors reader/writer: bit-exact round trips and named errors on malformed files.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <fstream>
#include <string>

#include "src/base/errors.h"
#include "src/base/files.h"
#include "src/io/safetensors.h"
#include "tests/test_util.h"

namespace gpt2 {
namespace {

class SafetensorsTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return dir_.file(name); }

  // A file made of the given header text and `data_bytes` zero bytes.
  std::string raw_file(const std::string& header, size_t data_bytes, uint64_t header_len_override = 0) {
    const std::string p = path("raw.safetensors");
    std::ofstream out(p, std::ios::binary);
    uint64_t n = header_len_override ? header_len_override : header.size();
    for (int i = 0; i < 8; ++i, n >>= 8) out.put(static_cast<char>(n & 0xff));
    out << header << std::string(data_bytes, '\0');
    return p;
  }

  std::string read_error(const std::string& p) {
    try {
      read_safetensors(p);
    } catch (const UserError& e) {
      return e.what();
    }
    return "<no UserError thrown>";
  }

  test::TempDir dir_{"gpt2_safetensors_test"};
};

// files.h in a binary that links libtorch: libtorch_cpu.so's copies of the standard library's
// file-system symbols would take over any call to them here (they crash), so this covers that
// files.h makes none. Torch is used first so its libraries are surely loaded and bound.
TEST_F(SafetensorsTest, FileHelpersWorkWithTorchLoaded) {
  EXPECT_EQ(torch::ones({2}).sum().item<float>(), 2.0f);
  const std::string deep = path("a/b/c");
  files::create_directories(deep);
  files::create_directories(deep);  // idempotent
  EXPECT_TRUE(files::is_directory(deep));
  write_safetensors(files::join(deep, "w.safetensors"), {{"w", torch::ones({3})}}, {});
  EXPECT_EQ(files::list_directory(deep), std::vector<std::string>{"w.safetensors"});
  EXPECT_GT(files::file_size(files::join(deep, "w.safetensors")), 8);
  EXPECT_EQ(files::filename(files::executable_path()), "gpt2_io_tests");
  files::remove_tree(path("a"));
  EXPECT_FALSE(files::exists(path("a")));
  EXPECT_TRUE(files::list_directory(dir_.path()).empty());
}

TEST_F(SafetensorsTest, RoundTripIsBitExact) {
  torch::manual_seed(0);
  NamedTensors in = {
      {"f32", torch::randn({3, 5})},
      {"f64", torch::randn({2, 2}, torch::kDouble)},
      {"f16", torch::randn({7}).to(torch::kHalf)},
      {"bf16", torch::randn({4, 1, 3}).to(torch::kBFloat16)},
      {"i64", torch::randint(-1000000000000LL, 1000000000000LL, {5}, torch::kLong)},
      {"i32", torch::randint(-100000, 100000, {2, 3}, torch::kInt)},
      {"u8", torch::randint(0, 255, {9}, torch::kByte)},
      {"scalar", torch::tensor(3.5)},
      {"empty", torch::zeros({0, 4})},
      {"strided", torch::randn({4, 6}).t()},  // non-contiguous input
      {"name with \"quote\"", torch::ones({1})},
  };
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"step", "12"}};
  write_safetensors(path("a.safetensors"), in, meta);
  {
    std::ifstream f(path("a.safetensors"), std::ios::binary);
    uint64_t header_len = 0;
    f.read(reinterpret_cast<char*>(&header_len), 8);
    EXPECT_EQ(header_len % 8, 0u);  // the data region starts 8-byte aligned
  }
  std::map<std::string, std::string> meta_out;
  NamedTensors out = read_safetensors(path("a.safetensors"), &meta_out);
  EXPECT_EQ(meta_out, meta);
  ASSERT_EQ(out.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out[i].first, in[i].first);
    EXPECT_EQ(out[i].second.scalar_type(), in[i].second.scalar_type()) << in[i].first;
    EXPECT_EQ(out[i].second.sizes(), in[i].second.sizes()) << in[i].first;
    // Bit-exact: compare raw bytes, which also covers NaN payloads and -0.0.
    auto a = in[i].second.contiguous(), b = out[i].second;
    EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0) << in[i].first;
  }
  EXPECT_FALSE(files::exists(path("a.safetensors.tmp")));
}

TEST_F(SafetensorsTest, ReadsFilesWithoutMetadata) {
  const std::string p = raw_file(R"({"x":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})", 8);
  std::map<std::string, std::string> meta = {{"stale", "1"}};
  auto t = read_safetensors(p, &meta);
  EXPECT_TRUE(meta.empty());
  ASSERT_EQ(t.size(), 1u);
  EXPECT_TRUE(torch::equal(t[0].second, torch::zeros({2}, torch::kInt)));
}

TEST_F(SafetensorsTest, BadHeaderLength) {
  const std::string p = raw_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4, 1u << 20);
  const std::string msg = read_error(p);
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("header length"), std::string::npos) << msg;
  const std::string huge = raw_file("{}", 0, ~uint64_t{0});
  EXPECT_NE(read_error(huge).find("header length"), std::string::npos);
  {
    std::ofstream out(path("short"), std::ios::binary);
    out << "abc";
  }
  EXPECT_NE(read_error(path("short")).find("shorter than"), std::string::npos);
  EXPECT_NE(read_error(path("does_not_exist")).find("cannot open"), std::string::npos);
}

TEST_F(SafetensorsTest, HeaderNotJson) {
  const std::string p = raw_file("{not json", 0);
  EXPECT_NE(read_error(p).find(p), std::string::npos);
}

TEST_F(SafetensorsTest, OffsetsPastEnd) {
  const std::string p = raw_file(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 12);
  const std::string msg = read_error(p);
  EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("past the end"), std::string::npos) << msg;
  const std::string rev = raw_file(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", 12);
  EXPECT_NE(read_error(rev).find("out of order"), std::string::npos);
}

TEST_F(SafetensorsTest, UnknownDtype) {
  const std::string p = raw_file(R"({"w":{"dtype":"F8_E9","shape":[1],"data_offsets":[0,1]}})", 1);
  const std::string msg = read_error(p);
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("F8_E9"), std::string::npos) << msg;
}

TEST_F(SafetensorsTest, ShapeSizeMismatch) {
  const std::string p = raw_file(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 24);
  const std::string msg = read_error(p);
  EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("need 24"), std::string::npos) << msg;
  const std::string overflow =
      raw_file(R"({"w":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8);
  EXPECT_NE(read_error(overflow).find("overflows"), std::string::npos);
  const std::string neg = raw_file(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4);
  EXPECT_NE(read_error(neg).find("negative"), std::string::npos);
}

TEST_F(SafetensorsTest, MissingFieldsOverlapAndDuplicates) {
  const std::string p = raw_file(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", 4);
  const std::string msg = read_error(p);
  EXPECT_NE(msg.find("shape"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
  const std::string overlap = raw_file(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      12);
  EXPECT_NE(read_error(overlap).find("overlap"), std::string::npos);
  EXPECT_THROW(write_safetensors(path("d"), {{"a", torch::ones({1})}, {"a", torch::ones({1})}}), UserError);
}

TEST_F(SafetensorsTest, DtypeNames) {
  EXPECT_EQ(safetensors_dtype("BF16"), torch::kBFloat16);
  EXPECT_EQ(safetensors_dtype_name(torch::kLong), "I64");
  EXPECT_THROW(safetensors_dtype("Q4"), UserError);
  EXPECT_THROW(safetensors_dtype_name(torch::kComplexFloat), UserError);
}

}  // namespace
}  // namespace gpt2
