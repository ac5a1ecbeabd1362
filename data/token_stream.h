#pragma once
// Several token files read as one stream: `spec` is a path, a comma-separated list, or shell globs
// (sorted), in that order. Reads may cross from one file into the next. Every file is validated by
// TokenFile::open; they must agree on vocab_size and eot_token. Errors name the spec or the file.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "data/token_file.h"

namespace gpt2::data {

class TokenStream {
 public:
  // `what` names the option in errors (e.g. "data.train"). model_vocab as in TokenFile::open.
  static TokenStream open(const std::string& spec, int64_t model_vocab, const std::string& what);

  int64_t size() const { return total_; }
  // Tokens [start, start + n) of the stream as int64; bounds-checked.
  void read(int64_t start, int64_t n, int64_t* out) const;
  // read(), and every id checked against [0, vocab): an id outside is a gpt2::UserError naming the
  // file, the position in it and `vocab_name` ("PATH: token id 65535 at position 100 is outside
  // model.vocab_size = 50257").
  void read_ids(int64_t start, int64_t n, int64_t* out, int64_t vocab, const std::string& vocab_name) const;
  // The file holding stream position `pos` and the position inside that file (for messages).
  std::pair<const std::string&, int64_t> locate(int64_t pos) const;
  // "N tokens in K file(s)" for the log.
  std::string describe() const;

 private:
  std::vector<TokenFile> files_;
  std::vector<int64_t> starts_;  // stream offset of each file, ascending
  int64_t total_ = 0;
};

// The paths a spec names: comma-separated items, each a path or a glob (sorted matches).
// Throws gpt2::UserError naming `what` when an item matches nothing.
std::vector<std::string> expand_paths(const std::string& spec, const std::string& what);

}  // namespace gpt2::data
