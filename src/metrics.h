#pragma once
// metrics.jsonl: one JSON object per line, written by rank 0, flushed per line so a crashed run
// keeps what it logged. Also the FLOP count behind MFU and the memory figures the lines carry.
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "src/model_config.h"

namespace gpt2 {

class MetricsWriter {
 public:
  MetricsWriter() = default;  // writes nothing
  // Creates parent directories; throws gpt2::UserError naming the path when it cannot write.
  explicit MetricsWriter(const std::string& path);
  // Fields in order; values are already-formatted JSON numbers (or quoted strings).
  void write(const std::vector<std::pair<std::string, std::string>>& fields);
  bool enabled() const { return out_.is_open(); }

 private:
  std::ofstream out_;
  std::string path_;
};

// JSON number text for a double ("null" when not finite, since JSON has no NaN).
std::string json_number(double v);

// Training FLOPs per token: 6N for the matmuls forward and backward plus 12·L·C·T for attention
// (the PaLM/nanoGPT estimate; N counts every parameter, vocab padding included).
double flops_per_token(const GPT2Config& model, int64_t num_params, int64_t seq_len);

// Peak memory of this process: the CUDA caching allocator's peak on `cuda_device` when >= 0,
// else the peak resident set size. In GiB.
double peak_memory_gib(int cuda_device);
void reset_peak_memory(int cuda_device);

}  // namespace gpt2
