// Weight-only int8 (src/kernels/int8_linear.h, Note [int8 weights]): the quantization's defining
// properties, the decode kernels against the fp64 product of the same int8 weights (CPU here, in
// every ISA variant; CUDA on the GPU machine), and GPT2::quantize_int8 against the fp32 model
// whose weights are the dequantized ones.
//
// Note [int8 kernel bound]: y[m, n] = sum_g s[n, g] sum_{k in g} q[n, k] x[m, k] + b[n] in fp32 is
// k products and sums inside a group, one multiply by s, G group sums and one add of b: at most
// K + G + 2 rounded operations along any path, so |y − exact| <= γ_{K+G+2} (sum_k |q s x| + |b|)
// with γ_n = n u / (1 − n u), u = 2^-24 (Higham, Accuracy and Stability, §3.1). x is exact in its
// dtype (the reference reads the same values); a bf16/fp16 output adds its own rounding of y.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "src/base/errors.h"
#include "src/kernels/decode_linear.h"
#include "src/kernels/int8_linear.h"
#include "src/model/gpt2_model.h"

namespace gpt2::kernels {
namespace {

double gamma32(int64_t n) { return n * 0x1p-24 / (1 - n * 0x1p-24); }

// A weight with a few large entries per row, as trained projections have.
torch::Tensor weight(int64_t n, int64_t k, uint64_t seed) {
  torch::manual_seed(seed);
  auto w = torch::randn({n, k}) * 0.02;
  w.index_put_({torch::indexing::Slice(), torch::indexing::Slice(0, k, 97)}, 0.3);
  return w;
}

TEST(Int8Quantize, EachGroupScaledByItsMaxAndRoundedToNearest) {
  for (int64_t group : {0, 128}) {
    SCOPED_TRACE("group " + std::to_string(group));
    auto w = weight(40, 384, 1);
    w[3].zero_();  // a zero row: scale 1, q 0
    const Int8Weight q = quantize_int8(w, group);
    const int64_t g = group == 0 ? 384 : group, groups = 384 / g;
    ASSERT_EQ(q.q.sizes(), w.sizes());
    ASSERT_EQ(q.scale.sizes(), (std::vector<int64_t>{40, groups}));
    EXPECT_EQ(q.group(), g);
    const auto wd = w.to(torch::kDouble).view({40, groups, g});
    const auto qd = q.q.to(torch::kDouble).view({40, groups, g});
    const auto s = q.scale.to(torch::kDouble).unsqueeze(2);
    const auto maxabs = wd.abs().amax(2, true);
    // s = max|W| / 127 (fp32: one rounding), 1 for an all-zero group.
    const auto want_s = torch::where(maxabs.eq(0), torch::ones_like(maxabs), maxabs / 127);
    EXPECT_LE(((s - want_s).abs() / want_s).max().item<double>(), 0x1p-23);
    // Round to nearest: |W - q s| <= s / 2 (plus s's own rounding), and the largest entry hits ±127.
    EXPECT_LE(((wd - qd * s).abs() / s).max().item<double>(), 0.5 + 1e-5);
    EXPECT_EQ(qd.abs().amax(2).max().item<double>(), 127);
    EXPECT_EQ(q.q[3].abs().max().item<int>(), 0);
    EXPECT_TRUE(torch::equal(dequantize_int8(q, torch::kDouble), (qd * s).view({40, 384})));
  }
}

// The product of x with the dequantized int8 weight in fp64, and Note [int8 kernel bound].
std::pair<torch::Tensor, torch::Tensor> reference(const torch::Tensor& x, const Int8Weight& w, const torch::Tensor& b) {
  const auto wd = dequantize_int8(w, torch::kDouble).to(x.device());
  const auto xd = x.to(torch::kDouble).reshape({-1, x.size(-1)});
  const auto bd = b.to(torch::kDouble);
  const auto y = xd.matmul(wd.t()) + bd;
  const int64_t n_ops = w.q.size(1) + w.scale.size(1) + 2;
  const auto bound = gamma32(n_ops) * (xd.abs().matmul(wd.abs().t()) + bd.abs());
  return {y, bound};
}

void expect_within_bound(const torch::Tensor& got, const torch::Tensor& want, const torch::Tensor& bound, double out_u,
                         const std::string& what) {
  const auto g = got.to(torch::kDouble).reshape(want.sizes());
  const auto total = bound + out_u * want.abs() * (1 + 1e-6);
  const double ratio = ((g - want).abs() / total).max().item<double>();
  EXPECT_LE(ratio, 1.0) << what;
  std::printf("[ measured ] %s: max |y - exact| / bound %.3f\n", what.c_str(), ratio);
}

TEST(Int8Linear, CpuDecodeKernelIsTheProductOfTheInt8Weights) {
  std::printf("[ measured ] CPU int8 kernel: %s\n", int8_cpu_isa().c_str());
  for (auto [n, k] : {std::pair<int64_t, int64_t>{2304, 768}, {770, 3072}, {5, 200}}) {
    for (int64_t group : {0, 128}) {
      if (group != 0 && k % group != 0) continue;
      const Int8Weight w = quantize_int8(weight(n, k, 2), group);
      const auto b = torch::randn({n}) * 0.1;
      for (int64_t m : {1, 2, 3, 16}) {
        const auto x = torch::randn({m, 1, k});
        const auto y = int8_linear(x, w, b);
        ASSERT_EQ(y.sizes(), (std::vector<int64_t>{m, 1, n}));
        auto [want, bound] = reference(x, w, b);
        expect_within_bound(y, want, bound, 0,
                            std::to_string(m) + " x " + std::to_string(k) + " -> " + std::to_string(n) + ", group " +
                                std::to_string(group));
      }
    }
  }
  // Without a bias, and a batch of more rows than the kernel takes: the dequantized weight and ATen.
  const Int8Weight w = quantize_int8(weight(64, 256, 3));
  const auto x = torch::randn({2, 20, 256});
  EXPECT_TRUE(torch::equal(int8_linear(x, w, {}), at::linear(x, dequantize_int8(w, torch::kFloat), {})));
  auto [want, bound] = reference(x.narrow(1, 0, 1).contiguous(), w, torch::zeros({64}));
  expect_within_bound(int8_linear(x.narrow(1, 0, 1).contiguous(), w, {}), want, bound, 0, "no bias");
}

TEST(Int8Linear, CudaDecodeKernelIsTheProductOfTheInt8Weights) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    const double out_u = dtype == torch::kFloat ? 0 : dtype == torch::kBFloat16 ? 0x1p-8 : 0x1p-11;
    for (auto [n, k] : {std::pair<int64_t, int64_t>{2304, 768}, {768, 3072}, {50, 1600}}) {
      for (int64_t group : {0, 128}) {
        if (group != 0 && k % group != 0) continue;
        const Int8Weight w0 = quantize_int8(weight(n, k, 4), group);
        const Int8Weight w{w0.q.cuda(), w0.scale.cuda()};
        const auto b = (torch::randn({n}) * 0.1).to(torch::kCUDA, dtype);
        for (int64_t m : {1, 4, 9, 16}) {
          const auto x = torch::randn({m, k}, torch::kCUDA).to(dtype);
          const auto y = int8_linear(x, w, b);
          ASSERT_EQ(y.scalar_type(), dtype);
          auto [want, bound] = reference(x, w, b);
          expect_within_bound(y, want, bound, out_u,
                              std::string(c10::toString(dtype)) + " " + std::to_string(m) + " x " + std::to_string(k) +
                                  " -> " + std::to_string(n) + ", group " + std::to_string(group));
        }
      }
    }
  }
}

// Every int8 value at every byte of a 16-byte chunk reaches the sums exactly: the CUDA kernels widen
// a chunk's bytes with integer instructions, not a cast (int8x16_to_float in convert.cuh). One-hot
// rows of x pick single columns of q, so y[r, j] = q[j, c_r] with no rounding anywhere (one nonzero
// product; integers of magnitude <= 128 are exact in fp32, bf16 and fp16). q[j, i] = (i + j) mod 256
// - 128, so column c_r = 17 r, at byte r of its chunk, holds every value from -128 to 127 down j.
TEST(Int8Linear, EveryInt8ValueAtEveryChunkByteIsReadExactly) {
  const auto i = torch::arange(256, torch::kLong);
  const auto q = ((i.view({1, 256}) + i.view({256, 1})) % 256 - 128).to(torch::kChar);
  const auto cols = torch::arange(16, torch::kLong) * 17;
  const auto want = q.index_select(1, cols).t().to(torch::kFloat);  // (16, 256)
  auto x = torch::zeros({16, 256});
  x.index_put_({torch::arange(16, torch::kLong), cols}, 1.0);
  std::vector<std::pair<c10::Device, at::ScalarType>> runs{{torch::kCPU, torch::kFloat}};
  if (torch::cuda::is_available())
    for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) runs.emplace_back(torch::kCUDA, dtype);
  for (auto [device, dtype] : runs) {
    SCOPED_TRACE(c10::str(device, " ", dtype));
    const Int8Weight w{q.to(device), torch::ones({256, 1}).to(device)};
    const auto xd = x.to(device, dtype);
    EXPECT_TRUE(torch::equal(int8_linear(xd, w, {}).cpu().to(torch::kFloat), want)) << "int8_linear";
    for (int64_t first : {0, 8}) {  // decode_linear takes up to kDecodeRows = 8 rows
      const auto y = decode_linear(xd.narrow(0, first, 8).contiguous(), DecodeNorm{}, DecodeWeight{{}, &w, {}}, false);
      EXPECT_TRUE(torch::equal(y.cpu().to(torch::kFloat), want.narrow(0, first, 8)))
          << "decode_linear, rows from " << first;
    }
  }
}

// The quantized model is the fp32 model with the dequantized weights: every projection, the
// embedding and the tied head read their int8 weight (a missed one would differ by the whole quantization error, ~1e-3
// relative), and the parameters it replaced are freed. The two runs differ in the order of their fp32 sums only: Note
// [int8 kernel bound] per product, carried through 2 layers; 1e-4 relative sits well above that (γ_256 = 1.5e-5 for the
// longest sum) and below a missed quantization.
TEST(Int8Model, QuantizedModelIsTheModelOfItsDequantizedWeights) {
  const GPT2Config cfg{/*n_layer=*/2, /*n_head=*/4, /*n_embd=*/64, /*vocab_size=*/50257, /*block_size=*/32};
  GPT2 model(cfg), deq(cfg);
  model->init_weights(5);
  deq->init_weights(5);
  model->quantize_int8();
  ASSERT_TRUE(model->quantized());
  // The int8 weights count as parameters (the start-up lines of gpt2-generate and gpt2-serve).
  EXPECT_EQ(model->num_parameters(), deq->num_parameters());
  EXPECT_EQ(model->num_parameters(), cfg.num_parameters());
  const auto int8 = model->int8_weights();
  ASSERT_EQ(int8.size(), 9u);  // wte, then 4 projections a block
  EXPECT_EQ(int8.front().first, "transformer.wte.weight");
  torch::NoGradGuard no_grad;
  auto params = deq->named_parameters();
  for (const auto& [name, w] : int8) params[name].copy_(dequantize_int8(*w, torch::kFloat));
  for (const auto& p : model->named_parameters()) {
    if ((p.key().find(".c_") != std::string::npos && p.key().find(".weight") != std::string::npos) ||
        p.key() == "transformer.wte.weight") {
      EXPECT_EQ(p.value().numel(), 0) << p.key();
    }
  }
  // 12 rows: the decode kernel; 24: the dequantized weight and ATen (the same bits as the twin).
  const auto idx = torch::randint(0, cfg.vocab_size, {1, 12});
  const auto got = model->forward(idx), want = deq->forward(idx);
  const double rel = ((got - want).abs().max() / want.abs().max()).item<double>();
  EXPECT_LE(rel, 1e-4);
  EXPECT_GT(rel, 0) << "the decode kernel did not run";
  std::printf("[ measured ] int8 model vs its dequantized fp32 twin: max rel %.2e\n", rel);
  const auto idx2 = torch::randint(0, cfg.vocab_size, {2, 12});
  EXPECT_TRUE(torch::equal(model->forward(idx2), deq->forward(idx2)));
  // And it is not the unquantized model.
  GPT2 orig(cfg);
  orig->init_weights(5);
  EXPECT_GT(((orig->forward(idx) - want).abs().max() / want.abs().max()).item<double>(), 10 * rel);
  EXPECT_THROW(model->quantize_int8(), gpt2::Error);
}

}  // namespace
}  // namespace gpt2::kernels
