// Tests for data/token_file.h: round trips (uint16, uint32) and a named UserError for each way a
// token file can be wrong (the malformed-input list in tests/fuzz/README.md points here). Bad
// files are built here with the HDF5 C API or by damaging good ones.
#include "data/token_file.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <functional>
#include <numeric>

#include "data/batch_sampler.h"
#include "src/base/files.h"
#include "src/base/h5_check.h"
#include "tests/test_util.h"

namespace gpt2::data {
namespace {

using h5::H5Id;

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
  H5Id dset(H5_ID(H5Dcreate2(file, "tokens", file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT)), H5Dclose);
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
  EXPECT_HAS(user_error([&] {
               write_token_file(dir_.file("x.h5"), {1, 50257}, TokenFileAttrs{});
             }),
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

// ---------------------------------------------------------------- more malformed files

// A valid file's bytes, for damaging.
std::string good_file_bytes(const TempDir& dir, size_t num_tokens = 100) {
  const std::string path = dir.file("good_source.h5");
  write_token_file(path, std::vector<uint32_t>(num_tokens, 7), TokenFileAttrs{});
  return test::read_file(path);
}

TEST_F(TokenFileTest, EmptyFileOfZeroBytes) {
  write_file(dir_.file("zero.h5"), "");
  EXPECT_HAS(open_error(dir_.file("zero.h5")), dir_.file("zero.h5") + ": empty file (0 bytes), not a token file");
}

TEST_F(TokenFileTest, DirectoryGivenAsFile) {
  files::create_directories(dir_.file("sub.h5"));
  EXPECT_HAS(open_error(dir_.file("sub.h5")), dir_.file("sub.h5") + ": not a regular file (a directory");
}

// Root reads a file whatever its mode (CI runs as root): while it lives, the process acts as
// nobody (effective uid and gid 65534; the saved uid 0 lets it come back).
class ActAsNobody {
 public:
  ActAsNobody() {
    if (::geteuid() != 0) return;
    dropped_ = ::setegid(65534) == 0 && ::seteuid(65534) == 0;
  }
  ~ActAsNobody() {
    if (dropped_ && (::seteuid(0) != 0 || ::setegid(0) != 0)) std::abort();  // later tests need root back
  }
  ActAsNobody(const ActAsNobody&) = delete;
  ActAsNobody& operator=(const ActAsNobody&) = delete;
  bool ok() const { return ::geteuid() != 0; }

 private:
  bool dropped_ = false;
};

TEST_F(TokenFileTest, UnreadableFile) {
  const std::string path = dir_.file("secret.h5");
  write_token_file(path, {1, 2}, TokenFileAttrs{});
  ASSERT_EQ(::chmod(path.c_str(), 0), 0);
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);  // the directory is not what stops the read
  std::string error;
  {
    ActAsNobody nobody;
    ASSERT_TRUE(nobody.ok()) << "cannot drop root to test a file's permissions";
    ASSERT_NE(::faccessat(AT_FDCWD, path.c_str(), R_OK, AT_EACCESS), 0);  // as the effective user
    error = open_error(path);
  }
  EXPECT_HAS(error, path + ": cannot read token file: Permission denied");
}

TEST_F(TokenFileTest, OtherFormatsAreNotHdf5) {
  // An llm.c shard given where a token file belongs, and an HDF5 signature at a non-standard offset.
  std::string llmc(1024 + 8, '\0');
  const int32_t header[3] = {20240520, 1, 4};
  std::memcpy(llmc.data(), header, sizeof header);
  write_file(dir_.file("shard.bin"), llmc);
  EXPECT_HAS(open_error(dir_.file("shard.bin")), dir_.file("shard.bin") + ": not an HDF5 file");
  write_file(dir_.file("offset.h5"), std::string(100, 'x') + good_file_bytes(dir_));
  EXPECT_HAS(open_error(dir_.file("offset.h5")), "not an HDF5 file");
}

TEST_F(TokenFileTest, SignatureOnlyOrCutHeader) {
  const std::string good = good_file_bytes(dir_);
  for (size_t keep : {size_t{8}, size_t{40}, size_t{200}, good.size() - 300}) {
    const std::string path = dir_.file("cut" + std::to_string(keep) + ".h5");
    write_file(path, good.substr(0, keep));
    const std::string msg = open_error(path);
    EXPECT_HAS(msg, path + ": ");
    EXPECT_TRUE(msg.find("damaged or truncated") != std::string::npos || msg.find("truncated") != std::string::npos)
        << keep << ": " << msg;
  }
}

TEST_F(TokenFileTest, UserBlockFileOpens) {
  // HDF5 allows a user block before the superblock; the signature check must look past it.
  const std::string path = dir_.file("ublock.h5");
  H5Id fcpl(H5_ID(H5Pcreate(H5P_FILE_CREATE)), H5Pclose);
  H5_CHECK(H5Pset_userblock(fcpl.get(), 512));
  {
    H5Id file(H5_ID(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl.get(), H5P_DEFAULT)), H5Fclose);
    good_attrs(file.get());
    tokens_dataset(file.get(), H5T_STD_U16LE, {11, 12, 13});
  }
  TokenFile f = TokenFile::open(path);
  EXPECT_EQ(read_all(f), (std::vector<int64_t>{11, 12, 13}));
}

TEST_F(TokenFileTest, TwoDimensionalDataset) {
  const std::string path = dir_.file("2d.h5");
  make_h5(path, [](hid_t f) {
    good_attrs(f);
    const hsize_t dims[2] = {2, 3};
    H5Id space(H5_ID(H5Screate_simple(2, dims, nullptr)), H5Sclose);
    H5Id dset(H5_ID(H5Dcreate2(f, "tokens", H5T_STD_U16LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)),
              H5Dclose);
    const uint16_t data[6] = {1, 2, 3, 4, 5, 6};
    H5_CHECK(H5Dwrite(dset.get(), H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
  });
  EXPECT_EQ(open_error(path), path + ": /tokens has rank 2, expected a 1-D dataset");
}

TEST_F(TokenFileTest, TokensIsAGroup) {
  const std::string path = dir_.file("group.h5");
  make_h5(path, [](hid_t f) {
    good_attrs(f);
    H5Id g(H5_ID(H5Gcreate2(f, "tokens", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)), H5Gclose);
  });
  EXPECT_EQ(open_error(path), path + ": /tokens is not a dataset");
}

TEST_F(TokenFileTest, TokensIsAnExternalLink) {
  // The link would make the mmap offset point into another file than the one mapped.
  const std::string target = dir_.file("target.h5");
  write_token_file(target, {1, 2, 3}, TokenFileAttrs{});
  const std::string path = dir_.file("extlink.h5");
  make_h5(path, [&](hid_t f) {
    good_attrs(f);
    H5_CHECK(H5Lcreate_external(target.c_str(), "/tokens", f, "tokens", H5P_DEFAULT, H5P_DEFAULT));
  });
  EXPECT_EQ(open_error(path), path + ": /tokens is an external link, expected a dataset in this file");
}

TEST_F(TokenFileTest, CompactAndUnallocatedDatasets) {
  const std::string path = dir_.file("compact.h5");
  make_h5(path, [](hid_t f) {
    good_attrs(f);
    const hsize_t dims[1] = {4};
    H5Id space(H5_ID(H5Screate_simple(1, dims, nullptr)), H5Sclose);
    H5Id dcpl(H5_ID(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
    H5_CHECK(H5Pset_layout(dcpl.get(), H5D_COMPACT));
    H5Id dset(H5_ID(H5Dcreate2(f, "tokens", H5T_STD_U16LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT)),
              H5Dclose);
  });
  EXPECT_HAS(open_error(path), path + ": /tokens is compact, expected contiguous storage");
  const std::string path2 = dir_.file("unalloc.h5");
  make_h5(path2, [](hid_t f) {
    good_attrs(f);
    const hsize_t dims[1] = {4};
    H5Id space(H5_ID(H5Screate_simple(1, dims, nullptr)), H5Sclose);
    // Contiguous, late allocation, never written: no storage in the file at all.
    H5Id dset(H5_ID(H5Dcreate2(f, "tokens", H5T_STD_U16LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)),
              H5Dclose);
  });
  EXPECT_EQ(open_error(path2), path2 + ": /tokens has no storage allocated");
}

TEST_F(TokenFileTest, BigEndianAndOddPrecisionTypes) {
  const std::string path = dir_.file("be.h5");
  make_h5(path, [](hid_t f) {
    good_attrs(f);
    tokens_dataset(f, H5T_STD_U16BE, {1, 2, 3});
  });
  EXPECT_EQ(open_error(path), path + ": /tokens has type uint16 (big-endian), expected little-endian uint16 or uint32");
  const std::string path2 = dir_.file("12bit.h5");
  make_h5(path2, [](hid_t f) {
    good_attrs(f);
    H5Id type(H5_ID(H5Tcopy(H5T_STD_U16LE)), H5Tclose);
    H5_CHECK(H5Tset_precision(type.get(), 12));
    tokens_dataset(f, type.get(), {1, 2, 3});
  });
  EXPECT_HAS(open_error(path2), path2 + ": /tokens has type uint16 (12 significant bits at offset 0)");
  const std::string path3 = dir_.file("u8.h5");
  make_h5(path3, [](hid_t f) {
    good_attrs(f);
    tokens_dataset(f, H5T_STD_U8LE, {1, 2, 3});
  });
  EXPECT_HAS(open_error(path3), "/tokens has type uint8");
  const std::string path4 = dir_.file("u64.h5");
  make_h5(path4, [](hid_t f) {
    good_attrs(f);
    tokens_dataset(f, H5T_STD_U64LE, {1, 2, 3});
  });
  EXPECT_HAS(open_error(path4), "/tokens has type uint64");
}

TEST_F(TokenFileTest, Uint16WithLargeVocab) {
  const std::string path = dir_.file("narrow.h5");
  make_h5(path, [](hid_t f) {
    str_attr(f, "format", kTokenFileFormat);
    int_attr(f, "format_version", 1);
    int_attr(f, "vocab_size", 100000);
    int_attr(f, "eot_token", 5);
    str_attr(f, "tokenizer", "big");
    tokens_dataset(f, H5T_STD_U16LE, {1, 2});
  });
  EXPECT_EQ(open_error(path), path + ": /tokens is uint16 but vocab_size 100000 needs uint32");
}

// A file with good attributes except `name` = value (int) or replaced by a string.
std::string with_attr(const TempDir& dir, const std::string& file, const std::function<void(hid_t)>& attrs) {
  const std::string path = dir.file(file);
  make_h5(path, [&](hid_t f) {
    attrs(f);
    tokens_dataset(f, H5T_STD_U16LE, {1, 2});
  });
  return path;
}

TEST_F(TokenFileTest, NegativeAndAbsurdAttributes) {
  auto attrs = [](int64_t vocab, int64_t eot) {
    return [=](hid_t f) {
      str_attr(f, "format", kTokenFileFormat);
      int_attr(f, "format_version", 1);
      H5Id space(H5_ID(H5Screate(H5S_SCALAR)), H5Sclose);
      for (auto [name, value] : {std::pair<const char*, int64_t>{"vocab_size", vocab}, {"eot_token", eot}}) {
        H5Id attr(H5_ID(H5Acreate2(f, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT)), H5Aclose);
        H5_CHECK(H5Awrite(attr.get(), H5T_NATIVE_INT64, &value));
      }
      str_attr(f, "tokenizer", "gpt2");
    };
  };
  std::string p = with_attr(dir_, "negvocab.h5", attrs(-5, 0));
  EXPECT_EQ(open_error(p), p + ": vocab_size -5 is out of range");
  p = with_attr(dir_, "hugevocab.h5", attrs(int64_t{1} << 40, 0));
  EXPECT_EQ(open_error(p), p + ": vocab_size 1099511627776 is out of range");
  p = with_attr(dir_, "negeot.h5", attrs(50257, -1));
  EXPECT_EQ(open_error(p), p + ": eot_token -1 is not below vocab_size 50257");
  p = with_attr(dir_, "bigeot.h5", attrs(50257, 50257));
  EXPECT_EQ(open_error(p), p + ": eot_token 50257 is not below vocab_size 50257");
  p = with_attr(dir_, "negversion.h5", [](hid_t f) { good_attrs(f, kTokenFileFormat, -1); });
  EXPECT_HAS(open_error(p), p + ": format_version -1 is not supported");
}

TEST_F(TokenFileTest, AttributesOfTheWrongKind) {
  std::string p = with_attr(dir_, "strvocab.h5", [](hid_t f) {
    str_attr(f, "format", kTokenFileFormat);
    int_attr(f, "format_version", 1);
    str_attr(f, "vocab_size", "50257");
    int_attr(f, "eot_token", 50256);
    str_attr(f, "tokenizer", "gpt2");
  });
  EXPECT_EQ(open_error(p), p + ": root attribute 'vocab_size' is not a single integer");
  p = with_attr(dir_, "intformat.h5", [](hid_t f) { int_attr(f, "format", 1); });
  EXPECT_EQ(open_error(p), p + ": root attribute 'format' is not a string");
  p = with_attr(dir_, "noeot.h5", [](hid_t f) {
    str_attr(f, "format", kTokenFileFormat);
    int_attr(f, "format_version", 1);
    int_attr(f, "vocab_size", 50257);
    str_attr(f, "tokenizer", "gpt2");
  });
  EXPECT_HAS(open_error(p), p + ": missing root attribute 'eot_token'");
  p = with_attr(dir_, "longstr.h5", [](hid_t f) {
    good_attrs(f);
    H5_CHECK(H5Adelete(f, "tokenizer"));
    str_attr(f, "tokenizer", std::string(10000, 'x'));
  });
  EXPECT_EQ(open_error(p), p + ": root attribute 'tokenizer' has an implausible string size 10001");
  p = with_attr(dir_, "arrayvocab.h5", [](hid_t f) {
    str_attr(f, "format", kTokenFileFormat);
    int_attr(f, "format_version", 1);
    const hsize_t two[1] = {2};
    H5Id space(H5_ID(H5Screate_simple(1, two, nullptr)), H5Sclose);
    H5Id attr(H5_ID(H5Acreate2(f, "vocab_size", H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT)), H5Aclose);
    const int64_t v[2] = {50257, 50257};
    H5_CHECK(H5Awrite(attr.get(), H5T_NATIVE_INT64, v));
    int_attr(f, "eot_token", 50256);
    str_attr(f, "tokenizer", "gpt2");
  });
  EXPECT_EQ(open_error(p), p + ": root attribute 'vocab_size' is not a single integer");
}

TEST_F(TokenFileTest, GlobalHeapThatWouldHangLibhdf5) {
  // Found by tests/fuzz: a global heap whose free-space object has size 0 makes libhdf5 1.10 loop
  // forever when it reads the variable-length `format` string (Note [libhdf5 global heap loop]).
  std::string bytes = good_file_bytes(dir_);
  const size_t heap = bytes.find("GCOL");
  ASSERT_NE(heap, std::string::npos);
  // Walk to the free-space object (index 0) and zero its size.
  size_t p = heap + 16;
  while (true) {
    uint16_t index;
    uint64_t size;
    std::memcpy(&index, bytes.data() + p, 2);
    std::memcpy(&size, bytes.data() + p + 8, 8);
    if (index == 0) break;
    p += 16 + ((size + 7) & ~uint64_t{7});
  }
  const uint64_t zero = 0;
  std::memcpy(bytes.data() + p + 8, &zero, 8);
  write_file(dir_.file("heap.h5"), bytes);
  EXPECT_EQ(open_error(dir_.file("heap.h5")),
            dir_.file("heap.h5") + ": damaged HDF5 global heap at byte " + std::to_string(heap) +
                " (object 0 of size 0); refusing it before libhdf5 parses it (it can hang on such heaps)");
}

TEST_F(TokenFileTest, FilesThatCrashLibhdf5AreUserErrors) {
  // tests/data/damaged_h5 holds the inputs tests/fuzz found (crash-*, and hangs/leaks from before
  // the fixes). Parsed by libhdf5 1.10.8 in this process, two of them kill it with SIGSEGV (and
  // others read past buffers). Opened here, each must be refused with a UserError naming the file
  // and nothing else (Note [libhdf5 in a child process]), at least one as a libhdf5 crash.
  const std::string dir = test::source_dir() + "/tests/data/damaged_h5";
  const std::vector<std::string> names = files::list_directory(dir);
  ASSERT_GE(names.size(), 10u);
  int crashed = 0;
  for (const std::string& name : names) {
    const std::string path = dir + "/" + name;
    const std::string message = open_error(path);
    EXPECT_EQ(message.rfind(path + ": ", 0), 0u) << message;
    if (message.find("libhdf5 crashed reading this file") != std::string::npos) ++crashed;
    std::printf("%s -> %s\n", name.c_str(), message.substr(path.size() + 2).c_str());
  }
  EXPECT_GE(crashed, 1);
}

TEST_F(TokenFileTest, DamagedBytesNeverCrash) {
  // Overwrite every 64-byte stretch of a good file in turn: each variant opens, or fails with a
  // UserError naming the file; none may crash or throw anything else (the fuzzer's seed idea).
  const std::string good = good_file_bytes(dir_, 50);
  int opened = 0, refused = 0;
  for (size_t at = 0; at + 64 <= good.size(); at += 64) {
    std::string bad = good;
    for (size_t i = at; i < at + 64; ++i) bad[i] = static_cast<char>(bad[i] ^ 0x5A);
    const std::string path = dir_.file("damaged.h5");
    write_file(path, bad);
    try {
      TokenFile f = TokenFile::open(path);
      f.validate_ids();
      read_all(f);
      ++opened;
    } catch (const UserError& e) {
      EXPECT_HAS(e.what(), path);
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(opened + refused, 10);
}

TEST_F(TokenFileTest, ShorterThanOneWindow) {
  // Through TokenFile + BatchSampler, as the trainer reads it: 8 tokens cannot fill a window of
  // seq_len + 1 = 9 tokens.
  const std::string path = dir_.file("short.h5");
  write_token_file(path, std::vector<uint32_t>(8, 1), TokenFileAttrs{});
  TokenFile f = TokenFile::open(path, 50304);
  EXPECT_HAS(user_error([&] { BatchSampler(f.size(), 8, 1); }),
             "token stream of 8 tokens is shorter than one window of 9 tokens");
  BatchSampler ok(f.size(), 7, 1);  // 8 tokens make exactly one window of 7 + 1
  EXPECT_EQ(ok.num_windows(), 1);
  write_token_file(dir_.file("none.h5"), {}, TokenFileAttrs{});
  EXPECT_HAS(user_error([&] { BatchSampler(TokenFile::open(dir_.file("none.h5")).size(), 1024, 1); }),
             "token stream of 0 tokens is shorter than one window of 1025 tokens");
}

TEST_F(TokenFileTest, RawPointerWritersRoundTrip) {
  const uint16_t narrow[4] = {1, 2, 50256, 3};
  write_token_file(dir_.file("p16.h5"), narrow, 4, TokenFileAttrs{});
  EXPECT_EQ(read_all(TokenFile::open(dir_.file("p16.h5"))), (std::vector<int64_t>{1, 2, 50256, 3}));
  const uint32_t wide[3] = {99999, 0, 70000};
  write_token_file(dir_.file("p32.h5"), wide, 3, TokenFileAttrs{100000, 99999, "big"});
  TokenFile f = TokenFile::open(dir_.file("p32.h5"));
  EXPECT_EQ(f.info().dtype_bytes, 4);
  EXPECT_EQ(read_all(f), (std::vector<int64_t>{99999, 0, 70000}));
  EXPECT_HAS(user_error([&] { write_token_file(dir_.file("bad.h5"), wide, 3, TokenFileAttrs{}); }),
             "token 99999 at position 0 is not below vocab_size 50257");
}

}  // namespace
}  // namespace gpt2::data
