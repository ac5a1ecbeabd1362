// POSIX file-system helpers (see files.h for why not the standard library's).
#include "src/base/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "src/base/errors.h"

namespace gpt2::files {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what, int err) {
  throw UserError(path + ": " + what + ": " + std::strerror(err));
}

// Note [EINTR]: on NFS, Lustre or FUSE file systems (where checkpoints often live) a signal whose
// handler was installed without SA_RESTART, by this program or a library in it, cuts open, write,
// fsync, rename, mkdir and remove short with EINTR; each is retried, and a write that moved fewer
// bytes goes on from there. close is not retried: Linux releases the descriptor even when close
// reports EINTR, and a retry could close one that another thread has just opened. An interrupted
// close counts as closed; what a durable write needs on disk is fsynced through a new descriptor
// after it (sync_path), and that reports any error the close would have.

// Calls `call` again while it fails with EINTR; its last result (errno set when it is -1).
template <typename Call>
auto retry_interrupted(Call call) {
  for (;;) {
    const auto rc = call();
    if (rc != -1 || errno != EINTR) return rc;
  }
}

int open_file(const std::string& path, int flags, mode_t mode = 0) {
  return retry_interrupted([&] { return ::open(path.c_str(), flags, mode); });
}

// close(2) that counts EINTR as closed (Note [EINTR]): 0, or the error of any other failure.
int close_file(int fd) { return ::close(fd) == 0 || errno == EINTR ? 0 : errno; }

bool is_missing(int err) { return err == ENOENT || err == ENOTDIR; }

// stat (or lstat) that returns false for a missing path and throws on any other failure.
bool stat_path(const std::string& path, struct stat* st, bool follow) {
  if ((follow ? ::stat(path.c_str(), st) : ::lstat(path.c_str(), st)) == 0) return true;
  const int err = errno;
  if (is_missing(err)) return false;
  fail(path, "cannot stat", err);
}

std::string strip_trailing_slashes(const std::string& path) {
  size_t end = path.size();
  while (end > 1 && path[end - 1] == '/') --end;
  return path.substr(0, end);
}

// nftw's callback takes no user data; the path that failed is passed out through this.
thread_local std::string* g_remove_failed_path = nullptr;

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  if (retry_interrupted([&] { return ::remove(path); }) == 0 || errno == ENOENT) return 0;
  const int err = errno;
  if (g_remove_failed_path != nullptr) *g_remove_failed_path = path;
  errno = err;
  return -1;
}

}  // namespace

bool exists(const std::string& path) {
  struct stat st {};
  return stat_path(path, &st, true);
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return stat_path(path, &st, true) && S_ISDIR(st.st_mode);
}

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return stat_path(path, &st, true) && S_ISREG(st.st_mode);
}

bool is_symlink(const std::string& path) {
  struct stat st {};
  return stat_path(path, &st, false) && S_ISLNK(st.st_mode);
}

int64_t file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(path, "cannot stat", errno);
  return static_cast<int64_t>(st.st_size);
}

std::string parent_path(const std::string& path) {
  const std::string p = strip_trailing_slashes(path);
  const size_t slash = p.rfind('/');
  if (slash == std::string::npos) return "";
  size_t end = slash;
  while (end > 0 && p[end - 1] == '/') --end;  // "a//b" -> "a"
  return end == 0 ? "/" : p.substr(0, end);
}

std::string filename(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string extension(const std::string& path) {
  const std::string name = filename(path);
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos || dot == 0 || name == "..") return "";
  return name.substr(dot);
}

std::string join(const std::string& a, const std::string& b) {
  if (a.empty() || (!b.empty() && b[0] == '/')) return b;
  if (b.empty()) return a;
  return a.back() == '/' ? a + b : a + "/" + b;
}

std::string real_path(const std::string& path) {
  std::unique_ptr<char, decltype(&std::free)> resolved(::realpath(path.c_str(), nullptr), &std::free);
  if (!resolved) fail(path, "cannot resolve path", errno);
  return resolved.get();
}

std::string current_dir() {
  char buf[4096];
  return ::getcwd(buf, sizeof buf) != nullptr ? std::string(buf) : std::string("?");
}

std::string executable_path() {
  std::string buf(256, '\0');
  for (;;) {
    const ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size());
    if (n < 0) fail("/proc/self/exe", "cannot read link", errno);
    if (static_cast<size_t>(n) < buf.size()) return buf.substr(0, static_cast<size_t>(n));
    buf.resize(buf.size() * 2);  // possibly truncated: readlink does not say, so retry larger
  }
}

std::vector<std::string> list_directory(const std::string& dir) {
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), &::closedir);
  if (!d) fail(dir, "cannot list directory", errno);
  std::vector<std::string> names;
  for (;;) {
    errno = 0;  // readdir returns nullptr both at the end and on error
    const struct dirent* e = ::readdir(d.get());
    if (e == nullptr) {
      if (errno != 0) fail(dir, "cannot list directory", errno);
      break;
    }
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    names.emplace_back(e->d_name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

void create_directories(const std::string& dir) {
  if (dir.empty()) throw UserError("cannot create a directory with an empty name");
  // Each prefix ending before a '/', then the whole path. stat first, so an existing parent we
  // may not write to (/home) is not an error; EEXIST after mkdir covers a concurrent creator.
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    if (pos != dir.size() && dir[pos - 1] == '/') continue;  // "a//b"
    const std::string prefix = dir.substr(0, pos);
    struct stat st {};
    if (::stat(prefix.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) throw UserError(prefix + ": cannot create directory: exists and is not a directory");
      continue;
    }
    if (retry_interrupted([&] { return ::mkdir(prefix.c_str(), 0777); }) != 0) {
      const int err = errno;
      if (err == EEXIST && ::stat(prefix.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) continue;
      fail(prefix, "cannot create directory", err);
    }
  }
}

std::string make_temp_dir(const std::string& prefix) {
  const char* env = std::getenv("TMPDIR");
  const std::string base = env != nullptr && *env != '\0' ? env : "/tmp";
  std::string tmpl = join(base, prefix + ".XXXXXX");
  if (::mkdtemp(tmpl.data()) == nullptr) fail(tmpl, "cannot create temporary directory", errno);
  return tmpl;
}

void remove_tree(const std::string& path) {
  struct stat st {};
  if (!stat_path(path, &st, false)) return;
  std::string failed;
  g_remove_failed_path = &failed;
  // FTW_DEPTH: children before their directory; FTW_PHYS: never follow symlinks.
  const int rc = ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  const int err = errno;
  g_remove_failed_path = nullptr;
  if (rc != 0) fail(failed.empty() ? path : failed, "cannot remove", err);
}

bool remove_file(const std::string& path) {
  if (retry_interrupted([&] { return ::remove(path.c_str()); }) == 0) return true;
  const int err = errno;
  if (is_missing(err)) return false;
  fail(path, "cannot remove", err);
}

void rename_file(const std::string& from, const std::string& to) {
  for (bool interrupted = false;;) {
    if (::rename(from.c_str(), to.c_str()) == 0) return;
    const int err = errno;
    if (err == EINTR) {
      interrupted = true;
      continue;
    }
    // Over NFS an interrupted attempt may have renamed already: `from` gone and `to` there is done.
    struct stat st {};
    if (interrupted && err == ENOENT && !stat_path(from, &st, false) && stat_path(to, &st, false)) return;
    throw UserError("cannot rename " + from + " to " + to + ": " + std::strerror(err));
  }
}

std::string read_file(const std::string& path) {
  const int fd = open_file(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open", errno);
  std::string out;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      fail(path, "cannot read", err);
    }
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

void sync_path(const std::string& path) {
  // O_RDONLY opens a directory too; fsync of that descriptor makes its entries durable.
  const int fd = open_file(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open to sync", errno);
  const int rc = retry_interrupted([&] { return ::fsync(fd); });
  const int err = errno;
  close_file(fd);
  if (rc != 0) fail(path, "fsync failed", err);
}

void rename_durably(const std::string& from, const std::string& to) {
  sync_path(from);
  rename_file(from, to);
  const std::string dir = parent_path(to);
  sync_path(dir.empty() ? "." : dir);
}

void write_durably(const std::string& path, const std::function<void(const std::string& tmp)>& write_tmp) {
  const std::string tmp = path + ".tmp";
  try {
    write_tmp(tmp);
    rename_durably(tmp, path);
  } catch (...) {
    ::remove(tmp.c_str());  // best effort: the error that got us here is the one to report
    throw;
  }
}

void write_file_durably(const std::string& path, const std::string& bytes) {
  write_durably(path, [&](const std::string& tmp) {
    const int fd = open_file(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) fail(tmp, "cannot write", errno);
    for (size_t done = 0; done < bytes.size();) {  // a short write goes on where it stopped
      const ssize_t n = retry_interrupted([&] { return ::write(fd, bytes.data() + done, bytes.size() - done); });
      if (n <= 0) {
        const int err = n < 0 ? errno : EIO;
        close_file(fd);
        fail(tmp, "write failed", err);
      }
      done += static_cast<size_t>(n);
    }
    if (const int err = close_file(fd); err != 0) fail(tmp, "write failed", err);
  });
}

}  // namespace gpt2::files
