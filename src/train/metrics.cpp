#include "src/train/metrics.h"

#include <sys/resource.h>

#include <cmath>
#include <cstdio>

#ifdef GPT2_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "src/base/errors.h"
#include "src/base/files.h"

namespace gpt2 {

MetricsWriter::MetricsWriter(const std::string& jsonl_path, const std::string& tensorboard_dir) {
  if (!jsonl_path.empty()) {
    const std::string parent = files::parent_path(jsonl_path);
    try {
      if (!parent.empty()) files::create_directories(parent);
    } catch (const UserError& e) {
      throw UserError("log.metrics = " + jsonl_path + ": " + e.what());
    }
    jsonl_.open(jsonl_path, std::ios::out | std::ios::app);
    if (!jsonl_) throw UserError("log.metrics = " + jsonl_path + ": cannot open for writing");
  }
  if (!tensorboard_dir.empty()) {
    try {
      tensorboard_ = TensorBoardWriter(tensorboard_dir);
    } catch (const UserError& e) {
      throw UserError(std::string("log.tensorboard = ") + tensorboard_dir + ": " + e.what());
    }
  }
}

void MetricsWriter::write(int64_t step, const std::vector<std::pair<std::string, double>>& values,
                          const std::vector<std::pair<std::string, int64_t>>& counts) {
  if (jsonl_.is_open()) {
    std::string line = "{\"step\": " + std::to_string(step);
    for (const auto& [name, v] : values) line += ", \"" + name + "\": " + json_number(v);
    for (const auto& [name, n] : counts) line += ", \"" + name + "\": " + std::to_string(n);
    jsonl_ << line << "}\n";
    jsonl_.flush();
  }
  tensorboard_.add_scalars(step, values);
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);  // round-trips: runs compare bit for bit
  return buf;
}

double flops_per_token(const GPT2Config& model, int64_t num_params, int64_t seq_len) {
  return 6.0 * static_cast<double>(num_params) + 12.0 * static_cast<double>(model.n_layer * model.n_embd * seq_len);
}

double peak_memory_gib(int cuda_device) {
#ifdef GPT2_WITH_CUDA
  if (cuda_device >= 0) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(cuda_device);
    const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    return static_cast<double>(stats.allocated_bytes[agg].peak) / (1 << 30);
  }
#endif
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) * 1024.0 / (1 << 30);  // ru_maxrss is KiB on Linux
}

void reset_peak_memory(int cuda_device) {
#ifdef GPT2_WITH_CUDA
  if (cuda_device >= 0) c10::cuda::CUDACachingAllocator::resetPeakStats(cuda_device);
#endif
  (void)cuda_device;
}

}  // namespace gpt2
