// Slot decoding's attention (slot_attention.h): the checks, the CUDA launch, and the CPU loop.
#include "src/kernels/slot_attention.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/kernels/dtype.h"

#ifdef GPT2_WITH_CUDA
#include "src/base/cuda_check.h"
#endif

namespace gpt2::kernels {
namespace {

// Row b, head h of the CPU loop: softmax over the scores of positions 0..pos (max, exp, sum in
// fp32, in position order), then the weighted sum of the values, each written rounded to T.
template <typename T>
void cpu_slot_attention(const torch::Tensor& q, const torch::Tensor& keys, const torch::Tensor& values,
                        const torch::Tensor& positions, torch::Tensor& y) {
  const int64_t B = keys.size(0), nh = keys.size(1), capacity = keys.size(2), hs = keys.size(3);
  const int64_t qsb = q.stride(0), qsh = q.stride(1);
  const T* qp = q.data_ptr<T>();
  const T* kp = keys.data_ptr<T>();
  const T* vp = values.data_ptr<T>();
  const int64_t* pp = positions.data_ptr<int64_t>();
  T* yp = y.data_ptr<T>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  at::parallel_for(0, B * nh, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(hs), acc(hs), scores;
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / nh, h = r % nh, n = pp[b] + 1;
      const T* qr = qp + b * qsb + h * qsh;
      for (int64_t d = 0; d < hs; ++d) qf[d] = static_cast<float>(qr[d]);
      const T* kr = kp + r * capacity * hs;
      const T* vr = vp + r * capacity * hs;
      scores.resize(n);
      float top = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        float dot = 0.0f;
        for (int64_t d = 0; d < hs; ++d) dot += qf[d] * static_cast<float>(kr[j * hs + d]);
        scores[j] = dot * scale;
        top = std::max(top, scores[j]);
      }
      float sum = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < n; ++j) {
        const float p = std::exp(scores[j] - top);
        sum += p;
        for (int64_t d = 0; d < hs; ++d) acc[d] += p * static_cast<float>(vr[j * hs + d]);
      }
      for (int64_t d = 0; d < hs; ++d) yp[r * hs + d] = static_cast<T>(acc[d] / sum);
    }
  });
}

}  // namespace

bool slot_attention_applies(const torch::Tensor& q, const torch::Tensor& keys, const torch::Tensor& values,
                            const torch::Tensor& positions) {
  if (!q.defined() || !keys.defined() || !values.defined() || !positions.defined()) return false;
  if (keys.dim() != 4 || q.dim() != 4 || positions.dim() != 1) return false;
  const int64_t B = keys.size(0), nh = keys.size(1), capacity = keys.size(2), hs = keys.size(3);
  const auto t = keys.scalar_type();
  const bool shapes = capacity >= 1 && hs >= 1 && q.size(0) == B && q.size(1) == nh && q.size(2) == 1 &&
                      q.size(3) == hs && q.stride(3) == 1 && values.sizes() == keys.sizes() && keys.is_contiguous() &&
                      values.is_contiguous() && positions.size(0) == B && positions.scalar_type() == torch::kLong &&
                      positions.is_contiguous();
  const bool types = is_kernel_dtype(t) && q.scalar_type() == t && values.scalar_type() == t;
  const bool one_device =
      q.device() == keys.device() && values.device() == keys.device() && positions.device() == keys.device();
  const bool no_grad =
      !(torch::GradMode::is_enabled() && (q.requires_grad() || keys.requires_grad() || values.requires_grad()));
  if (!(shapes && types && one_device && no_grad)) return false;
  if (keys.is_cpu()) return true;
#ifdef GPT2_WITH_CUDA
  const auto align = static_cast<uintptr_t>(2 * keys.element_size());
  return keys.is_cuda() && slot_attention_supported(hs) && reinterpret_cast<uintptr_t>(keys.data_ptr()) % align == 0 &&
         reinterpret_cast<uintptr_t>(values.data_ptr()) % align == 0;
#else
  return false;
#endif
}

torch::Tensor slot_attention(const torch::Tensor& q, const torch::Tensor& keys, const torch::Tensor& values,
                             const torch::Tensor& positions) {
  if (!slot_attention_applies(q, keys, values, positions)) {
    throw std::invalid_argument(
        "kernels::slot_attention: q (B, nh, 1, hs) with its last dim contiguous, keys and values (B, nh, capacity, "
        "hs) contiguous, positions (B) int64, one device (CPU, or CUDA in a CUDA build with hs even and <= 128) "
        "and one dtype of fp32/bf16/fp16, no gradient");
  }
  const int64_t B = keys.size(0), nh = keys.size(1), capacity = keys.size(2), hs = keys.size(3);
  auto y = torch::empty({B, nh, 1, hs}, keys.options());  // (B, nh, 1, hs)
  if (keys.is_cpu()) {
    const int64_t* pp = positions.data_ptr<int64_t>();
    for (int64_t b = 0; b < B; ++b) {
      if (pp[b] < 0 || pp[b] >= capacity) {
        throw std::invalid_argument("kernels::slot_attention: positions[" + std::to_string(b) +
                                    "] = " + std::to_string(pp[b]) +
                                    " is outside [0, capacity = " + std::to_string(capacity) + ")");
      }
    }
    switch (keys.scalar_type()) {
      case torch::kFloat:
        cpu_slot_attention<float>(q, keys, values, positions, y);
        break;
      case torch::kBFloat16:
        cpu_slot_attention<c10::BFloat16>(q, keys, values, positions, y);
        break;
      default:
        cpu_slot_attention<c10::Half>(q, keys, values, positions, y);
        break;
    }
    return y;
  }
#ifdef GPT2_WITH_CUDA
  SlotAttentionArgs args{q.data_ptr(),
                         q.stride(0),
                         q.stride(1),
                         keys.data_ptr(),
                         values.data_ptr(),
                         positions.data_ptr<int64_t>(),
                         B,
                         nh,
                         capacity,
                         hs,
                         static_cast<float>(1.0 / std::sqrt(static_cast<double>(hs)))};
  CUDA_CHECK(launch_slot_attention(dtype_of(keys, "kernels::slot_attention"), args, y.data_ptr(), stream_of(keys)));
#endif
  return y;
}

}  // namespace gpt2::kernels
