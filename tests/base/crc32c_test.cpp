// CRC-32C against the standard check value and a bitwise reference; the SSE4.2 path and the table
// must agree at every length and alignment; a file's CRC equals the CRC of its bytes.
#include "src/base/crc32c.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/test_util.h"

namespace gpt2 {
namespace {

// Bit by bit, straight from the definition (reflected, init and final xor 0xFFFFFFFF).
uint32_t reference(const unsigned char* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

TEST(Crc32c, CheckValueAndHex) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the catalogue's check value for CRC-32C
  EXPECT_EQ(crc32c("", 0), 0u);
  EXPECT_EQ(crc32c_hex(0xE3069283u), "e3069283");
  EXPECT_EQ(crc32c_hex(0x1u), "00000001");
}

TEST(Crc32c, MatchesBitwiseReferenceAndContinues) {
  std::vector<unsigned char> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 131 + 7);
  for (size_t start : {0, 1, 3, 7}) {
    for (size_t n : {0, 1, 7, 8, 9, 63, 500, 993}) {
      EXPECT_EQ(crc32c(data.data() + start, n), reference(data.data() + start, n)) << start << " " << n;
    }
  }
  // Continuing over two pieces equals one pass.
  EXPECT_EQ(crc32c(data.data() + 333, 667, crc32c(data.data(), 333)), crc32c(data.data(), 1000));
}

TEST(Crc32c, FileAndMissingFile) {
  test::TempDir dir("gpt2_crc");
  std::string bytes(10 << 20, 'x');
  for (size_t i = 0; i < bytes.size(); i += 4093) bytes[i] = static_cast<char>(i);
  test::write_file(dir.file("f.bin"), bytes);
  uint64_t size = 0;
  EXPECT_EQ(crc32c_file(dir.file("f.bin"), &size), crc32c(bytes.data(), bytes.size()));
  EXPECT_EQ(size, bytes.size());
  const std::string err = test::user_error([&] { crc32c_file(dir.file("none.bin")); });
  EXPECT_NE(err.find(dir.file("none.bin")), std::string::npos) << err;
}

}  // namespace
}  // namespace gpt2
