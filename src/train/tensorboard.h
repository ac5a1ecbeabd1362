#pragma once
// TensorBoard scalars without TensorFlow or a protobuf library: an event file is TFRecord framing
// around hand-encoded `tensorflow.Event` messages (only the fields scalars need). Written by rank 0,
// flushed after every call so a crashed run keeps what it wrote; TensorBoard reads the file while
// it grows. No torch here, so the format is testable in a small binary.
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace gpt2 {

class TensorBoardWriter {
 public:
  TensorBoardWriter() = default;  // writes nothing
  // Creates `dir` and DIR/events.out.tfevents.<unix seconds>.<hostname> (TensorBoard only reads
  // names containing "tfevents") and writes the file_version event. Throws gpt2::UserError naming
  // the path when it cannot create or write it.
  explicit TensorBoardWriter(const std::string& dir);

  // Wall time is now. Non-finite values are written as they are (float NaN/inf is a legal
  // simple_value; TensorBoard shows them).
  void add_scalar(const std::string& tag, double value, int64_t step);
  // One Event carrying every scalar of a step (one Summary.Value each).
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  void flush();

  bool enabled() const { return out_.is_open(); }
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);

  std::ofstream out_;
  std::string path_;
};

// The encoding, exposed for tests.
namespace tensorboard {

// TFRecord's checksum: CRC-32C rotated right by 15 bits plus a constant, so that a CRC over data
// that itself contains CRCs does not degenerate.
uint32_t masked_crc32c(const void* data, size_t n);
// One TFRecord: u64 LE length, u32 LE masked CRC of those 8 bytes, data, u32 LE masked CRC of data.
std::string frame_record(const std::string& data);
// Serialized Event{wall_time, file_version} (the first event of every file).
std::string file_version_event(double wall_time, const std::string& version = "brain.Event:2");
// Serialized Event{wall_time, step, summary{value{tag, simple_value} ...}}.
std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, double>>& scalars);

}  // namespace tensorboard
}  // namespace gpt2
