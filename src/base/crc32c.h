#pragma once
// CRC-32C (Castagnoli, the iSCSI/ext4 checksum) of byte ranges and files, for checkpoint manifests.
// Uses the SSE4.2 crc32 instruction when the CPU has it (several GB/s), else a table.
// crc32c("123456789") == 0xE3069283.
#include <cstddef>
#include <cstdint>
#include <string>

namespace gpt2 {

// Continues `crc` (0 for a fresh start) over [data, data + n).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// CRC-32C of a whole file and its size; throws gpt2::UserError naming the file when it cannot be read.
uint32_t crc32c_file(const std::string& path, uint64_t* bytes = nullptr);
// As 8 lower-case hex digits (the manifest's spelling).
std::string crc32c_hex(uint32_t crc);

}  // namespace gpt2
