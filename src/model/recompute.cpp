// Activation recomputation (see recompute.h for the contract). The reentrant scheme of
// torch.utils.checkpoint(use_reentrant=True), written as a C++ custom autograd function.
#include "src/model/recompute.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <mutex>
#include <optional>
#include <utility>

namespace gpt2 {
namespace {

// Generator states are read and written under the generator's mutex, as ATen asks; the mutex is
// not held while fn runs (dropout takes it itself).
at::Tensor get_rng_state(const at::Device& device) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();  // a byte tensor copy on CPU
}

void set_rng_state(const at::Device& device, const at::Tensor& state) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// Everything the backward needs besides the saved input. Kept as one opaque object in the
// context's saved_data (an IValue capsule), since a std::function is not an IValue.
struct RecomputeState : torch::CustomClassHolder {
  RecomputeFn fn;
  at::Tensor cpu_rng;              // CPU generator state before the forward ran fn
  std::optional<at::Device> cuda;  // x's CUDA device, when x was on CUDA
  at::Tensor cuda_rng;             // that device's generator state before the forward
};

// Sets the forward's RNG states for a scope (the recompute) and puts the caller's back after, so
// recomputation neither replays nor skips random draws of the surrounding code.
class ForkRng {
 public:
  explicit ForkRng(const RecomputeState& st) : cuda_(st.cuda) {
    saved_cpu_ = get_rng_state(at::kCPU);
    set_rng_state(at::kCPU, st.cpu_rng);
    if (cuda_) {
      saved_cuda_ = get_rng_state(*cuda_);
      set_rng_state(*cuda_, st.cuda_rng);
    }
  }
  ~ForkRng() {
    set_rng_state(at::kCPU, saved_cpu_);
    if (cuda_) set_rng_state(*cuda_, saved_cuda_);
  }
  ForkRng(const ForkRng&) = delete;
  ForkRng& operator=(const ForkRng&) = delete;

 private:
  std::optional<at::Device> cuda_;
  at::Tensor saved_cpu_, saved_cuda_;
};

}  // namespace

// Not in the anonymous namespace: the node's name() (CppNode<gpt2::RecomputeFunction>) is what
// tests look for in the graph.
struct RecomputeFunction : public torch::autograd::Function<RecomputeFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, RecomputeFn fn) {
    auto st = c10::make_intrusive<RecomputeState>();
    st->cpu_rng = get_rng_state(at::kCPU);
    if (x.is_cuda()) {
      st->cuda = x.device();
      st->cuda_rng = get_rng_state(x.device());
    }
    torch::Tensor out;
    {
      // Function::apply already runs forward with grad off; explicit because it is the point: no
      // node inside fn is recorded, so none of fn's intermediates is kept alive.
      torch::NoGradGuard no_grad;
      out = fn(x);
    }
    st->fn = std::move(fn);
    ctx->save_for_backward({x});  // the only activation kept: the block input
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(st));
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    TORCH_CHECK(!torch::GradMode::is_enabled(),
                "activation recomputation does not support double backward (create_graph=true)");
    auto st = c10::static_intrusive_pointer_cast<RecomputeState>(ctx->saved_data["state"].toCapsule());
    const torch::Tensor x = ctx->get_saved_variables()[0];
    // A fresh leaf: the nested backward stops here and leaves d(loss)/dx in x_in.grad().
    torch::Tensor x_in = x.detach().requires_grad_(true);
    torch::Tensor out;
    {
      ForkRng rng(*st);
      torch::AutoGradMode grad_on(true);
      out = st->fn(x_in);  // same shape as the forward's output
    }
    // One gradient per forward argument: x's, and an undefined one for fn.
    if (!grad_out[0].defined()) return {torch::Tensor(), torch::Tensor()};  // output unused by the loss
    // Backward through the recomputed graph. It reaches the parameters' AccumulateGrad nodes: hooks
    // fire, .grad is added to in place; and x_in, a leaf, receives its gradient in x_in.grad().
    torch::autograd::backward({out}, {grad_out[0]});
    return {x_in.grad(), torch::Tensor()};
  }
};

torch::Tensor recomputed(RecomputeFn fn, const torch::Tensor& x) {
  if (!torch::GradMode::is_enabled() || !x.requires_grad()) return fn(x);
  return RecomputeFunction::apply(x, std::move(fn));
}

}  // namespace gpt2
