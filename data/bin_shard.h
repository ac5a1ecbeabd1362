#pragma once
// Already-tokenized `.bin` shards as gpt2-data inputs: llm.c shards (a header of 256 little-endian
// int32: magic 20240520, version 1 = uint16 tokens, [2] = token count; then the tokens) and nanoGPT
// files (raw little-endian uint16, no header). Contract: the header, the file size and every id
// (< vocab_size) are checked; each problem is a gpt2::UserError naming the file and what is wrong
// (and for an id, its token position). Tokens are returned unchanged, in file order.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gpt2::data {

// --bin_format: kAuto reads an llm.c header when the file starts with its magic, else raw uint16.
// Why auto is safe: the magic's first uint16 (0xD3C8 = 54216) is not a GPT-2 id, so a raw file of
// GPT-2 tokens can never look like an llm.c shard.
enum class BinFormat { kAuto, kLlmc, kRaw };
BinFormat parse_bin_format(const std::string& name);  // "auto" | "llmc" | "raw"; else UserError

inline constexpr int32_t kLlmcMagic = 20240520;        // llm.c GPT-2 shards
inline constexpr int32_t kLlmcLlama3Magic = 20240801;  // llm.c LLaMA-3 shards (uint32): refused by name
inline constexpr int32_t kLlmcVersion = 1;             // uint16 tokens
inline constexpr int64_t kLlmcHeaderBytes = 256 * 4;

struct BinShardInfo {
  bool llmc_header = false;  // false: raw uint16 (nanoGPT)
  int64_t data_offset = 0;   // byte offset of the first token
  int64_t num_tokens = 0;
};

// Decides the layout from the first bytes of a file (`head`: up to kLlmcHeaderBytes of them) and its
// size. Throws gpt2::UserError naming `path` for a bad magic/version/count or a size that does not fit.
BinShardInfo parse_bin_header(std::string_view head, int64_t file_size, BinFormat format, const std::string& path);

// Streams the tokens of one shard. Move-only; closes the file in the destructor.
class BinShardReader {
 public:
  BinShardReader(const std::string& path, BinFormat format, int64_t vocab_size);
  BinShardReader(BinShardReader&& other) noexcept;
  BinShardReader& operator=(BinShardReader&& other) = delete;
  BinShardReader(const BinShardReader&) = delete;
  BinShardReader& operator=(const BinShardReader&) = delete;
  ~BinShardReader();

  const BinShardInfo& info() const { return info_; }

  // Appends up to `max_tokens` further tokens to `out`; returns how many (0 at the end). Throws
  // gpt2::UserError for an id >= vocab_size (naming its position) or a read error / short file.
  size_t read(std::vector<int32_t>& out, size_t max_tokens);

 private:
  std::string path_;
  int fd_ = -1;
  int64_t vocab_size_ = 0;
  BinShardInfo info_;
  int64_t position_ = 0;  // tokens returned so far
  std::vector<uint16_t> buffer_;
};

}  // namespace gpt2::data
