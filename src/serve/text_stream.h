#pragma once
// The text of one choice as its tokens come: decoded incrementally, whole UTF-8 characters only,
// cut before the first stop string. Contract: the concatenation of every push() and finish() is
// to_valid_utf8 of the decoded tokens up to (not including) the first stop string; a piece is
// never taken back, so text that might be the start of a stop string is held until it is not.
#include <cstdint>
#include <string>
#include <vector>

namespace gpt2::data {
class Gpt2Tokenizer;
}

namespace gpt2::serve {

class TextStream {
 public:
  TextStream(const data::Gpt2Tokenizer& tokenizer, std::vector<std::string> stop);
  // Appends one token; returns the text that is now final (often "", never after stopped()).
  std::string push(int64_t id);
  // The text still held back (a partial character as U+FFFD, a prefix of a stop string) when the
  // choice ends for another reason; "" after a stop string.
  std::string finish();
  // True once the text contains a stop string: the choice is over (finish_reason "stop").
  bool stopped() const { return stopped_; }

 private:
  const data::Gpt2Tokenizer& tokenizer_;
  std::vector<std::string> stop_;
  std::string pending_;  // decoded bytes not yet returned
  bool stopped_ = false;
};

}  // namespace gpt2::serve
