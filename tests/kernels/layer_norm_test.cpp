// src/kernels/layer_norm.h and at::layer_norm of x + y on the same inputs, both against float64
// under Note [Kernel accuracy rule] (compare.h): s, the output and the gradients of x, y, weight
// and bias, with and without y, with the sum s used downstream or not, in fp32, bf16 and fp16, for
// gpt2-124m's and gpt2-xl's widths (the packed path), widths that need the scalar path, and row
// counts that do not fill the kernel's blocks. Needs a GPU: skips cleanly without one (CI).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "src/kernels/layer_norm.h"
#include "tests/kernels/compare.h"

namespace gpt2 {
namespace {

// residual: y is given; use_sum: the loss also reads s (so s gets a gradient of its own).
void compare(torch::ScalarType dtype, std::vector<int64_t> shape, bool residual, bool use_sum) {
  torch::manual_seed(static_cast<uint64_t>(shape.back() * 31 + shape.front() + 7 * residual + use_sum));
  const auto opts = torch::dtype(torch::kFloat).device(torch::kCUDA);
  const int64_t C = shape.back();
  auto x = (torch::randn(shape, opts) * 2 + 0.5).to(dtype);
  auto y = (torch::randn(shape, opts) * 0.7).to(dtype);
  auto w = (torch::randn({C}, opts) * 0.3 + 1).to(dtype);
  auto b = (torch::randn({C}, opts) * 0.3).to(dtype);
  auto dout = torch::randn(shape, opts).to(dtype);
  auto dsum = torch::randn(shape, opts).to(dtype);
  enum { kUnfused, kFused, kReference };
  std::vector<torch::Tensor> outs[3];
  for (int path : {kUnfused, kFused, kReference}) {
    const auto t = path == kReference ? torch::kDouble : dtype;  // the reference: the same values in float64
    auto leaf = [t](const torch::Tensor& v) { return v.to(t).clone().requires_grad_(true); };  // a fresh copy
    auto xi = leaf(x), yi = leaf(y), wi = leaf(w), bi = leaf(b);
    torch::Tensor s, out;
    if (path == kFused) {
      std::tie(s, out) = kernels::residual_layer_norm(xi, residual ? yi : torch::Tensor(), wi, bi, 1e-5);
    } else {
      s = residual ? xi + yi : xi;
      out = at::layer_norm(s, {C}, wi, bi, 1e-5);
    }
    const auto acc = path == kReference ? torch::kDouble : torch::kFloat;
    auto loss = (out.to(acc) * dout.to(acc)).sum();
    if (use_sum) loss = loss + (s.to(acc) * dsum.to(acc)).sum();
    loss.backward();
    outs[path] = {s.detach(), out.detach(), xi.grad(), wi.grad(), bi.grad()};
    if (residual) outs[path].push_back(yi.grad());
  }
  const char* names[] = {"s", "output", "dx", "dweight", "dbias", "dy"};
  const std::string what = std::string("layer_norm ") + c10::toString(dtype) + " " +
                           c10::str(torch::IntArrayRef(shape)) + (residual ? " residual" : "") + (use_sum ? " s used" : "");
  for (size_t i = 0; i < outs[kUnfused].size(); ++i) {
    ASSERT_TRUE(outs[kFused][i].defined()) << what << " " << names[i];
    EXPECT_EQ(outs[kFused][i].scalar_type(), dtype) << what << " " << names[i];
    expect_as_accurate(what + " " + names[i], outs[kFused][i], outs[kUnfused][i], outs[kReference][i]);
  }
}

TEST(FusedLayerNorm, AsAccurateAsLibTorch) {
  REQUIRE_CUDA();
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (int residual = 0; residual < 2; ++residual) {
      for (int use_sum = 0; use_sum < 2; ++use_sum) {
        compare(dtype, {4, 256, 768}, residual, use_sum);  // gpt2-124m's width
        compare(dtype, {3, 100, 100}, residual, use_sum);  // 300 rows, a width off the 16-byte packs
        compare(dtype, {1, 7}, residual, use_sum);         // one short row
      }
    }
    if (dtype != torch::kFloat) compare(dtype, {2, 333, 1600}, true, true);  // gpt2-xl: 7 packs per lane
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
