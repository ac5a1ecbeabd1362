// src/base/files.h and crc32c_file when system calls are interrupted: on NFS, Lustre or FUSE (where
// checkpoints often live) a signal can cut open, write, fsync, close, rename or mkdir short with
// EINTR, and a write can be short. This binary is linked with --wrap for those calls (see
// CMakeLists.txt), so while `Interrupted` is in scope every other call of each fails with EINTR
// before doing anything, except close, which (as Linux's does) releases the descriptor first, and
// the calls that do run move at most 64 KiB, so writes and reads are short.
#include <fcntl.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdio>
#include <map>
#include <string>

#include "src/base/crc32c.h"
#include "src/base/errors.h"
#include "src/base/files.h"
#include "tests/test_util.h"

namespace {

bool g_interrupting = false;
std::map<std::string, int>* g_calls = nullptr;       // per call: how many while interrupting
std::map<std::string, int>* g_interrupts = nullptr;  // per call: how many failed with EINTR

// Whether this call of `name` is to fail with EINTR: every other one while interrupting.
bool interrupt(const char* name) {
  if (!g_interrupting) return false;
  if ((*g_calls)[name]++ % 2 != 0) return false;
  ++(*g_interrupts)[name];
  errno = EINTR;
  return true;
}

size_t shortened(size_t n) { return g_interrupting && n > (64u << 10) ? (64u << 10) : n; }

}  // namespace

extern "C" {
int __real_open(const char* path, int flags, ...);
int __real_open64(const char* path, int flags, ...);
ssize_t __real_write(int fd, const void* buf, size_t n);
ssize_t __real_read(int fd, void* buf, size_t n);
int __real_fsync(int fd);
int __real_close(int fd);
int __real_rename(const char* from, const char* to);
int __real_mkdir(const char* path, mode_t mode);

#define GPT2_WRAP_OPEN(name)                            \
  int __wrap_##name(const char* path, int flags, ...) { \
    mode_t mode = 0;                                    \
    if ((flags & O_CREAT) != 0) {                       \
      va_list ap;                                       \
      va_start(ap, flags);                              \
      mode = static_cast<mode_t>(va_arg(ap, int));      \
      va_end(ap);                                       \
    }                                                   \
    if (interrupt(#name)) return -1;                    \
    return __real_##name(path, flags, mode);            \
  }
GPT2_WRAP_OPEN(open)
GPT2_WRAP_OPEN(open64)

ssize_t __wrap_write(int fd, const void* buf, size_t n) {
  if (interrupt("write")) return -1;
  return __real_write(fd, buf, shortened(n));
}
ssize_t __wrap_read(int fd, void* buf, size_t n) {
  if (interrupt("read")) return -1;
  return __real_read(fd, buf, shortened(n));
}
int __wrap_fsync(int fd) { return interrupt("fsync") ? -1 : __real_fsync(fd); }
int __wrap_close(int fd) {
  const int rc = __real_close(fd);
  return interrupt("close") ? -1 : rc;  // Linux: the descriptor is gone even when close says EINTR
}
int __wrap_rename(const char* from, const char* to) { return interrupt("rename") ? -1 : __real_rename(from, to); }
int __wrap_mkdir(const char* path, mode_t mode) { return interrupt("mkdir") ? -1 : __real_mkdir(path, mode); }
}

namespace gpt2::files {
namespace {

// Interrupts the wrapped calls while in scope; counts() says which calls it interrupted.
class Interrupted {
 public:
  Interrupted() {
    g_calls = &calls_;
    g_interrupts = &interrupts_;
    g_interrupting = true;
  }
  ~Interrupted() { g_interrupting = false; }
  const std::map<std::string, int>& counts() const { return interrupts_; }

 private:
  std::map<std::string, int> calls_, interrupts_;
};

std::string pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + i / 4096) & 0xff);
  return s;
}

int opens(const std::map<std::string, int>& counts) {
  return (counts.count("open") ? counts.at("open") : 0) + (counts.count("open64") ? counts.at("open64") : 0);
}

TEST(FilesUnderEintr, DurableWriteRetriesEveryCall) {
  test::TempDir dir;
  const std::string sub = dir.file("a/b"), path = files::join(sub, "big.bin"), bytes = pattern(3u << 20);
  std::map<std::string, int> counts;
  {
    Interrupted interrupted;
    try {
      create_directories(sub);
      write_file_durably(path, bytes);
    } catch (const UserError& e) {
      ADD_FAILURE() << e.what();
    }
    counts = interrupted.counts();
  }
  EXPECT_TRUE(test::read_file(path) == bytes) << "the file differs from what was written";
  EXPECT_FALSE(exists(path + ".tmp"));
  // Every kind of call was interrupted at least once, and the write went in short pieces.
  EXPECT_GT(opens(counts), 0);
  for (const char* call : {"write", "fsync", "close", "rename", "mkdir"}) EXPECT_GT(counts[call], 0) << call;
  EXPECT_GT(counts["write"], 10);
}

TEST(FilesUnderEintr, WriteDurablyAndRenameDurablyRetry) {
  test::TempDir dir;
  const std::string path = dir.file("x.bin"), moved = dir.file("y.bin");
  std::map<std::string, int> counts;
  {
    Interrupted interrupted;
    try {
      write_durably(path, [](const std::string& tmp) {
        FILE* f = std::fopen(tmp.c_str(), "wb");  // another writer's code (HDF5, a stream): not wrapped
        ASSERT_NE(f, nullptr);
        std::fputs("made elsewhere", f);
        std::fclose(f);
      });
      rename_durably(path, moved);
      sync_path(moved);
    } catch (const UserError& e) {
      ADD_FAILURE() << e.what();
    }
    counts = interrupted.counts();
  }
  EXPECT_EQ(test::read_file(moved), "made elsewhere");
  EXPECT_FALSE(exists(path));
  for (const char* call : {"fsync", "rename"}) EXPECT_GT(counts[call], 0) << call;
}

TEST(FilesUnderEintr, ReadsRetry) {
  test::TempDir dir;
  const std::string path = dir.file("r.bin"), bytes = pattern(1u << 20);
  test::write_file(path, bytes);
  std::string got;
  uint32_t crc = 0;
  uint64_t size = 0;
  std::map<std::string, int> counts;
  {
    Interrupted interrupted;
    try {
      got = read_file(path);
      crc = crc32c_file(path, &size);
    } catch (const UserError& e) {
      ADD_FAILURE() << e.what();
    }
    counts = interrupted.counts();
  }
  EXPECT_TRUE(got == bytes) << "read_file: " << got.size() << " of " << bytes.size() << " bytes";
  EXPECT_EQ(size, bytes.size());
  EXPECT_EQ(crc, crc32c(bytes.data(), bytes.size()));
  EXPECT_GT(opens(counts), 0);
  EXPECT_GT(counts["read"], 0);
}

}  // namespace
}  // namespace gpt2::files
