// The fused cross-entropy as an autograd function (cross_entropy.h) over the CUDA launchers, or
// on CPU over row chunks of ATen's vectorised ops.
#include "src/kernels/cross_entropy.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "src/base/errors.h"
#include "src/kernels/dtype.h"
#include "src/kernels/gemm.h"
#include "src/kernels/target_check.h"

#ifdef GPT2_WITH_CUDA
#include "src/base/cuda_check.h"
#endif

namespace gpt2::kernels {

bool have_cuda_kernels() {
#ifdef GPT2_WITH_CUDA
  return true;
#else
  return false;
#endif
}

namespace {

// Note [CPU cross-entropy]
// On CPU the plain path (cast the logits to fp32, log_softmax, nll, then the same backwards, the
// slice of the padding and the cast back) walks the (N, Vp) logits some ten times through memory:
// two thirds of a tiny model's step on 2 cores. Here each pass works on kCpuChunkRows rows at a
// time (6.4 MB in fp32, which stays in cache), the chunks spread over the threads, and the
// gradient is written once, in the logits' dtype.
constexpr int64_t kCpuChunkRows = 32;

// Calls fn(first_row, rows) for the chunks of `rows`, in parallel; ATen ops inside run serially.
template <typename Fn>
void for_row_chunks(int64_t rows, const Fn& fn) {
  const int64_t chunks = (rows + kCpuChunkRows - 1) / kCpuChunkRows;
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t r0 = c * kCpuChunkRows;
      fn(r0, std::min(kCpuChunkRows, rows - r0));
    }
  });
}

// The forward kernel over (N, Vp) logits: the mean loss over counted rows, each row's log-sum-exp,
// and the count (on the device: no host synchronisation inside a step). A bad target id is noted
// for raise_noted_bad_target() by its place in targets of `positions` per row (Note [Target check]).
struct LossForward {
  torch::Tensor mean, lse, count;
};

LossForward loss_forward(const torch::Tensor& logits, const torch::Tensor& targets, int64_t vocab, int64_t ignore_index,
                         int64_t positions, const char* who) {
  const int64_t rows = logits.size(0);
  const auto f32 = logits.options().dtype(torch::kFloat);
  auto loss = torch::empty({rows}, f32), lse = torch::empty({rows}, f32);
  if (logits.is_cuda()) {
#ifdef GPT2_WITH_CUDA
    const BadTargetNote note{bad_target_record(logits.device()), positions};
    CUDA_CHECK(launch_cross_entropy_forward(dtype_of(logits, who), logits.data_ptr(), targets.data_ptr<int64_t>(), rows,
                                            logits.size(1), vocab, ignore_index, loss.data_ptr<float>(),
                                            lse.data_ptr<float>(), note, stream_of(logits)));
#endif
  } else {
    (void)positions, (void)who;  // CPU targets were checked before (check_targets throws)
    for_row_chunks(rows, [&](int64_t r0, int64_t n) {
      const auto x = logits.narrow(0, r0, n).narrow(1, 0, vocab).to(torch::kFloat);
      const auto t = targets.narrow(0, r0, n);
      const auto l = at::logsumexp(x, 1);
      const auto picked = x.gather(1, t.clamp_min(0).unsqueeze(1)).squeeze(1);
      loss.narrow(0, r0, n).copy_((l - picked).masked_fill_(t.eq(ignore_index), 0.0));
      lse.narrow(0, r0, n).copy_(l);
    });
  }
  auto count = (targets != ignore_index).sum().to(torch::kFloat).clamp_min(1.0);
  return {loss.sum() / count, lse, count};
}

// The backward kernel: the gradient of the mean loss, times the upstream gradient, into `grad`
// (which may be the logits themselves).
void loss_backward(const torch::Tensor& logits, const torch::Tensor& targets, const torch::Tensor& lse,
                   const torch::Tensor& count, const torch::Tensor& upstream, int64_t vocab, int64_t ignore_index,
                   torch::Tensor& grad, const char* who) {
  const auto scale = (upstream.to(torch::kFloat) / count).reshape({1}).contiguous();
  if (logits.is_cuda()) {
#ifdef GPT2_WITH_CUDA
    CUDA_CHECK(launch_cross_entropy_backward(dtype_of(logits, who), logits.data_ptr(), targets.data_ptr<int64_t>(),
                                             lse.data_ptr<float>(), scale.data_ptr<float>(), logits.size(0),
                                             logits.size(1), vocab, ignore_index, grad.data_ptr(), stream_of(logits)));
#endif
    return;
  }
  (void)who;
  const double s = scale.item<double>();
  const int64_t width = logits.size(1);
  for_row_chunks(logits.size(0), [&](int64_t r0, int64_t n) {
    // softmax - one_hot, times the scale; ignored rows get zero. Read into fp32 before `grad`
    // (possibly the logits themselves) is written.
    auto g = logits.narrow(0, r0, n).narrow(1, 0, vocab).to(torch::kFloat);
    const auto t = targets.narrow(0, r0, n);
    const auto keep = t.ne(ignore_index).to(torch::kFloat);
    g.sub_(lse.narrow(0, r0, n).unsqueeze(1)).exp_();
    g.scatter_add_(1, t.clamp_min(0).unsqueeze(1), -keep.unsqueeze(1));
    g.mul_((keep * s).unsqueeze(1));
    auto out = grad.narrow(0, r0, n);
    out.narrow(1, 0, vocab).copy_(g);
    if (width > vocab) out.narrow(1, vocab, width - vocab).zero_();
  });
}

// Targets of any shape with one id per row of rows_of, on its device: int64 (N) for the kernels,
// and the positions per row the error messages count in (the last dimension).
std::pair<torch::Tensor, int64_t> flat_targets(const torch::Tensor& targets, const torch::Tensor& rows_of,
                                               const char* message) {
  if (targets.scalar_type() != torch::kLong || targets.numel() != rows_of.size(0) ||
      targets.device() != rows_of.device()) {
    throw std::invalid_argument(message);
  }
  const int64_t positions = targets.dim() > 0 && targets.size(-1) > 0 ? targets.size(-1) : 1;
  return {targets.reshape({-1}).contiguous(), positions};
}

class FusedCrossEntropy : public torch::autograd::Function<FusedCrossEntropy> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& targets, int64_t vocab, int64_t ignore_index, int64_t positions) {
    auto f = loss_forward(logits, targets, vocab, ignore_index, positions, "kernels::cross_entropy");
    ctx->save_for_backward({logits, targets, f.lse, f.count});
    ctx->saved_data["vocab"] = vocab;
    ctx->saved_data["ignore_index"] = ignore_index;
    return f.mean;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto grad = torch::empty_like(saved[0]);
    loss_backward(saved[0], saved[1], saved[2], saved[3], grads[0], ctx->saved_data["vocab"].toInt(),
                  ctx->saved_data["ignore_index"].toInt(), grad, "kernels::cross_entropy");
    return {grad, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// The head and the loss (head_cross_entropy): the logits exist only inside this node, so backward
// writes their gradient over them and runs the head's two GEMMs on it. (A single kernel that also
// writes the gradient during forward, re-reading each row from shared memory, measured slower on
// an H200 than these two: 3.4 against 2.5 ms per gpt2-124m step; it is compute-bound.) Having
// overwritten them, backward drops the logits and refuses a second run through the same graph
// (retain_graph), which would otherwise read the gradient as logits and add a wrong gradient.
class HeadCrossEntropy : public torch::autograd::Function<HeadCrossEntropy> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& h, const torch::Tensor& w,
                               const torch::Tensor& targets, int64_t vocab, int64_t ignore_index, int64_t positions,
                               bool want_grad) {
    auto logits = gemm(h, w.t());  // (N, Vp) in the compute dtype (gemm.h)
    auto f = loss_forward(logits, targets, vocab, ignore_index, positions, "kernels::head_cross_entropy");
    if (want_grad) {
      ctx->save_for_backward({h, w, targets, f.lse, f.count});
      ctx->saved_data["logits"] = logits;
      ctx->saved_data["vocab"] = vocab;
      ctx->saved_data["ignore_index"] = ignore_index;
    }
    return f.mean;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    if (ctx->saved_data.count("backward_done") != 0) {
      throw Error(
          "kernels::head_cross_entropy: a second backward through the same graph: the fused head + loss "
          "writes the logits' gradient over its logits, so its backward can run once per forward; for a double "
          "backward (retain_graph) use LibTorch's ops (the model's fused kernels off) or the chunked loss");
    }
    if (ctx->saved_data.count("logits") == 0) {
      throw std::logic_error("kernels::head_cross_entropy: backward of a loss computed without gradients");
    }
    const auto saved = ctx->get_saved_variables();
    const auto &h = saved[0], &w = saved[1];
    auto g = ctx->saved_data["logits"].toTensor();  // becomes the logits' gradient, in place
    loss_backward(g, saved[2], saved[3], saved[4], grads[0], ctx->saved_data["vocab"].toInt(),
                  ctx->saved_data["ignore_index"].toInt(), g, "kernels::head_cross_entropy");
    torch::Tensor dh, dw;
    if (ctx->needs_input_grad(0)) dh = gemm(g, w);
    if (ctx->needs_input_grad(1)) dw = gemm(g.t(), h);
    ctx->saved_data.erase("logits");  // they hold the gradient now; their memory goes back with g
    ctx->saved_data["backward_done"] = true;
    return {dh, dw, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets, int64_t vocab,
                            int64_t ignore_index) {
  if (logits.is_cuda() && !have_cuda_kernels())
    throw std::logic_error("kernels::cross_entropy: this build has no CUDA");
  if (!(logits.is_cuda() || logits.is_cpu()) || logits.dim() != 2 || !logits.is_contiguous() ||
      !is_kernel_dtype(logits.scalar_type()) || vocab < 1 || vocab > logits.size(1)) {
    throw std::invalid_argument(
        "kernels::cross_entropy: logits must be contiguous (N, Vp) fp32/bf16/fp16 on CPU "
        "or CUDA with 1 <= vocab <= Vp");
  }
  const auto [flat, positions] =
      flat_targets(targets, logits, "kernels::cross_entropy: targets must be N int64 ids on the logits' device");
  if (logits.is_cpu()) check_targets(targets, vocab, ignore_index);  // throws for a bad id
  return FusedCrossEntropy::apply(logits, flat, vocab, ignore_index, positions);
}

torch::Tensor head_cross_entropy(const torch::Tensor& h, const torch::Tensor& weight, const torch::Tensor& targets,
                                 int64_t vocab, int64_t ignore_index) {
  if (h.is_cuda() && !have_cuda_kernels())
    throw std::logic_error("kernels::head_cross_entropy: this build has no CUDA");
  const auto t = h.scalar_type();
  if (!(h.is_cuda() || h.is_cpu()) || h.dim() != 2 || weight.dim() != 2 || weight.size(1) != h.size(1) ||
      weight.scalar_type() != t || weight.device() != h.device() || !is_kernel_dtype(t) || vocab < 1 ||
      vocab > weight.size(0)) {
    throw std::invalid_argument(
        "kernels::head_cross_entropy: h (N, C) and weight (Vp, C) on CPU or CUDA, of one "
        "dtype (fp32/bf16/fp16), with 1 <= vocab <= Vp");
  }
  const auto [flat, positions] =
      flat_targets(targets, h, "kernels::head_cross_entropy: targets must be N int64 ids on h's device");
  if (h.is_cpu()) check_targets(targets, vocab, ignore_index);  // throws for a bad id
  const bool want_grad = at::GradMode::is_enabled() && (h.requires_grad() || weight.requires_grad());
  return HeadCrossEntropy::apply(h, weight, flat, vocab, ignore_index, positions, want_grad);
}

}  // namespace gpt2::kernels
