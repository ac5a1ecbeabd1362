// src/kernels/layer_norm.h against at::layer_norm on the same inputs: output and the gradients of
// x, weight and bias, in fp32 (relative error <= 1e-5) and bf16/fp16 (<= 1e-2), for widths that are
// and are not multiples of the kernel's 32-column tiles and row counts around its 256-row chunks.
// Needs a GPU: skips cleanly without one (CI).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "src/kernels/cross_entropy.h"  // have_cuda_kernels
#include "src/kernels/layer_norm.h"

namespace gpt2 {
namespace {

double rel_error(const torch::Tensor& got, const torch::Tensor& ref) {
  const auto g = got.to(torch::kCPU, torch::kDouble), r = ref.to(torch::kCPU, torch::kDouble);
  return ((g - r).abs().max() / r.abs().max().clamp_min(1e-30)).item<double>();
}

void compare(torch::ScalarType dtype, std::vector<int64_t> shape, double tol) {
  torch::manual_seed(static_cast<uint64_t>(shape.back() * 31 + shape.front()));
  const auto opts = torch::dtype(torch::kFloat).device(torch::kCUDA);
  const int64_t C = shape.back();
  auto x = (torch::randn(shape, opts) * 2 + 0.5).to(dtype);
  auto w = (torch::randn({C}, opts) * 0.3 + 1).to(dtype);
  auto b = (torch::randn({C}, opts) * 0.3).to(dtype);
  auto dy = torch::randn(shape, opts).to(dtype);
  std::vector<torch::Tensor> outs[2];
  for (int fused = 0; fused < 2; ++fused) {
    auto xi = x.clone().requires_grad_(true), wi = w.clone().requires_grad_(true), bi = b.clone().requires_grad_(true);
    auto y = fused ? kernels::layer_norm(xi, wi, bi, 1e-5) : at::layer_norm(xi, {C}, wi, bi, 1e-5);
    y.backward(dy);
    outs[fused] = {y, xi.grad(), wi.grad(), bi.grad()};
  }
  const char* names[] = {"output", "dx", "dweight", "dbias"};
  std::string what = std::string(c10::toString(dtype)) + " " + c10::str(torch::IntArrayRef(shape));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(outs[1][i].scalar_type(), dtype) << what << " " << names[i];
    EXPECT_LE(rel_error(outs[1][i], outs[0][i]), tol) << what << " " << names[i];
  }
}

TEST(FusedLayerNorm, MatchesLibTorch) {
  if (!kernels::have_cuda_kernels() || !torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    const double tol = dtype == torch::kFloat ? 1e-5 : 1e-2;
    compare(dtype, {4, 256, 768}, tol);  // gpt2-124m's width, 4 whole chunks of rows
    compare(dtype, {3, 100, 100}, tol);  // 300 rows (a partial chunk), 100 columns (a partial tile)
    compare(dtype, {1, 7}, tol);         // one row
  }
}

TEST(FusedLayerNorm, RejectsTensorsOutsideTheContract) {
  // Runs everywhere: CPU tensors are refused.
  EXPECT_ANY_THROW(kernels::layer_norm(torch::randn({2, 8}), torch::ones({8}), torch::zeros({8}), 1e-5));
}

}  // namespace
}  // namespace gpt2
