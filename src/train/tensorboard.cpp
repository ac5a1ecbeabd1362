#include "src/train/tensorboard.h"

#include <unistd.h>

#include <chrono>
#include <cstring>

#include "src/base/crc32c.h"
#include "src/base/errors.h"
#include "src/base/files.h"

namespace gpt2 {
namespace tensorboard {
namespace {

// Protobuf wire types (the low 3 bits of a field's key).
constexpr int kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

// Little-endian by shifts, so the bytes do not depend on the host's byte order.
void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xFF);
}

// Base-128, low groups first, high bit set on every byte but the last. A negative int64 is its
// two's complement as uint64 (10 bytes), as protobuf encodes int64.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}

void put_key(std::string& out, int field, int wire_type) {
  put_varint(out, static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire_type));
}

void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

void put_double(std::string& out, int field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed64);
  put_le(out, bits, 8);
}

void put_float(std::string& out, int field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed32);
  put_le(out, bits, 4);
}

// Event field numbers (tensorflow/core/util/event.proto).
constexpr int kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5;
// Summary.value = 1; Summary.Value.tag = 1, simple_value = 2.
constexpr int kSummaryValue = 1, kTag = 1, kSimpleValue = 2;

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string frame_record(const std::string& data) {
  std::string out;
  put_le(out, data.size(), 8);
  const uint32_t length_crc = masked_crc32c(out.data(), 8);
  put_le(out, length_crc, 4);
  out += data;
  put_le(out, masked_crc32c(data.data(), data.size()), 4);
  return out;
}

std::string file_version_event(double wall_time, const std::string& version) {
  std::string event;
  put_double(event, kWallTime, wall_time);
  put_bytes(event, kFileVersion, version);
  return event;
}

std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    put_bytes(v, kTag, tag);
    put_float(v, kSimpleValue, static_cast<float>(value));  // simple_value is a float
    put_bytes(summary, kSummaryValue, v);
  }
  std::string event;
  put_double(event, kWallTime, wall_time);
  // Written even when 0 (proto3 would omit it); parsers accept an explicit default.
  put_key(event, kStep, kVarint);
  put_varint(event, static_cast<uint64_t>(step));
  put_bytes(event, kSummary, summary);
  return event;
}

}  // namespace tensorboard

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  try {
    files::create_directories(dir);
  } catch (const UserError& e) {
    throw UserError("tensorboard directory " + dir + ": " + e.what());
  }
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::strcpy(host, "localhost");
  const double now = tensorboard::now_seconds();
  path_ = files::join(dir, "events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) + "." + host);
  // Append: a second writer started in the same second adds its records instead of destroying
  // the first one's (a file may hold several file_version events).
  out_.open(path_, std::ios::out | std::ios::app | std::ios::binary);
  if (!out_) throw UserError(path_ + ": cannot open TensorBoard event file for writing");
  write_record(tensorboard::file_version_event(now));
  flush();
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  add_scalars(step, {{tag, value}});
}

void TensorBoardWriter::add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  if (!enabled() || scalars.empty()) return;
  write_record(tensorboard::scalars_event(tensorboard::now_seconds(), step, scalars));
  flush();
}

void TensorBoardWriter::flush() {
  if (!enabled()) return;
  out_.flush();
  if (!out_) throw UserError(path_ + ": cannot write TensorBoard event file");
}

void TensorBoardWriter::write_record(const std::string& data) { out_ << tensorboard::frame_record(data); }

}  // namespace gpt2
