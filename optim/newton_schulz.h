#pragma once
// Muon's orthogonalisation (Jordan et al. 2024; torch.optim.Muon's defaults): the update matrix
// G replaced by about U Vᵀ, where G = U Σ Vᵀ, by five Newton–Schulz iterations of a quintic.
//
// Note [Newton–Schulz]
// X₀ = G / max(‖G‖_F, eps), transposed first when G has more rows than columns (so that A = X Xᵀ
// is the smaller Gram matrix), then `steps` times X ← a X + (b A + c A²) X with A = X Xᵀ and
// (a, b, c) = (3.4445, −4.7750, 2.0315). Each iteration keeps the singular vectors and maps every
// singular value x to p(x) = a x + b x³ + c x⁵, so in exact arithmetic the result is
// U f(Σ / ‖G‖_F) Vᵀ with f = p∘…∘p (`steps` times). X₀'s singular values lie in (0, 1] (the
// Frobenius norm bounds the spectral one); the coefficients make p steep at 0 and do not converge
// to 1: with 5 steps f maps [0.0015, 1] into [0.68, 1.21] (f(1) = 0.70), which is what Muon wants
// (a cheap, nearly orthogonal update, not the polar factor). Hence:
//  - against the polar factor U Vᵀ, the spectral-norm error is exactly max_i |f(σ_i / ‖G‖_F) − 1|
//    (the bound the tests take from an fp64 SVD);
//  - against U f(Σ / ‖G‖_F) Vᵀ the difference is rounding only. A product of k-term dot products
//    errs by at most γ_k = k u / (1 − k u) relative to |A||B| (Higham, Accuracy and Stability,
//    §3.5); each iteration does three products, and an error in X is amplified by at most
//    max |p'| ≤ a per iteration over the singular values it meets, so after s steps the error is
//    below 3 s a^s γ_k in norm (u = 2⁻²⁴ in fp32, 2⁻⁸ in bf16, 2⁻⁵³ in fp64).
// On CUDA the iterations run in bf16, as torch.optim.Muon's do, through src/kernels' GEMMs (a
// matrix) or ATen's batched GEMM (a stack, what the optimizer runs); on the
// CPU in fp32 (LibTorch's bf16 products are a portable loop on CPUs without AVX-512 BF16, Note
// [bf16 on CPU]), or in the dtype asked for.
#include <torch/types.h>

#include <cstdint>

namespace gpt2::optim {

struct NewtonSchulz {
  static constexpr double kA = 3.4445, kB = -4.7750, kC = 2.0315;
  int steps = 5;
  double eps = 1e-7;
};

// The orthogonalised 2-D `g` (any float dtype), or each matrix of a stack g [k, rows, cols] (each
// normalised by its own norm; one batched product per product), computed in `compute` (Undefined:
// bf16 on CUDA, fp32 on the CPU), returned in g's dtype.
torch::Tensor newton_schulz(const torch::Tensor& g, const NewtonSchulz& ns = {},
                            at::ScalarType compute = at::ScalarType::Undefined);

// f(x): the quintic applied `steps` times (what newton_schulz does to a singular value).
double newton_schulz_map(double x, const NewtonSchulz& ns = {});

}  // namespace gpt2::optim
