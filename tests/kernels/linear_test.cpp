// src/kernels/linear.h and at::linear / at::linear(gelu(at::linear, "tanh")) on the same inputs,
// both against float64 under Note [Kernel accuracy rule] (compare.h): output and every gradient,
// in fp32, bf16 and fp16, for gpt2-124m's shapes (c_fc's GELU in a cuBLASLt epilogue), a frozen
// weight (only the bias gradient), hidden widths off multiples of 8 (ATen's GELU instead of the
// epilogue), odd widths and row counts that do not fill the kernels' chunks. Needs a GPU: skips
// cleanly without one (CI).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "src/kernels/gemm.h"
#include "src/kernels/linear.h"
#include "tests/kernels/compare.h"

namespace gpt2 {
namespace {

enum Path { kUnfused, kFused, kReference };

// A fresh leaf holding v's values in the path's dtype (float64 for the reference).
torch::Tensor leaf(const torch::Tensor& v, Path path, bool requires_grad = true) {
  return v.to(path == kReference ? torch::kDouble : v.scalar_type()).clone().requires_grad_(requires_grad);
}

// kernels::linear and at::linear: output and the gradients of x, weight and bias (with the weight
// frozen, only the bias gradient: the column-sum kernel instead of the GEMM epilogue).
void compare_linear(torch::ScalarType dtype, std::vector<int64_t> x_shape, int64_t out, bool freeze_weight) {
  torch::manual_seed(static_cast<uint64_t>(x_shape.back() * 13 + out));
  const auto opts = torch::dtype(torch::kFloat).device(torch::kCUDA);
  const int64_t in = x_shape.back();
  auto x = torch::randn(x_shape, opts).to(dtype);
  auto w = (torch::randn({out, in}, opts) / std::sqrt(static_cast<double>(in))).to(dtype);
  auto b = (torch::randn({out}, opts) * 0.5).to(dtype);
  std::vector<int64_t> y_shape = x_shape;
  y_shape.back() = out;
  auto dy = torch::randn(y_shape, opts).to(dtype);
  std::vector<torch::Tensor> outs[3];
  for (Path path : {kUnfused, kFused, kReference}) {
    auto xi = leaf(x, path), wi = leaf(w, path, !freeze_weight), bi = leaf(b, path);
    auto y = path == kFused ? kernels::linear(xi, wi, bi) : at::linear(xi, wi, bi);
    y.backward(dy.to(y.scalar_type()));
    outs[path] = {y.detach(), xi.grad(), bi.grad()};
    if (!freeze_weight) outs[path].push_back(wi.grad());
  }
  const char* names[] = {"output", "dx", "dbias", "dweight"};
  const std::string what = std::string("linear ") + c10::toString(dtype) + " " + c10::str(torch::IntArrayRef(x_shape)) +
                           " -> " + std::to_string(out) + (freeze_weight ? " (weight frozen)" : "");
  for (size_t i = 0; i < outs[kUnfused].size(); ++i) {
    EXPECT_EQ(outs[kFused][i].scalar_type(), dtype) << what << " " << names[i];
    expect_as_accurate(what + " " + names[i], outs[kFused][i], outs[kUnfused][i], outs[kReference][i]);
  }
}

// kernels::mlp and at::linear(gelu(at::linear(x), "tanh")): output and all five gradients. The
// fused path once keeping the GELU output for backward and once recomputing it: the same output
// and gradients bit for bit but c_proj's weight gradient (from the recomputed GELU output), which
// meets the same accuracy rule.
void compare_mlp(torch::ScalarType dtype, std::vector<int64_t> x_shape, int64_t hidden) {
  torch::manual_seed(static_cast<uint64_t>(x_shape.back() * 17 + hidden));
  const auto opts = torch::dtype(torch::kFloat).device(torch::kCUDA);
  const int64_t C = x_shape.back();
  auto x = torch::randn(x_shape, opts).to(dtype);
  auto fw = (torch::randn({hidden, C}, opts) / std::sqrt(static_cast<double>(C))).to(dtype);
  auto fb = (torch::randn({hidden}, opts) * 0.5).to(dtype);
  auto pw = (torch::randn({C, hidden}, opts) / std::sqrt(static_cast<double>(hidden))).to(dtype);
  auto pb = (torch::randn({C}, opts) * 0.5).to(dtype);
  auto dy = torch::randn(x_shape, opts).to(dtype);
  std::vector<torch::Tensor> outs[3], recomputed;
  for (Path path : {kUnfused, kFused, kReference}) {
    for (bool keep_gelu_output : {true, false}) {
      if (path != kFused && !keep_gelu_output) continue;
      std::vector<torch::Tensor> p;
      for (const auto& t : {x, fw, fb, pw, pb}) p.push_back(leaf(t, path));
      auto y = path == kFused ? kernels::mlp(p[0], p[1], p[2], p[3], p[4], keep_gelu_output)
                              : at::linear(at::gelu(at::linear(p[0], p[1], p[2]), "tanh"), p[3], p[4]);
      y.backward(dy.to(y.scalar_type()));
      auto& out = keep_gelu_output ? outs[path] : recomputed;
      out = {y.detach()};
      for (const auto& t : p) out.push_back(t.grad());
    }
  }
  const char* names[] = {"output", "dx", "dfc_weight", "dfc_bias", "dproj_weight", "dproj_bias"};
  const std::string what = std::string("mlp ") + c10::toString(dtype) + " " + c10::str(torch::IntArrayRef(x_shape)) +
                           " hidden " + std::to_string(hidden);
  for (size_t i = 0; i < outs[kUnfused].size(); ++i) {
    EXPECT_EQ(outs[kFused][i].scalar_type(), dtype) << what << " " << names[i];
    expect_as_accurate(what + " " + names[i], outs[kFused][i], outs[kUnfused][i], outs[kReference][i]);
    if (std::string(names[i]) == "dproj_weight") {
      expect_as_accurate(what + " dproj_weight, GELU output recomputed", recomputed[i], outs[kUnfused][i],
                         outs[kReference][i]);
    } else {
      EXPECT_TRUE(torch::equal(recomputed[i], outs[kFused][i])) << what << " " << names[i] << ": recomputing the GELU "
                                                                << "output changed it";
    }
  }
}

// Recomputing the GELU output holds one (rows, hidden) activation less between forward and backward.
TEST(FusedMlp, RecomputingTheGeluOutputKeepsOneActivationLess) {
  REQUIRE_CUDA();
  const auto opts = torch::dtype(torch::kBFloat16).device(torch::kCUDA);
  const int64_t rows = 1024, C = 256, hidden = 1024;
  auto x = torch::randn({rows, C}, opts).requires_grad_();
  auto fw = torch::randn({hidden, C}, opts).requires_grad_(), fb = torch::randn({hidden}, opts).requires_grad_();
  auto pw = torch::randn({C, hidden}, opts).requires_grad_(), pb = torch::randn({C}, opts).requires_grad_();
  kernels::mlp(x, fw, fb, pw, pb).sum().backward();  // first use: cuBLASLt's workspace, the allocator's pools
  int64_t held[2] = {0, 0};
  for (bool keep : {true, false}) {
    const int64_t before = allocated_bytes();
    auto y = kernels::mlp(x, fw, fb, pw, pb, keep);
    held[keep] = allocated_bytes() - before - static_cast<int64_t>(y.nbytes());  // what backward will read
    y.sum().backward();
  }
  EXPECT_EQ(held[true] - held[false], rows * hidden * 2)
      << "kept " << held[true] << " bytes, recomputing " << held[false];
}

TEST(FusedLinear, AsAccurateAsLibTorch) {
  REQUIRE_CUDA();
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (bool frozen : {false, true}) {
      compare_linear(dtype, {4, 256, 768}, 2304, frozen);  // gpt2-124m's c_attn
      compare_linear(dtype, {2, 300, 64}, 37, frozen);     // 600 rows (a partial chunk), an odd width
      compare_linear(dtype, {5, 24}, 24, frozen);
    }
  }
}

TEST(FusedMlp, AsAccurateAsLibTorch) {
  REQUIRE_CUDA();
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    compare_mlp(dtype, {4, 256, 768}, 3072);  // gpt2-124m's MLP (the cuBLASLt epilogues)
    compare_mlp(dtype, {2, 300, 64}, 100);    // a hidden width off multiples of 8: the kernels instead
    compare_mlp(dtype, {7, 32}, 128);
  }
}

// The same with train.gemm_tuning's timed GEMM algorithms (gemm.h) in every product.
TEST(FusedLinearAndMlp, AsAccurateAsLibTorchWithTunedGemms) {
  REQUIRE_CUDA();
  kernels::set_gemm_tuning(true);
  for (auto dtype : {torch::kBFloat16, torch::kHalf}) {
    for (bool frozen : {false, true}) compare_linear(dtype, {4, 256, 768}, 2304, frozen);
    compare_linear(dtype, {2, 300, 64}, 37, false);
    compare_mlp(dtype, {4, 256, 768}, 3072);
    compare_mlp(dtype, {7, 32}, 128);
  }
  kernels::set_gemm_tuning(false);
}

TEST(FusedLinear, AppliesOnlyWithinTheContract) {
  const auto x = torch::randn({2, 8}), w = torch::randn({4, 8}), b = torch::randn({4});
  EXPECT_FALSE(kernels::linear_applies(x, w, b));  // CPU tensors
  EXPECT_THROW(kernels::linear(x, w, b), std::invalid_argument);
  EXPECT_THROW(kernels::mlp(x, w, b, w.t().contiguous(), torch::randn({8})), std::invalid_argument);
  if (!have_gpu()) return;
  const auto g = torch::kCUDA;
  EXPECT_TRUE(kernels::linear_applies(x.to(g), w.to(g), b.to(g)));
  EXPECT_FALSE(kernels::linear_applies(x.to(g), w.to(g), torch::Tensor()));  // no bias
  EXPECT_FALSE(kernels::linear_applies(x.to(g), w.to(g).t(), b.to(g)));      // shapes
}

}  // namespace
}  // namespace gpt2
