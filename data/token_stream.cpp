#include "data/token_stream.h"

#include <glob.h>

#include <algorithm>

#include "src/base/errors.h"

namespace gpt2::data {

std::vector<std::string> expand_paths(const std::string& spec, const std::string& what) {
  std::vector<std::string> paths;
  size_t begin = 0;
  while (begin <= spec.size()) {
    const size_t comma = std::min(spec.find(',', begin), spec.size());
    const std::string item = spec.substr(begin, comma - begin);
    begin = comma + 1;
    if (item.empty()) continue;
    if (item.find_first_of("*?[") == std::string::npos) {
      paths.push_back(item);  // a plain path: TokenFile::open reports if it is missing
      continue;
    }
    glob_t g{};
    const int rc = ::glob(item.c_str(), 0, nullptr, &g);
    std::vector<std::string> matches(g.gl_pathv, g.gl_pathv + (rc == 0 ? g.gl_pathc : 0));
    globfree(&g);
    if (matches.empty()) throw UserError(what + " = " + spec + ": pattern '" + item + "' matches no file");
    std::sort(matches.begin(), matches.end());
    paths.insert(paths.end(), matches.begin(), matches.end());
  }
  if (paths.empty()) throw UserError(what + " = '" + spec + "': names no file");
  return paths;
}

TokenStream TokenStream::open(const std::string& spec, int64_t model_vocab, const std::string& what) {
  TokenStream s;
  for (const auto& path : expand_paths(spec, what)) {
    TokenFile f = TokenFile::open(path, model_vocab);
    if (!s.files_.empty()) {
      const auto& first = s.files_.front().info();
      if (f.info().vocab_size != first.vocab_size || f.info().eot_token != first.eot_token) {
        throw UserError(path + ": vocab_size/eot_token (" + std::to_string(f.info().vocab_size) + "/" +
                        std::to_string(f.info().eot_token) + ") differ from " + first.path + "'s (" +
                        std::to_string(first.vocab_size) + "/" + std::to_string(first.eot_token) + ")");
      }
    }
    s.starts_.push_back(s.total_);
    s.total_ += f.size();
    s.files_.push_back(std::move(f));
  }
  return s;
}

void TokenStream::read(int64_t start, int64_t n, int64_t* out) const {
  GPT2_ASSERT(start >= 0 && n >= 0 && start + n <= total_, "TokenStream::read out of range");
  // The last file starting at or before `start`.
  size_t i = std::upper_bound(starts_.begin(), starts_.end(), start) - starts_.begin() - 1;
  while (n > 0) {
    const int64_t offset = start - starts_[i];
    const int64_t take = std::min(n, files_[i].size() - offset);
    files_[i].read(offset, take, out);
    out += take;
    start += take;
    n -= take;
    ++i;
  }
}

void TokenStream::read_ids(int64_t start, int64_t n, int64_t* out, int64_t vocab, const std::string& vocab_name) const {
  read(start, n, out);
  for (int64_t j = 0; j < n; ++j) {
    if (out[j] < 0 || out[j] >= vocab) {
      const auto [path, pos] = locate(start + j);
      throw UserError(path + ": token id " + std::to_string(out[j]) + " at position " + std::to_string(pos) +
                      " is outside " + vocab_name + " = " + std::to_string(vocab));
    }
  }
}

std::pair<const std::string&, int64_t> TokenStream::locate(int64_t pos) const {
  const size_t i = std::upper_bound(starts_.begin(), starts_.end(), pos) - starts_.begin() - 1;
  return {files_[i].info().path, pos - starts_[i]};
}

std::string TokenStream::describe() const {
  return std::to_string(total_) + " tokens in " + std::to_string(files_.size()) + " file(s)" +
         (files_.size() == 1 ? " " + files_.front().info().path : " from " + files_.front().info().path);
}

}  // namespace gpt2::data
