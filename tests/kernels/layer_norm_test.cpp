// src/kernels/layer_norm.h against at::layer_norm of x + y on the same inputs: s, the output and
// the gradients of x, y, weight and bias, with and without y, with the sum s used downstream or
// not, in fp32 (relative error <= 1e-5) and bf16/fp16 (<= 1e-2), for gpt2-124m's and gpt2-xl's
// widths (the packed path), widths that need the scalar path, and row counts that do not fill the
// kernel's blocks. Needs a GPU: skips cleanly without one (CI).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "src/kernels/layer_norm.h"
#include "tests/kernels/compare.h"

namespace gpt2 {
namespace {

// residual: y is given; use_sum: the loss also reads s (so s gets a gradient of its own).
void compare(torch::ScalarType dtype, std::vector<int64_t> shape, double tol, bool residual, bool use_sum) {
  torch::manual_seed(static_cast<uint64_t>(shape.back() * 31 + shape.front() + 7 * residual + use_sum));
  const auto opts = torch::dtype(torch::kFloat).device(torch::kCUDA);
  const int64_t C = shape.back();
  auto x = (torch::randn(shape, opts) * 2 + 0.5).to(dtype);
  auto y = (torch::randn(shape, opts) * 0.7).to(dtype);
  auto w = (torch::randn({C}, opts) * 0.3 + 1).to(dtype);
  auto b = (torch::randn({C}, opts) * 0.3).to(dtype);
  auto dout = torch::randn(shape, opts).to(dtype);
  auto dsum = torch::randn(shape, opts).to(dtype);
  std::vector<torch::Tensor> outs[2];
  for (int fused = 0; fused < 2; ++fused) {
    auto xi = x.clone().requires_grad_(true), yi = y.clone().requires_grad_(true);
    auto wi = w.clone().requires_grad_(true), bi = b.clone().requires_grad_(true);
    torch::Tensor s, out;
    if (fused) {
      std::tie(s, out) = kernels::residual_layer_norm(xi, residual ? yi : torch::Tensor(), wi, bi, 1e-5);
    } else {
      s = residual ? xi + yi : xi;
      out = at::layer_norm(s, {C}, wi, bi, 1e-5);
    }
    auto loss = (out.to(torch::kFloat) * dout.to(torch::kFloat)).sum();
    if (use_sum) loss = loss + (s.to(torch::kFloat) * dsum.to(torch::kFloat)).sum();
    loss.backward();
    outs[fused] = {s.detach(), out.detach(), xi.grad(), wi.grad(), bi.grad()};
    if (residual) outs[fused].push_back(yi.grad());
  }
  const char* names[] = {"s", "output", "dx", "dweight", "dbias", "dy"};
  const std::string what = std::string(c10::toString(dtype)) + " " + c10::str(torch::IntArrayRef(shape)) +
                           (residual ? " residual" : "") + (use_sum ? " s used" : "");
  for (size_t i = 0; i < outs[0].size(); ++i) {
    ASSERT_TRUE(outs[1][i].defined()) << what << " " << names[i];
    EXPECT_EQ(outs[1][i].scalar_type(), dtype) << what << " " << names[i];
    EXPECT_LE(rel_error(outs[1][i], outs[0][i]), tol) << what << " " << names[i];
  }
}

TEST(FusedLayerNorm, MatchesLibTorch) {
  REQUIRE_CUDA();
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    const double tol = dtype == torch::kFloat ? 1e-5 : 1e-2;
    for (int residual = 0; residual < 2; ++residual) {
      for (int use_sum = 0; use_sum < 2; ++use_sum) {
        compare(dtype, {4, 256, 768}, tol, residual, use_sum);  // gpt2-124m's width
        compare(dtype, {3, 100, 100}, tol, residual, use_sum);  // 300 rows, a width off the 16-byte packs
        compare(dtype, {1, 7}, tol, residual, use_sum);         // one short row
      }
    }
    if (dtype != torch::kFloat) compare(dtype, {2, 333, 1600}, tol, true, true);  // gpt2-xl: 7 packs per lane
  }
}

TEST(FusedLayerNorm, AppliesOnlyWithinTheContract) {
  const auto cpu = torch::randn({2, 8});
  EXPECT_FALSE(kernels::residual_layer_norm_applies(cpu, {}, torch::ones({8}), torch::zeros({8})));
  EXPECT_THROW(kernels::residual_layer_norm(cpu, {}, torch::ones({8}), torch::zeros({8}), 1e-5), std::invalid_argument);
  if (!have_gpu()) return;
  const auto opts = torch::dtype(torch::kBFloat16).device(torch::kCUDA);
  const auto w = torch::ones({4096}, opts), b = torch::zeros({4096}, opts);
  EXPECT_FALSE(kernels::residual_layer_norm_applies(torch::randn({2, 4096}, opts), {}, w, b));  // too wide a row
  EXPECT_FALSE(kernels::residual_layer_norm_applies(torch::randn({2, 8}, opts), torch::randn({2, 9}, opts),
                                                    w.narrow(0, 0, 8), b.narrow(0, 0, 8)));  // y's shape
  EXPECT_TRUE(kernels::residual_layer_norm_applies(torch::randn({2, 8}, opts), torch::randn({2, 8}, opts),
                                                   w.narrow(0, 0, 8), b.narrow(0, 0, 8)));
}

}  // namespace
}  // namespace gpt2
