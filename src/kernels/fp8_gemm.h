#pragma once
// FP8 GEMMs and an FP8 linear layer (issue 40's first pieces): a tensor quantized per tensor to
// e4m3 (activations and weights: 3 mantissa bits, largest 448) or e5m2 (gradients: 2 mantissa
// bits, largest 57344) with a scale s, q = saturate(round-to-nearest-even(x · s)), x ≈ q / s; and
// the product of two such tensors with fp32 accumulation and a bf16 (or fp32) output, through
// LibTorch's _scaled_mm (cuBLASLt's FP8 tensor-core GEMM on CUDA sm_89+, a reference
// implementation on the CPU).
// Note [FP8 GEMM bound] in fp8_gemm.cpp gives the error each step may add.
// Contract: fp8_gemm_nt(a, b) = a · bᵀ for a (M, K) and b (N, K) in fp8, both contiguous on one
// device, K and N multiples of 16 (cuBLASLt's FP8 rule, checked on every device so that a shape that
// passes on the CPU also runs on the GPU); at most one operand e5m2 (no e5m2 x e5m2 GEMM exists);
// bias (N) in the output dtype. Anything else is a gpt2::Error naming fp8_gemm_nt.
#include <torch/types.h>

#include <utility>
#include <vector>

namespace gpt2::kernels {

struct Fp8Tensor {
  torch::Tensor data;       // float8_e4m3fn or float8_e5m2, contiguous
  torch::Tensor scale_inv;  // () fp32 on data's device: the tensor is data · scale_inv
};

// The largest finite value of an fp8 format (448 or 57344); a gpt2::Error for any other dtype.
float fp8_max(at::ScalarType format);
// The scale mapping `amax` (a () fp32 tensor: max |x|) onto the format's largest value, fp8_max /
// amax; 1 where amax is 0 or not finite (a tensor of zeros, or an overflow the caller handles).
torch::Tensor fp8_scale_for(const torch::Tensor& amax, at::ScalarType format);
// x (any float dtype, any shape) quantized with `scale` (() fp32): finite values saturated to
// ±fp8_max first, so an amax larger than the scale was made for clips instead of turning into NaN;
// inf and NaN stay non-finite (NaN in e4m3fn).
Fp8Tensor quantize_fp8(const torch::Tensor& x, at::ScalarType format, const torch::Tensor& scale);
// The value an Fp8Tensor stands for, in `dtype`.
torch::Tensor dequantize_fp8(const Fp8Tensor& t, at::ScalarType dtype);
// t's data transposed into a contiguous tensor (the backward GEMMs' operands), the same scale.
Fp8Tensor transpose_fp8(const Fp8Tensor& t);
torch::Tensor fp8_gemm_nt(const Fp8Tensor& a, const Fp8Tensor& b, at::ScalarType out_dtype,
                          const torch::Tensor& bias = {});
// Whether fp8_gemm_nt runs on `device`: the CPU, or a CUDA device of compute capability 8.9 or newer.
bool fp8_supported(const torch::Device& device);

// The same tensor cast with its own amax (what fp8_linear does to each operand): quantize_fp8
// with fp8_scale_for(max |x|). On CUDA (fp32/bf16/fp16) two kernels of ours give the same bits as
// that composition (NaN payloads aside) in two reads of x.
Fp8Tensor quantize_fp8_current(const torch::Tensor& x, at::ScalarType format);
// A matrix cast so, and its transpose (the same scale), written by the same pass on CUDA.
std::pair<Fp8Tensor, Fp8Tensor> quantize_fp8_current_and_transpose(const torch::Tensor& x, at::ScalarType format);

// Delayed scaling (Transformer Engine's recipe) for one linear layer. `amax` (3, L >= 2) fp32 on
// the layer's device, contiguous: rows x, w and gy; column 0 the current step's largest |value|
// (a max over the step's casts: micro-batches, recomputation), columns 1..L-1 the steps before,
// newest first. A cast scales by fp8_scale_for(max of its row's columns 1..L-1), so the scale is
// fixed for the step and values past it saturate; with use_history false (no step recorded yet)
// it takes its own amax, as current scaling. Either way a recording cast raises column 0 to its
// amax.
struct Fp8DelayedScaling {
  torch::Tensor amax;
  bool use_history = false;
};
// A matrix cast by that rule with one history row (L), recording, and its transpose. On CUDA,
// with the history used, one read of x.
std::pair<Fp8Tensor, Fp8Tensor> quantize_fp8_delayed_and_transpose(const torch::Tensor& x, at::ScalarType format,
                                                                   const torch::Tensor& history_row, bool use_history);
// The step is over: every history (the last dim) moves one column on, the oldest drops, column 0
// restarts at 0; a non-finite amax (an overflow, a skipped step; recording casts write a NaN as
// inf, so an all-reduce max before the roll is well defined) enters as the step before's amax.
void fp8_amax_roll(torch::Tensor& amax);

// A linear layer x wᵀ + b whose three products run in FP8 with current per-tensor scaling (each
// tensor scaled by its own amax as it is cast): forward e4m3 x e4m3, backward dx = gy · w and
// dw = gyᵀ · x with gy in e5m2; bias and its gradient (linear.h's bias_grad) stay in x's dtype. Backward keeps the fp8
// xᵀ (half the bytes of bf16) and w, a parameter, whose fp8 transpose it casts again (the same
// scale: w has not changed) rather than keep a copy of every weight. x (..., K) bf16 or fp32, w (N, K) and bias (N) in
// x's dtype; K, N and x's rows multiples of 16. The output has x's dtype. Outside that, a gpt2::Error naming
// fp8_linear.
// With `delayed`, the casts scale by Fp8DelayedScaling's rule instead, and record into it when the
// forward runs with grad enabled (training; evaluation and decoding leave the histories alone).
torch::Tensor fp8_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias,
                         const Fp8DelayedScaling* delayed = nullptr);
// fp8_linear(gelu_tanh(x), w, bias) as one node (the MLP's GELU and output projection): the GELU's
// output is cast to FP8 as it is computed, with the bits the composition's cast would have, and
// never stored in x's dtype; backward keeps x (which GELU's backward needs anyway) and casts
// gelu(x)ᵀ again for dw, then dx = gelu'(x) · (gy · w). The same checks, naming fp8_gelu_linear.
torch::Tensor fp8_gelu_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias,
                              const Fp8DelayedScaling* delayed = nullptr);
// The attention's q/k/v projection: fp8_linear(x, w, bias).split(N / 3, -1) bit for bit (w (3C, K),
// bias (3C)) as one node with three outputs, whose backward takes the three gradients as autograd
// hands them over: on CUDA, with delayed scaling from a history, one pass casts them to e5m2 and sums
// the bias gradient, where the composition concatenates them in x's dtype first (a copy) and reads
// that twice. The outputs are views of one (M, 3C) product: not to be written in place. fp8_linear's
// checks, naming fp8_qkv_linear.
std::vector<torch::Tensor> fp8_qkv_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias,
                                          const Fp8DelayedScaling* delayed = nullptr);
// The MLP, c_proj(gelu_tanh(c_fc(x))), as one node: forward fp8_gelu_linear(fp8_linear(x, fc_w, fc_b),
// proj_w, proj_b) bit for bit, keeping gelu's FP8 transpose from forward (no second cast of it in
// backward; keep_gelu_output false, memory.recompute_gelu, casts it again from the GELU's input there
// instead, the same bits, a byte an element less held); backward the same products, with the GELU backward and c_fc's
// bias gradient in one pass (linear.h's gelu_and_bias_backward: on CUDA our kernel's derivative, not ATen's bits, on
// the CPU ATen's, so there the composition's bits). Both layers biased and scaled alike (both current or both delayed);
// fp8_linear's checks on each, naming fp8_mlp.
torch::Tensor fp8_mlp(const torch::Tensor& x, const torch::Tensor& fc_w, const torch::Tensor& fc_b,
                      const torch::Tensor& proj_w, const torch::Tensor& proj_b,
                      const Fp8DelayedScaling* fc_delayed = nullptr, const Fp8DelayedScaling* proj_delayed = nullptr,
                      bool keep_gelu_output = true);

}  // namespace gpt2::kernels
