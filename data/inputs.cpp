// Input expansion for gpt2-data (see inputs.h).
#include "data/inputs.h"

#include <glob.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <set>
#include <string>

#include "src/base/errors.h"
#include "src/base/files.h"

namespace gpt2::data {
namespace {

// Appends the regular files under `dir` (not following symlinks, skipping hidden entries).
void walk_directory_into(const std::string& dir, std::vector<std::string>& out) {
  for (const std::string& name : files::list_directory(dir)) {
    if (name[0] == '.') continue;
    const std::string path = files::join(dir, name);
    // Symlinks are skipped: in a directory they usually alias files already listed (fortune's
    // *.u8 links), and not following them rules out loops.
    if (files::is_symlink(path)) continue;
    if (files::is_directory(path)) {
      walk_directory_into(path, out);
    } else if (files::is_regular_file(path)) {
      out.push_back(path);
    }
  }
}

// The directory glob(3) could not read (glob's callback has no user pointer, hence thread_local).
thread_local std::string glob_error_path;
thread_local int glob_error_errno = 0;

int on_glob_error(const char* path, int err) {
  // A missing directory on the way just means no match; anything else (EACCES, ...) would leave
  // a silent gap in the corpus, so it stops the expansion.
  if (err == ENOENT || err == ENOTDIR) return 0;
  glob_error_path = path;
  glob_error_errno = err;
  return 1;
}

std::vector<std::string> glob_matches(const std::string& pattern) {
  glob_t g{};
  glob_error_path.clear();
  const int rc = ::glob(pattern.c_str(), 0, on_glob_error, &g);
  std::vector<std::string> out;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  ::globfree(&g);
  if (rc == GLOB_NOMATCH) {
    throw UserError("'" + pattern +
                    "': the pattern matches no files (a glob is expanded by gpt2-data; "
                    "check the directory and the quotes)");
  }
  if (rc == GLOB_ABORTED) {
    throw UserError("'" + pattern + "': cannot read directory " + glob_error_path + ": " +
                    std::strerror(glob_error_errno));
  }
  if (rc != 0) throw UserError("'" + pattern + "': glob failed (out of memory?)");
  return out;  // glob(3) sorts the matches
}

}  // namespace

InputKind input_kind(const std::string& path) {
  const std::string ext = files::extension(path);
  if (ext == ".jsonl") return InputKind::kJsonLines;
  if (ext == ".bin") return InputKind::kTokenShard;
  return InputKind::kText;
}

bool has_glob_chars(const std::string& arg) { return arg.find_first_of("*?[") != std::string::npos; }

ExpandedInputs expand_inputs(const std::vector<std::string>& inputs) {
  if (inputs.empty()) throw UserError("no INPUT given (text, .jsonl or .bin files, directories or globs)");
  ExpandedInputs result;
  std::set<std::string> seen;  // real paths already listed
  auto add = [&](const std::string& path, bool named) {
    if (!named && files::extension(path) == ".dat") {
      result.skipped.push_back(SkippedFile{path, kSkippedDat});
      return;
    }
    if (!seen.insert(files::real_path(path)).second) {
      result.skipped.push_back(SkippedFile{path, "already read (the same file reached twice)"});
      return;
    }
    result.files.push_back(InputFile{path, input_kind(path), named, files::file_size(path)});
  };
  auto add_directory = [&](const std::string& dir) {
    std::vector<std::string> found;
    walk_directory_into(dir, found);
    std::sort(found.begin(), found.end());
    for (const std::string& path : found) add(path, false);
  };
  for (const std::string& input : inputs) {
    if (input.empty()) throw UserError("an INPUT is an empty string");
    if (!files::exists(input)) {
      if (!has_glob_chars(input)) throw UserError(input + ": no such file or directory");
      for (const std::string& path : glob_matches(input)) {
        if (files::is_directory(path)) {
          add_directory(path);
        } else if (files::is_regular_file(path)) {
          add(path, false);
        }  // sockets, fifos, dangling links: not corpus files
      }
    } else if (files::is_directory(input)) {
      add_directory(input);
    } else if (files::is_regular_file(input)) {
      add(input, true);
    } else {
      throw UserError(input + ": not a regular file or directory");
    }
  }
  return result;
}

}  // namespace gpt2::data
