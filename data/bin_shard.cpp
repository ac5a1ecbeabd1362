// llm.c / nanoGPT `.bin` token shards (see bin_shard.h).
#include "data/bin_shard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "src/base/errors.h"

namespace gpt2::data {
namespace {

int32_t load_i32le(std::string_view bytes, size_t index) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data()) + 4 * index;
  const uint32_t v = uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
  return static_cast<int32_t>(v);
}

// pread until `n` bytes or EOF; returns the bytes read. Throws on an I/O error.
size_t pread_full(int fd, void* dst, size_t n, int64_t offset, const std::string& path) {
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd, static_cast<char*>(dst) + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw UserError(path + ": read failed: " + std::strerror(errno));
    }
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

}  // namespace

BinFormat parse_bin_format(const std::string& name) {
  if (name == "auto") return BinFormat::kAuto;
  if (name == "llmc") return BinFormat::kLlmc;
  if (name == "raw") return BinFormat::kRaw;
  throw UserError("--bin_format " + name + ": expected auto, llmc or raw");
}

BinShardInfo parse_bin_header(std::string_view head, int64_t file_size, BinFormat format, const std::string& path) {
  if (file_size <= 0) throw UserError(path + ": empty .bin file (no header, no tokens)");
  const int32_t first = head.size() >= 4 ? load_i32le(head, 0) : 0;
  const bool magic = head.size() >= 4 && (first == kLlmcMagic || first == kLlmcLlama3Magic);
  BinShardInfo info;
  const bool llmc = format == BinFormat::kLlmc || (format == BinFormat::kAuto && magic);
  if (!llmc) {
    if (file_size % 2 != 0) {
      throw UserError(path + ": " + std::to_string(file_size) + " bytes is an odd size: " +
                      (format == BinFormat::kRaw ? std::string()
                                                 : "no llm.c header (magic " + std::to_string(kLlmcMagic) + ") and ") +
                      "not raw uint16 tokens (nanoGPT)");
    }
    info.num_tokens = file_size / 2;
    return info;
  }
  if (!magic) {
    throw UserError(path + ": no llm.c header: the first int32 is " + std::to_string(first) + ", expected magic " +
                    std::to_string(kLlmcMagic) + " (for headerless nanoGPT uint16 files use --bin_format=raw)");
  }
  if (first == kLlmcLlama3Magic) {
    throw UserError(path + ": an llm.c LLaMA-3 shard (magic " + std::to_string(kLlmcLlama3Magic) +
                    ", uint32 tokens), not GPT-2 tokens (magic " + std::to_string(kLlmcMagic) + ")");
  }
  if (file_size < kLlmcHeaderBytes || head.size() < static_cast<size_t>(kLlmcHeaderBytes)) {
    throw UserError(path + ": truncated llm.c header: the file has " + std::to_string(file_size) +
                    " bytes, the header alone needs " + std::to_string(kLlmcHeaderBytes));
  }
  const int32_t version = load_i32le(head, 1);
  if (version != kLlmcVersion) {
    throw UserError(path + ": llm.c header version " + std::to_string(version) + " is not supported (expected " +
                    std::to_string(kLlmcVersion) + " = uint16 GPT-2 tokens)");
  }
  const int32_t count = load_i32le(head, 2);
  if (count < 0) throw UserError(path + ": llm.c header token count " + std::to_string(count) + " is negative");
  const int64_t expected = kLlmcHeaderBytes + 2 * int64_t{count};
  if (expected != file_size) {
    throw UserError(path + ": llm.c header says " + std::to_string(count) + " tokens (" + std::to_string(expected) +
                    " bytes with the header) but the file has " + std::to_string(file_size) + " bytes" +
                    (file_size < expected ? " (truncated?)" : ""));
  }
  info.llmc_header = true;
  info.data_offset = kLlmcHeaderBytes;
  info.num_tokens = count;
  return info;
}

BinShardReader::BinShardReader(const std::string& path, BinFormat format, int64_t vocab_size)
    : path_(path), vocab_size_(vocab_size) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw UserError(path + ": cannot open: " + std::strerror(errno));
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw UserError(path + ": cannot stat: " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) throw UserError(path + ": not a regular file");
    std::string head(static_cast<size_t>(kLlmcHeaderBytes), '\0');
    head.resize(pread_full(fd_, head.data(), head.size(), 0, path));
    info_ = parse_bin_header(head, static_cast<int64_t>(st.st_size), format, path);
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

BinShardReader::BinShardReader(BinShardReader&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      vocab_size_(other.vocab_size_),
      info_(other.info_),
      position_(other.position_),
      buffer_(std::move(other.buffer_)) {}

BinShardReader::~BinShardReader() {
  if (fd_ >= 0) ::close(fd_);
}

size_t BinShardReader::read(std::vector<int32_t>& out, size_t max_tokens) {
  const auto n = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(max_tokens), info_.num_tokens - position_));
  if (n == 0) return 0;
  buffer_.resize(n);
  const size_t got = pread_full(fd_, buffer_.data(), 2 * n, info_.data_offset + 2 * position_, path_);
  if (got != 2 * n) {
    throw UserError(path_ + ": file ended at token " + std::to_string(position_ + static_cast<int64_t>(got / 2)) +
                    " of " + std::to_string(info_.num_tokens) + " (truncated while reading?)");
  }
  const size_t base = out.size();
  out.resize(base + n);
  uint16_t max_id = 0;
  for (size_t i = 0; i < n; ++i) {
    // The format is little-endian; every host we build for is too.
    const uint16_t id = buffer_[i];
    max_id = std::max(max_id, id);
    out[base + i] = id;
  }
  if (max_id >= vocab_size_) {
    for (size_t i = 0; i < n; ++i) {
      if (buffer_[i] >= vocab_size_) {
        throw UserError(path_ + ": token at position " + std::to_string(position_ + static_cast<int64_t>(i)) + " is " +
                        std::to_string(buffer_[i]) + ", not below vocab_size " + std::to_string(vocab_size_) +
                        " (not GPT-2 tokens?)");
      }
    }
  }
  position_ += static_cast<int64_t>(n);
  return n;
}

}  // namespace gpt2::data
