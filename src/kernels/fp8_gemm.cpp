// FP8 quantization and GEMMs (see fp8_gemm.h).
#include "src/kernels/fp8_gemm.h"

#include <ATen/ATen.h>

#include <string>

#include "src/base/errors.h"

#ifdef GPT2_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime.h>
#endif

namespace gpt2::kernels {

// Note [FP8 GEMM bound]
// Round to nearest in a format with p stored mantissa bits (e4m3: p = 3, e5m2: p = 2) puts a value
// whose scaled magnitude lies in the normal range [2^emin, max] within a relative u8 = 2^-(p+1) of
// itself (2^-4 for e4m3, 2^-3 for e5m2); below 2^emin (e4m3: 2^-6, e5m2: 2^-14) the spacing is
// fixed at 2^(emin-p), so the error is at most 2^(emin-p-1), divided by the scale. The GEMM then
// multiplies those fp8 values (exactly, in fp32) and sums K products in fp32:
// |ŷ − y| <= γ_K Σ_k |a_k||b_k| with γ_K = K u / (1 − K u), u = 2^-24 (Higham, §3.1); the two scale
// multiplies add 2u |y|, and a bf16 output rounds once more, 2^-8 |y| (8 bits of precision). Against
// the exact product of the unquantized operands the quantization adds, per product,
// |x_k||w_k| (u_a + u_b + u_a u_b) (plus the absolute terms of subnormal entries). The tests hold
// each part to its term (tests/kernels/fp8_gemm_test.cpp).

float fp8_max(at::ScalarType format) {
  switch (format) {
    case at::kFloat8_e4m3fn:
      return 448.0f;
    case at::kFloat8_e5m2:
      return 57344.0f;
    default:
      throw Error(std::string("fp8: ") + c10::toString(format) + " is not an fp8 format (float8_e4m3fn, float8_e5m2)");
  }
}

torch::Tensor fp8_scale_for(const torch::Tensor& amax, at::ScalarType format) {
  const float top = fp8_max(format);
  const at::Tensor a = amax.to(at::kFloat);
  const at::Tensor ok = a.gt(0).logical_and(a.isfinite());
  return at::where(ok, top / a, at::ones_like(a));
}

Fp8Tensor quantize_fp8(const torch::Tensor& x, at::ScalarType format, const torch::Tensor& scale) {
  const float top = fp8_max(format);
  GPT2_ASSERT(scale.numel() == 1 && scale.scalar_type() == at::kFloat,
              "quantize_fp8: the scale must be one fp32 value");
  at::NoGradGuard no_grad;
  const at::Tensor s = scale.to(x.device()).reshape({});
  const at::Tensor data = x.to(at::kFloat).mul(s).clamp_(-top, top).to(format).contiguous();
  return {data, s.reciprocal()};
}

torch::Tensor dequantize_fp8(const Fp8Tensor& t, at::ScalarType dtype) {
  const auto compute = dtype == at::kDouble ? at::kDouble : at::kFloat;
  return t.data.to(compute).mul(t.scale_inv.to(compute)).to(dtype);
}

Fp8Tensor transpose_fp8(const Fp8Tensor& t) {
  GPT2_ASSERT(t.data.dim() == 2, "transpose_fp8 takes a matrix");
  // A float8 transpose is a byte copy: through uint8, which every device copies.
  const at::Tensor bytes = t.data.view(at::kByte).t().contiguous();
  return {bytes.view(t.data.scalar_type()), t.scale_inv};
}

bool fp8_supported(const torch::Device& device) {
  if (device.is_cpu()) return true;
#ifdef GPT2_WITH_CUDA
  if (device.is_cuda()) {
    int major = 0, minor = 0;
    const int index = device.has_index() ? device.index() : c10::cuda::current_device();
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return major * 10 + minor >= 89;
  }
#endif
  return false;
}

torch::Tensor fp8_gemm_nt(const Fp8Tensor& a, const Fp8Tensor& b, at::ScalarType out_dtype, const torch::Tensor& bias) {
  auto is_fp8 = [](const at::Tensor& t) {
    return t.scalar_type() == at::kFloat8_e4m3fn || t.scalar_type() == at::kFloat8_e5m2;
  };
  GPT2_ASSERT(a.data.dim() == 2 && b.data.dim() == 2 && is_fp8(a.data) && is_fp8(b.data),
              "fp8_gemm_nt: a (M, K) and b (N, K) must be fp8 matrices");
  GPT2_ASSERT(a.data.scalar_type() == at::kFloat8_e4m3fn || b.data.scalar_type() == at::kFloat8_e4m3fn,
              "fp8_gemm_nt: at most one operand may be e5m2");
  const int64_t k = a.data.size(1), n = b.data.size(0);
  GPT2_ASSERT(b.data.size(1) == k, "fp8_gemm_nt: a and b must have the same K");
  GPT2_ASSERT(k % 16 == 0 && n % 16 == 0, "fp8_gemm_nt: K and N must be multiples of 16");
  GPT2_ASSERT(a.data.is_contiguous() && b.data.is_contiguous() && a.data.device() == b.data.device(),
              "fp8_gemm_nt: a and b must be contiguous on one device");
  GPT2_ASSERT(out_dtype == at::kBFloat16 || out_dtype == at::kFloat, "fp8_gemm_nt: the output must be bf16 or fp32");
  GPT2_ASSERT(!bias.defined() || (bias.numel() == n && bias.scalar_type() == out_dtype),
              "fp8_gemm_nt: bias must be (N) in the output dtype");
  GPT2_ASSERT(fp8_supported(a.data.device()), "fp8_gemm_nt: " + a.data.device().str() + " has no FP8 GEMM (sm_89+)");
  at::NoGradGuard no_grad;
  // b (N, K) row-major is bᵀ (K, N) column-major: the layout _scaled_mm's second operand takes.
  // cuBLASLt adds a bias in the epilogue of a 16-bit output only; an fp32 output adds it after.
  const bool epilogue_bias = bias.defined() && out_dtype == at::kBFloat16;
  at::Tensor y =
      at::_scaled_mm(a.data, b.data.t(), a.scale_inv, b.scale_inv,
                     epilogue_bias ? std::optional<at::Tensor>(bias) : std::nullopt, std::nullopt, out_dtype);
  if (bias.defined() && !epilogue_bias) y.add_(bias);
  return y;
}

}  // namespace gpt2::kernels
