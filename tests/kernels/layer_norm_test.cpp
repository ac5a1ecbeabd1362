// src/kernels/layer_norm.h and at::layer_norm of x + y on the same inputs, both against float64
// under Note [Kernel accuracy rule] (compare.h): s, the output and the gradients of x, y, weight
// and bias, with and without y, with the sum s used downstream or not, in fp32, bf16 and fp16, for
// gpt2-124m's and gpt2-xl's widths (the packed path), widths that need the scalar path, and row
// counts that do not fill the kernel's blocks; and output gradients that do not start 16-byte
// aligned. Needs a GPU: skips cleanly without one (CI).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <tuple>
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
                           c10::str(torch::IntArrayRef(shape)) + (residual ? " residual" : "") +
                           (use_sum ? " s used" : "");
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

// A gradient that does not start 16-byte aligned reaches backward as it is: a view at an odd
// element offset into a larger buffer, which autograd passes on without a copy. For rows wider
// than the unpacked path's 256 elements the kernels need aligned rows, so backward must work on an
// aligned copy: the same gradients, bit for bit, as from the aligned gradient, and as accurate
// against float64 as LibTorch given the same misaligned gradient (Note [Kernel accuracy rule]).
// fp32 rows are taken up to 1024 columns (wider ones go to LibTorch: residual_layer_norm_applies).
TEST(FusedLayerNorm, MisalignedGradientGivesTheAlignedResult) {
  REQUIRE_CUDA();
  const auto f32 = torch::dtype(torch::kFloat).device(torch::kCUDA);
  EXPECT_FALSE(kernels::residual_layer_norm_applies(torch::zeros({2, 1600}, f32), {}, torch::ones({1600}, f32),
                                                    torch::zeros({1600}, f32)));
  struct Case {
    torch::ScalarType dtype;
    int64_t width;
  };
  for (const Case& c : {Case{torch::kFloat, 768}, Case{torch::kFloat, 1024}, Case{torch::kBFloat16, 768},
                        Case{torch::kBFloat16, 1600}}) {
    for (bool residual : {false, true}) {
      torch::manual_seed(c.width + residual);
      const std::vector<int64_t> shape = {3, 50, c.width};  // 150 rows
      const auto opts = f32.dtype(c.dtype);
      const auto x = (torch::randn(shape, f32) * 2 + 0.5).to(c.dtype), y = (torch::randn(shape, f32) * 0.7).to(c.dtype);
      const auto w = (torch::randn({c.width}, f32) * 0.3 + 1).to(c.dtype),
                 b = (torch::randn({c.width}, f32) * 0.3).to(c.dtype);
      const auto dout = torch::randn(shape, f32).to(c.dtype), ds = torch::randn(shape, f32).to(c.dtype);
      // The same values one element into a larger buffer: 2 or 4 bytes off any 16-byte boundary.
      auto misaligned = [&](const torch::Tensor& t) {
        auto view = torch::empty({t.numel() + 1}, opts).narrow(0, 1, t.numel()).view(t.sizes());
        view.copy_(t);
        EXPECT_NE(reinterpret_cast<uintptr_t>(view.data_ptr()) % 16, 0u);
        return view;
      };
      enum Path { kAligned, kMisaligned, kLibTorch, kReference };
      std::vector<torch::Tensor> outs[4];
      for (Path path : {kAligned, kMisaligned, kLibTorch, kReference}) {
        const auto t = path == kReference ? torch::kDouble : c.dtype;
        auto leaf = [t](const torch::Tensor& v) { return v.to(t).clone().requires_grad_(true); };
        auto xi = leaf(x), yi = leaf(y), wi = leaf(w), bi = leaf(b);
        torch::Tensor s, out;
        if (path == kAligned || path == kMisaligned) {
          std::tie(s, out) = kernels::residual_layer_norm(xi, residual ? yi : torch::Tensor(), wi, bi, 1e-5);
        } else {
          s = residual ? xi + yi : xi;
          out = at::layer_norm(s, {c.width}, wi, bi, 1e-5);
        }
        const bool aligned = path == kAligned || path == kReference;
        const auto g_out = aligned ? dout.to(t) : misaligned(dout), g_s = aligned ? ds.to(t) : misaligned(ds);
        if (residual) {
          torch::autograd::backward({s, out}, {g_s, g_out});
        } else {
          torch::autograd::backward({out}, {g_out});
        }
        outs[path] = {xi.grad(), wi.grad(), bi.grad()};
        if (residual) outs[path].push_back(yi.grad());
      }
      const char* names[] = {"dx", "dweight", "dbias", "dy"};
      const std::string what = std::string("layer_norm ") + c10::toString(c.dtype) + " width " +
                               std::to_string(c.width) + (residual ? " residual" : "") + ", misaligned gradient";
      for (size_t i = 0; i < outs[kAligned].size(); ++i) {
        ASSERT_TRUE(outs[kMisaligned][i].defined()) << what << " " << names[i];
        EXPECT_TRUE(torch::equal(outs[kMisaligned][i], outs[kAligned][i]))
            << what << " " << names[i] << ": differs from the aligned gradient's by up to "
            << (outs[kMisaligned][i].to(torch::kDouble) - outs[kAligned][i].to(torch::kDouble))
                   .abs()
                   .max()
                   .item<double>();
        expect_as_accurate(what + " " + names[i], outs[kMisaligned][i], outs[kLibTorch][i], outs[kReference][i]);
      }
    }
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
