// The fused cross-entropy as an autograd function (cross_entropy.h) over the CUDA launchers.
#include "src/kernels/cross_entropy.h"

#include <torch/torch.h>

#include <stdexcept>
#include <string>

#ifdef GPT2_WITH_CUDA
#include <c10/cuda/CUDAStream.h>

#include "parallel/cuda_check.h"
#include "src/kernels/dtype.h"
#endif

namespace gpt2::kernels {

bool have_cuda_kernels() {
#ifdef GPT2_WITH_CUDA
  return true;
#else
  return false;
#endif
}

#ifdef GPT2_WITH_CUDA
namespace {

class FusedCrossEntropy : public torch::autograd::Function<FusedCrossEntropy> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& targets, int64_t vocab, int64_t ignore_index,
                               bool overwrite_logits) {
    const int64_t rows = logits.size(0), stride = logits.size(1);
    auto f32 = logits.options().dtype(torch::kFloat);
    auto loss = torch::empty({rows}, f32), lse = torch::empty({rows}, f32);
    const auto stream = c10::cuda::getCurrentCUDAStream(logits.device().index()).stream();
    CUDA_CHECK(launch_cross_entropy_forward(dtype_of(logits, "kernels::cross_entropy"), logits.data_ptr(), targets.data_ptr<int64_t>(), rows,
                                            stride, vocab, ignore_index, loss.data_ptr<float>(),
                                            lse.data_ptr<float>(), stream));
    // Counted rows stay on the device: no host synchronisation inside a step.
    auto count = (targets != ignore_index).sum().to(torch::kFloat).clamp_min(1.0);
    ctx->save_for_backward({logits, targets, lse, count});
    ctx->saved_data["vocab"] = vocab;
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["overwrite_logits"] = overwrite_logits;
    return loss.sum() / count;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& logits = saved[0];
    const auto& targets = saved[1];
    const int64_t vocab = ctx->saved_data["vocab"].toInt(), ignore_index = ctx->saved_data["ignore_index"].toInt();
    auto scale = (grads[0].to(torch::kFloat) / saved[3]).reshape({1}).contiguous();
    auto grad = ctx->saved_data["overwrite_logits"].toBool() ? logits : torch::empty_like(logits);
    const auto stream = c10::cuda::getCurrentCUDAStream(logits.device().index()).stream();
    CUDA_CHECK(launch_cross_entropy_backward(dtype_of(logits, "kernels::cross_entropy"), logits.data_ptr(), targets.data_ptr<int64_t>(),
                                             saved[2].data_ptr<float>(), scale.data_ptr<float>(), logits.size(0),
                                             logits.size(1), vocab, ignore_index, grad.data_ptr(), stream));
    return {grad, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace
#endif

torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets, int64_t vocab,
                            int64_t ignore_index, bool overwrite_logits) {
#ifdef GPT2_WITH_CUDA
  if (!logits.is_cuda() || logits.dim() != 2 || !logits.is_contiguous() || vocab < 1 || vocab > logits.size(1)) {
    throw std::invalid_argument("kernels::cross_entropy: logits must be contiguous (N, Vp) CUDA with 1 <= vocab <= Vp");
  }
  if (targets.scalar_type() != torch::kLong || targets.dim() != 1 || targets.size(0) != logits.size(0) ||
      targets.device() != logits.device()) {
    throw std::invalid_argument("kernels::cross_entropy: targets must be (N) int64 on the logits' device");
  }
  return FusedCrossEntropy::apply(logits, targets.contiguous(), vocab, ignore_index, overwrite_logits);
#else
  (void)logits, (void)targets, (void)vocab, (void)ignore_index, (void)overwrite_logits;
  throw std::logic_error("kernels::cross_entropy: this build has no CUDA");
#endif
}

}  // namespace gpt2::kernels
