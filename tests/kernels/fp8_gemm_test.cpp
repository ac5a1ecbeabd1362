// FP8 quantization and GEMMs (src/kernels/fp8_gemm.h) against float64, each step held to its term of
// Note [FP8 GEMM bound]: the quantization's rounding (e4m3 and e5m2, normal and subnormal, and the
// saturation at the format's largest value), the GEMM of fp8 values against the fp64 product of the
// same values, and the whole forward and backward products of a linear layer against the unquantized
// operands. On the CPU here (LibTorch's reference _scaled_mm); on the GPU machine the same checks run
// cuBLASLt's FP8 GEMM (`ctest -L gpu`; skipped on a GPU older than sm_89).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "src/base/errors.h"
#include "src/kernels/fp8_gemm.h"
#include "src/kernels/gemm.h"
#include "src/kernels/linear.h"
#include "tests/kernels/compare.h"  // allocated_bytes

namespace gpt2::kernels {
namespace {

double gamma32(int64_t n) { return n * 0x1p-24 / (1 - n * 0x1p-24); }

struct Format {
  at::ScalarType dtype;
  double unit;        // relative rounding bound in the normal range, 2^-(p+1)
  double min_normal;  // 2^emin
  double subnormal;   // absolute rounding bound below min_normal, 2^(emin-p-1)
};
const Format kE4m3{at::kFloat8_e4m3fn, 0x1p-4, 0x1p-6, 0x1p-10};
const Format kE5m2{at::kFloat8_e5m2, 0x1p-3, 0x1p-14, 0x1p-17};

std::vector<torch::Device> devices() {
  std::vector<torch::Device> out{torch::kCPU};
  if (torch::cuda::is_available() && fp8_supported(torch::Device(torch::kCUDA))) out.emplace_back(torch::kCUDA);
  return out;
}

bool has_fp8_gpu() { return torch::cuda::is_available() && fp8_supported(torch::Device(torch::kCUDA)); }

// Every device, and on CUDA also with GEMM tuning on (train.gemm_tuning: the FP8 products run the
// fastest of cuBLASLt's candidates, split-K ones among them, instead of ATen's _scaled_mm).
std::vector<std::pair<torch::Device, bool>> devices_and_tuning() {
  std::vector<std::pair<torch::Device, bool>> out;
  for (const auto& device : devices()) {
    out.emplace_back(device, false);
    if (device.is_cuda()) out.emplace_back(device, true);
  }
  return out;
}

// GEMM tuning as asked for one scope, off again after it.
struct TuningFor {
  explicit TuningFor(bool on) { set_gemm_tuning(on); }
  ~TuningFor() { set_gemm_tuning(false); }
};

// Activations or gradients with a heavy tail and values across many binades, as training has.
torch::Tensor values(int64_t rows, int64_t cols, uint64_t seed, const torch::Device& device) {
  torch::manual_seed(seed);
  auto x = torch::randn({rows, cols}) * torch::exp(torch::randn({rows, cols}) * 2);
  return x.to(device);
}

// The per-element rounding bound of `f` for x with scale s, in units of x; plus 2^-23 |x| for the
// two fp32 roundings around it (x · s before the cast, and scale_inv = 1 / s).
torch::Tensor rounding_bound(const torch::Tensor& x, double s, const Format& f) {
  const auto scaled = x.to(torch::kDouble).abs() * s;
  return torch::where(scaled >= f.min_normal, scaled * f.unit, torch::full_like(scaled, f.subnormal)) / s +
         0x1p-23 * x.to(torch::kDouble).abs();
}

TEST(Fp8Quantize, RoundsToNearestWithinTheFormatsUnitAndSaturates) {
  for (const auto& device : devices()) {
    for (const Format& f : {kE4m3, kE5m2}) {
      SCOPED_TRACE(device.str() + " " + c10::toString(f.dtype));
      auto x = values(64, 256, 1, device);
      const auto amax = x.abs().max();
      const auto scale = fp8_scale_for(amax, f.dtype);
      EXPECT_NEAR(scale.item<double>() * amax.item<double>(), fp8_max(f.dtype), fp8_max(f.dtype) * 0x1p-23);
      const Fp8Tensor q = quantize_fp8(x, f.dtype, scale);
      ASSERT_EQ(q.data.scalar_type(), f.dtype);
      const auto err = (dequantize_fp8(q, at::kDouble) - x.to(torch::kDouble)).abs();
      const auto ratio = (err / rounding_bound(x, scale.item<double>(), f)).max().item<double>();
      std::printf("[ measured ] %s %s: max rounding error / bound %.3f\n", device.str().c_str(), c10::toString(f.dtype),
                  ratio);
      EXPECT_LE(ratio, 1.0);
      // amax maps onto the largest code.
      EXPECT_EQ(q.data.to(torch::kFloat).abs().max().item<float>(), fp8_max(f.dtype));
      // A value past what the scale was made for clips to the largest value (not NaN, not inf).
      const Fp8Tensor over = quantize_fp8(x * 4, f.dtype, scale);
      EXPECT_EQ(over.data.to(torch::kFloat).abs().max().item<float>(), fp8_max(f.dtype));
      EXPECT_FALSE(over.data.to(torch::kFloat).isnan().any().item<bool>());
      // inf and NaN stay non-finite: an overflow reaches the gradients and the step is skipped.
      auto bad = x.clone();
      bad[0][0] = INFINITY;
      bad[1][1] = NAN;
      const auto back = dequantize_fp8(quantize_fp8(bad, f.dtype, scale), at::kFloat);
      EXPECT_FALSE(std::isfinite(back[0][0].item<float>()));
      EXPECT_TRUE(std::isnan(back[1][1].item<float>()));
      EXPECT_TRUE(back[2].isfinite().all().item<bool>());
    }
  }
  // amax 0 or not finite: scale 1.
  EXPECT_EQ(fp8_scale_for(torch::zeros({}), at::kFloat8_e4m3fn).item<float>(), 1.0f);
  EXPECT_EQ(fp8_scale_for(torch::full({}, INFINITY), at::kFloat8_e4m3fn).item<float>(), 1.0f);
  EXPECT_EQ(fp8_scale_for(torch::full({}, NAN), at::kFloat8_e5m2).item<float>(), 1.0f);
  EXPECT_THROW(fp8_max(at::kBFloat16), Error);
}

// quantize_fp8_current and its transposing twin give the bits of the composition they stand for,
// quantize_fp8 with fp8_scale_for(max |x|): on CUDA that is our two kernels against ATen's ops
// (fp32, bf16 and fp16; shapes off the kernels' 32 x 32 and 64 x 64 tiles, multiples of 8 (the packed
// kernels) and not; inf and NaN entries; all zeros).
TEST(Fp8Quantize, CurrentScalingIsTheCompositionBitForBit) {
  for (const auto& device : devices()) {
    for (const auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
      for (const Format& f : {kE4m3, kE5m2}) {
        for (const auto& [rows, cols, special] : std::vector<std::tuple<int64_t, int64_t, int>>{
                 {67, 45, 0}, {256, 768, 0}, {33, 64, 1}, {16, 48, 2}, {40, 72, 1}, {136, 200, 0}}) {
          const std::string what = device.str() + " " + c10::toString(dtype) + " " + c10::toString(f.dtype) + " " +
                                   std::to_string(rows) + "x" + std::to_string(cols) + " case " +
                                   std::to_string(special);
          auto x = (values(rows, cols, 8, device) * 0.01).to(dtype);
          if (special == 1) {  // an overflow: inf and NaN entries
            x[3][5] = INFINITY;
            x[7][1] = -INFINITY;
            x[20][63] = NAN;
          }
          if (special == 2) x.zero_();
          const auto amax = x.abs().amax().to(at::kFloat);
          const Fp8Tensor want = quantize_fp8(x, f.dtype, fp8_scale_for(amax, f.dtype));
          const Fp8Tensor got = quantize_fp8_current(x, f.dtype);
          const auto [pair, pair_t] = quantize_fp8_current_and_transpose(x, f.dtype);
          // Bytes, NaNs compared as NaN (their sign and payload are the casts' own).
          auto same = [](const torch::Tensor& a, const torch::Tensor& b) {
            const auto fa = a.to(torch::kFloat), fb = b.to(torch::kFloat);
            return a.sizes() == b.sizes() &&
                   torch::equal(torch::where(fa.isnan(), torch::zeros_like(fa), fa),
                                torch::where(fb.isnan(), torch::zeros_like(fb), fb)) &&
                   torch::equal(fa.isnan(), fb.isnan()) &&
                   torch::equal(torch::where(fa.isnan(), torch::zeros_like(a.view(at::kByte)), a.view(at::kByte)),
                                torch::where(fb.isnan(), torch::zeros_like(b.view(at::kByte)), b.view(at::kByte)));
          };
          EXPECT_TRUE(same(got.data, want.data)) << what;
          EXPECT_TRUE(same(pair.data, want.data)) << what;
          EXPECT_TRUE(same(pair_t.data, want.data.view(at::kByte).t().contiguous().view(f.dtype))) << what;
          for (const auto& s : {got.scale_inv, pair.scale_inv, pair_t.scale_inv}) {
            EXPECT_EQ(s.numel(), 1) << what;
            EXPECT_EQ(s.item<float>(), want.scale_inv.item<float>()) << what;
          }
        }
      }
    }
  }
}

// The GEMM's accumulation term of Note [FP8 GEMM bound], as a multiple of Σ|a||b|: K products
// summed in fp32 on the CPU; on the GPU in chunks of at most 128 with 13 kept mantissa bits
// (truncated), the chunk sums then added in fp32.
double accumulation_gamma(const torch::Device& device, int64_t k) {
  if (!device.is_cuda()) return gamma32(k);
  const int64_t chunk = std::min<int64_t>(k, 128);
  const double acc = chunk * 0x1p-13 / (1 - chunk * 0x1p-13);
  const double chunks = gamma32((k + chunk - 1) / chunk);
  return acc + chunks + acc * chunks;
}

// The GEMM's wiring, exactly: operands that are small integers times powers of two keep every
// partial sum within 14 significant bits (|Σ| <= K max|a||b| < 2^14), so any accumulator of the
// note's model sums them exactly, and the power-of-two scales and an integer bias add no rounding.
// An fp32 output is then the exact product bit for bit; a bf16 one is rounded once, or twice if
// the bias is added after the output's rounding: within 2^-8 (|a·b| + |y|) (1 + 2^-8).
TEST(Fp8Gemm, SumsSmallIntegersExactly) {
  for (const auto& [device, tuned] : devices_and_tuning()) {
    TuningFor tuning(tuned);
    for (const auto out_dtype : {at::kFloat, at::kBFloat16}) {
      for (const auto& [m, n, k, top] :
           std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{{64, 96, 768, 4}, {16, 32, 3072, 2}}) {
        const std::string what =
            device.str() + (tuned ? " tuned " : " ") + c10::toString(out_dtype) + " K=" + std::to_string(k);
        ASSERT_LT(k * top * top, 1 << 14) << what;
        torch::manual_seed(7);
        const auto opt = torch::TensorOptions(device).dtype(torch::kFloat);
        const auto x = torch::randint(-top, top + 1, {m, k}, opt) * 0.25;  // scaled by 4: data = integers
        const auto w = torch::randint(-top, top + 1, {n, k}, opt) * 8.0;   // scaled by 1/8
        const Fp8Tensor a = quantize_fp8(x, at::kFloat8_e4m3fn, torch::full({}, 4.0f, opt));
        const Fp8Tensor b = quantize_fp8(w, at::kFloat8_e5m2, torch::full({}, 0.125f, opt));
        const auto bias = torch::randint(-8, 9, {n}, opt).to(out_dtype);
        const auto exact = x.to(torch::kDouble).matmul(w.to(torch::kDouble).t()) + bias.to(torch::kDouble);
        const auto y = fp8_gemm_nt(a, b, out_dtype, bias).to(torch::kDouble);
        if (out_dtype == at::kFloat) {
          EXPECT_TRUE(torch::equal(y, exact)) << what << ": max error " << (y - exact).abs().max().item<double>();
        } else {
          const auto product = exact - bias.to(torch::kDouble);
          const auto bound = 0x1p-8 * (product.abs() + exact.abs()) * (1 + 0x1p-8);
          EXPECT_TRUE(((y - exact).abs() <= bound).all().item<bool>()) << what;
        }
      }
    }
  }
}

// The GEMM's own error on values across many binades: fp8 values multiplied exactly and summed as
// the note's accumulation model allows, against fp64 on the same values.
TEST(Fp8Gemm, SumsTheFp8ProductsWithinTheAccumulationBound) {
  for (const auto& [device, tuned] : devices_and_tuning()) {
    TuningFor tuning(tuned);
    for (const auto out_dtype : {at::kFloat, at::kBFloat16}) {
      for (const auto& [m, n, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{64, 96, 768}, {8, 32, 3072}}) {
        const std::string what = device.str() + (tuned ? " tuned " : " ") + c10::toString(out_dtype) + " " +
                                 std::to_string(m) + "x" + std::to_string(k) + " . (" + std::to_string(n) + "x" +
                                 std::to_string(k) + ")T";
        const auto x = values(m, k, 2, device), w = values(n, k, 3, device);
        const Fp8Tensor a = quantize_fp8(x, at::kFloat8_e4m3fn, fp8_scale_for(x.abs().max(), at::kFloat8_e4m3fn));
        const Fp8Tensor b = quantize_fp8(w, at::kFloat8_e5m2, fp8_scale_for(w.abs().max(), at::kFloat8_e5m2));
        const auto bias = torch::randn({n}, torch::TensorOptions(device).dtype(out_dtype));
        const auto y = fp8_gemm_nt(a, b, out_dtype, bias);
        ASSERT_EQ(y.sizes(), (std::vector<int64_t>{m, n}));
        ASSERT_EQ(y.scalar_type(), out_dtype);
        const auto ad = dequantize_fp8(a, at::kDouble), bd = dequantize_fp8(b, at::kDouble);
        const auto exact = ad.matmul(bd.t()) + bias.to(torch::kDouble);
        const double u_out = out_dtype == at::kBFloat16 ? 0x1p-8 : 0x1p-24;
        // E = γ (Σ|a||b|) + γ_3 |bias| + 2u |y| (the bias add and the two scale multiplies, in fp32);
        // the output's rounding adds u_out (|y| + E).
        const auto sum_error = accumulation_gamma(device, k) * ad.abs().matmul(bd.abs().t()) +
                               gamma32(3) * bias.to(torch::kDouble).abs() + 2 * 0x1p-24 * exact.abs();
        const auto bound = sum_error * (1 + u_out) + u_out * exact.abs();
        const double ratio = ((y.to(torch::kDouble) - exact).abs() / bound).max().item<double>();
        std::printf("[ measured ] fp8 GEMM %s: max error / bound %.3f\n", what.c_str(), ratio);
        EXPECT_LE(ratio, 1.0) << what;
      }
    }
  }
}

// A linear layer's three products in fp8 against the unquantized fp64 ones: forward x·wᵀ (e4m3 x
// e4m3), backward gy·w (e5m2 x e4m3, w transposed) and gyᵀ·x (e5m2 x e4m3, both transposed). The
// bound is the quantization's per-product term plus the GEMM's (Note [FP8 GEMM bound]).
TEST(Fp8Gemm, ALinearLayersProductsAreWithinTheQuantizationBound) {
  const int64_t m = 128, n = 256, k = 192;
  for (const auto& device : devices()) {
    const auto x = values(m, k, 4, device), w = values(n, k, 5, device) * 0.02, gy = values(m, n, 6, device) * 1e-3;
    auto q = [](const torch::Tensor& t, const Format& f) {
      return quantize_fp8(t, f.dtype, fp8_scale_for(t.abs().max(), f.dtype));
    };
    const Fp8Tensor x8 = q(x, kE4m3), w8 = q(w, kE4m3), g8 = q(gy, kE5m2);
    struct Product {
      std::string name;
      torch::Tensor got, a, b;  // got ≈ a · bᵀ, a and b unquantized
      Fp8Tensor qa, qb;
      Format fa, fb;
    };
    const std::vector<Product> products = {
        {"forward x.wT", fp8_gemm_nt(x8, w8, at::kBFloat16), x, w, x8, w8, kE4m3, kE4m3},
        {"backward gy.w", fp8_gemm_nt(g8, transpose_fp8(w8), at::kBFloat16), gy, w.t(), g8, transpose_fp8(w8), kE5m2,
         kE4m3},
        {"backward gyT.x", fp8_gemm_nt(transpose_fp8(g8), transpose_fp8(x8), at::kBFloat16), gy.t(), x.t(),
         transpose_fp8(g8), transpose_fp8(x8), kE5m2, kE4m3},
    };
    for (const auto& p : products) {
      const std::string what = device.str() + " " + p.name;
      const auto ad = p.a.to(torch::kDouble), bd = p.b.to(torch::kDouble);
      const auto exact = ad.matmul(bd.t());
      // Quantization: each operand within its rounding bound ea, eb: |âb̂ − ab| <= |a| eb + ea |b| + ea eb.
      const auto ea = rounding_bound(p.a, 1 / p.qa.scale_inv.item<double>(), p.fa);
      const auto eb = rounding_bound(p.b, 1 / p.qb.scale_inv.item<double>(), p.fb);
      const auto quantization = ad.abs().matmul(eb.t()) + ea.matmul(bd.abs().t()) + ea.matmul(eb.t());
      const auto qa = dequantize_fp8(p.qa, at::kDouble), qb = dequantize_fp8(p.qb, at::kDouble);
      const auto q_exact = qa.matmul(qb.t()).abs();
      const auto gemm =
          (accumulation_gamma(device, ad.size(1)) * qa.abs().matmul(qb.abs().t()) + 2 * 0x1p-24 * q_exact) *
              (1 + 0x1p-8) +
          0x1p-8 * q_exact;
      const auto err = (p.got.to(torch::kDouble) - exact).abs();
      const double ratio = (err / (quantization + gemm)).max().item<double>();
      const double rel = (err.norm() / exact.norm()).item<double>();
      std::printf("[ measured ] fp8 linear %s: max error / bound %.3f, relative norm error %.4f\n", what.c_str(), ratio,
                  rel);
      EXPECT_LE(ratio, 1.0) << what;
      // And quantizing matters: the error is far above a bf16 GEMM's (so a skipped cast would show).
      EXPECT_GT(rel, 1e-3) << what;
    }
  }
}

// fp8_linear is its documented composition, bit for bit: each operand cast with its own amax, the
// forward e4m3 x e4m3 product plus bias, dx = gy8 · w8 and dw = gy8ᵀ · x8 with gy in e5m2, db = Σ gy
// through linear.h's bias_grad (the products' accuracy is the test above; bias_grad's, FusedLinear's). A 3-D x keeps
// its leading dims.
TEST(Fp8Linear, ForwardAndBackwardAreTheFp8ProductsOfItsCasts) {
  for (const auto& device : devices()) {
    for (const auto dtype : {at::kFloat, at::kBFloat16}) {
      const std::string what = device.str() + " " + c10::toString(dtype);
      const auto opts = torch::TensorOptions(device).dtype(dtype);
      const auto x = values(64, 96, 7, device).to(dtype).view({2, 32, 96}).requires_grad_();
      const auto w = (values(48, 96, 8, device) * 0.05).to(dtype).requires_grad_();
      const auto b = torch::randn({48}, opts).requires_grad_();
      const auto gy = (values(64, 48, 9, device) * 1e-3).to(dtype).view({2, 32, 48});
      const auto y = fp8_linear(x, w, b);
      ASSERT_EQ(y.sizes(), (std::vector<int64_t>{2, 32, 48})) << what;
      y.backward(gy);
      torch::NoGradGuard no_grad;
      const Fp8Tensor x8 = quantize_fp8_current(x.view({64, 96}), at::kFloat8_e4m3fn);
      const Fp8Tensor w8 = quantize_fp8_current(w, at::kFloat8_e4m3fn);
      const Fp8Tensor g8 = quantize_fp8_current(gy.view({64, 48}), at::kFloat8_e5m2);
      EXPECT_TRUE(torch::equal(y.view({64, 48}), fp8_gemm_nt(x8, w8, dtype, b))) << what;
      EXPECT_TRUE(torch::equal(x.grad().view({64, 96}), fp8_gemm_nt(g8, transpose_fp8(w8), dtype))) << what;
      EXPECT_TRUE(torch::equal(w.grad(), fp8_gemm_nt(transpose_fp8(g8), transpose_fp8(x8), dtype))) << what;
      EXPECT_TRUE(torch::equal(b.grad(), bias_grad(gy.view({64, 48})))) << what;
    }
  }
  const auto x = torch::randn({24, 32}), w = torch::randn({16, 32});
  EXPECT_THROW(fp8_linear(x, w, {}), Error);  // 24 rows
  EXPECT_THROW(fp8_linear(torch::randn({16, 32}).to(at::kHalf), w.to(at::kHalf), {}), Error);
  // No bias: the product alone, and no bias gradient.
  const auto x16 = torch::randn({16, 32}), w16 = w.clone().requires_grad_();
  const auto y = fp8_linear(x16, w16, {});
  EXPECT_TRUE(torch::equal(y, fp8_gemm_nt(quantize_fp8_current(x16, at::kFloat8_e4m3fn),
                                          quantize_fp8_current(w, at::kFloat8_e4m3fn), at::kFloat)));
  y.sum().backward();
  EXPECT_TRUE(w16.grad().defined());
}

// Delayed scaling's cast: the scale from the history's earlier steps (values past it saturate),
// the current amax raised into column 0; before any step (use_history false), current scaling.
TEST(Fp8Delayed, ScalesFromTheEarlierStepsAndRecordsTheAmax) {
  for (const auto& device : devices()) {
    for (const Format& f : {kE4m3, kE5m2}) {
      const std::string what = device.str() + " " + c10::toString(f.dtype);
      const auto x = values(48, 80, 11, device).to(torch::kBFloat16);
      const float amax = x.abs().max().to(torch::kFloat).item<float>();
      const auto fopt = torch::TensorOptions(device).dtype(torch::kFloat);
      // History: amax / 2 recorded this step so far (not a scale source), then 3 steps; their
      // largest, amax / 4, makes the values past it saturate.
      auto row = torch::tensor({amax / 2, amax / 8, amax / 4, amax / 16}, fopt);
      const auto [q, q_t] = quantize_fp8_delayed_and_transpose(x, f.dtype, row, /*use_history=*/true);
      const Fp8Tensor want = quantize_fp8(x, f.dtype, fp8_scale_for(torch::tensor(amax / 4, fopt), f.dtype));
      EXPECT_TRUE(torch::equal(q.data.view(at::kByte), want.data.view(at::kByte))) << what;
      EXPECT_TRUE(torch::equal(q_t.data.view(at::kByte), want.data.view(at::kByte).t().contiguous())) << what;
      EXPECT_EQ(q.scale_inv.item<float>(), want.scale_inv.item<float>()) << what;
      EXPECT_NEAR(dequantize_fp8(q, at::kFloat).abs().max().item<float>(), amax / 4, amax / 4 * 0x1p-22) << what;
      EXPECT_EQ(row[0].item<float>(), amax) << what;      // max(0.5, amax)
      EXPECT_EQ(row[2].item<float>(), amax / 4) << what;  // the earlier steps untouched
      // Before any step: its own amax, as current scaling, and still recorded (a larger one stays).
      auto first = torch::tensor({2 * amax, 0.0f, 0.0f}, fopt);
      const auto [c, c_t] = quantize_fp8_delayed_and_transpose(x, f.dtype, first, /*use_history=*/false);
      const Fp8Tensor current = quantize_fp8_current(x, f.dtype);
      EXPECT_TRUE(torch::equal(c.data.view(at::kByte), current.data.view(at::kByte))) << what;
      EXPECT_EQ(c.scale_inv.item<float>(), current.scale_inv.item<float>()) << what;
      EXPECT_EQ(first[0].item<float>(), 2 * amax) << what;
      // An overflow: a NaN is recorded as inf (the ranks' all-reduce max is then well defined).
      auto bad = x.clone();
      bad[1][2] = NAN;
      auto row_nan = torch::tensor({0.0f, amax, 0.0f}, fopt);
      quantize_fp8_delayed_and_transpose(bad, f.dtype, row_nan, /*use_history=*/true);
      EXPECT_EQ(row_nan[0].item<float>(), INFINITY) << what;
    }
  }
}

// The end of a step: each history moves one column on, the oldest drops, column 0 restarts; a
// non-finite amax (an overflowed step) enters as the step before's.
TEST(Fp8Delayed, RollMovesTheStepIntoTheHistory) {
  auto h = torch::tensor({5.0f, 1.0f, 2.0f, 3.0f, INFINITY, 4.0f, 6.0f, 7.0f, NAN, 8.0f, 9.0f, 10.0f}).view({3, 4});
  fp8_amax_roll(h);
  const auto want =
      torch::tensor({0.0f, 5.0f, 1.0f, 2.0f, 0.0f, 4.0f, 4.0f, 6.0f, 0.0f, 8.0f, 8.0f, 9.0f}).view({3, 4});
  EXPECT_TRUE(torch::equal(h, want)) << h;
  auto one_column = torch::zeros({3, 1});
  EXPECT_THROW(fp8_amax_roll(one_column), Error);
}

// fp8_linear with delayed scaling is the composition of its casts: x and w (forward) and gy
// (backward) each scaled from its history row, each row's column 0 raised to its tensor's amax; a
// forward without grad (evaluation, decoding) scales the same and records nothing.
TEST(Fp8Linear, DelayedScalingIsItsCastsFromTheHistory) {
  for (const auto& device : devices()) {
    const std::string what = device.str();
    const auto opts = torch::TensorOptions(device).dtype(torch::kBFloat16);
    const auto fopt = torch::TensorOptions(device).dtype(torch::kFloat);
    const auto x = values(32, 64, 12, device).to(torch::kBFloat16).requires_grad_();
    const auto w = (values(48, 64, 13, device) * 0.05).to(torch::kBFloat16).requires_grad_();
    const auto b = torch::randn({48}, opts).requires_grad_();
    const auto gy = (values(32, 48, 14, device) * 1e-3).to(torch::kBFloat16);
    auto amax_of = [](const torch::Tensor& t) { return t.detach().abs().max().to(torch::kFloat).item<float>(); };
    // Earlier steps saw half of each tensor's amax (so the upper half saturates), then twice it.
    const float ax = amax_of(x), aw = amax_of(w), ag = amax_of(gy);
    Fp8DelayedScaling scaling{
        torch::tensor({0.0f, ax / 2, ax / 4, 0.0f, aw / 2, aw / 4, 0.0f, ag * 2, 0.0f}, fopt).view({3, 3}), true};
    const auto y = fp8_linear(x, w, b, &scaling);
    y.backward(gy);
    torch::NoGradGuard no_grad;
    auto q = [&](const torch::Tensor& t, at::ScalarType format, float scale_amax) {
      return quantize_fp8(t, format, fp8_scale_for(torch::tensor(scale_amax, fopt), format));
    };
    const Fp8Tensor x8 = q(x, at::kFloat8_e4m3fn, ax / 2), w8 = q(w, at::kFloat8_e4m3fn, aw / 2);
    const Fp8Tensor g8 = q(gy, at::kFloat8_e5m2, ag * 2);
    EXPECT_TRUE(torch::equal(y, fp8_gemm_nt(x8, w8, torch::kBFloat16, b))) << what;
    EXPECT_TRUE(torch::equal(x.grad(), fp8_gemm_nt(g8, transpose_fp8(w8), torch::kBFloat16))) << what;
    EXPECT_TRUE(torch::equal(w.grad(), fp8_gemm_nt(transpose_fp8(g8), transpose_fp8(x8), torch::kBFloat16))) << what;
    const auto recorded = scaling.amax.select(1, 0);
    EXPECT_TRUE(torch::equal(recorded, torch::tensor({ax, aw, ag}, fopt))) << what << " " << recorded;
    // Without grad: the same product, nothing recorded.
    scaling.amax.select(1, 0).zero_();
    EXPECT_TRUE(torch::equal(fp8_linear(x, w, b, &scaling), y)) << what;
    EXPECT_EQ(scaling.amax.select(1, 0).abs().sum().item<float>(), 0.0f) << what;
  }
}

// fp8_gelu_linear is fp8_linear(gelu_tanh(x)) bit for bit, forward and backward, and records the
// same amaxes: the GELU's output is cast as it is computed (on CUDA: our cast kernels computing
// ATen's GELU, against ATen's gelu then our cast), and backward's second cast of gelu(x)ᵀ and of wᵀ
// gives the forward's bits. With current scaling and with delayed (the history used and not).
TEST(Fp8Linear, GeluLinearIsTheCompositionBitForBit) {
  for (const auto& device : devices()) {
    for (const int mode : {0, 1, 2}) {  // current scaling; delayed, first step; delayed from the history
      const std::string what = device.str() + " mode " + std::to_string(mode);
      const auto opts = torch::TensorOptions(device).dtype(torch::kBFloat16);
      const auto fopt = torch::TensorOptions(device).dtype(torch::kFloat);
      const auto x0 = (values(32, 64, 15, device) * 0.5).to(torch::kBFloat16);
      const auto w0 = (values(48, 64, 16, device) * 0.05).to(torch::kBFloat16);
      const auto b0 = torch::randn({48}, opts);
      const auto gy = (values(32, 48, 17, device) * 1e-3).to(torch::kBFloat16);
      const auto history = torch::tensor({0.0f, 0.3f, 0.2f, 0.0f, 0.01f, 0.02f, 0.0f, 5e-4f, 0.0f}, fopt).view({3, 3});
      Fp8DelayedScaling fused{history.clone(), mode == 2}, composed{history.clone(), mode == 2};
      auto run = [&](bool gelu_node, Fp8DelayedScaling& scaling) {
        auto x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_();
        const auto* delayed = mode == 0 ? nullptr : &scaling;
        const auto y =
            gelu_node ? fp8_gelu_linear(x, w, b, delayed) : fp8_linear(torch::gelu(x, "tanh"), w, b, delayed);
        y.backward(gy);
        return std::vector<torch::Tensor>{y.detach(), x.grad(), w.grad(), b.grad()};
      };
      const auto got = run(true, fused), want = run(false, composed);
      const char* names[] = {"y", "dx", "dw", "db"};
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_TRUE(torch::equal(got[i], want[i]))
            << what << " " << names[i] << ": max " << (got[i] - want[i]).abs().max().item<double>();
      }
      if (mode > 0) EXPECT_TRUE(torch::equal(fused.amax, composed.amax)) << what << fused.amax << composed.amax;
    }
  }
}

// fp8_mlp is its documented composition bit for bit, on every device and in every scaling mode:
// forward fp8_gelu_linear(fp8_linear(x)); backward c_proj's products as fp8_linear of the GELU's
// output (whose cast has fp8_gelu_linear's bits: the test above), then dpre and c_fc's bias gradient
// from linear.h's gelu_and_bias_backward (on CUDA our kernel, not ATen's GELU backward), then c_fc's
// products of dpre; and the same amaxes recorded. On CUDA, with delayed scaling from a history, the
// node casts dpre in the GELU backward's own pass (launch_gelu_backward_fp8): the same bits again.
// Both with the GELU output's FP8 transpose kept from forward and cast again in backward
// (keep_gelu_output false, memory.recompute_gelu: on CUDA from a history, in that same pass).
TEST(Fp8Mlp, IsItsLayersCompositionWithOneGeluBackwardPass) {
  for (const auto& device : devices()) {
    // (rows, hidden): on CUDA the second gives the fused GELU backward + cast (mode 2) two chunks of
    // rows, the last a partial tile, and two column blocks, the last partial.
    for (const auto& [n, hidden, mode] : std::vector<std::tuple<int64_t, int64_t, int>>{
             {32, 128, 0}, {32, 128, 1}, {32, 128, 2}, {272, 384, 0}, {272, 384, 2}}) {
      // mode 0: current scaling; 1: delayed, its first step; 2: delayed from the history
      const std::string what =
          device.str() + " " + std::to_string(n) + "x" + std::to_string(hidden) + " mode " + std::to_string(mode);
      const auto opts = torch::TensorOptions(device).dtype(torch::kBFloat16);
      const auto fopt = torch::TensorOptions(device).dtype(torch::kFloat);
      const auto x0 = (values(n, 64, 21, device) * 0.5).to(torch::kBFloat16).view({n / 16, 16, 64});
      const auto fc_w0 = (values(hidden, 64, 22, device) * 0.05).to(torch::kBFloat16);
      const auto proj_w0 = (values(48, hidden, 23, device) * 0.05).to(torch::kBFloat16);
      const auto fc_b0 = torch::randn({hidden}, opts), proj_b0 = torch::randn({48}, opts);
      const auto gy = (values(n, 48, 24, device) * 1e-3).to(torch::kBFloat16).view({n / 16, 16, 48});
      const auto history = torch::tensor({0.0f, 3.0f, 2.0f, 0.0f, 0.1f, 0.2f, 0.0f, 5e-4f, 1e-3f}, fopt).view({3, 3});
      Fp8DelayedScaling fc_ref{history.clone(), mode == 2}, proj_ref{history.clone(), mode == 2};
      auto scaling = [&](Fp8DelayedScaling& s) { return mode == 0 ? nullptr : &s; };
      // The reference, node by node.
      auto xr = x0.clone().requires_grad_(), fc_wr = fc_w0.clone().requires_grad_();
      auto fc_br = fc_b0.clone().requires_grad_(), proj_wr = proj_w0.clone().requires_grad_();
      auto proj_br = proj_b0.clone().requires_grad_();
      const auto pre = fp8_linear(xr, fc_wr, fc_br, scaling(fc_ref));
      const auto h = torch::gelu(pre.detach(), "tanh").requires_grad_();
      const auto yr = fp8_linear(h, proj_wr, proj_br, scaling(proj_ref));
      yr.backward(gy);
      const auto [dpre, dfc_b] =
          gelu_and_bias_backward(h.grad().view({n, hidden}), pre.detach().view({n, hidden}).contiguous());
      pre.backward(dpre.view({n / 16, 16, hidden}));
      // The node, keeping the GELU output's FP8 transpose or casting it again in backward.
      for (bool keep : {true, false}) {
        const std::string case_name = what + (keep ? " kept" : " recast");
        Fp8DelayedScaling fc{history.clone(), mode == 2}, proj{history.clone(), mode == 2};
        auto x = x0.clone().requires_grad_(), fc_w = fc_w0.clone().requires_grad_();
        auto fc_b = fc_b0.clone().requires_grad_(), proj_w = proj_w0.clone().requires_grad_();
        auto proj_b = proj_b0.clone().requires_grad_();
        const auto y = fp8_mlp(x, fc_w, fc_b, proj_w, proj_b, scaling(fc), scaling(proj), keep);
        y.backward(gy);
        const std::vector<std::pair<const char*, std::pair<torch::Tensor, torch::Tensor>>> pairs{
            {"y", {y, yr}},
            {"dx", {x.grad(), xr.grad()}},
            {"d fc_w", {fc_w.grad(), fc_wr.grad()}},
            {"d fc_b", {fc_b.grad(), dfc_b}},
            {"d proj_w", {proj_w.grad(), proj_wr.grad()}},
            {"d proj_b", {proj_b.grad(), proj_br.grad()}}};
        for (const auto& [name, got_want] : pairs) {
          const auto& [got, want] = got_want;
          EXPECT_TRUE(torch::equal(got, want))
              << case_name << " " << name << ": max " << (got - want).abs().max().item<double>();
        }
        if (mode > 0) {
          EXPECT_TRUE(torch::equal(fc.amax, fc_ref.amax)) << case_name << fc.amax << fc_ref.amax;
          EXPECT_TRUE(torch::equal(proj.amax, proj_ref.amax)) << case_name << proj.amax << proj_ref.amax;
        }
      }
    }
  }
  // Mixed scaling and missing biases are named errors.
  const auto x = torch::randn({16, 32}), fc_w = torch::randn({64, 32}), proj_w = torch::randn({16, 64});
  const auto fc_b = torch::randn({64}), proj_b = torch::randn({16});
  Fp8DelayedScaling delayed{torch::zeros({3, 4}), false};
  EXPECT_THROW(fp8_mlp(x, fc_w, fc_b, proj_w, proj_b, &delayed, nullptr), Error);
  EXPECT_THROW(fp8_mlp(x, fc_w, {}, proj_w, proj_b), Error);
  EXPECT_THROW(fp8_mlp(x, fc_w, fc_b, torch::randn({16, 48}), proj_b), Error);
}

// fp8_qkv_linear is fp8_linear(...).split(N / 3, -1) bit for bit, forward and backward, in all three
// scaling modes, whatever layout the three output gradients come in: contiguous, rows of a wider
// tensor (a row stride past the part's width), a layout whose rows do not merge (a copy), or one part
// unused (autograd hands over no gradient; the composition's split backward fills zeros). On CUDA,
// with delayed scaling from a history, the contiguous and wider-row cases take the one-pass cast
// (launch_parts_fp8) against the composition's concatenation, cast and bias_grad.
TEST(Fp8QkvLinear, IsFp8LinearSplitBitForBit) {
  for (const auto& device : devices()) {
    for (const auto& [n, c, mode] : std::vector<std::tuple<int64_t, int64_t, int>>{
             {32, 48, 0}, {32, 48, 1}, {32, 48, 2}, {272, 128, 0}, {272, 128, 2}}) {
      for (int layout = 0; layout < 4; ++layout) {  // gradients: contiguous, wider rows, not mergeable, k unused
        const std::string what = device.str() + " " + std::to_string(n) + "x" + std::to_string(c) + " mode " +
                                 std::to_string(mode) + " layout " + std::to_string(layout);
        const auto opts = torch::TensorOptions(device).dtype(torch::kBFloat16);
        const auto fopt = torch::TensorOptions(device).dtype(torch::kFloat);
        const auto x0 = (values(n, 64, 31, device) * 0.5).to(torch::kBFloat16).view({n / 16, 16, 64});
        const auto w0 = (values(3 * c, 64, 32, device) * 0.05).to(torch::kBFloat16);
        const auto b0 = torch::randn({3 * c}, opts);
        const auto history = torch::tensor({0.0f, 3.0f, 2.0f, 0.0f, 0.1f, 0.2f, 0.0f, 5e-4f, 1e-3f}, fopt).view({3, 3});
        std::vector<torch::Tensor> grads;
        for (int i = 0; i < 3; ++i) {
          const auto g = (values(n, c, 33 + i, device) * 1e-3).to(torch::kBFloat16);
          if (layout == 1) {  // rows of a (n, 2c) tensor
            grads.push_back(torch::cat({g, torch::zeros_like(g)}, 1).narrow(1, 0, c).view({n / 16, 16, c}));
          } else if (layout == 2) {  // (16, n / 16, c) transposed: rows 16 apart, not one stride
            grads.push_back(g.view({n / 16, 16, c}).transpose(0, 1).contiguous().transpose(0, 1));
          } else {
            grads.push_back(g.view({n / 16, 16, c}));
          }
        }
        Fp8DelayedScaling ours{history.clone(), mode == 2}, ref{history.clone(), mode == 2};
        auto scaling = [&](Fp8DelayedScaling& s) { return mode == 0 ? nullptr : &s; };
        auto run = [&](bool node, Fp8DelayedScaling& s) {
          auto x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_();
          const auto qkv = node ? fp8_qkv_linear(x, w, b, scaling(s)) : fp8_linear(x, w, b, scaling(s)).split(c, -1);
          std::vector<torch::Tensor> outs{qkv[0], qkv[1], qkv[2]}, gs = grads;
          if (layout == 3) outs.erase(outs.begin() + 1), gs.erase(gs.begin() + 1);
          torch::autograd::backward(outs, gs);
          return std::vector<torch::Tensor>{qkv[0], qkv[1], qkv[2], x.grad(), w.grad(), b.grad()};
        };
        const auto got = run(true, ours), want = run(false, ref);
        const char* names[] = {"q", "k", "v", "dx", "dw", "db"};
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_TRUE(torch::equal(got[i], want[i]))
              << what << " " << names[i] << ": max " << (got[i] - want[i]).abs().max().item<double>();
        }
        if (mode > 0) EXPECT_TRUE(torch::equal(ours.amax, ref.amax)) << what << ours.amax << ref.amax;
      }
    }
  }
  const auto x = torch::randn({16, 32}), w = torch::randn({48, 32}), b = torch::randn({48});
  EXPECT_THROW(fp8_qkv_linear(x, torch::randn({64, 32}), torch::randn({64})), Error);  // 64 rows: not three parts
  EXPECT_THROW(fp8_qkv_linear(x, w, {}), Error);
}

// memory.recompute_gelu under fp8: between forward and backward the node holds the GELU output's
// FP8 transpose only when it keeps it, rows x hidden bytes (sizes the caching allocator's 512-byte
// rounding leaves exact). CUDA only: the CPU allocator keeps no counts.
TEST(Fp8Mlp, CastingTheGeluOutputAgainHoldsItsFp8TransposeLess) {
  if (!has_fp8_gpu()) {
    GTEST_SKIP() << "needs a CUDA GPU with FP8 tensor cores (runs on the GPU machine)";
  }
  const auto opts = torch::TensorOptions(torch::kCUDA).dtype(torch::kBFloat16);
  const int64_t rows = 1024, C = 256, hidden = 1024;
  auto x = torch::randn({rows, C}, opts).requires_grad_();
  auto fw = (torch::randn({hidden, C}, opts) * 0.05).requires_grad_(),
       fb = torch::randn({hidden}, opts).requires_grad_();
  auto pw = (torch::randn({C, hidden}, opts) * 0.05).requires_grad_(), pb = torch::randn({C}, opts).requires_grad_();
  fp8_mlp(x, fw, fb, pw, pb).sum().backward();  // first use: cuBLASLt's workspace, the allocator's pools
  int64_t held[2] = {0, 0};
  for (bool keep : {true, false}) {
    const int64_t before = allocated_bytes();
    auto y = fp8_mlp(x, fw, fb, pw, pb, nullptr, nullptr, keep);
    held[keep] = allocated_bytes() - before - static_cast<int64_t>(y.nbytes());  // what backward will read
    y.sum().backward();
  }
  EXPECT_EQ(held[true] - held[false], rows * hidden)
      << "kept " << held[true] << " bytes, casting again " << held[false];
}

// Tuned FP8 products enter the tuning table a resumed run loads (Note [GEMM tuning]): saved, forgotten
// and loaded, the same shapes run their stored algorithms again, bit for bit, without timing. The
// shapes are a linear layer's forward (e4m3 x e4m3, bias) and its weight gradient (e5m2 x e4m3, a
// long K that split-K candidates suit).
TEST(Fp8Gemm, TunedShapesRoundTripThroughTheTuningTable) {
  if (!has_fp8_gpu()) {
    GTEST_SKIP() << "needs a CUDA GPU with FP8 tensor cores (runs on the GPU machine)";
  }
  TuningFor tuning(true);
  clear_gemm_choices();
  const auto opts = torch::TensorOptions(torch::kCUDA).dtype(torch::kFloat);
  const auto x = values(4096, 768, 11, torch::kCUDA), w = values(3072, 768, 12, torch::kCUDA);
  const auto g = values(3072, 4096, 13, torch::kCUDA), xt = values(768, 4096, 14, torch::kCUDA);
  auto fp8 = [&](const torch::Tensor& t, at::ScalarType f) {
    return quantize_fp8(t, f, fp8_scale_for(t.abs().max(), f));
  };
  const Fp8Tensor x8 = fp8(x, at::kFloat8_e4m3fn), w8 = fp8(w, at::kFloat8_e4m3fn);
  const Fp8Tensor g8 = fp8(g, at::kFloat8_e5m2), xt8 = fp8(xt, at::kFloat8_e4m3fn);
  const auto bias = torch::randn({3072}, opts).to(at::kBFloat16);
  auto products = [&] {
    return std::vector<torch::Tensor>{fp8_gemm_nt(x8, w8, at::kBFloat16, bias), fp8_gemm_nt(g8, xt8, at::kBFloat16)};
  };
  const auto first = products();
  ASSERT_EQ(gemm_choices_count(), 2) << "each FP8 shape is tuned once";
  const std::string bytes = gemm_choices_bytes();
  clear_gemm_choices();
  EXPECT_EQ(load_gemm_choices(bytes, "table"), 2);
  const auto again = products();
  for (size_t i = 0; i < first.size(); ++i) EXPECT_TRUE(torch::equal(again[i], first[i])) << "product " << i;
  EXPECT_EQ(gemm_choices_bytes(), bytes) << "a loaded FP8 shape was timed again";
  clear_gemm_choices();
}

TEST(Fp8Gemm, ShapesAndFormatsOutsideTheContractAreNamedErrors) {
  const auto one = torch::ones({});
  auto fp8 = [&](int64_t r, int64_t c, at::ScalarType f) { return Fp8Tensor{torch::zeros({r, c}).to(f), one}; };
  const auto e4 = at::kFloat8_e4m3fn, e5 = at::kFloat8_e5m2;
  auto message = [](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { fp8_gemm_nt(fp8(16, 24, e4), fp8(16, 24, e4), at::kBFloat16); }).find("multiples of 16"),
            std::string::npos);
  EXPECT_NE(message([&] { fp8_gemm_nt(fp8(16, 32, e4), fp8(24, 32, e4), at::kBFloat16); }).find("multiples of 16"),
            std::string::npos);
  EXPECT_NE(message([&] { fp8_gemm_nt(fp8(16, 32, e5), fp8(16, 32, e5), at::kBFloat16); }).find("e5m2"),
            std::string::npos);
  EXPECT_NE(message([&] { fp8_gemm_nt(fp8(16, 32, e4), fp8(16, 48, e4), at::kBFloat16); }).find("same K"),
            std::string::npos);
  EXPECT_NE(message([&] { fp8_gemm_nt(fp8(16, 32, e4), fp8(16, 32, e4), at::kHalf); }).find("bf16 or fp32"),
            std::string::npos);
  EXPECT_NE(message([&] {
              fp8_gemm_nt(Fp8Tensor{torch::zeros({16, 32}), one}, fp8(16, 32, e4), at::kBFloat16);
            }).find("fp8_gemm_nt"),
            std::string::npos);
}

}  // namespace
}  // namespace gpt2::kernels
