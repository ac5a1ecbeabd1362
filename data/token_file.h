#pragma once
// Token files (DESIGN.md "File formats"): HDF5, a 1-D contiguous unfiltered `/tokens` (uint16, or
// uint32 when vocab_size > 65536), root attributes format = "gpt2-tokens", format_version,
// vocab_size, eot_token, tokenizer. Written as `<path>.tmp`, then renamed; read by validating up
// front (bytes before libhdf5, then its metadata) and mmapping the data at H5Dget_offset. Every
// problem with a file is a gpt2::UserError naming its path.
#include <cstdint>
#include <string>
#include <vector>

namespace gpt2::data {

inline constexpr char kTokenFileFormat[] = "gpt2-tokens";
inline constexpr int64_t kTokenFileVersion = 1;

struct TokenFileAttrs {
  int64_t vocab_size = 50257;  // ids must be below this; picks uint16 (<= 65536) or uint32
  int64_t eot_token = 50256;   // document separator
  std::string tokenizer = "gpt2";
};

// Writes `tokens` to `path` (atomically: `path`.tmp, then rename). Throws gpt2::UserError when an
// id is >= vocab_size or the file cannot be written.
void write_token_file(const std::string& path, const std::vector<uint32_t>& tokens, const TokenFileAttrs& attrs);
// The same from a raw array of uint16 or uint32 ids (a shard cut out of a larger buffer); HDF5
// converts to the file's type as it writes, so no narrowed copy is made.
void write_token_file(const std::string& path, const uint16_t* tokens, size_t n, const TokenFileAttrs& attrs);
void write_token_file(const std::string& path, const uint32_t* tokens, size_t n, const TokenFileAttrs& attrs);

struct TokenFileInfo {
  std::string path;
  int64_t num_tokens = 0;
  int64_t vocab_size = 0;
  int64_t eot_token = 0;
  int dtype_bytes = 0;  // 2 (uint16) or 4 (uint32)
  std::string tokenizer;
  int64_t format_version = 0;
};

// A read-only, memory-mapped token file. Move-only; unmaps in the destructor.
class TokenFile {
 public:
  // Opens and validates `path`. When expected_vocab >= 0 the file's vocab_size must not exceed it
  // (a model whose vocab is padded, e.g. 50304, still reads 50257-token files).
  static TokenFile open(const std::string& path, int64_t expected_vocab = -1);

  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  ~TokenFile();

  int64_t size() const { return info_.num_tokens; }
  const TokenFileInfo& info() const { return info_; }

  // Copies tokens [start, start + n) into out[0, n) as int64. Throws gpt2::UserError when the
  // range is outside [0, size()).
  void read(int64_t start, int64_t n, int64_t* out) const;

  // Scans every token; throws gpt2::UserError naming the file and the position of the first id
  // >= vocab_size. Costs one pass over the file, so callers choose when to pay it.
  void validate_ids() const;

 private:
  TokenFile() = default;
  void unmap();

  TokenFileInfo info_;
  void* map_base_ = nullptr;  // whole-file mapping
  size_t map_length_ = 0;
  const unsigned char* data_ = nullptr;  // first token (H5Dget_offset); may be unaligned
};

}  // namespace gpt2::data
