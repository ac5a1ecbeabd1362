#include "src/base/crc32c.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "src/base/errors.h"

namespace gpt2 {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

const std::array<uint32_t, 256>& table() {
  static const std::array<uint32_t, 256> t = [] {
    std::array<uint32_t, 256> out{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      out[i] = c;
    }
    return out;
  }();
  return t;
}

uint32_t crc_table(const unsigned char* p, size_t n, uint32_t c) {
  const auto& t = table();
  for (size_t i = 0; i < n; ++i) c = t[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc_sse42(const unsigned char* p, size_t n, uint32_t c) {
  uint64_t c64 = c;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = __builtin_ia32_crc32di(c64, v);
  }
  c = static_cast<uint32_t>(c64);
  for (; n > 0; --n, ++p) c = __builtin_ia32_crc32qi(c, *p);
  return c;
}
#endif

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
#if defined(__x86_64__)
  static const bool have_sse42 = __builtin_cpu_supports("sse4.2");
  c = have_sse42 ? crc_sse42(p, n, c) : crc_table(p, n, c);
#else
  c = crc_table(p, n, c);
#endif
  return ~c;
}

uint32_t crc32c_file(const std::string& path, uint64_t* bytes) {
  int fd = -1;
  do {  // files.cpp Note [EINTR]
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) throw UserError(path + ": cannot read: " + std::strerror(errno));
  std::vector<unsigned char> buf(size_t{4} << 20);
  uint32_t crc = 0;
  uint64_t total = 0;
  for (;;) {
    const ssize_t got = ::read(fd, buf.data(), buf.size());
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int err = errno;
      ::close(fd);
      throw UserError(path + ": read failed: " + std::strerror(err));
    }
    if (got == 0) break;
    crc = crc32c(buf.data(), static_cast<size_t>(got), crc);
    total += static_cast<uint64_t>(got);
  }
  ::close(fd);
  if (bytes != nullptr) *bytes = total;
  return crc;
}

std::string crc32c_hex(uint32_t crc) {
  char s[9];
  std::snprintf(s, sizeof s, "%08x", crc);
  return s;
}

}  // namespace gpt2
