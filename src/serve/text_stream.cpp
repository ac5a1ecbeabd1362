// Incremental detokenization with stop strings (see text_stream.h).
#include "src/serve/text_stream.h"

#include <algorithm>

#include "data/bpe_tokenizer.h"
#include "data/unicode_tables.h"

namespace gpt2::serve {

TextStream::TextStream(const data::Gpt2Tokenizer& tokenizer, std::vector<std::string> stop)
    : tokenizer_(tokenizer), stop_(std::move(stop)) {}

std::string TextStream::push(int64_t id) {
  if (stopped_) return {};
  // A model may have more rows than the tokenizer has tokens (a padded vocabulary): those ids have
  // no text.
  if (id < 0 || id >= tokenizer_.vocab_size()) return {};
  pending_ += tokenizer_.decode({static_cast<int32_t>(id)});
  // Returned text never ends inside a stop string's prefix (held back below), so a stop string
  // can only lie wholly inside pending_.
  size_t cut = std::string::npos;
  for (const auto& s : stop_) cut = std::min(cut, pending_.find(s));
  if (cut != std::string::npos) {
    stopped_ = true;
    auto out = data::unicode::to_valid_utf8(std::string_view(pending_).substr(0, cut));
    pending_.clear();
    return out;
  }
  // Hold back the longest tail that begins some stop string, and a partial UTF-8 character.
  size_t hold = 0;
  for (const auto& s : stop_) {
    for (size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k) {
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  const size_t n = std::min(pending_.size() - hold, data::unicode::complete_utf8_prefix(pending_));
  auto out = data::unicode::to_valid_utf8(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string TextStream::finish() {
  auto out = data::unicode::to_valid_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace gpt2::serve
