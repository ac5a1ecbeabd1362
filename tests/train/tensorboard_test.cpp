// TensorBoard event files: the masked CRC against a value worked out by hand, an Event's bytes
// against the wire format spelled out byte by byte, a written file re-read record by record with
// both CRCs checked, and a directory that cannot be created. TensorBoard itself reads the files in
// tests/python/test_tensorboard.py.
#include "src/train/tensorboard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "src/base/files.h"
#include "tests/test_util.h"

namespace gpt2 {
namespace {

std::string bytes(std::initializer_list<unsigned> list) {
  std::string s;
  for (unsigned b : list) s += static_cast<char>(b);
  return s;
}

uint64_t read_le(const std::string& s, size_t pos, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(s[pos + i])) << (8 * i);
  return v;
}

TEST(TensorBoardWriter, MaskedCrcByHand) {
  // crc32c("123456789") = 0xE3069283 (the catalogue check value). Rotate right by 15:
  // low 15 bits 0x1283 move to the top (0x1283 << 17 = 0x25060000), the rest shift down
  // (0xE3069283 >> 15 = 0x0001C60D): 0x2507C60D. Plus 0xA282EAD8 mod 2^32 = 0xC78AB0E5.
  EXPECT_EQ(tensorboard::masked_crc32c("123456789", 9), 0xC78AB0E5u);
  // crc32c of nothing is 0, so the mask is the constant alone.
  EXPECT_EQ(tensorboard::masked_crc32c("", 0), 0xA282EAD8u);
}

TEST(TensorBoardWriter, ScalarEventBytes) {
  const std::string expected = bytes({
      0x09,                                            // key: field 1 (wall_time), wire type 1 (64-bit)
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xF8, 0x3F,  // 1.5 as a little-endian double (0x3FF8000000000000)
      0x10,                                            // key: field 2 (step), wire type 0 (varint)
      0xAC, 0x02,                                      // 300 = 0b10_0101100: 0x2C | 0x80, then 0x02
      0x2A,                                            // key: field 5 (summary), wire type 2 (length-delimited)
      0x0D,                                            // 13 bytes of Summary follow
      0x0A,                                            //   key: Summary field 1 (value), wire type 2
      0x0B,                                            //   11 bytes of Summary.Value follow
      0x0A,                                            //     key: Value field 1 (tag), wire type 2
      0x04, 'l',  'o',  's',  's',                     //     length 4, "loss"
      0x15,                                            //     key: Value field 2 (simple_value), wire type 5 (32-bit)
      0x00, 0x00, 0x20, 0x40,                          //     2.5 as a little-endian float (0x40200000)
  });
  EXPECT_EQ(tensorboard::scalars_event(1.5, 300, {{"loss", 2.5}}), expected);

  const std::string version = bytes({
                                  0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xF8, 0x3F,  // wall_time 1.5
                                  0x1A, 0x0D,  // field 3 (file_version), wire type 2, 13 bytes
                              }) +
                              "brain.Event:2";
  EXPECT_EQ(tensorboard::file_version_event(1.5), version);

  // A negative step is its 64-bit two's complement: ten varint bytes.
  const std::string neg = tensorboard::scalars_event(1.5, -1, {{"x", 0.0}});
  EXPECT_EQ(neg.substr(9, 11), bytes({0x10, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01}));
  // Non-finite values go through as floats: +inf is 0x7F800000.
  const std::string inf = tensorboard::scalars_event(1.5, 0, {{"x", std::numeric_limits<double>::infinity()}});
  EXPECT_EQ(inf.substr(inf.size() - 4), bytes({0x00, 0x00, 0x80, 0x7F}));
}

TEST(TensorBoardWriter, RecordFraming) {
  const std::string data = "abc";
  const std::string rec = tensorboard::frame_record(data);
  ASSERT_EQ(rec.size(), 8u + 4u + 3u + 4u);
  EXPECT_EQ(rec.substr(0, 8), bytes({3, 0, 0, 0, 0, 0, 0, 0}));  // u64 LE length
  EXPECT_EQ(read_le(rec, 8, 4), tensorboard::masked_crc32c(rec.data(), 8));
  EXPECT_EQ(rec.substr(12, 3), data);
  EXPECT_EQ(read_le(rec, 15, 4), tensorboard::masked_crc32c("abc", 3));
}

TEST(TensorBoardWriter, FileReadsBackRecordByRecord) {
  test::TempDir tmp("tb_test");
  const std::string dir = tmp.file("runs/a");  // nested: the writer creates both levels
  std::string path;
  {
    TensorBoardWriter tb(dir);
    ASSERT_TRUE(tb.enabled());
    path = tb.path();
    tb.add_scalar("loss", 2.5, 0);
    tb.add_scalars(1, {{"loss", 2.25}, {"lr", 3e-4}, {"grad_norm", std::nan("")}});
    tb.add_scalars(2, {});  // nothing to write: no record
    tb.add_scalar("loss", 2.0, 2);
  }
  const auto names = files::list_directory(dir);
  ASSERT_EQ(names.size(), 1u);
  EXPECT_EQ(names[0].rfind("events.out.tfevents.", 0), 0u) << names[0];
  EXPECT_EQ(files::join(dir, names[0]), path);

  const std::string file = test::read_file(path);
  std::vector<std::string> records;
  size_t pos = 0;
  while (pos < file.size()) {
    ASSERT_LE(pos + 12, file.size()) << "truncated header at " << pos;
    const uint64_t len = read_le(file, pos, 8);
    EXPECT_EQ(read_le(file, pos + 8, 4), tensorboard::masked_crc32c(file.data() + pos, 8))
        << "record " << records.size();
    ASSERT_LE(pos + 12 + len + 4, file.size()) << "truncated data at " << pos;
    const std::string data = file.substr(pos + 12, len);
    EXPECT_EQ(read_le(file, pos + 12 + len, 4), tensorboard::masked_crc32c(data.data(), data.size()))
        << "record " << records.size();
    records.push_back(data);
    pos += 12 + len + 4;
  }
  ASSERT_EQ(records.size(), 4u);  // file_version + three add calls
  EXPECT_EQ(records[0].substr(9), bytes({0x1A, 0x0D}) + "brain.Event:2");
  EXPECT_NE(records[2].find("grad_norm"), std::string::npos);
  // The recorded wall time is now-ish (seconds since the epoch, after 2020).
  const uint64_t bits = read_le(records[1], 1, 8);
  double wall;
  std::memcpy(&wall, &bits, sizeof wall);
  EXPECT_GT(wall, 1.58e9);
}

TEST(TensorBoardWriter, DefaultWritesNothing) {
  TensorBoardWriter tb;
  EXPECT_FALSE(tb.enabled());
  tb.add_scalar("loss", 1.0, 0);  // no-op, no throw
  tb.flush();
}

TEST(TensorBoardWriter, UncreatableDirectoryNamesThePath) {
  test::TempDir tmp("tb_test");
  const std::string plain = tmp.file("plain");
  test::write_file(plain, "not a directory");
  const std::string dir = plain + "/tb";
  const std::string msg = test::user_error([&] { TensorBoardWriter tb(dir); });
  EXPECT_HAS(msg, dir);
}

}  // namespace
}  // namespace gpt2
