#pragma once
// Newton–Schulz in bf16 held to its rounding, one iteration at a time (used on the CPU by
// muon_test.cpp and on the GPU by muon_gpu_test.cpp).
//
// Note [bf16 Newton–Schulz bound]
// Five bf16 iterations cannot be bounded against exact arithmetic usefully: an iteration amplifies
// an earlier error by up to a = 3.4445 (Note [Newton–Schulz]) and bf16 keeps 8 bits, so a worst-case
// bound over five is larger than the result. So each iteration is checked alone: X_{i+1} as computed
// against one exact (fp64) iteration of the computed X_i, whose entries are exactly bf16 values.
// (X_i is newton_schulz with `steps` = i; the same operations run in the same order every call.)
// The bound is carried through the iteration's five operations as an elementwise matrix E, with
// the exact value V (fp64, `Bounded`), for u = 2⁻⁸ (bf16 rounding to nearest):
//  - product C = A B, inner dimension k (bf16 inputs, fp32 accumulation, one rounding to bf16):
//    D = E_A|B| + |A|E_B + E_A E_B + γ_k(|A| + E_A)(|B| + E_B), E_C = D + u(|C| + D), with
//    γ_k = k u₃₂/(1 − k u₃₂) for the fp32 sums (Higham, Accuracy and Stability, §3.5);
//  - c A (mul_): E = |c|E_A + u|c|(|A| + E_A)(2 + u), which also covers c itself rounded to bf16;
//  - A + β B (add_ with alpha): E_βB as c B above, then E = E_A + E_βB + u(|A + βB| + E_A + E_βB).
//    (LibTorch's CPU kernel rounds β to bf16, its CUDA kernel keeps it in fp32: the bound covers both.)
// u is taken as 2⁻⁸ + 4·2⁻²⁴ + 2·2⁻⁵³, which also covers the scalars' fp32 conversion and the fp64
// reference's own rounding; γ_k likewise adds fp64's. X₀ = G / ‖G‖_F: the norm of bf16 G sums k
// squares in fp32 and rounds to bf16 (relative η = (u + γ_k + u₃₂)(1 + u)), the division rounds once:
// E₀ = |X₀|(η/(1 − η)(1 + u) + u).
// The test also shows the bound discriminates: at the last iteration, where the singular values are
// near 1 and every term counts, the iteration without its A term (b = 0) or its A² term (c = 0)
// falls outside it. cuBLAS's reduced-precision split-K (ATen's default for bf16, adding partial sums in bf16) is
// outside this model, so the GPU test turns it off (at::globalContext()).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include "optim/newton_schulz.h"

namespace gpt2::optim::test {

inline constexpr double kBf16RoundingU = 0x1p-8 + 4 * 0x1p-24 + 2 * 0x1p-53;

inline double gamma_fp32(int64_t k) { return k * 0x1p-24 / (1 - k * 0x1p-24) + k * 0x1p-53 / (1 - k * 0x1p-53); }

// An fp64 value and an elementwise bound on a bf16 computation's distance from it.
struct Bounded {
  torch::Tensor value, err;
  Bounded t() const { return {value.t(), err.t()}; }
};

inline Bounded exactly(const torch::Tensor& x) {
  const auto v = x.to(torch::kDouble);
  return {v, torch::zeros_like(v)};
}

inline Bounded product(const Bounded& a, const Bounded& b) {
  const double u = kBf16RoundingU;
  const auto A = a.value.abs(), B = b.value.abs();
  const auto d = a.err.matmul(B) + A.matmul(b.err) + a.err.matmul(b.err) +
                 gamma_fp32(a.value.size(1)) * (A + a.err).matmul(B + b.err);
  const auto v = a.value.matmul(b.value);
  return {v, d + u * (v.abs() + d)};
}

inline Bounded scaled(const Bounded& a, double c) {
  const double u = kBf16RoundingU;
  return {c * a.value, std::abs(c) * a.err + u * std::abs(c) * (a.value.abs() + a.err) * (2 + u)};
}

inline Bounded plus(const Bounded& a, double beta, const Bounded& b) {
  const Bounded bb = scaled(b, beta);
  const auto v = a.value + bb.value, d = a.err + bb.err;
  return {v, d + kBf16RoundingU * (v.abs() + d)};
}

// One iteration X ← a X + (b A + c A²) X, A = X Xᵀ, in newton_schulz's order of operations.
inline Bounded iteration(const Bounded& x, double b_coef = NewtonSchulz::kB, double c_coef = NewtonSchulz::kC) {
  const Bounded a = product(x, x.t());
  const Bounded b = plus(scaled(product(a, a), c_coef), b_coef, a);
  return plus(product(b, x), NewtonSchulz::kA, x);
}

// Every iterate of newton_schulz(g) in `compute` (bf16) within its bound, g a bf16 matrix. With
// `stacked_with` (bf16 [k, rows, cols]) g is orthogonalised first of a stack with those matrices,
// which must not change its bound: each matrix of a stack is its own.
inline void expect_iterations_within_rounding(const torch::Tensor& g, at::ScalarType compute,
                                              const torch::Tensor& stacked_with = {}) {
  const std::string what = std::to_string(g.size(0)) + " x " + std::to_string(g.size(1)) +
                           (stacked_with.defined() ? ", stack of " + std::to_string(stacked_with.size(0) + 1) : "");
  SCOPED_TRACE(what);
  ASSERT_EQ(g.scalar_type(), torch::kBFloat16);
  const bool tall = g.size(0) > g.size(1);
  auto iterate = [&](int steps) {  // X_steps in the iteration's orientation (wide), in fp64 on g's device
    NewtonSchulz ns;
    ns.steps = steps;
    const auto x = stacked_with.defined() ? newton_schulz(torch::cat({g.unsqueeze(0), stacked_with}), ns, compute)[0]
                                          : newton_schulz(g, ns, compute);
    return (tall ? x.t() : x).to(torch::kDouble);
  };
  const double u = kBf16RoundingU;
  const auto gd = (tall ? g.t() : g).to(torch::kDouble);
  const auto x0 = gd / gd.norm();
  const double eta = (u + gamma_fp32(g.numel()) + 0x1p-24) * (1 + u);
  const auto e0 = x0.abs() * (eta / (1 - eta) * (1 + u) + u);
  auto x = iterate(0);
  EXPECT_TRUE(((x - x0).abs() <= e0).all().item<bool>()) << "X0: " << ((x - x0).abs() / e0).max().item<double>();
  for (int i = 0; i < 5; ++i) {
    const auto next = iterate(i + 1);
    const Bounded want = iteration(exactly(x));
    const auto diff = (next - want.value).abs();
    const double ratio = (diff / want.err).max().item<double>();
    EXPECT_LE(ratio, 1.0) << "iteration " << i + 1;
    if (i == 4) {  // the bound discriminates
      for (const auto& [b, c] : {std::pair{0.0, NewtonSchulz::kC}, {NewtonSchulz::kB, 0.0}}) {
        const Bounded wrong = iteration(exactly(x), b, c);
        EXPECT_FALSE(((next - wrong.value).abs() <= wrong.err).all().item<bool>()) << "b " << b << ", c " << c;
      }
    }
    std::printf("[ measured ] %s iteration %d: max |X - exact| / bound %.3f; bound / max |X| %.3f\n", what.c_str(),
                i + 1, ratio, want.err.max().item<double>() / want.value.abs().max().item<double>());
    x = next;
  }
}

}  // namespace gpt2::optim::test
