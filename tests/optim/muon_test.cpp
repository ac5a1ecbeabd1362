// Muon's pieces against fp64 references written here: Newton–Schulz against U f(Σ/‖G‖_F) Vᵀ from
// LAPACK's SVD (f the quintic applied 5 times) and against the polar factor U Vᵀ, and one and two
// Muon steps against the update spelled out in fp64. The orthogonalisation runs in fp64 here
// (compute = kDouble), so the bounds are Note [Newton–Schulz]'s rounding bound at u = 2^-53; the
// bf16 iterations are held to their own rounding, one at a time (Note [bf16 Newton–Schulz bound]).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <tuple>

#include "optim/muon.h"
#include "optim/newton_schulz.h"
#include "tests/optim/newton_schulz_rounding.h"

namespace gpt2::optim {
namespace {

// f(x): x <- 3.4445 x - 4.7750 x^3 + 2.0315 x^5, five times (the coefficients written out again).
double quintic5(double x) {
  for (int i = 0; i < 5; ++i) x = 3.4445 * x - 4.7750 * x * x * x + 2.0315 * x * x * x * x * x;
  return x;
}

struct Svd {
  torch::Tensor u, s, vh;
};
Svd singular_values_of(const torch::Tensor& g) {
  auto [u, s, vh] = torch::linalg_svd(g.to(torch::kDouble), /*full_matrices=*/false);
  return {u, s, vh};
}

// What 5 exact iterations give: U f(Σ / ‖G‖_F) Vᵀ.
torch::Tensor exact_newton_schulz(const torch::Tensor& g) {
  const Svd d = singular_values_of(g);
  const double fro = g.to(torch::kDouble).norm().item<double>();
  auto fs = d.s.clone();
  for (int64_t i = 0; i < fs.numel(); ++i) fs[i] = quintic5(d.s[i].item<double>() / fro);
  return d.u.matmul(torch::diag(fs)).matmul(d.vh);
}

// Note [Newton–Schulz]'s rounding bound for s = 5 steps, inner dimension k, unit roundoff u:
// 3 s a^s γ_k, with γ_k = k u / (1 - k u), times 14, the largest entry of |A||B| over the three
// products (rows of X, A = X Xᵀ and b A + c A² have norms at most their spectral norms: 1.21,
// 1.46 and |b| 1.46 + c 1.46² = 11.3, and Cauchy–Schwarz bounds each entry of |A||B| by a row
// norm times a column norm: at most 11.3 x 1.21 < 14).
double rounding_bound(int64_t k, double u) {
  const double gamma = k * u / (1 - k * u);
  return 3 * 5 * std::pow(3.4445, 5) * gamma * 14;
}

constexpr double kU64 = 1.1102230246251565e-16;  // 2^-53

TEST(NewtonSchulz, IsTheQuinticAppliedToTheSingularValues) {
  torch::manual_seed(3);
  for (auto [rows, cols] : {std::pair{64, 256}, {256, 64}, {96, 96}}) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols));
    const auto g = torch::randn({rows, cols}, torch::kDouble);
    const auto got = newton_schulz(g, {}, torch::kDouble);
    ASSERT_EQ(got.sizes(), g.sizes());
    ASSERT_EQ(got.scalar_type(), torch::kDouble);
    const double err = (got - exact_newton_schulz(g)).abs().max().item<double>();
    const double bound = rounding_bound(std::max(rows, cols), kU64);
    EXPECT_LE(err, bound);
    std::printf("[ measured ] %lld x %lld: max |NS - U f(S) V^T| %.2e (bound %.2e)\n", (long long)rows, (long long)cols,
                err, bound);
    // Against the polar factor U Vᵀ: exactly max |f(σ / ‖G‖_F) - 1| in the spectral norm.
    const Svd d = singular_values_of(g);
    const double fro = g.norm().item<double>();
    double worst = 0;
    for (int64_t i = 0; i < d.s.numel(); ++i)
      worst = std::max(worst, std::abs(quintic5(d.s[i].item<double>() / fro) - 1));
    const double spectral = torch::linalg_matrix_norm(got - d.u.matmul(d.vh), 2).item<double>();
    EXPECT_NEAR(spectral, worst, bound * std::sqrt(static_cast<double>(rows) * cols));
    // Nearly orthogonal: every singular value of X₀ from 0.0015 up lands in [0.68, 1.21] (the Note's
    // claim, checked with the quintic written here).
    for (int64_t i = 0; i < d.s.numel(); ++i) {
      const double x = d.s[i].item<double>() / fro;
      if (x < 0.0015) continue;
      EXPECT_GE(quintic5(x), 0.68) << x;
      EXPECT_LE(quintic5(x), 1.21) << x;
    }
  }
  // The library's own map of a singular value is the quintic's: each step's polynomial, evaluated
  // in another order, rounds by a few ulps (4 u), and a step amplifies an error by at most a.
  for (double x : {0.01, 0.1, 0.5, 1.0}) {
    EXPECT_NEAR(newton_schulz_map(x), quintic5(x), 5 * std::pow(3.4445, 5) * 4 * kU64) << x;
  }
}

// bf16 Newton–Schulz on the CPU (compute = bf16; the GPU's default, checked on its shapes by
// muon_gpu_test.cpp): each iteration within its rounding bound of the exact iteration of the last
// iterate (Note [bf16 Newton–Schulz bound]).
TEST(NewtonSchulz, Bf16IterationsAreWithinTheirRoundingBound) {
  torch::manual_seed(5);
  for (auto [rows, cols] : {std::pair{64, 192}, {192, 64}, {96, 96}})
    test::expect_iterations_within_rounding(torch::randn({rows, cols}).to(torch::kBFloat16), torch::kBFloat16);
  // First of a stack of three (the sharded optimizer's batched path), beside matrices 100 times
  // larger and smaller, which a norm shared over the stack would show.
  for (auto [rows, cols] : {std::pair{64, 192}, {192, 64}}) {
    const auto others = torch::stack({torch::randn({rows, cols}) * 100, torch::randn({rows, cols}) / 100});
    test::expect_iterations_within_rounding(torch::randn({rows, cols}).to(torch::kBFloat16), torch::kBFloat16,
                                            others.to(torch::kBFloat16));
  }
}

// A stack's step is each matrix's own step: in fp64 (compute kDouble) a stack of three updates each
// matrix and momentum as muon_step on that matrix alone does, within twice the fp64 rounding bound
// of Note [Newton–Schulz] (each side's distance from the exact step is below one bound).
TEST(Muon, AStackStepsEachMatrixAsItsOwnStep) {
  torch::manual_seed(6);
  const int64_t rows = 40, cols = 72;
  const double lr = 0.02;
  MuonOptions o;
  auto grads = torch::randn({3, rows, cols}, torch::kDouble);
  grads[1] *= 1000;  // a shared norm would shrink the others' updates
  auto momentum = torch::randn({3, rows, cols}, torch::kDouble) * 0.1;
  std::vector<torch::Tensor> params, alone_params, alone_momenta;
  for (int64_t j = 0; j < 3; ++j) {
    params.push_back(torch::randn({rows, cols}, torch::kDouble));
    alone_params.push_back(params.back().clone());
    alone_momenta.push_back(momentum[j].clone());
  }
  muon_step(params, grads, momentum, lr, o, torch::kDouble);
  const double bound = 2 * (lr * rounding_bound(cols, kU64) + 4 * kU64 * 10);
  for (int64_t j = 0; j < 3; ++j) {
    muon_step(alone_params[j], grads[j], alone_momenta[j], lr, o, torch::kDouble);
    EXPECT_TRUE(torch::equal(momentum[j], alone_momenta[j])) << j;  // elementwise: the same operations
    EXPECT_LE((params[j] - alone_params[j]).abs().max().item<double>(), bound) << j;
  }
}

// One step, spelled out in fp64 for a 48 x 96 matrix (scale 1) and a 96 x 48 one (scale √2):
// m = 0.95 m + 0.05 g; u = g + 0.95 (m - g) (Nesterov); p = p (1 - lr wd) - lr scale NS(u). Then a
// second step, whose momentum carries the first's.
TEST(Muon, StepsAreTheUpdateSpelledOutInFloat64) {
  torch::manual_seed(4);
  for (auto [rows, cols] : {std::pair{48, 96}, {96, 48}}) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols));
    const double lr = 0.02, wd = 0.1, mu = 0.95;
    const double scale = std::sqrt(std::max(1.0, static_cast<double>(rows) / cols));
    EXPECT_DOUBLE_EQ(muon_lr_scale(rows, cols), scale);
    auto p = torch::randn({rows, cols}, torch::kDouble), m = torch::zeros({rows, cols}, torch::kDouble);
    auto want_p = p.clone(), want_m = m.clone();
    MuonOptions o;
    o.weight_decay = wd;
    for (int step = 0; step < 2; ++step) {
      const auto g = torch::randn({rows, cols}, torch::kDouble);
      muon_step(p, g, m, lr, o, torch::kDouble);
      want_m = mu * want_m + (1 - mu) * g;
      const auto update = g + mu * (want_m - g);
      want_p = want_p * (1 - lr * wd) - lr * scale * exact_newton_schulz(update);
      EXPECT_LE((m - want_m).abs().max().item<double>(), 4 * kU64 * want_m.abs().max().item<double>()) << step;
      const double bound =
          lr * scale * rounding_bound(std::max(rows, cols), kU64) + 4 * kU64 * want_p.abs().max().item<double>();
      EXPECT_LE((p - want_p).abs().max().item<double>(), bound * (step + 1)) << step;
    }
  }
}

}  // namespace
}  // namespace gpt2::optim
