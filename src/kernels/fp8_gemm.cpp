// FP8 quantization and GEMMs (see fp8_gemm.h).
#include "src/kernels/fp8_gemm.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "src/base/errors.h"
#include "src/kernels/dtype.h"
#include "src/kernels/gemm.h"
#include "src/kernels/linear.h"

#ifdef GPT2_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>

#include "src/base/cuda_check.h"
#endif

namespace gpt2::kernels {

// Note [FP8 GEMM bound]
// Round to nearest in a format with p stored mantissa bits (e4m3: p = 3, e5m2: p = 2) puts a value
// whose scaled magnitude lies in the normal range [2^emin, max] within a relative u8 = 2^-(p+1) of
// itself (2^-4 for e4m3, 2^-3 for e5m2); below 2^emin (e4m3: 2^-6, e5m2: 2^-14) the spacing is
// fixed at 2^(emin-p), so the error is at most 2^(emin-p-1), divided by the scale. The GEMM then
// multiplies those fp8 values (exactly) and sums K products. LibTorch's CPU reference sums in fp32:
// |ŷ − y| <= γ_K Σ_k |a_k||b_k| with γ_K = K u / (1 − K u), u = 2^-24 (Higham, §3.1). Hopper's FP8
// tensor cores do not: their accumulator keeps about 14 bits (DeepSeek-V3 report, §3.3.2), an
// fp32 exponent with 13 mantissa bits, truncated (SageAttention2), and cuBLASLt without fast
// accumulation (what _scaled_mm asks for) promotes the partial sums to fp32 at an interval it does
// not document; DeepSeek-V3 promotes every 128 products. Measured on an H200, the error was 15.6x
// the fp32 bound at K = 768. The model the tests hold the GPU to: chunks of at most c = 128
// products summed with a relative error of 2^-13 per addition (truncation), the chunk sums added
// in fp32: γ = γ'_c + γ_⌈K/c⌉ + γ'_c γ_⌈K/c⌉, γ'_c = c 2^-13 / (1 − c 2^-13). The bias add and the
// two scale multiplies add γ_3 |bias| + 2u |y|, and a bf16 output rounds once more, 2^-8 |y|
// (8 bits of precision). Sums of small integers times powers of two stay within 14 bits and are
// exact under this model, which pins the GEMM's wiring bit for bit. Against
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
  // Finite values saturate; inf and NaN stay non-finite (NaN in e4m3fn, which has no inf), so an
  // overflow reaches the gradients and the step is skipped (LossScaler's skip_non_finite).
  const at::Tensor scaled = x.to(at::kFloat).mul(s);
  const at::Tensor data = at::where(scaled.isfinite(), scaled.clamp(-top, top), scaled).to(format).contiguous();
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
    // ATen's cached properties: its own checked CUDA call, once a device.
    const cudaDeviceProp* prop =
        at::cuda::getDeviceProperties(device.has_index() ? device.index() : at::cuda::current_device());
    return prop->major * 10 + prop->minor >= 89;
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
  at::Tensor y = gemm_fp8_nt(a.data, a.scale_inv, b.data, b.scale_inv, epilogue_bias ? bias : at::Tensor(), out_dtype);
  if (bias.defined() && !epilogue_bias) y.add_(bias);
  return y;
}

namespace {

// Which of a matrix's casts a caller takes: the matrix, its transpose (a backward GEMM's operand),
// or both from one pass.
enum class Fp8Layout { kRows, kTranspose, kBoth };

// A per-tensor cast of x, or with `gelu` of gelu_tanh(x) (ATen's, in x's dtype: the value the
// composition gelu-then-cast would cast, but never stored), in `layout` (the pair's first: the
// matrix, second: its transpose; what was not asked for is undefined). `row` undefined: current
// scaling (the cast's own amax). `row` an amax history row (L fp32, Fp8DelayedScaling): the scale
// from its columns 1..L-1 when use_history, else the cast's own amax; with `record`, column 0
// becomes max(column 0, the cast's amax). On CUDA, for a kernel dtype, our kernels (fp8_cast.cu:
// the bits of the ATen composition below; delayed scaling in one read of x, current in two, the
// transpose from the same tile); elsewhere ATen.
std::pair<Fp8Tensor, Fp8Tensor> cast(const torch::Tensor& x, at::ScalarType format, Fp8Layout layout,
                                     const at::Tensor& row = {}, bool use_history = false, bool record = false,
                                     bool gelu = false) {
  at::NoGradGuard no_grad;
  GPT2_ASSERT(format == at::kFloat8_e4m3fn || format == at::kFloat8_e5m2,
              std::string("fp8 cast: ") + c10::toString(format) + " is not an fp8 format");
  GPT2_ASSERT(layout == Fp8Layout::kRows || x.dim() == 2, "fp8 cast: the transposing cast takes a matrix");
  GPT2_ASSERT(x.numel() > 0, "fp8 cast: the tensor is empty (it has no amax to scale by)");
  GPT2_ASSERT(!row.defined() || (row.dim() == 1 && row.size(0) >= 2 && row.scalar_type() == at::kFloat &&
                                 row.is_contiguous() && row.device() == x.device()),
              "fp8 cast: an amax history row is >= 2 contiguous fp32 values on x's device");
  const bool rows_out = layout != Fp8Layout::kTranspose, transposed = layout != Fp8Layout::kRows;
#ifdef GPT2_WITH_CUDA
  if (x.is_cuda() && is_kernel_dtype(x.scalar_type())) {
    const at::Tensor xc = x.contiguous();
    const int64_t cols = xc.dim() == 0 ? 1 : xc.size(-1), rows = xc.numel() / cols;
    const auto stream = stream_of(xc);
    const Dtype dtype = dtype_of(xc, "kernels::fp8 cast");
    at::Tensor scale_inv = at::empty({}, xc.options().dtype(at::kFloat));
    at::Tensor data = rows_out ? at::empty(xc.sizes(), xc.options().dtype(format)) : at::Tensor();
    at::Tensor data_t = transposed ? at::empty({cols, rows}, xc.options().dtype(format)) : at::Tensor();
    Fp8CastArgs args{xc.data_ptr(),
                     rows,
                     cols,
                     format == at::kFloat8_e5m2,
                     fp8_max(format),
                     nullptr,
                     nullptr,
                     0,
                     nullptr,
                     rows_out ? data.data_ptr() : nullptr,
                     transposed ? data_t.data_ptr() : nullptr,
                     scale_inv.data_ptr<float>(),
                     gelu};
    at::Tensor amax;
    if (row.defined() && use_history) {
      args.history = row.data_ptr<float>();
      args.history_len = row.size(0);
    } else {
      amax = at::empty({1}, xc.options().dtype(at::kInt));
      auto* bits = reinterpret_cast<unsigned*>(amax.data_ptr<int32_t>());
      CUDA_CHECK(launch_fp8_amax(dtype, xc.data_ptr(), xc.numel(), bits, stream, gelu));
      args.amax_bits = bits;
    }
    // Column 0 holds an fp32 >= 0 (zeroed by fp8_amax_roll): its bits order as the values do.
    if (row.defined() && record) args.record_bits = reinterpret_cast<unsigned*>(row.data_ptr<float>());
    CUDA_CHECK(launch_fp8_cast(dtype, args, stream));
    return {{data, scale_inv}, {data_t, scale_inv}};
  }
#endif
  const at::Tensor in = gelu ? at::gelu(x, "tanh") : x;
  const at::Tensor amax = in.abs().amax().to(at::kFloat);
  const at::Tensor scale_amax = row.defined() && use_history ? row.narrow(0, 1, row.size(0) - 1).max() : amax;
  const Fp8Tensor q = quantize_fp8(in, format, fp8_scale_for(scale_amax, format));
  if (row.defined() && record) {  // a NaN recorded as inf, as the CUDA kernel does
    const at::Tensor finite_or_inf = at::where(amax.isnan(), at::full_like(amax, INFINITY), amax);
    row.narrow(0, 0, 1).copy_(at::maximum(row.narrow(0, 0, 1), finite_or_inf.reshape({1})));
  }
  return {rows_out ? q : Fp8Tensor{}, transposed ? transpose_fp8(q) : Fp8Tensor{}};
}

}  // namespace

Fp8Tensor quantize_fp8_current(const torch::Tensor& x, at::ScalarType format) {
  return cast(x, format, Fp8Layout::kRows).first;
}

std::pair<Fp8Tensor, Fp8Tensor> quantize_fp8_current_and_transpose(const torch::Tensor& x, at::ScalarType format) {
  return cast(x, format, Fp8Layout::kBoth);
}

std::pair<Fp8Tensor, Fp8Tensor> quantize_fp8_delayed_and_transpose(const torch::Tensor& x, at::ScalarType format,
                                                                   const torch::Tensor& history_row, bool use_history) {
  GPT2_ASSERT(history_row.defined(), "quantize_fp8_delayed_and_transpose: needs an amax history row");
  return cast(x, format, Fp8Layout::kBoth, history_row, use_history, /*record=*/true);
}

void fp8_amax_roll(torch::Tensor& amax) {
  at::NoGradGuard no_grad;
  GPT2_ASSERT(amax.dim() >= 1 && amax.size(-1) >= 2 && amax.scalar_type() == at::kFloat && amax.is_contiguous(),
              "fp8_amax_roll: the histories are contiguous fp32 with >= 2 columns");
  const int64_t len = amax.size(-1);
  // A non-finite amax (an overflow, its step skipped) is not history: the step before's amax
  // stands in for it, so an overflow neither pins a scale nor empties a short history (an empty
  // one scales by 1, which flushes small gradients).
  const at::Tensor now = amax.narrow(-1, 0, 1), before = amax.narrow(-1, 1, 1);
  now.copy_(at::where(now.isfinite(), now, before));
  amax.narrow(-1, 1, len - 1).copy_(amax.narrow(-1, 0, len - 1).clone());
  now.zero_();
}

namespace {

class Fp8LinearFunction : public torch::autograd::Function<Fp8LinearFunction> {
 public:
  // `bias` with no elements: none (autograd's apply takes no undefined tensor).
  // `amax`: (3, L) histories of x, w and gy (Fp8DelayedScaling), or no elements: current scaling.
  // record: raise the current step's amaxes (a training forward; not evaluation or decoding).
  // gelu: the layer's input is gelu_tanh(x) (fp8_gelu_linear), cast as it is computed.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& bias, const torch::Tensor& amax, bool use_history, bool record,
                               bool gelu) {
    const bool has_bias = bias.numel() > 0, delayed = amax.numel() > 0;
    const int64_t k = x.size(-1);
    const at::Tensor x2 = x.reshape({-1, k});
    const at::Tensor x_row = delayed ? amax[0] : at::Tensor(), w_row = delayed ? amax[1] : at::Tensor();
    // Backward keeps what is smallest: x8ᵀ (the dw GEMM's operand, written by the same pass), or with
    // gelu x itself (GELU's backward needs it anyway; gelu(x)8ᵀ is cast again there), and w, a
    // parameter (its fp8 transpose is cast again too, with the same scale: w has not changed).
    const auto [x8, x8_t] =
        cast(x2, at::kFloat8_e4m3fn, gelu ? Fp8Layout::kRows : Fp8Layout::kBoth, x_row, use_history, record, gelu);
    const Fp8Tensor w8 = cast(w, at::kFloat8_e4m3fn, Fp8Layout::kRows, w_row, use_history, record).first;
    at::Tensor y = fp8_gemm_nt(x8, w8, x.scalar_type(), has_bias ? bias : at::Tensor());
    if (gelu) {
      ctx->save_for_backward({x2, w});
    } else {
      ctx->save_for_backward({x8_t.data, x8_t.scale_inv, w});
    }
    ctx->saved_data["has_bias"] = has_bias;
    ctx->saved_data["gelu"] = gelu;
    // Not saved for backward: the backward's cast writes into it, which a saved tensor may not see.
    ctx->saved_data["amax"] = amax;
    ctx->saved_data["use_history"] = use_history;
    ctx->saved_data["record"] = record;
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = w.size(0);
    return y.view(shape);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const bool gelu = ctx->saved_data["gelu"].toBool();
    const at::Tensor& w = saved.back();  // (N, K)
    const int64_t n = w.size(0), k = w.size(1);
    const at::Tensor gy = grads[0].reshape({-1, n}).contiguous();
    const at::ScalarType dtype = gy.scalar_type();
    const at::Tensor amax = ctx->saved_data["amax"].toTensor();
    const bool delayed = amax.numel() > 0, use_history = ctx->saved_data["use_history"].toBool();
    const auto [g8, g8_t] = cast(gy, at::kFloat8_e5m2, Fp8Layout::kBoth, delayed ? amax[2] : at::Tensor(), use_history,
                                 ctx->saved_data["record"].toBool());
    // The forward's casts again, transposed, not recorded a second time.
    const Fp8Tensor w8_t =
        cast(w, at::kFloat8_e4m3fn, Fp8Layout::kTranspose, delayed ? amax[1] : at::Tensor(), use_history).second;
    const Fp8Tensor x8_t = gelu ? cast(saved[0], at::kFloat8_e4m3fn, Fp8Layout::kTranspose,
                                       delayed ? amax[0] : at::Tensor(), use_history, false, true)
                                      .second
                                : Fp8Tensor{saved[0], saved[1]};  // (K, M)
    at::Tensor dx = fp8_gemm_nt(g8, w8_t, dtype);                 // (M, K)
    const at::Tensor dw = fp8_gemm_nt(g8_t, x8_t, dtype);         // (N, K)
    if (gelu) dx = at::gelu_backward(dx, saved[0], "tanh");
    std::vector<int64_t> x_shape = grads[0].sizes().vec();
    x_shape.back() = k;
    const at::Tensor db = ctx->saved_data["has_bias"].toBool() ? bias_grad(gy) : at::Tensor();
    return {dx.view(x_shape), dw, db, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

#ifdef GPT2_WITH_CUDA
// The arguments of a (rows, cols) cast scaled from history row `h` (delayed scaling) into the
// transpose `t` and, if given, the rows `rows_out`, recording its amax if asked (launch.h).
Fp8CastArgs history_cast_args(int64_t rows, int64_t cols, at::ScalarType format, const at::Tensor& h, bool record,
                              const Fp8Tensor& t, const at::Tensor& rows_out, bool gelu = false) {
  return Fp8CastArgs{nullptr,
                     rows,
                     cols,
                     format == at::kFloat8_e5m2,
                     fp8_max(format),
                     nullptr,
                     h.data_ptr<float>(),
                     h.size(0),
                     record ? reinterpret_cast<unsigned*>(h.data_ptr<float>()) : nullptr,
                     rows_out.defined() ? rows_out.data_ptr() : nullptr,
                     t.data.data_ptr(),
                     t.scale_inv.data_ptr<float>(),
                     gelu};
}
#endif

// What the FP8 GELU backward pass gives: dpre in e5m2 (rows and transpose), c_fc's bias gradient,
// and, where asked, gelu(pre)'s e4m3 transpose (c_proj's dw operand, not kept from forward).
struct GeluBackwardFp8 {
  Fp8Tensor d8, d8_t;
  at::Tensor dbias;
  Fp8Tensor h8_t;
};

// gelu_and_bias_backward(dh, pre) with its dpre cast to e5m2 in the same pass (launch_gelu_backward_fp8:
// the bits of the two in turn, dpre never stored), where a history fixes the scale before dpre exists
// (delayed scaling after its first step); with `gelu_row` (c_proj's x history) defined, the pass also
// casts gelu(pre)ᵀ as the forward's cast did (same scale, same bits; not recorded). nullopt elsewhere
// (current scaling, the first step, the CPU, fp32, other shapes), for the caller to take the steps.
std::optional<GeluBackwardFp8> gelu_backward_to_fp8(const at::Tensor& dh, const at::Tensor& pre, const at::Tensor& row,
                                                    bool use_history, bool record, const at::Tensor& gelu_row) {
#ifdef GPT2_WITH_CUDA
  auto aligned = [](const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; };
  if (!row.defined() || !use_history || !dh.is_cuda() ||
      (dh.scalar_type() != at::kBFloat16 && dh.scalar_type() != at::kHalf) || dh.dim() != 2 || dh.size(0) % 16 != 0 ||
      dh.size(1) % 8 != 0 || !dh.is_contiguous() || !pre.is_contiguous() || pre.sizes() != dh.sizes() ||
      pre.scalar_type() != dh.scalar_type() || !aligned(dh) || !aligned(pre)) {
    return std::nullopt;
  }
  at::NoGradGuard no_grad;
  const int64_t rows = dh.size(0), cols = dh.size(1);
  auto fp8_pair = [&](at::ScalarType format) {  // a transposed cast's bytes and its scale
    return Fp8Tensor{at::empty({cols, rows}, dh.options().dtype(format)),
                     at::empty({}, dh.options().dtype(at::kFloat))};
  };
  GeluBackwardFp8 out;
  out.d8_t = fp8_pair(at::kFloat8_e5m2);
  out.d8 = {at::empty({rows, cols}, dh.options().dtype(at::kFloat8_e5m2)), out.d8_t.scale_inv};
  out.dbias = at::empty({cols}, dh.options());
  at::Tensor partial = at::empty({column_sum_chunks(rows) * cols}, dh.options().dtype(at::kFloat));
  const Fp8CastArgs args = history_cast_args(rows, cols, at::kFloat8_e5m2, row, record, out.d8_t, out.d8.data);
  Fp8CastArgs gelu_args{};
  if (gelu_row.defined()) {
    out.h8_t = fp8_pair(at::kFloat8_e4m3fn);
    gelu_args = history_cast_args(rows, cols, at::kFloat8_e4m3fn, gelu_row, false, out.h8_t, at::Tensor(), true);
  }
  CUDA_CHECK(launch_gelu_backward_fp8(dtype_of(dh, "kernels::fp8_mlp"), dh.data_ptr(), pre.data_ptr(), rows, cols, args,
                                      partial.data_ptr<float>(), out.dbias.data_ptr(), stream_of(dh),
                                      gelu_row.defined() ? &gelu_args : nullptr));
  return out;
#else
  (void)dh, (void)pre, (void)row, (void)use_history, (void)record, (void)gelu_row;
  return std::nullopt;
#endif
}

// c_proj(gelu_tanh(c_fc(x))) in FP8 (fp8_mlp): forward the casts and products of fp8_linear then
// fp8_gelu_linear; backward from what forward kept: x8ᵀ (c_fc's dw operand), pre (GELU's backward)
// and, with keep_gelu, gelu(pre)8ᵀ (c_proj's dw operand; without, backward casts it from pre again,
// with the forward's scale and so its bits), and the GELU backward with c_fc's bias gradient in one
// pass (linear.h's gelu_and_bias_backward).
class Fp8MlpFunction : public torch::autograd::Function<Fp8MlpFunction> {
 public:
  // Layer 0's (c_fc) or 1's (c_proj) history row `what` (0 x, 1 w, 2 gy); undefined for current scaling.
  static at::Tensor history_row(const at::Tensor& fc_amax, const at::Tensor& proj_amax, int layer, int what) {
    return fc_amax.numel() > 0 ? (layer == 0 ? fc_amax : proj_amax)[what] : at::Tensor();
  }
  // `fc_amax`, `proj_amax`: the layers' (3, L) histories (Fp8DelayedScaling), or no elements: current scaling.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& fc_w,
                               const torch::Tensor& fc_b, const torch::Tensor& proj_w, const torch::Tensor& proj_b,
                               const torch::Tensor& fc_amax, const torch::Tensor& proj_amax, bool use_history,
                               bool record, bool keep_gelu) {
    auto row = [&](int layer, int what) { return history_row(fc_amax, proj_amax, layer, what); };
    const at::Tensor x2 = x.reshape({-1, x.size(-1)});
    const auto [x8, x8_t] = cast(x2, at::kFloat8_e4m3fn, Fp8Layout::kBoth, row(0, 0), use_history, record);
    const Fp8Tensor fc_w8 = cast(fc_w, at::kFloat8_e4m3fn, Fp8Layout::kRows, row(0, 1), use_history, record).first;
    const at::Tensor pre = fp8_gemm_nt(x8, fc_w8, x.scalar_type(), fc_b);
    const auto [h8, h8_t] = cast(pre, at::kFloat8_e4m3fn, keep_gelu ? Fp8Layout::kBoth : Fp8Layout::kRows, row(1, 0),
                                 use_history, record, /*gelu=*/true);
    const Fp8Tensor proj_w8 = cast(proj_w, at::kFloat8_e4m3fn, Fp8Layout::kRows, row(1, 1), use_history, record).first;
    const at::Tensor y = fp8_gemm_nt(h8, proj_w8, x.scalar_type(), proj_b);
    ctx->save_for_backward(
        {x8_t.data, x8_t.scale_inv, pre, h8_t.data, h8_t.scale_inv, fc_w, proj_w});  // h8_t: maybe none
    // Not saved for backward: the backward's casts write into them, which a saved tensor may not see.
    ctx->saved_data["fc_amax"] = fc_amax;
    ctx->saved_data["proj_amax"] = proj_amax;
    ctx->saved_data["use_history"] = use_history;
    ctx->saved_data["record"] = record;
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = proj_w.size(0);
    return y.view(shape);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &pre = saved[2], &fc_w = saved[5], &proj_w = saved[6];
    const at::Tensor fc_amax = ctx->saved_data["fc_amax"].toTensor(),
                     proj_amax = ctx->saved_data["proj_amax"].toTensor();
    const bool use_history = ctx->saved_data["use_history"].toBool();
    const bool record = ctx->saved_data["record"].toBool();
    auto row = [&](int layer, int what) { return history_row(fc_amax, proj_amax, layer, what); };
    const Fp8Tensor x8_t{saved[0], saved[1]};
    const at::Tensor gy = grads[0].reshape({-1, proj_w.size(0)}).contiguous();
    const at::ScalarType dtype = gy.scalar_type();
    // c_proj: its output gradient cast once for both products, its weight's transpose cast again.
    const auto [g8, g8_t] = cast(gy, at::kFloat8_e5m2, Fp8Layout::kBoth, row(1, 2), use_history, record);
    const Fp8Tensor proj_w8_t = cast(proj_w, at::kFloat8_e4m3fn, Fp8Layout::kTranspose, row(1, 1), use_history).second;
    const at::Tensor dh = fp8_gemm_nt(g8, proj_w8_t, dtype);  // (M, 4C)
    const at::Tensor dproj_b = bias_grad(gy);
    // c_fc's GELU backward and bias gradient in one pass; where forward did not keep gelu(pre)8ᵀ, the
    // same pass casts it again from pre, with the forward's scale (a history fixed for the step), so
    // the same bits; else (the composition) the forward's cast again, not recorded a second time.
    const bool kept = saved[3].defined();
    Fp8Tensor d8, d8_t, h8_t = kept ? Fp8Tensor{saved[3], saved[4]} : Fp8Tensor{};
    at::Tensor dfc_b;
    if (auto fused = gelu_backward_to_fp8(dh, pre, row(0, 2), use_history, record, kept ? at::Tensor() : row(1, 0))) {
      d8 = fused->d8, d8_t = fused->d8_t, dfc_b = fused->dbias;  // dpre never stored in bf16
      if (!kept) h8_t = fused->h8_t;
    } else {
      at::Tensor dpre;
      std::tie(dpre, dfc_b) = gelu_and_bias_backward(dh, pre);
      std::tie(d8, d8_t) = cast(dpre, at::kFloat8_e5m2, Fp8Layout::kBoth, row(0, 2), use_history, record);
      if (!kept) {
        h8_t =
            cast(pre, at::kFloat8_e4m3fn, Fp8Layout::kTranspose, row(1, 0), use_history, false, /*gelu=*/true).second;
      }
    }
    const at::Tensor dproj_w = fp8_gemm_nt(g8_t, h8_t, dtype);
    const Fp8Tensor fc_w8_t = cast(fc_w, at::kFloat8_e4m3fn, Fp8Layout::kTranspose, row(0, 1), use_history).second;
    const at::Tensor dx = fp8_gemm_nt(d8, fc_w8_t, dtype);  // (M, C)
    const at::Tensor dfc_w = fp8_gemm_nt(d8_t, x8_t, dtype);
    std::vector<int64_t> x_shape = grads[0].sizes().vec();
    x_shape.back() = fc_w.size(1);
    return {dx.view(x_shape), dfc_w,        dfc_b,        dproj_w,      dproj_b,
            at::Tensor(),     at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The stride between consecutive rows of g viewed as (rows, g.size(-1)) without a copy: its
// leading dims merge and its last is unit-strided; nullopt otherwise.
std::optional<int64_t> row_stride_of(const at::Tensor& g) {
  if (g.dim() < 2 || g.stride(-1) != 1) return std::nullopt;
  int64_t stride = g.stride(-2), span = g.size(-2);  // the rows merged so far and their stride
  for (int64_t d = g.dim() - 3; d >= 0; --d) {
    if (g.size(d) != 1 && g.stride(d) != stride * span) return std::nullopt;
    span *= g.size(d);
  }
  return stride;
}

// The q/k/v projection's output gradient, given as its three parts (each (..., c) in one 16-bit
// dtype on CUDA, rows x c), cast to e5m2 (rows and transpose) with its column sums (the bias
// gradient) in one pass (launch_parts_fp8: the bits of cat, cast and bias_grad in turn), where a
// history fixes the scale before the gradient exists; nullopt elsewhere, for the caller's steps.
std::optional<std::tuple<Fp8Tensor, Fp8Tensor, at::Tensor>> parts_to_fp8(const torch::autograd::variable_list& parts,
                                                                         int64_t rows, int64_t c, const at::Tensor& row,
                                                                         bool use_history, bool record) {
#ifdef GPT2_WITH_CUDA
  if (!row.defined() || !use_history || parts.size() != 3 || c % 8 != 0) return std::nullopt;
  const void* ptrs[3];
  int64_t strides[3];
  for (int i = 0; i < 3; ++i) {
    const at::Tensor& g = parts[i];
    if (!g.defined() || !g.is_cuda() || g.scalar_type() != parts[0].scalar_type() ||
        (g.scalar_type() != at::kBFloat16 && g.scalar_type() != at::kHalf) || g.numel() != rows * c ||
        g.size(-1) != c) {
      return std::nullopt;
    }
    const auto stride = row_stride_of(g);
    if (!stride || *stride % 8 != 0 || reinterpret_cast<uintptr_t>(g.data_ptr()) % 16 != 0) return std::nullopt;
    ptrs[i] = g.data_ptr();
    strides[i] = *stride;
  }
  at::NoGradGuard no_grad;
  const auto opts = parts[0].options();
  const Fp8Tensor g8{at::empty({rows, 3 * c}, opts.dtype(at::kFloat8_e5m2)), at::empty({}, opts.dtype(at::kFloat))};
  const Fp8Tensor g8_t{at::empty({3 * c, rows}, opts.dtype(at::kFloat8_e5m2)), g8.scale_inv};
  at::Tensor dbias = at::empty({3 * c}, opts);
  at::Tensor partial = at::empty({column_sum_chunks(rows) * 3 * c}, opts.dtype(at::kFloat));
  const Fp8CastArgs args = history_cast_args(rows, 3 * c, at::kFloat8_e5m2, row, record, g8_t, g8.data);
  CUDA_CHECK(launch_parts_fp8(dtype_of(parts[0], "kernels::fp8_qkv_linear"), ptrs, strides, rows, c, args,
                              partial.data_ptr<float>(), dbias.data_ptr(), stream_of(parts[0])));
  return std::make_tuple(g8, g8_t, dbias);
#else
  (void)parts, (void)rows, (void)c, (void)row, (void)use_history, (void)record;
  return std::nullopt;
#endif
}

// fp8_linear(x, w, bias).split(N / 3, -1) as one node with three outputs (fp8_qkv_linear): forward
// fp8_linear's casts and product; backward takes the three output gradients as they come (never
// concatenated in bf16 on CUDA with a history: parts_to_fp8), then fp8_linear's two products.
class Fp8QkvFunction : public torch::autograd::Function<Fp8QkvFunction> {
 public:
  // `amax`: (3, L) histories of x, w and gy, or no elements: current scaling (as Fp8LinearFunction).
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& w, const torch::Tensor& bias,
                                                const torch::Tensor& amax, bool use_history, bool record) {
    const bool delayed = amax.numel() > 0;
    const int64_t k = x.size(-1), c = w.size(0) / 3;
    const at::Tensor x2 = x.reshape({-1, k});
    const auto [x8, x8_t] =
        cast(x2, at::kFloat8_e4m3fn, Fp8Layout::kBoth, delayed ? amax[0] : at::Tensor(), use_history, record);
    const Fp8Tensor w8 =
        cast(w, at::kFloat8_e4m3fn, Fp8Layout::kRows, delayed ? amax[1] : at::Tensor(), use_history, record).first;
    const at::Tensor y = fp8_gemm_nt(x8, w8, x.scalar_type(), bias);  // (M, 3C)
    ctx->save_for_backward({x8_t.data, x8_t.scale_inv, w});
    // Not saved for backward: the backward's cast writes into it, which a saved tensor may not see.
    ctx->saved_data["amax"] = amax;
    ctx->saved_data["use_history"] = use_history;
    ctx->saved_data["record"] = record;
    ctx->saved_data["x_shape"] = x.sizes().vec();
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = c;
    return {y.narrow(1, 0, c).view(shape), y.narrow(1, c, c).view(shape), y.narrow(1, 2 * c, c).view(shape)};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Fp8Tensor x8_t{saved[0], saved[1]};
    const at::Tensor& w = saved[2];
    const int64_t rows = x8_t.data.size(1), c = w.size(0) / 3;
    const at::Tensor amax = ctx->saved_data["amax"].toTensor();
    const bool delayed = amax.numel() > 0, use_history = ctx->saved_data["use_history"].toBool();
    const bool record = ctx->saved_data["record"].toBool();
    Fp8Tensor g8, g8_t;
    at::Tensor db;
    if (auto fused = parts_to_fp8(grads, rows, c, delayed ? amax[2] : at::Tensor(), use_history, record)) {
      std::tie(g8, g8_t, db) = *fused;
    } else {  // the composition: autograd's split backward (zeros for an unused part), then fp8_linear's
      std::vector<at::Tensor> parts;
      for (int i = 0; i < 3; ++i) {
        const at::Tensor& g = grads[i];
        parts.push_back(g.defined() ? g.reshape({rows, c}) : at::zeros({rows, c}, w.options()));
      }
      const at::Tensor gy = at::cat(parts, 1);
      std::tie(g8, g8_t) =
          cast(gy, at::kFloat8_e5m2, Fp8Layout::kBoth, delayed ? amax[2] : at::Tensor(), use_history, record);
      db = bias_grad(gy);
    }
    const Fp8Tensor w8_t =
        cast(w, at::kFloat8_e4m3fn, Fp8Layout::kTranspose, delayed ? amax[1] : at::Tensor(), use_history).second;
    const at::Tensor dx = fp8_gemm_nt(g8, w8_t, w.scalar_type());  // (M, K)
    const at::Tensor dw = fp8_gemm_nt(g8_t, x8_t, w.scalar_type());
    return {dx.view(ctx->saved_data["x_shape"].toIntVector()), dw, db, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// fp8_linear's checks of one layer: x's dtype and device, `rows` x `k` the layer's input, w (N, K),
// bias (N) if any, the histories; a gpt2::Error naming `who` where one fails.
void check_fp8_layer(const std::string& who, const torch::Tensor& x, int64_t rows, int64_t k, const torch::Tensor& w,
                     const torch::Tensor& bias, const Fp8DelayedScaling* delayed) {
  GPT2_ASSERT(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat,
              who + ": x must be bf16 or fp32 (the FP8 GEMM's outputs)");
  GPT2_ASSERT(w.dim() == 2 && k == w.size(1) && w.scalar_type() == x.scalar_type(),
              who + ": w must be (N, K) in x's dtype");
  GPT2_ASSERT(!bias.defined() || (bias.numel() == w.size(0) && bias.scalar_type() == x.scalar_type()),
              who + ": bias must be (N) in x's dtype");
  GPT2_ASSERT(k % 16 == 0 && w.size(0) % 16 == 0 && rows % 16 == 0 && rows > 0,
              who + ": K, N and x's rows must be multiples of 16 (rows at least 16)");
  if (delayed) {
    const at::Tensor& h = delayed->amax;
    GPT2_ASSERT(h.dim() == 2 && h.size(0) == 3 && h.size(1) >= 2 && h.scalar_type() == at::kFloat &&
                    h.is_contiguous() && h.device() == x.device(),
                who + ": the amax histories are (3, L >= 2) contiguous fp32 on x's device");
  }
}

int64_t rows_of(const torch::Tensor& x) { return x.numel() / std::max<int64_t>(1, x.size(-1)); }

// The histories a node takes: a layer's (3, L), or no elements for current scaling.
at::Tensor histories(const Fp8DelayedScaling* delayed, const torch::Tensor& x) {
  return delayed ? delayed->amax : at::empty({0}, x.options().dtype(at::kFloat));
}

// fp8_linear's checks and the node, for x or (gelu) gelu_tanh(x).
torch::Tensor apply_fp8_linear(const char* who, const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& bias, const Fp8DelayedScaling* delayed, bool gelu) {
  check_fp8_layer(who, x, rows_of(x), x.size(-1), w, bias, delayed);
  return Fp8LinearFunction::apply(x.contiguous(), w.contiguous(), bias.defined() ? bias : at::empty({0}, x.options()),
                                  histories(delayed, x), delayed && delayed->use_history,
                                  /*record=*/delayed && at::GradMode::is_enabled(), gelu);
}

}  // namespace

torch::Tensor fp8_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias,
                         const Fp8DelayedScaling* delayed) {
  return apply_fp8_linear("fp8_linear", x, w, bias, delayed, /*gelu=*/false);
}

torch::Tensor fp8_gelu_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias,
                              const Fp8DelayedScaling* delayed) {
  return apply_fp8_linear("fp8_gelu_linear", x, w, bias, delayed, /*gelu=*/true);
}

std::vector<torch::Tensor> fp8_qkv_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias,
                                          const Fp8DelayedScaling* delayed) {
  check_fp8_layer("fp8_qkv_linear", x, rows_of(x), x.size(-1), w, bias, delayed);
  GPT2_ASSERT(w.size(0) % 3 == 0 && bias.defined(), "fp8_qkv_linear: w's rows are three equal parts, with a bias");
  return Fp8QkvFunction::apply(x.contiguous(), w.contiguous(), bias, histories(delayed, x),
                               delayed && delayed->use_history, /*record=*/delayed && at::GradMode::is_enabled());
}

torch::Tensor fp8_mlp(const torch::Tensor& x, const torch::Tensor& fc_w, const torch::Tensor& fc_b,
                      const torch::Tensor& proj_w, const torch::Tensor& proj_b, const Fp8DelayedScaling* fc_delayed,
                      const Fp8DelayedScaling* proj_delayed, bool keep_gelu_output) {
  GPT2_ASSERT((fc_delayed == nullptr) == (proj_delayed == nullptr) &&
                  (fc_delayed == nullptr || fc_delayed->use_history == proj_delayed->use_history),
              "fp8_mlp: both layers scale alike (current, or delayed with or without their histories)");
  GPT2_ASSERT(fc_b.defined() && proj_b.defined(), "fp8_mlp: both layers have a bias");
  check_fp8_layer("fp8_mlp (c_fc)", x, rows_of(x), x.size(-1), fc_w, fc_b, fc_delayed);
  check_fp8_layer("fp8_mlp (c_proj)", x, rows_of(x), fc_w.size(0), proj_w, proj_b, proj_delayed);
  return Fp8MlpFunction::apply(x.contiguous(), fc_w.contiguous(), fc_b, proj_w.contiguous(), proj_b,
                               histories(fc_delayed, x), histories(proj_delayed, x),
                               fc_delayed && fc_delayed->use_history,
                               /*record=*/fc_delayed && at::GradMode::is_enabled(), keep_gelu_output);
}

}  // namespace gpt2::kernels
