#pragma once
// The model's GEMMs through cuBLASLt, with the algorithm for each shape chosen by timing.
// Row-major: d (M, N) = a (M, K) b (K, N) [+ bias (N)], where a and b are each contiguous or the
// transpose (.t()) of a contiguous tensor, on one CUDA device in one dtype.
// - gemm / gemm_bias: at::mm / at::linear semantics. With tuning off (the default) they are
//   ATen's calls, bit for bit. With tuning on, bf16/fp16 products of each new shape (dtype, sizes,
//   transposes, alignment) are timed once: ATen's GEMM and every algorithm cuBLASLt's heuristic
//   offers (tile, split-K, stages), each on the call's own buffers; the fastest is kept for the
//   process (Note [GEMM tuning] in gemm.cpp). fp32 and CPU tensors always take ATen (TF32 rules).
// - gemm_bias_gelu: the MLP's first layer with bias and GELU (tanh) in the GEMM, also storing the
//   GELU input for backward; the heuristic's first algorithm, or the fastest one when tuning is on.
//   Returns false, having written nothing, when cuBLASLt has no algorithm (the caller then runs
//   the separate kernels). The backward epilogues (DGELU_BGRAD, BGRADB) were measured on an H200
//   and left out: slower than linear.cu's kernels (bench/results/2026-12-01-fused-kernels-h200.log).
// - gemm_fp8_nt: FP8 d (M, N) = (a (M, K) a_scale) (b (N, K) b_scale)^T [+ bias (N)], fp32
//   accumulation (no fast accumulation), d in out_dtype: ATen's _scaled_mm, or with tuning on and a
//   16-bit output on CUDA, timed as the 16-bit products are (split-K partials summed in fp32). The
//   caller (fp8_gemm.h's fp8_gemm_nt) checks the operands.
// A failing cuBLASLt call throws gpt2::Error naming it. Without CUDA: ATen, and gemm_bias_gelu false.
#include <torch/types.h>

#include <string>
#include <vector>

namespace gpt2::kernels {

// Per-shape timing on first use; off by default (the trainer turns it on, train.gemm_tuning).
void set_gemm_tuning(bool on);
bool gemm_tuning();

torch::Tensor gemm(const torch::Tensor& a, const torch::Tensor& b);  // a b
// x (M, K) w (N, K)^T + bias (N)
torch::Tensor gemm_bias(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias);

torch::Tensor gemm_fp8_nt(const torch::Tensor& a, const torch::Tensor& a_scale, const torch::Tensor& b,
                          const torch::Tensor& b_scale, const torch::Tensor& bias, at::ScalarType out_dtype);

// pre = x W^T + b, out = gelu(pre); x (M, K), w (N, K), b (N), out and pre (M, N), contiguous.
bool gemm_bias_gelu(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, torch::Tensor& out,
                    torch::Tensor& pre);

// The tuned choices of this process as bytes, and back: what a resumed run loads so that it
// multiplies in the order of the run it continues (Note [GEMM tuning]). A table made on another GPU
// model or cuBLASLt version gives nothing (load returns 0); bytes that are not a table are a
// gpt2::UserError naming `what`. Loaded choices replace this process's for their shapes.
std::string gemm_choices_bytes();
int64_t load_gemm_choices(const std::string& bytes, const std::string& what);
int64_t gemm_choices_count();
// Forgets every tuned choice, as a new process starts (tests of the table).
void clear_gemm_choices();

// For bench/kernel_bench: every candidate's time for d = a b [+ bias], as tuning measures them
// ("aten", then "lt0", "lt1", ... in the heuristic's order; "(skip)" marks algorithms that failed to run).
struct GemmCandidateTime {
  std::string name;
  double ms;
};
std::vector<GemmCandidateTime> time_gemm_candidates(const torch::Tensor& a, const torch::Tensor& b,
                                                    const torch::Tensor& bias);

}  // namespace gpt2::kernels
