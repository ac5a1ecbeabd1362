// Tests for data/token_file.h: round trips (uint16, uint32) and a named UserError for each way a
// token file can be wrong. Bad files are built here with the HDF5 C API.
#include "data/token_file.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <functional>
#include <numeric>

#include "data/h5_check.h"
#include "src/base/files.h"
#include "tests/test_util.h"

namespace gpt2::data {
namespace {

using gpt2::test::TempDir;
using test::user_error;
using test::write_file;

std::vector<int64_t> read_all(const TokenFile& f) {
  std::vector<int64_t> out(static_cast<size_t>(f.size()));
  f.read(0, f.size(), out.data());
  return out;
}

// Builds an HDF5 file by hand; `body` gets the file id.
void make_h5(const std::string& path, const std::function<void(hid_t)>& body) {
  H5Id file(H5_ID(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)), H5Fclose);
  body(file.get());
}

void str_attr(hid_t loc, const char* name, const std::string& value) {
  H5Id type(H5_ID(H5Tcopy(H5T_C_S1)), H5Tclose);
  H5_CHECK(H5Tset_size(type.get(), value.size() + 1));  // fixed-length: the reader takes both kinds
  H5Id space(H5_ID(H5Screate(H5S_SCALAR)), H5Sclose);
  H5Id attr(H5_ID(H5Acreate2(loc, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT)), H5Aclose);
  H5_CHECK(H5Awrite(attr.get(), type.get(), value.c_str()));
}

void int_attr(hid_t loc, const char* name, int64_t value) {
  H5Id space(H5_ID(H5Screate(H5S_SCALAR)), H5Sclose);
  H5Id attr(H5_ID(H5Acreate2(loc, name, H5T_STD_I32LE, space.get(), H5P_DEFAULT, H5P_DEFAULT)), H5Aclose);
  H5_CHECK(H5Awrite(attr.get(), H5T_NATIVE_INT64, &value));
}

void good_attrs(hid_t file, const std::string& format = kTokenFileFormat, int64_t version = 1) {
  str_attr(file, "format", format);
  int_attr(file, "format_version", version);
  int_attr(file, "vocab_size", 50257);
  int_attr(file, "eot_token", 50256);
  str_attr(file, "tokenizer", "gpt2");
}

// /tokens with the given file type, storage and contents (written as native uint32).
void tokens_dataset(hid_t file, hid_t file_type, const std::vector<uint32_t>& data, bool chunked_gzip = false) {
  const hsize_t dims[1] = {data.size()};
  H5Id space(H5_ID(H5Screate_simple(1, dims, nullptr)), H5Sclose);
  H5Id dcpl(H5_ID(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
  if (chunked_gzip) {
    const hsize_t chunk[1] = {4};
    H5_CHECK(H5Pset_chunk(dcpl.get(), 1, chunk));
    H5_CHECK(H5Pset_deflate(dcpl.get(), 4));
  }
  H5Id dset(H5_ID(H5Dcreate2(file, "tokens", file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT)),
            H5Dclose);
  H5_CHECK(H5Dwrite(dset.get(), H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()));
}

class TokenFileTest : public ::testing::Test {
 protected:
  std::string open_error(const std::string& path, int64_t expected_vocab = -1) {
    return user_error([&] { TokenFile::open(path, expected_vocab); });
  }
  TempDir dir_;
};

TEST_F(TokenFileTest, RoundTripUint16) {
  const std::string path = dir_.file("train.h5");
  std::vector<uint32_t> tokens = {15496, 995, 0, 50256, 1, 50255, 50256};
  write_token_file(path, tokens, TokenFileAttrs{});
  EXPECT_FALSE(files::exists(path + ".tmp"));
  TokenFile f = TokenFile::open(path, 50304);
  EXPECT_EQ(f.size(), 7);
  EXPECT_EQ(f.info().path, path);
  EXPECT_EQ(f.info().num_tokens, 7);
  EXPECT_EQ(f.info().dtype_bytes, 2);
  EXPECT_EQ(f.info().vocab_size, 50257);
  EXPECT_EQ(f.info().eot_token, 50256);
  EXPECT_EQ(f.info().tokenizer, "gpt2");
  EXPECT_EQ(f.info().format_version, 1);
  EXPECT_EQ(read_all(f), std::vector<int64_t>(tokens.begin(), tokens.end()));
  int64_t mid[3];
  f.read(2, 3, mid);
  EXPECT_EQ(mid[0], 0);
  EXPECT_EQ(mid[2], 1);
  f.validate_ids();
  // Move keeps the mapping alive.
  TokenFile g = std::move(f);
  EXPECT_EQ(read_all(g)[3], 50256);
}

TEST_F(TokenFileTest, RoundTripUint32) {
  const std::string path = dir_.file("big.h5");
  std::vector<uint32_t> tokens(100000);
  std::iota(tokens.begin(), tokens.end(), 0u);
  TokenFileAttrs attrs{100000, 99999, "custom-100k"};
  write_token_file(path, tokens, attrs);
  TokenFile f = TokenFile::open(path);
  EXPECT_EQ(f.info().dtype_bytes, 4);
  EXPECT_EQ(f.info().tokenizer, "custom-100k");
  EXPECT_EQ(read_all(f), std::vector<int64_t>(tokens.begin(), tokens.end()));
  f.validate_ids();
}

TEST_F(TokenFileTest, EmptyFile) {
  const std::string path = dir_.file("empty.h5");
  write_token_file(path, {}, TokenFileAttrs{});
  TokenFile f = TokenFile::open(path);
  EXPECT_EQ(f.size(), 0);
  f.validate_ids();
  f.read(0, 0, nullptr);
}

TEST_F(TokenFileTest, ReadOutOfRange) {
  const std::string path = dir_.file("t.h5");
  write_token_file(path, {1, 2, 3}, TokenFileAttrs{});
  TokenFile f = TokenFile::open(path);
  int64_t buf[4];
  EXPECT_HAS(user_error([&] { f.read(1, 3, buf); }), path + ": read of tokens [1, 1+3) is outside [0, 3)");
  EXPECT_HAS(user_error([&] { f.read(-1, 1, buf); }), "outside");
}

TEST_F(TokenFileTest, WriterRejectsIdsOutsideVocab) {
  EXPECT_HAS(user_error([&] { write_token_file(dir_.file("x.h5"), {1, 50257}, TokenFileAttrs{}); }),
             "token 50257 at position 1 is not below vocab_size 50257");
  EXPECT_HAS(user_error([&] { write_token_file(dir_.path() + "/no/such/dir/x.h5", {1}, TokenFileAttrs{}); }),
             "cannot create " + dir_.path() + "/no/such/dir/x.h5.tmp");
}

TEST_F(TokenFileTest, UnreadablePath) {
  EXPECT_HAS(open_error(dir_.file("missing.h5")), dir_.file("missing.h5") + ": cannot open token file: No such file");
  EXPECT_HAS(open_error(dir_.path()), dir_.path() + ": not a regular file");
}

TEST_F(TokenFileTest, NotHdf5) {
  write_file(dir_.file("text.h5"), "just some text, not HDF5\n");
  EXPECT_EQ(open_error(dir_.file("text.h5")),
            dir_.file("text.h5") + ": not an HDF5 file (expected a token file from gpt2-data)");
}

TEST_F(TokenFileTest, TruncatedFile) {
  const std::string path = dir_.file("trunc.h5");
  std::vector<uint32_t> tokens(10000, 42);
  write_token_file(path, tokens, TokenFileAttrs{});
  ASSERT_EQ(::truncate(path.c_str(), files::file_size(path) / 2), 0);
  const std::string msg = open_error(path);
  EXPECT_HAS(msg, path + ": ");
  EXPECT_HAS(msg, "truncated");
}

TEST_F(TokenFileTest, MissingDataset) {
  const std::string path = dir_.file("nodata.h5");
  make_h5(path, [](hid_t f) { good_attrs(f); });
  EXPECT_EQ(open_error(path), path + ": no dataset /tokens");
}

TEST_F(TokenFileTest, WrongDtype) {
  const std::string path = dir_.file("int32.h5");
  make_h5(path, [](hid_t f) {
    good_attrs(f);
    tokens_dataset(f, H5T_STD_I32LE, {1, 2, 3});
  });
  EXPECT_EQ(open_error(path), path + ": /tokens has type int32, expected little-endian uint16 or uint32");
  const std::string path2 = dir_.file("float.h5");
  make_h5(path2, [](hid_t f) {
    good_attrs(f);
    tokens_dataset(f, H5T_IEEE_F32LE, {1, 2, 3});
  });
  EXPECT_HAS(open_error(path2), "/tokens has type float32");
}

TEST_F(TokenFileTest, ChunkedCompressedDataset) {
  const std::string path = dir_.file("chunked.h5");
  make_h5(path, [](hid_t f) {
    good_attrs(f);
    tokens_dataset(f, H5T_STD_U16LE, {1, 2, 3, 4, 5, 6, 7, 8, 9}, /*chunked_gzip=*/true);
  });
  EXPECT_HAS(open_error(path), path + ": /tokens is chunked, expected contiguous storage");
}

TEST_F(TokenFileTest, WrongFormatAttribute) {
  const std::string path = dir_.file("format.h5");
  make_h5(path, [](hid_t f) {
    good_attrs(f, "llm.c-tokens");
    tokens_dataset(f, H5T_STD_U16LE, {1, 2});
  });
  EXPECT_EQ(open_error(path), path + ": root attribute format is 'llm.c-tokens', expected 'gpt2-tokens'");
  const std::string path2 = dir_.file("noformat.h5");
  make_h5(path2, [](hid_t f) { tokens_dataset(f, H5T_STD_U16LE, {1, 2}); });
  EXPECT_HAS(open_error(path2), path2 + ": missing root attribute 'format'");
  const std::string path3 = dir_.file("version.h5");
  make_h5(path3, [](hid_t f) {
    good_attrs(f, kTokenFileFormat, 7);
    tokens_dataset(f, H5T_STD_U16LE, {1, 2});
  });
  EXPECT_HAS(open_error(path3), path3 + ": format_version 7 is not supported");
}

TEST_F(TokenFileTest, HandBuiltValidFileOpens) {
  // Fixed-length string attributes and int32 ints (as other writers may produce) are accepted.
  const std::string path = dir_.file("hand.h5");
  make_h5(path, [](hid_t f) {
    good_attrs(f);
    tokens_dataset(f, H5T_STD_U16LE, {7, 8, 9});
  });
  TokenFile f = TokenFile::open(path);
  EXPECT_EQ(read_all(f), (std::vector<int64_t>{7, 8, 9}));
  EXPECT_EQ(f.info().tokenizer, "gpt2");
}

TEST_F(TokenFileTest, IdsOutsideVocab) {
  const std::string path = dir_.file("ids.h5");
  make_h5(path, [](hid_t f) {
    good_attrs(f);
    std::vector<uint32_t> data(10000, 5);
    data[6543] = 60000;
    tokens_dataset(f, H5T_STD_U16LE, data);
  });
  TokenFile f = TokenFile::open(path);  // opening does not scan
  EXPECT_HAS(user_error([&] { f.validate_ids(); }),
             path + ": token at position 6543 is 60000, not below vocab_size 50257");
}

TEST_F(TokenFileTest, VocabLargerThanModel) {
  const std::string path = dir_.file("v.h5");
  write_token_file(path, {1}, TokenFileAttrs{});
  EXPECT_HAS(open_error(path, 1000), path + ": vocab_size 50257 is larger than the model's vocab_size 1000");
}

}  // namespace
}  // namespace gpt2::data
