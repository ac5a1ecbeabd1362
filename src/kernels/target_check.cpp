// Target ids outside the vocabulary (target_check.h, Note [Target check]).
#include "src/kernels/target_check.h"

#include <torch/torch.h>

#include <mutex>
#include <stdexcept>
#include <vector>

#include "src/base/errors.h"

#ifdef GPT2_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>

#include "src/base/cuda_check.h"
#include "src/kernels/dtype.h"
#endif

namespace gpt2::kernels {
namespace {

// Positions per row of `targets` for the messages: its last dimension (a scalar is one row).
int64_t positions_per_row(const torch::Tensor& targets) {
  return targets.dim() > 0 && targets.size(-1) > 0 ? targets.size(-1) : 1;
}

#ifdef GPT2_WITH_CUDA
// The notes, one per device, made on first use and kept for the life of the process (never
// destroyed: a static destructor would free device memory after CUDA has shut down).
struct Notes {
  std::mutex mutex;
  std::vector<torch::Tensor> by_device;
};

Notes& notes() {
  static Notes* n = new Notes;
  return *n;
}
#endif

}  // namespace

std::string bad_target_message(int64_t row, int64_t position, int64_t id, int64_t vocab) {
  return "target id " + std::to_string(id) + " at (row " + std::to_string(row) + ", position " +
         std::to_string(position) + ") is outside the vocabulary [0, " + std::to_string(vocab) + ")";
}

CheckedTargets check_targets(const torch::Tensor& targets, int64_t vocab, int64_t ignore_index) {
  if (targets.scalar_type() != torch::kLong) {
    throw std::invalid_argument(std::string("kernels::check_targets: targets must be int64, got ") +
                                c10::toString(targets.scalar_type()));
  }
  const int64_t per_row = positions_per_row(targets);
#ifdef GPT2_WITH_CUDA
  if (targets.is_cuda()) {
    const c10::cuda::CUDAGuard guard(targets.device());
    const auto flat = targets.contiguous();
    auto safe = torch::empty_like(flat);
    auto poison = torch::empty({}, flat.options().dtype(torch::kFloat));
    CUDA_CHECK(launch_check_targets(flat.data_ptr<int64_t>(), flat.numel(), vocab, ignore_index,
                                    {bad_target_record(flat.device()), per_row}, safe.data_ptr<int64_t>(),
                                    poison.data_ptr<float>(), stream_of(flat)));
    return {safe, poison};
  }
#endif
  const auto flat = targets.to(torch::kCPU).contiguous();
  const int64_t* ids = flat.data_ptr<int64_t>();
  for (int64_t i = 0; i < flat.numel(); ++i) {
    if (ids[i] != ignore_index && (ids[i] < 0 || ids[i] >= vocab)) {
      throw UserError(bad_target_message(i / per_row, i % per_row, ids[i], vocab));
    }
  }
  return {targets, torch::Tensor()};
}

#ifdef GPT2_WITH_CUDA
int64_t* bad_target_record(const torch::Device& device) {
  Notes& n = notes();
  const std::lock_guard<std::mutex> lock(n.mutex);
  const auto index = static_cast<size_t>(device.index() < 0 ? 0 : device.index());
  if (n.by_device.size() <= index) n.by_device.resize(index + 1);
  auto& record = n.by_device[index];
  if (!record.defined()) {
    // A blocking copy, once per device: the record is -1s before any kernel can note into it.
    record = torch::full({4}, -1, torch::kLong).to(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index)));
  }
  return record.data_ptr<int64_t>();
}
#endif

void raise_noted_bad_target() {
#ifdef GPT2_WITH_CUDA
  std::vector<torch::Tensor> records;
  {
    Notes& n = notes();
    const std::lock_guard<std::mutex> lock(n.mutex);
    for (const auto& r : n.by_device) {
      if (r.defined()) records.push_back(r);
    }
  }
  for (auto& record : records) {
    const auto host = record.to(torch::kCPU);  // waits for the losses queued before it
    const int64_t* r = host.data_ptr<int64_t>();
    if (r[0] >= 0) {
      record.fill_(-1);
      throw UserError(bad_target_message(r[0], r[1], r[2], r[3]));
    }
  }
#endif
}

}  // namespace gpt2::kernels
