#pragma once
// The scalars of a run, written by rank 0 to metrics.jsonl (one JSON object per line) and to
// TensorBoard event files (tensorboard.h) under the same names, each flushed per write so a
// crashed run keeps what it logged. Also the FLOP count behind MFU and the memory figures.
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "src/model/model_config.h"
#include "src/train/tensorboard.h"

namespace gpt2 {

class MetricsWriter {
 public:
  MetricsWriter() = default;  // writes nothing
  // "" turns a sink off. Creates directories; throws gpt2::UserError naming the key and path when
  // it cannot write.
  MetricsWriter(const std::string& jsonl_path, const std::string& tensorboard_dir);
  // One line {"step": step, name: value, ..., count: n, ...}; TensorBoard gets the values (not the
  // counts) as scalars at `step`. Non-finite values are null in JSON.
  void write(int64_t step, const std::vector<std::pair<std::string, double>>& values,
             const std::vector<std::pair<std::string, int64_t>>& counts = {});

 private:
  std::ofstream jsonl_;
  TensorBoardWriter tensorboard_;
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
