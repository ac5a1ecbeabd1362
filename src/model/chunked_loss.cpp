// The chunked head + cross-entropy (see chunked_loss.h).
#include "src/model/chunked_loss.h"

#include <torch/autograd.h>

#include <algorithm>

#include "src/kernels/target_check.h"

namespace gpt2 {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::ScalarType accumulate_type(const torch::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

class ChunkedCrossEntropy : public torch::autograd::Function<ChunkedCrossEntropy> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& h, const torch::Tensor& W,
                               const torch::Tensor& targets, int64_t vocab, int64_t ignore_index, int64_t chunk) {
    at::NoGradGuard no_grad;
    const int64_t N = h.size(0);
    const auto acc = accumulate_type(h);
    auto lse = torch::empty({N}, h.options().dtype(acc));
    auto loss_sum = torch::zeros({}, h.options().dtype(acc));
    const auto valid = targets.ne(ignore_index);
    for (int64_t r0 = 0; r0 < N; r0 += chunk) {
      const int64_t n = std::min(chunk, N - r0);
      const auto logits = h.narrow(0, r0, n).mm(W.t()).narrow(1, 0, vocab).to(acc);  // (n, V)
      const auto lse_c = logits.logsumexp(1);
      const auto t = targets.narrow(0, r0, n);
      const auto picked = logits.gather(1, t.clamp_min(0).unsqueeze(1)).squeeze(1);
      loss_sum += ((lse_c - picked) * valid.narrow(0, r0, n).to(acc)).sum();
      lse.narrow(0, r0, n).copy_(lse_c);
    }
    const auto count = valid.sum().to(acc).clamp_min(1);
    ctx->save_for_backward({h, W, targets, lse, count});
    ctx->saved_data["vocab"] = vocab;
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["chunk"] = chunk;
    return loss_sum / count;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const auto &h = saved[0], &W = saved[1], &targets = saved[2], &lse = saved[3], &count = saved[4];
    const int64_t vocab = ctx->saved_data["vocab"].toInt();
    const int64_t ignore_index = ctx->saved_data["ignore_index"].toInt();
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const int64_t N = h.size(0), Vp = W.size(0);
    const auto acc = accumulate_type(h);
    const auto scale = grad_out[0].to(acc) / count;  // d(mean)/d(row loss)
    auto dh = torch::empty_like(h);
    auto dW = torch::zeros(W.sizes(), W.options().dtype(acc));
    for (int64_t r0 = 0; r0 < N; r0 += chunk) {
      const int64_t n = std::min(chunk, N - r0);
      const auto hc = h.narrow(0, r0, n);
      // softmax - one_hot over the classes, zero on padding columns and on ignored rows.
      auto g = torch::zeros({n, Vp}, h.options().dtype(acc));
      auto gv = g.narrow(1, 0, vocab);
      gv.copy_(hc.mm(W.t()).narrow(1, 0, vocab).to(acc));
      gv.sub_(lse.narrow(0, r0, n).unsqueeze(1)).exp_();
      const auto t = targets.narrow(0, r0, n);
      const auto valid = t.ne(ignore_index);
      gv.scatter_add_(1, t.clamp_min(0).unsqueeze(1), -valid.to(acc).unsqueeze(1));
      g.mul_(valid.to(acc).unsqueeze(1) * scale);
      const auto gc = g.to(h.scalar_type());  // matmuls in the compute dtype (tensor cores)
      dh.narrow(0, r0, n).copy_(gc.mm(W));
      dW.add_(gc.t().mm(hc));
    }
    return {dh, dW.to(W.scalar_type()), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor chunked_cross_entropy(const torch::Tensor& h, const torch::Tensor& W, const torch::Tensor& targets,
                                    int64_t vocab, int64_t ignore_index, int64_t chunk_rows) {
  TORCH_CHECK(
      h.dim() == 2 && W.dim() == 2 && h.size(1) == W.size(1) && targets.numel() == h.size(0) && vocab <= W.size(0),
      "chunked_cross_entropy: h ", h.sizes(), ", W ", W.sizes(), ", targets ", targets.sizes());
  // Note [Target check]: CPU throws here; CUDA notes a bad id, ignores its row and makes the loss NaN.
  const auto checked = kernels::check_targets(targets, vocab, ignore_index);
  auto loss = ChunkedCrossEntropy::apply(h.contiguous(), W, checked.targets.reshape({-1}).contiguous(), vocab,
                                         ignore_index, std::max<int64_t>(chunk_rows, 1));
  return checked.poison.defined() ? loss + checked.poison : loss;
}

}  // namespace gpt2
