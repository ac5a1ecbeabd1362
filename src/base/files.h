#pragma once
// File-system helpers on plain POSIX calls. Why not the C++17 std-filesystem library: pip
// LibTorch (libtorch_cpu.so) exports its own copies of those symbols, which interpose on
// libstdc++'s at run time, so any such call in a torch-linked binary segfaults. This project uses
// none of it (a ctest lint enforces that); use these instead. Errors are gpt2::UserError naming the
// path(s) and strerror(errno). Paths are plain strings; nothing here follows symlinks unless it says so.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace gpt2::files {

// ---- queries. A missing path (ENOENT, ENOTDIR) gives false; any other stat failure (EACCES,
// ELOOP, ...) throws rather than pretending the path is absent.
bool exists(const std::string& path);           // follows symlinks: a dangling link does not exist
bool is_directory(const std::string& path);     // follows symlinks
bool is_regular_file(const std::string& path);  // follows symlinks
bool is_symlink(const std::string& path);       // the entry itself (lstat)
int64_t file_size(const std::string& path);     // follows symlinks; throws if missing

// ---- path strings (lexical, no file-system access)
// Everything before the last component, like dirname(1), but "" (not ".") when there is no '/';
// trailing slashes are ignored: parent_path("a/b/") == "a", parent_path("/a") == "/".
std::string parent_path(const std::string& path);
// The text after the last '/': filename("a/b.txt") == "b.txt", filename("a/") == "".
std::string filename(const std::string& path);
// filename()'s suffix from its last '.', "" when none or when the name starts with its only '.':
// extension("x/a.b.dat") == ".dat", extension(".hidden") == "".
std::string extension(const std::string& path);
// a + "/" + b without doubling the '/'; b when a is empty or b is absolute.
std::string join(const std::string& a, const std::string& b);
// Absolute path with symlinks, "." and ".." resolved (realpath(3)); the path must exist.
std::string real_path(const std::string& path);
// getcwd(3), for messages about relative paths ("?" when it cannot be read).
std::string current_dir();
// The running binary (/proc/self/exe).
std::string executable_path();

// ---- directories
// Entry names of `dir` (not paths), sorted, without "." and "..".
std::vector<std::string> list_directory(const std::string& dir);
// mkdir -p (mode 0777 before umask); fine if `dir` already is a directory.
void create_directories(const std::string& dir);
// A new empty directory $TMPDIR/<prefix>.XXXXXX (/tmp when TMPDIR is unset); returns its path.
std::string make_temp_dir(const std::string& prefix);
// rm -rf: removes `path` and, for a directory, everything under it, never following symlinks
// (a link is removed, not its target). A missing path is not an error.
void remove_tree(const std::string& path);

// ---- files
// Removes a file or empty directory; returns false when it did not exist.
bool remove_file(const std::string& path);
// rename(2): atomic replace of `to` on one file system (the tmp + rename write pattern).
void rename_file(const std::string& from, const std::string& to);
// The whole file as bytes.
std::string read_file(const std::string& path);

// ---- durable writes. Note [Durable write]: a file that matters (checkpoint parts, model files,
// token files, exports) is written to PATH.tmp, flushed to the disk (fsync), renamed over PATH,
// and then PATH's directory is fsynced so that the rename itself survives a power loss. A crash
// at any point leaves the old PATH or the new one, never a part of either. A signal that interrupts
// one of these calls (EINTR, e.g. on NFS or FUSE) or a short write does not fail it: the call is
// retried or goes on (files.cpp Note [EINTR]).
// fsync(2) of a file or a directory (what a rename into it or a new entry needs to be durable).
void sync_path(const std::string& path);
// Syncs `from` (a file or a directory), renames it to `to` and syncs `to`'s directory.
void rename_durably(const std::string& from, const std::string& to);
// Writes `bytes` to `path` durably (Note [Durable write]).
void write_file_durably(const std::string& path, const std::string& bytes);
// The same for a file that other code writes (HDF5, a stream): `write_tmp(tmp)` creates tmp = PATH.tmp,
// then it is synced and renamed over PATH. When anything throws, PATH.tmp is removed and the error
// passed on; PATH is left as it was.
void write_durably(const std::string& path, const std::function<void(const std::string& tmp)>& write_tmp);

}  // namespace gpt2::files
