#pragma once
// GPT-2 byte-level BPE tokenizer, token-for-token equal to tiktoken's "gpt2" encode_ordinary().
// Contract: load() reads <dir>/encoder.json and <dir>/vocab.bpe and throws gpt2::UserError naming
// the file (and line) on any problem. encode() splits text with the GPT-2 pre-tokenizer pattern
// (a hand-written scanner, see Note [Pre-tokenizer] in the .cpp), maps bytes to tokens and applies
// merges by rank; "<|endoftext|>" in the text is ordinary text. Invalid UTF-8 is a UserError
// naming the source and byte offset. Thread-safe: encode/decode are const and may run concurrently.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gpt2::data {

class Gpt2Tokenizer {
 public:
  // Reads dir/encoder.json and dir/vocab.bpe.
  static Gpt2Tokenizer load(const std::string& dir);

  // Token ids of `text`. `source` names the text in errors (a file name, "text" by default).
  std::vector<int32_t> encode(std::string_view text, std::string_view source = "text") const;
  // Same, appending to `out` (no EOT is added): what the corpus tool uses to avoid copies.
  void encode_append(std::string_view text, std::vector<int32_t>& out, std::string_view source = "text") const;

  // The bytes the ids stand for (EOT decodes to "<|endoftext|>"). Throws gpt2::UserError for an
  // id outside [0, vocab_size()).
  std::string decode(const std::vector<int32_t>& ids) const;

  int32_t eot_token() const { return eot_token_; }                                  // 50256 for GPT-2
  int64_t vocab_size() const { return static_cast<int64_t>(id_to_bytes_.size()); }  // 50257

 private:
  Gpt2Tokenizer() = default;

  // Appends the tokens of one pre-tokenized piece (raw bytes).
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_small(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_large(std::string_view piece, std::vector<int32_t>& out) const;

  // Id of a mergeable token with exactly these bytes, or -1.
  int32_t find_token(std::string_view bytes) const;
  // Id of the token that merging adjacent tokens a and b yields, or -1 when they never merge.
  int32_t find_pair(int32_t a, int32_t b) const;
  // Merge rank of a mergeable token (lower merges first).
  int32_t rank(int32_t id) const { return rank_[static_cast<size_t>(id)]; }

  uint64_t instance_id_ = 0;  // keys the per-thread word cache
  int32_t eot_token_ = -1;
  std::vector<std::string> id_to_bytes_;  // raw bytes of every token, by id
  std::vector<int32_t> rank_;             // by id; INT32_MAX for special tokens
  int32_t byte_token_[256] = {};          // id of each single byte

  // Open-addressing tables (power-of-two sizes, linear probing). Why not std::unordered_map:
  // these lookups are the tokenizer's inner loop, and probing flat arrays is several times faster.
  // Key of a slot: the token's first 11 bytes zero-padded, then its length (0xFF when longer, and
  // then the bytes are compared in full). One probe touches one cache line, not three dependent
  // loads (slot, std::string, heap bytes): these misses were most of encode's time.
  struct TokenSlot {
    uint64_t key_lo = 0;
    uint32_t key_hi = 0;
    int32_t id = -1;  // -1: empty
  };
  int32_t lookup_token(std::string_view bytes, uint64_t hash) const;
  std::vector<TokenSlot> token_table_;
  struct PairSlot {
    uint64_t key = ~uint64_t{0};  // (a << 32) | b; all ones: empty
    int32_t merged = -1;
  };
  std::vector<PairSlot> pair_table_;
};

// Where the GPT-2 vocabulary lives when the user does not say: the first of
// <executable dir>/../../data/tokenizer/gpt2 (build/bin/ inside the repo), ./data/tokenizer/gpt2,
// and the source tree this binary was built from, that holds encoder.json. Throws gpt2::UserError
// listing the places it looked.
std::string find_default_tokenizer_dir();

}  // namespace gpt2::data
