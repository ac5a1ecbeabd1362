// Tests for src/base/files.h: queries, path strings, directories, and that errors are
// gpt2::UserError naming the path. (The same helpers under a loaded libtorch: tests/io.)
#include "src/base/files.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "src/base/errors.h"
#include "tests/test_util.h"

namespace gpt2::files {
namespace {

using test::TempDir;
using test::user_error;
const auto& write = test::write_file;

TEST(Files, PathStrings) {
  EXPECT_EQ(parent_path("a/b/c.txt"), "a/b");
  EXPECT_EQ(parent_path("a/b/"), "a");
  EXPECT_EQ(parent_path("a//b"), "a");
  EXPECT_EQ(parent_path("/a"), "/");
  EXPECT_EQ(parent_path("/"), "/");
  EXPECT_EQ(parent_path("name"), "");
  EXPECT_EQ(parent_path(""), "");

  EXPECT_EQ(filename("a/b.txt"), "b.txt");
  EXPECT_EQ(filename("b.txt"), "b.txt");
  EXPECT_EQ(filename("a/"), "");

  EXPECT_EQ(extension("x/a.b.dat"), ".dat");
  EXPECT_EQ(extension("x.d/file"), "");
  EXPECT_EQ(extension(".hidden"), "");
  EXPECT_EQ(extension(".."), "");
  EXPECT_EQ(extension("a."), ".");

  EXPECT_EQ(join("a", "b"), "a/b");
  EXPECT_EQ(join("a/", "b"), "a/b");
  EXPECT_EQ(join("", "b"), "b");
  EXPECT_EQ(join("a", ""), "a");
  EXPECT_EQ(join("a", "/abs"), "/abs");
}

TEST(Files, Queries) {
  TempDir dir;
  write(dir.file("f"), "12345");
  ASSERT_EQ(::symlink(dir.file("f").c_str(), dir.file("link").c_str()), 0);
  ASSERT_EQ(::symlink(dir.file("gone").c_str(), dir.file("dangling").c_str()), 0);

  EXPECT_TRUE(exists(dir.path()));
  EXPECT_TRUE(is_directory(dir.path()));
  EXPECT_FALSE(is_regular_file(dir.path()));

  EXPECT_TRUE(exists(dir.file("f")));
  EXPECT_TRUE(is_regular_file(dir.file("f")));
  EXPECT_FALSE(is_directory(dir.file("f")));
  EXPECT_FALSE(is_symlink(dir.file("f")));
  EXPECT_EQ(file_size(dir.file("f")), 5);

  EXPECT_TRUE(is_symlink(dir.file("link")));
  EXPECT_TRUE(is_regular_file(dir.file("link")));  // follows the link
  EXPECT_EQ(file_size(dir.file("link")), 5);

  EXPECT_TRUE(is_symlink(dir.file("dangling")));
  EXPECT_FALSE(exists(dir.file("dangling")));

  EXPECT_FALSE(exists(dir.file("missing")));
  EXPECT_FALSE(exists(dir.file("f/under_a_file")));  // ENOTDIR counts as missing
  EXPECT_FALSE(exists(""));
  EXPECT_FALSE(is_directory(dir.file("missing")));
  EXPECT_FALSE(is_symlink(dir.file("missing")));
  EXPECT_HAS(user_error([&] { file_size(dir.file("missing")); }), dir.file("missing") + ": cannot stat: No such file");
}

TEST(Files, CreateDirectories) {
  TempDir dir;
  const std::string deep = dir.file("a/b//c/");
  create_directories(deep);
  EXPECT_TRUE(is_directory(dir.file("a/b/c")));
  create_directories(deep);  // already there: fine
  create_directories(dir.path());

  write(dir.file("file"), "x");
  EXPECT_EQ(user_error([&] { create_directories(dir.file("file/sub")); }),
            dir.file("file") + ": cannot create directory: exists and is not a directory");
  EXPECT_HAS(user_error([&] { create_directories(""); }), "empty name");

  ASSERT_EQ(::chmod(dir.file("a").c_str(), 0500), 0);
  if (::geteuid() != 0) {  // root ignores the mode
    EXPECT_EQ(user_error([&] { create_directories(dir.file("a/new/x")); }),
              dir.file("a/new") + ": cannot create directory: Permission denied");
  }
  ASSERT_EQ(::chmod(dir.file("a").c_str(), 0700), 0);
}

TEST(Files, ListDirectoryIsSortedWithoutDots) {
  TempDir dir;
  write(dir.file("b"), "");
  write(dir.file("a"), "");
  write(dir.file(".hidden"), "");
  create_directories(dir.file("c"));
  EXPECT_EQ(list_directory(dir.path()), (std::vector<std::string>{".hidden", "a", "b", "c"}));
  EXPECT_TRUE(list_directory(dir.file("c")).empty());
  EXPECT_HAS(user_error([&] { list_directory(dir.file("nope")); }),
             dir.file("nope") + ": cannot list directory: No such file");
  EXPECT_HAS(user_error([&] { list_directory(dir.file("a")); }),
             dir.file("a") + ": cannot list directory: Not a directory");
}

TEST(Files, RemoveTreeDoesNotFollowSymlinks) {
  TempDir outside;
  write(outside.file("keep"), "precious");
  TempDir dir;
  create_directories(dir.file("t/sub/deeper"));
  write(dir.file("t/sub/deeper/f"), "x");
  write(dir.file("t/g"), "y");
  ASSERT_EQ(::symlink(outside.path().c_str(), dir.file("t/sub/to_outside").c_str()), 0);
  ASSERT_EQ(::symlink(outside.file("keep").c_str(), dir.file("t/keep_link").c_str()), 0);

  remove_tree(dir.file("t"));
  EXPECT_FALSE(exists(dir.file("t")));
  EXPECT_EQ(read_file(outside.file("keep")), "precious");

  remove_tree(dir.file("t"));  // missing: nothing to do
  write(dir.file("plain"), "z");
  remove_tree(dir.file("plain"));  // a file is a tree of one
  EXPECT_FALSE(exists(dir.file("plain")));
  ASSERT_EQ(::symlink(outside.path().c_str(), dir.file("top_link").c_str()), 0);
  remove_tree(dir.file("top_link"));  // the link goes, its target stays
  EXPECT_FALSE(is_symlink(dir.file("top_link")));
  EXPECT_TRUE(is_regular_file(outside.file("keep")));

  if (::geteuid() != 0) {
    create_directories(dir.file("locked/inner"));
    write(dir.file("locked/inner/f"), "x");
    ASSERT_EQ(::chmod(dir.file("locked/inner").c_str(), 0500), 0);
    EXPECT_EQ(user_error([&] { remove_tree(dir.file("locked")); }),
              dir.file("locked/inner/f") + ": cannot remove: Permission denied");
    ASSERT_EQ(::chmod(dir.file("locked/inner").c_str(), 0700), 0);
  }
}

TEST(Files, RemoveFile) {
  TempDir dir;
  write(dir.file("f"), "x");
  EXPECT_TRUE(remove_file(dir.file("f")));
  EXPECT_FALSE(remove_file(dir.file("f")));
  create_directories(dir.file("d/e"));
  EXPECT_HAS(user_error([&] { remove_file(dir.file("d")); }), dir.file("d") + ": cannot remove: ");
}

TEST(Files, RenameFile) {
  TempDir dir;
  write(dir.file("tmp"), "new");
  write(dir.file("dst"), "old");
  rename_file(dir.file("tmp"), dir.file("dst"));
  EXPECT_EQ(read_file(dir.file("dst")), "new");
  EXPECT_FALSE(exists(dir.file("tmp")));
  EXPECT_EQ(user_error([&] { rename_file(dir.file("tmp"), dir.file("dst")); }),
            "cannot rename " + dir.file("tmp") + " to " + dir.file("dst") + ": No such file or directory");
}

// Note [Durable write]: the new bytes under PATH, no PATH.tmp left, and on any failure the old
// PATH untouched and no PATH.tmp either. Read back with std::ifstream, not our read_file.
std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(Files, WriteFileDurablyReplacesAndLeavesNoTemp) {
  TempDir dir;
  std::string bytes(100000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 13);
  write(dir.file("f"), "old");
  write_file_durably(dir.file("f"), bytes);
  EXPECT_EQ(slurp(dir.file("f")), bytes);
  EXPECT_FALSE(exists(dir.file("f.tmp")));
  write_file_durably(dir.file("empty"), "");
  EXPECT_TRUE(is_regular_file(dir.file("empty")));
  EXPECT_EQ(slurp(dir.file("empty")), "");
  EXPECT_EQ(user_error([&] { write_file_durably(dir.file("no/such/f"), "x"); }),
            dir.file("no/such/f.tmp") + ": cannot write: No such file or directory");
}

TEST(Files, WriteDurablyRemovesTheTempFileOnFailure) {
  TempDir dir;
  write(dir.file("f"), "old");
  std::string seen;
  write_durably(dir.file("f"), [&](const std::string& tmp) {
    seen = tmp;
    std::ofstream(tmp, std::ios::binary) << "new";
  });
  EXPECT_EQ(seen, dir.file("f.tmp"));
  EXPECT_EQ(slurp(dir.file("f")), "new");
  EXPECT_FALSE(exists(dir.file("f.tmp")));
  EXPECT_EQ(user_error([&] {
              write_durably(dir.file("f"), [](const std::string& tmp) {
                std::ofstream(tmp, std::ios::binary) << "partial";
                throw UserError(tmp + ": disk full");
              });
            }),
            dir.file("f.tmp") + ": disk full");
  EXPECT_EQ(slurp(dir.file("f")), "new");
  EXPECT_FALSE(exists(dir.file("f.tmp")));
  // A writer that creates nothing: an error naming PATH.tmp, and no PATH.
  EXPECT_HAS(user_error([&] { write_durably(dir.file("g"), [](const std::string&) {}); }), dir.file("g.tmp"));
  EXPECT_FALSE(exists(dir.file("g")));
}

TEST(Files, RenameDurablyMovesDirectoriesToo) {
  TempDir dir;
  create_directories(dir.file("d.tmp"));
  write(dir.file("d.tmp/x"), "1");
  rename_durably(dir.file("d.tmp"), dir.file("d"));
  EXPECT_EQ(slurp(dir.file("d/x")), "1");
  EXPECT_FALSE(exists(dir.file("d.tmp")));
  EXPECT_EQ(user_error([&] { sync_path(dir.file("gone")); }),
            dir.file("gone") + ": cannot open to sync: No such file or directory");
}

TEST(Files, ReadFile) {
  TempDir dir;
  std::string bytes(200000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7);
  write(dir.file("bin"), bytes);
  EXPECT_EQ(read_file(dir.file("bin")), bytes);
  write(dir.file("empty"), "");
  EXPECT_EQ(read_file(dir.file("empty")), "");
  EXPECT_EQ(user_error([&] { read_file(dir.file("nope")); }),
            dir.file("nope") + ": cannot open: No such file or directory");
  EXPECT_EQ(user_error([&] { read_file(dir.path()); }), dir.path() + ": cannot read: Is a directory");
}

// SIGALRM every `interval_us` microseconds while in scope, to a handler installed without
// SA_RESTART (as a library or a profiler may install one): a blocking call it interrupts fails with
// EINTR instead of going on.
class InterruptingTimer {
 public:
  explicit InterruptingTimer(long interval_us) {
    fired_ = 0;
    struct sigaction sa {};
    sa.sa_handler = [](int) { fired_.fetch_add(1); };
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    ::sigaction(SIGALRM, &sa, &previous_);
    const itimerval every{{0, interval_us}, {0, interval_us}};
    ::setitimer(ITIMER_REAL, &every, nullptr);
  }
  ~InterruptingTimer() {
    const itimerval off{};
    ::setitimer(ITIMER_REAL, &off, nullptr);
    ::sigaction(SIGALRM, &previous_, nullptr);
  }
  int fired() const { return fired_.load(); }

 private:
  static inline std::atomic<int> fired_{0};
  struct sigaction previous_ {};
};

// A FIFO whose writer comes late and writes slowly: read_file blocks in open() and then in read(),
// and SIGALRM keeps interrupting both. It must still return every byte.
TEST(Files, ReadFileGoesOnThroughSignalsWithoutRestart) {
  TempDir dir;
  const std::string fifo = dir.file("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string expected(1u << 20, '\0');
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = static_cast<char>(i * 7 + i / 1000);
  std::atomic<bool> written{false};
  std::thread writer([&] {
    sigset_t alrm;  // the timer's signals go to the reader (the main thread)
    sigemptyset(&alrm);
    sigaddset(&alrm, SIGALRM);
    pthread_sigmask(SIG_BLOCK, &alrm, nullptr);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const int fd = ::open(fifo.c_str(), O_WRONLY);
    for (size_t done = 0; fd >= 0 && done < expected.size();) {
      const ssize_t n = ::write(fd, expected.data() + done, std::min<size_t>(expected.size() - done, 32u << 10));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<size_t>(n);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (fd >= 0) ::close(fd);
    written = true;
  });
  std::string got;
  bool threw = false;
  {
    InterruptingTimer timer(/*interval_us=*/500);
    try {
      got = read_file(fifo);
    } catch (const UserError& e) {
      threw = true;
      ADD_FAILURE() << e.what();
    }
    EXPECT_GT(timer.fired(), 100);
  }
  if (threw) {  // release the writer: read what it writes until it is done
    const int fd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
    char buf[1 << 16];
    while (fd >= 0 && !written) {
      if (::read(fd, buf, sizeof buf) <= 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (fd >= 0) ::close(fd);
  }
  writer.join();
  EXPECT_EQ(got.size(), expected.size());
  EXPECT_TRUE(got == expected) << "read_file returned other bytes";
}

TEST(Files, MakeTempDirIsFreshEachTime) {
  const std::string a = make_temp_dir("gpt2_files_test");
  const std::string b = make_temp_dir("gpt2_files_test");
  EXPECT_NE(a, b);
  EXPECT_TRUE(is_directory(a));
  EXPECT_TRUE(list_directory(a).empty());
  EXPECT_EQ(filename(a).rfind("gpt2_files_test.", 0), 0u) << a;
  remove_tree(a);
  remove_tree(b);
  EXPECT_FALSE(exists(a));

  TempDir outer;
  const char* old = std::getenv("TMPDIR");
  const std::string saved = old != nullptr ? old : "";
  ASSERT_EQ(::setenv("TMPDIR", outer.path().c_str(), 1), 0);
  const std::string c = make_temp_dir("x");
  if (old != nullptr) {
    ::setenv("TMPDIR", saved.c_str(), 1);
  } else {
    ::unsetenv("TMPDIR");
  }
  EXPECT_EQ(parent_path(c), outer.path());
  EXPECT_HAS(user_error([&] { make_temp_dir("no/such/dir/x"); }), "cannot create temporary directory");
}

TEST(Files, ExecutableAndRealPath) {
  const std::string exe = executable_path();
  EXPECT_EQ(filename(exe), "gpt2_base_tests");
  EXPECT_TRUE(is_regular_file(exe));
  TempDir dir;
  create_directories(dir.file("a/b"));
  EXPECT_EQ(real_path(dir.file("a/b/../b/.")), real_path(dir.path()) + "/a/b");
  EXPECT_HAS(user_error([&] { real_path(dir.file("nope")); }), dir.file("nope") + ": cannot resolve path");
}

}  // namespace
}  // namespace gpt2::files
