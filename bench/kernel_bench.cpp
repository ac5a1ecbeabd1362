// Kernel timings on the GPU: GPT-2's training GEMMs under train.gemm_tuning (gemm.h), the GELU
// backward with its bias gradient, the loss kernels, the residual LayerNorm's forward and backward
// (launch.h) for gpt2-124m's and gpt2-1558m's activations in bf16, and the AdamW update of
// gpt2-1558m's 1.56B parameters: ATen's fused AdamW + the bf16 copy, ours with 8-bit moments
// (moments_8bit.h) and ours with fp32 moments and bf16 gradients (what ShardedOptimizer runs on one
// GPU), with the bandwidth the bytes each call must move make (an H200 streams about 4.8 TB/s).
// `fp8`: the blocks' GEMMs in FP8 (fp8_gemm.h: e4m3 x e4m3 forward, e5m2 x e4m3 backward) against
// the tuned bf16 ones, and a per-tensor cast, the ceiling issue 40 works under.
// `fp8_passes`: the FP8 training's memory-bound passes (GELU backward, q/k/v gradient, casts).
// `decode`: one batch-1 decode step's pieces per layer (slot attention over a context, the four
// linear layers in bf16 and int8, a LayerNorm), each against the time its bytes take at 4.8 TB/s:
// where gpt2-generate's milliseconds a token go (issue 41). `decode_step`: the whole step as one
// kernel against five kernels a block, and the one kernel's time per phase (its trace).
// `decode_kernels`: what each of the five kernels a block adds to the step (Kineto's trace).
// Correctness lives in tests/kernels and tests/optim.
//   build-gpu/bin/kernel_bench [passes | fp8 | fp8_passes | decode | decode_step | decode_rows | decode_kernels]
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/torch.h>

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <deque>
#include <exception>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "optim/adamw_step.h"
#include "optim/moments_8bit.h"
#include "src/base/cuda_check.h"
#include "src/kernels/decode_step.h"
#include "src/kernels/fp8_gemm.h"
#include "src/kernels/gemm.h"
#include "src/kernels/int8_linear.h"
#include "src/kernels/launch.h"
#include "src/kernels/slot_attention.h"
#include "tests/optim/host_buffers.h"

namespace {

// Mean milliseconds per call of fn over `iters` calls after a warm-up.
double time_ms(const std::function<void()>& fn, int iters = 50) {
  fn();
  const auto stream = c10::cuda::getCurrentCUDAStream();
  at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);  // timing events
  start.record(stream);
  for (int i = 0; i < iters; ++i) fn();
  stop.record(stream);
  stop.synchronize();
  return start.elapsed_time(stop) / iters;
}

void layer_norm(int64_t rows, int64_t cols) {
  using namespace gpt2::kernels;
  const auto opts = torch::dtype(torch::kBFloat16).device(torch::kCUDA);
  const auto f32 = torch::dtype(torch::kFloat).device(torch::kCUDA);
  auto x = torch::randn({rows, cols}, opts), y = torch::randn({rows, cols}, opts);
  auto w = torch::randn({cols}, opts), b = torch::randn({cols}, opts);
  auto s = torch::empty_like(x), out = torch::empty_like(x);
  auto mean = torch::empty({rows}, f32), rstd = torch::empty({rows}, f32);
  const auto stream = c10::cuda::getCurrentCUDAStream().stream();
  LayerNormArgs fa{x.data_ptr(), w.data_ptr(), b.data_ptr(), rows, cols};
  const double mb = rows * cols * 2 / 1e6;
  const double fwd = time_ms([&] {
    CUDA_CHECK(launch_layer_norm_forward(Dtype::kBF16, fa, 1e-5f, y.data_ptr(), s.data_ptr(), out.data_ptr(),
                                         mean.data_ptr<float>(), rstd.data_ptr<float>(), stream));
  });
  std::printf("LN forward  %6ld x %4ld: %7.1f us  %6.0f GB/s (x, y in; s, out out)\n", static_cast<long>(rows),
              static_cast<long>(cols), fwd * 1e3, 4 * mb / fwd);
  auto dout = torch::randn_like(x), ds = torch::randn_like(x);
  auto partial = torch::empty({2 * layer_norm_backward_blocks(rows) * cols}, f32);
  LayerNormArgs ba{s.data_ptr(), w.data_ptr(), nullptr, rows, cols};
  auto dx = torch::empty_like(x), dw = torch::empty_like(w), db = torch::empty_like(w);
  const double bwd = time_ms([&] {
    CUDA_CHECK(launch_layer_norm_backward(Dtype::kBF16, ba, dout.data_ptr(), ds.data_ptr(), mean.data_ptr<float>(),
                                          rstd.data_ptr<float>(), dx.data_ptr(), partial.data_ptr<float>(),
                                          dw.data_ptr(), db.data_ptr(), stream));
  });
  std::printf("LN backward %6ld x %4ld: %7.1f us  %6.0f GB/s (dout, ds, s in; dx out)\n", static_cast<long>(rows),
              static_cast<long>(cols), bwd * 1e3, 4 * mb / bwd);
}

// The MLP's GELU backward with its bias gradient over (rows, cols) bf16: reads the output gradient
// and the GELU input, writes the input gradient (the fp32 column partials are small).
void gelu_backward(int64_t rows, int64_t cols) {
  using namespace gpt2::kernels;
  const auto opts = torch::dtype(torch::kBFloat16).device(torch::kCUDA);
  auto dout = torch::randn({rows, cols}, opts), pre = torch::randn({rows, cols}, opts) * 2;
  auto dpre = torch::empty_like(dout), dbias = torch::empty({cols}, opts);
  auto partial = torch::empty({column_sum_chunks(rows) * cols}, torch::dtype(torch::kFloat).device(torch::kCUDA));
  const auto stream = c10::cuda::getCurrentCUDAStream().stream();
  const double ms = time_ms(
      [&] {
        CUDA_CHECK(launch_gelu_backward(Dtype::kBF16, dout.data_ptr(), pre.data_ptr(), rows, cols, dpre.data_ptr(),
                                        partial.data_ptr<float>(), dbias.data_ptr(), stream));
      },
      20);
  std::printf("GELU backward + bias %6ld x %4ld: %7.1f us  %6.0f GB/s (dout, pre in; dpre out)\n",
              static_cast<long>(rows), static_cast<long>(cols), ms * 1e3, 3.0 * rows * cols * 2 / 1e9 / ms * 1e3);
}

// The FP8 training passes over gpt2's activations (bf16 in), each against the time its bytes take:
// the GELU backward that writes dpre in e5m2 with its transpose and the bias gradient, keeping the
// GELU output's FP8 transpose from forward or casting it again (memory.recompute_gelu); the q/k/v
// gradient's pass over its three parts; and the delayed-scaling casts with their transposes.
void fp8_passes(const char* name, int64_t rows, int64_t C) {
  using namespace gpt2::kernels;
  const auto opts = torch::dtype(torch::kBFloat16).device(torch::kCUDA);
  const auto f32 = torch::dtype(torch::kFloat).device(torch::kCUDA);
  const auto u8 = torch::dtype(torch::kByte).device(torch::kCUDA);
  const auto stream = c10::cuda::getCurrentCUDAStream().stream();
  const int64_t H = 4 * C;
  auto history = torch::full({16}, 4.0f, f32), amax = torch::zeros({1}, torch::dtype(torch::kInt).device(torch::kCUDA));
  auto scale_inv = torch::empty({2}, f32);
  auto cast = [&](const void* x, int64_t r, int64_t c, bool e5m2, void* out, void* out_t, bool gelu, bool record) {
    return Fp8CastArgs{x,
                       r,
                       c,
                       e5m2,
                       fp8_max(e5m2 ? at::kFloat8_e5m2 : at::kFloat8_e4m3fn),
                       nullptr,
                       history.data_ptr<float>(),
                       history.numel(),
                       record ? reinterpret_cast<unsigned*>(amax.data_ptr<int>()) : nullptr,
                       out,
                       out_t,
                       scale_inv.data_ptr<float>() + (gelu ? 1 : 0),
                       gelu};
  };
  auto report = [&](const char* what, int64_t r, int64_t c, double bytes_per_elem, double ms) {
    std::printf("%s %-34s %6ld x %4ld: %7.1f us  %6.0f GB/s\n", name, what, static_cast<long>(r), static_cast<long>(c),
                ms * 1e3, bytes_per_elem * r * c / 1e9 / ms * 1e3);
  };
  {  // GELU backward: dout, pre in (2 + 2 bytes); dpre and its transpose out (1 + 1), gelu(pre)ᵀ (1) when recast
    auto dout = torch::randn({rows, H}, opts) * 1e-3, pre = torch::randn({rows, H}, opts) * 2;
    auto q = torch::empty({rows, H}, u8), qt = torch::empty({H, rows}, u8), gt = torch::empty({H, rows}, u8);
    auto dbias = torch::empty({H}, opts), partial = torch::empty({column_sum_chunks(rows) * H}, f32);
    const Fp8CastArgs c = cast(nullptr, rows, H, true, q.data_ptr(), qt.data_ptr(), false, true);
    const Fp8CastArgs g = cast(nullptr, rows, H, false, nullptr, gt.data_ptr(), true, false);
    for (const bool recast : {false, true}) {
      const double ms = time_ms(
          [&] {
            CUDA_CHECK(launch_gelu_backward_fp8(Dtype::kBF16, dout.data_ptr(), pre.data_ptr(), rows, H, c,
                                                partial.data_ptr<float>(), dbias.data_ptr(), stream,
                                                recast ? &g : nullptr));
          },
          20);
      report(recast ? "GELU backward -> e5m2, recast gelu" : "GELU backward -> e5m2", rows, H, recast ? 7 : 6, ms);
    }
  }
  {  // the q/k/v gradient: three (rows, C) parts in (2 bytes), e5m2 and its transpose out (1 + 1)
    auto parts = torch::randn({3, rows, C}, opts) * 1e-3;
    auto q = torch::empty({rows, 3 * C}, u8), qt = torch::empty({3 * C, rows}, u8);
    auto dbias = torch::empty({3 * C}, opts), partial = torch::empty({column_sum_chunks(rows) * 3 * C}, f32);
    const void* ptrs[3] = {parts[0].data_ptr(), parts[1].data_ptr(), parts[2].data_ptr()};
    const int64_t strides[3] = {C, C, C};
    const Fp8CastArgs c = cast(nullptr, rows, 3 * C, true, q.data_ptr(), qt.data_ptr(), false, true);
    const double ms = time_ms(
        [&] {
          CUDA_CHECK(launch_parts_fp8(Dtype::kBF16, ptrs, strides, rows, C, c, partial.data_ptr<float>(),
                                      dbias.data_ptr(), stream));
        },
        20);
    report("q/k/v gradient -> e5m2", rows, 3 * C, 4, ms);
  }
  for (const bool gelu : {false, true}) {  // forward casts from a history: x in (2), e4m3 and its transpose out (1 + 1)
    const int64_t c = gelu ? H : C;
    auto x = torch::randn({rows, c}, opts);
    auto q = torch::empty({rows, c}, u8), qt = torch::empty({c, rows}, u8);
    const Fp8CastArgs a = cast(x.data_ptr(), rows, c, false, q.data_ptr(), qt.data_ptr(), gelu, true);
    const double ms = time_ms([&] { CUDA_CHECK(launch_fp8_cast(Dtype::kBF16, a, stream)); }, 20);
    report(gelu ? "cast gelu(x) -> e4m3 + transpose" : "cast x -> e4m3 + transpose", rows, c, 4, ms);
  }
}

// The loss kernels over (rows, 50304) bf16 logits (gpt2's padded vocabulary): forward reads them
// once, backward reads them and writes the gradient over them.
void cross_entropy(int64_t rows) {
  using namespace gpt2::kernels;
  const int64_t Vp = 50304, V = 50257;
  const auto opts = torch::dtype(torch::kBFloat16).device(torch::kCUDA);
  const auto f32 = torch::dtype(torch::kFloat).device(torch::kCUDA);
  auto logits = torch::randn({rows, Vp}, opts) * 3;
  auto targets = torch::randint(0, V, {rows}, torch::dtype(torch::kLong).device(torch::kCUDA));
  auto loss = torch::empty({rows}, f32), lse = torch::empty({rows}, f32), scale = torch::ones({1}, f32);
  auto grad = torch::empty_like(logits);
  const auto stream = c10::cuda::getCurrentCUDAStream().stream();
  const double gb = rows * Vp * 2 / 1e9;
  const double fwd = time_ms(
      [&] {
        CUDA_CHECK(launch_cross_entropy_forward(Dtype::kBF16, logits.data_ptr(), targets.data_ptr<int64_t>(), rows, Vp,
                                                V, -1, loss.data_ptr<float>(), lse.data_ptr<float>(),
                                                BadTargetNote{nullptr, 1}, stream));
      },
      20);
  const double bwd = time_ms(
      [&] {
        CUDA_CHECK(launch_cross_entropy_backward(Dtype::kBF16, logits.data_ptr(), targets.data_ptr<int64_t>(),
                                                 lse.data_ptr<float>(), scale.data_ptr<float>(), rows, Vp, V, -1,
                                                 grad.data_ptr(), stream));
      },
      20);
  std::printf("CE forward  %6ld x %ld: %7.3f ms  %6.0f GB/s\n", static_cast<long>(rows), static_cast<long>(Vp), fwd,
              gb / fwd * 1e3);
  std::printf("CE backward %6ld x %ld: %7.3f ms  %6.0f GB/s\n", static_cast<long>(rows), static_cast<long>(Vp), bwd,
              2 * gb / bwd * 1e3);
}

// One AdamW step over n fp32 masters with fp32 gradients (the accumulated ones) and bf16 parameters.
void adamw_update(int64_t n) {
  using namespace gpt2::optim;
  const auto f32 = torch::dtype(torch::kFloat).device(torch::kCUDA);
  auto master = torch::randn({n}, f32), grad = torch::randn({n}, f32) * 1e-3;
  auto param = master.to(torch::kBFloat16);
  double gb = 0;
  {
    auto m = torch::zeros({n}, f32), v = torch::zeros({n}, f32);
    auto steps = torch::zeros({}, f32);
    const double ms = time_ms(
        [&] {
          at::_fused_adamw_({master}, {grad}, {m}, {v}, {}, {steps}, 1e-4, 0.9, 0.95, 0.1, 1e-8, false, false);
          param.copy_(master);
        },
        10);
    gb = n * (4.0 * 4 + 3 * 4 + 4 + 2) / 1e9;  // master, grad, m, v in; master, m, v out; the copy
    std::printf("AdamW fp32 moments  %ld values: %7.2f ms  %6.0f GB/s\n", static_cast<long>(n), ms, gb / ms * 1e3);
  }
  const auto u8 = torch::dtype(torch::kUInt8).device(torch::kCUDA);
  const auto blocks = contiguous_blocks(n, true);
  auto blocks_device = bytes_on_gpu(blocks.data(), blocks.size());
  auto tables = bytes_on_gpu(&quant_tables(), 1);
  const int64_t nb = static_cast<int64_t>(blocks.size());
  auto m_codes = torch::full({n}, 128, u8), v_codes = torch::zeros({n}, u8);
  auto m_absmax = torch::zeros({nb}, f32), v_absmax = torch::zeros({nb}, f32);
  CpuAdamWStep st;
  st.lr = 1e-4;
  st.weight_decay = 0.1;
  st.step = 3;
  AdamWStepArgs a;
  a.tables = reinterpret_cast<const QuantTables*>(tables.data_ptr<uint8_t>());
  a.c = adamw_coeffs(st);
  a.blocks = reinterpret_cast<const MomentBlock*>(blocks_device.data_ptr<uint8_t>());
  a.num_blocks = nb;
  a.param = master.data_ptr<float>();
  a.moments.exp_avg_codes = m_codes.data_ptr<uint8_t>();
  a.moments.exp_avg_sq_codes = v_codes.data_ptr<uint8_t>();
  a.moments.exp_avg_absmax = m_absmax.data_ptr<float>();
  a.moments.exp_avg_sq_absmax = v_absmax.data_ptr<float>();
  a.grad = grad.data_ptr();
  a.param_bf16 = static_cast<uint16_t*>(param.data_ptr());
  const double ms = time_ms([&] { CUDA_CHECK(adamw_step_gpu(a, c10::cuda::getCurrentCUDAStream().stream())); }, 10);
  gb = n * (4.0 + 4 + 2 + 4 + 2 + 2) / 1e9;  // master, grad, codes in; master, codes, bf16 out
  std::printf("AdamW 8-bit moments %ld values: %7.2f ms  %6.0f GB/s\n", static_cast<long>(n), ms, gb / ms * 1e3);
  // What ShardedOptimizer runs on one GPU: the same kernel over dense fp32 moments, bf16 gradients.
  m_codes = v_codes = torch::Tensor();
  auto m = torch::zeros({n}, f32), v = torch::zeros({n}, f32), grad16 = grad.to(torch::kBFloat16);
  const auto dense = dense_fp32_blocks({ParamSpan{0, n, true}});
  auto dense_device = bytes_on_gpu(dense.data(), dense.size());
  a.tables = nullptr;
  a.blocks = reinterpret_cast<const MomentBlock*>(dense_device.data_ptr<uint8_t>());
  a.num_blocks = static_cast<int64_t>(dense.size());
  a.moments = MomentBuffers{};
  a.moments.exp_avg = m.data_ptr<float>();
  a.moments.exp_avg_sq = v.data_ptr<float>();
  a.grad = grad16.data_ptr();
  a.grad_type = HostGradType::kBFloat16;
  const double dense_ms =
      time_ms([&] { CUDA_CHECK(adamw_step_gpu(a, c10::cuda::getCurrentCUDAStream().stream())); }, 10);
  gb = n * 28.0 / 1e9;  // master, m, v in and out (24), bf16 grad in, bf16 parameters out
  std::printf("AdamW fp32 moments, bf16 grads (ours) %ld values: %7.2f ms  %6.0f GB/s\n", static_cast<long>(n),
              dense_ms, gb / dense_ms * 1e3);
}

// Each training GEMM of a GPT-2 step (tokens M, width C, padded vocabulary V) timed as
// train.gemm_tuning times it: ATen's, cuBLASLt's first choice, the fastest candidate; and what
// the fastest saves per step (n_layer blocks, one head).
void gemms(const char* name, int64_t M, int64_t C, int64_t layers, int64_t V = 50304) {
  const auto opts = torch::dtype(torch::kBFloat16).device(torch::kCUDA);
  struct Product {
    const char* what;
    int64_t rows, inner, cols;  // d (rows, cols) = a (rows, inner) b (inner, cols)
    bool a_t, b_t;              // a / b stored transposed (the .t() of a contiguous buffer)
    bool bias;
    int64_t per_step;
  };
  const Product products[] = {
      {"qkv fwd", M, C, 3 * C, false, true, true, layers},
      {"attn proj fwd", M, C, C, false, true, true, layers},
      {"mlp proj fwd", M, 4 * C, C, false, true, true, layers},
      {"head fwd", M, C, V, false, true, false, 1},
      {"qkv dx", M, 3 * C, C, false, false, false, layers},
      {"attn proj dx", M, C, C, false, false, false, layers},
      {"fc dx", M, 4 * C, C, false, false, false, layers},
      {"mlp proj dx", M, C, 4 * C, false, false, false, layers},
      {"head dx", M, V, C, false, false, false, 1},
      {"qkv dw", 3 * C, M, C, true, false, false, layers},
      {"attn proj dw", C, M, C, true, false, false, layers},
      {"fc dw", 4 * C, M, C, true, false, false, layers},
      {"mlp proj dw", C, M, 4 * C, true, false, false, layers},
      {"head dw", V, M, C, true, false, false, 1},
  };
  double aten_total = 0, best_total = 0;
  std::printf("GEMMs of %s (M=%ld tokens, C=%ld, %ld layers), ms: aten / lt0 / best (which, of how many)\n", name,
              static_cast<long>(M), static_cast<long>(C), static_cast<long>(layers));
  for (const Product& p : products) {
    auto a = p.a_t ? torch::randn({p.inner, p.rows}, opts).t() : torch::randn({p.rows, p.inner}, opts);
    auto b = p.b_t ? torch::randn({p.cols, p.inner}, opts).t() : torch::randn({p.inner, p.cols}, opts);
    auto bias = p.bias ? torch::randn({p.cols}, opts) : torch::Tensor();
    const auto times = gpt2::kernels::time_gemm_candidates(a, b, bias);
    size_t best = 0;
    for (size_t i = 1; i < times.size(); ++i) {
      if (times[i].ms < times[best].ms) best = i;
    }
    const double tflops = 2.0 * p.rows * p.inner * p.cols / (times[best].ms * 1e9);
    std::printf("  %-14s %6.3f / %6.3f / %6.3f (%s of %zu) %4.0f TFLOP/s x%ld\n", p.what, times[0].ms,
                times.size() > 1 ? times[1].ms : 0.0, times[best].ms, times[best].name.c_str(), times.size(), tflops,
                static_cast<long>(p.per_step));
    aten_total += times[0].ms * p.per_step;
    best_total += times[best].ms * p.per_step;
  }
  std::printf("  per step: aten %.2f ms, tuned %.2f ms (%.2f ms less)\n", aten_total, best_total,
              aten_total - best_total);
}

// The cast kernels alone on preallocated buffers (no allocation, no host work between launches),
// against a device copy of x (one read and one write of its bytes: what this GPU's memory does):
// tells a kernel's own time from the calls' host overhead in the line before.
void fp8_cast_kernels_alone(const torch::Tensor& x) {
  using namespace gpt2::kernels;
  const auto stream = c10::cuda::getCurrentCUDAStream().stream();
  const int64_t rows = x.size(0), cols = x.size(1);
  const auto f32 = torch::dtype(torch::kFloat).device(torch::kCUDA);
  auto out = torch::empty({rows, cols}, x.options().dtype(at::kFloat8_e4m3fn));
  auto out_t = torch::empty({cols, rows}, x.options().dtype(at::kFloat8_e4m3fn));
  auto copy = torch::empty_like(x);
  auto amax = torch::zeros({1}, f32.dtype(torch::kInt));
  auto history = torch::full({16}, 4.0f, f32);
  auto scale_inv = torch::empty({}, f32);
  auto* bits = reinterpret_cast<unsigned*>(amax.data_ptr<int32_t>());
  const Fp8CastArgs rows_only{x.data_ptr(), rows, cols,    false,          448.0f,  bits,
                              nullptr,      0,    nullptr, out.data_ptr(), nullptr, scale_inv.data_ptr<float>(),
                              false};
  Fp8CastArgs both = rows_only, delayed = rows_only;
  both.out_t = delayed.out_t = out_t.data_ptr();
  delayed.amax_bits = nullptr;
  delayed.history = history.data_ptr<float>();
  delayed.history_len = history.numel();
  const double copy_ms = time_ms([&] {
    CUDA_CHECK(cudaMemcpyAsync(copy.data_ptr(), x.data_ptr(), x.nbytes(), cudaMemcpyDeviceToDevice, stream));
  });
  const double amax_ms =
      time_ms([&] { CUDA_CHECK(launch_fp8_amax(Dtype::kBF16, x.data_ptr(), x.numel(), bits, stream)); });
  const double rows_ms = time_ms([&] { CUDA_CHECK(launch_fp8_cast(Dtype::kBF16, rows_only, stream)); });
  const double both_ms = time_ms([&] { CUDA_CHECK(launch_fp8_cast(Dtype::kBF16, both, stream)); });
  const double delayed_ms = time_ms([&] { CUDA_CHECK(launch_fp8_cast(Dtype::kBF16, delayed, stream)); });
  // The bytes each moves, in x's: the copy 2, amax 1, a cast 1.5, with the transpose 2.
  const double gb = x.nbytes() / 1e6;  // ms -> GB/s
  std::printf(
      "  kernels alone, ms (GB/s): copy of x %.3f (%.0f), amax %.3f (%.0f), cast %.3f (%.0f), cast + transpose %.3f "
      "(%.0f), delayed cast + transpose %.3f (%.0f)\n",
      copy_ms, 2 * gb / copy_ms, amax_ms, gb / amax_ms, rows_ms, 1.5 * gb / rows_ms, both_ms, 2 * gb / both_ms,
      delayed_ms, 2 * gb / delayed_ms);
}

// The blocks' GEMMs of a step as a · bᵀ (rows, inner) x (cols, inner): FP8 (the backward's
// operands already transposed, as a cast kernel would write them) against the fastest bf16
// candidate; then a per-tensor cast of one activation, amax included.
void fp8_gemms(const char* name, int64_t M, int64_t C, int64_t layers) {
  using gpt2::kernels::Fp8Tensor;
  const auto bf16 = torch::dtype(torch::kBFloat16).device(torch::kCUDA);
  struct Product {
    const char* what;
    int64_t rows, inner, cols;
    bool grad;  // a is an output gradient: e5m2
  };
  const Product products[] = {
      {"qkv fwd", M, C, 3 * C, false},      {"attn proj fwd", M, C, C, false},  {"fc fwd", M, C, 4 * C, false},
      {"mlp proj fwd", M, 4 * C, C, false}, {"qkv dx", M, 3 * C, C, true},      {"attn proj dx", M, C, C, true},
      {"fc dx", M, 4 * C, C, true},         {"mlp proj dx", M, C, 4 * C, true}, {"qkv dw", 3 * C, M, C, true},
      {"attn proj dw", C, M, C, true},      {"fc dw", 4 * C, M, C, true},       {"mlp proj dw", C, M, 4 * C, true},
  };
  double fp8_total = 0, bf16_total = 0;
  std::printf("FP8 GEMMs of %s (M=%ld, C=%ld, %ld layers), ms: fp8 / best bf16\n", name, static_cast<long>(M),
              static_cast<long>(C), static_cast<long>(layers));
  const auto one = torch::ones({}, torch::dtype(torch::kFloat).device(torch::kCUDA));
  for (const Product& p : products) {
    const auto a = torch::randn({p.rows, p.inner}, bf16), b = torch::randn({p.cols, p.inner}, bf16);
    const Fp8Tensor a8 = gpt2::kernels::quantize_fp8(a, p.grad ? at::kFloat8_e5m2 : at::kFloat8_e4m3fn, one);
    const Fp8Tensor b8 = gpt2::kernels::quantize_fp8(b, at::kFloat8_e4m3fn, one);
    const double fp8_ms = time_ms([&] { gpt2::kernels::fp8_gemm_nt(a8, b8, at::kBFloat16); }, 20);
    const auto times = gpt2::kernels::time_gemm_candidates(a, b.t(), torch::Tensor());
    double best = times[0].ms;
    for (const auto& t : times) best = std::min(best, t.ms);
    const double flop = 2.0 * p.rows * p.inner * p.cols;
    std::printf("  %-14s %6.3f / %6.3f  %4.0f / %4.0f TFLOP/s  %.2fx\n", p.what, fp8_ms, best, flop / (fp8_ms * 1e9),
                flop / (best * 1e9), best / fp8_ms);
    fp8_total += fp8_ms * layers;
    bf16_total += best * layers;
  }
  const auto x = torch::randn({M, C}, bf16);
  const double aten_ms = time_ms([&] {
    const auto scale = gpt2::kernels::fp8_scale_for(x.abs().amax(), at::kFloat8_e4m3fn);
    gpt2::kernels::quantize_fp8(x, at::kFloat8_e4m3fn, scale);
  });
  const double ours_ms = time_ms([&] { gpt2::kernels::quantize_fp8_current(x, at::kFloat8_e4m3fn); });
  const double both_ms = time_ms([&] { gpt2::kernels::quantize_fp8_current_and_transpose(x, at::kFloat8_e4m3fn); });
  // Delayed scaling: the scale from a history, the amax recorded in the same pass (one read).
  auto history = torch::zeros({16}, torch::dtype(torch::kFloat).device(torch::kCUDA));
  history.narrow(0, 1, 1).fill_(4.0);
  const double delayed_ms = time_ms(
      [&] { gpt2::kernels::quantize_fp8_delayed_and_transpose(x, at::kFloat8_e4m3fn, history, /*use_history=*/true); });
  const double bytes_ms = (2.0 * 2 + 1) * M * C / 4.8e9;  // two reads of bf16, one fp8 write
  std::printf("  per step: fp8 %.2f ms, bf16 %.2f ms (%.2fx)\n", fp8_total, bf16_total, bf16_total / fp8_total);
  std::printf(
      "  one (M, C) cast with its amax, ms: ATen ops %.3f, ours %.3f, ours + transpose %.3f, delayed + transpose "
      "%.3f (bytes of two reads and a write: %.3f)\n",
      aten_ms, ours_ms, both_ms, delayed_ms, bytes_ms);
  fp8_cast_kernels_alone(x);
}

// One layer of a batch-1 decode step at n_embd C and `heads` heads of 64, `context` positions into
// a 1024-position cache: each piece's microseconds a call (back to back, so launch-bound pieces
// show their launch rate) and the microseconds its bytes take at 4.8 TB/s.
void decode_layer(const char* name, int64_t C, int64_t heads) {
  const auto bf16 = torch::dtype(torch::kBFloat16).device(torch::kCUDA);
  const double tbps = 4.8e12;
  auto us = [](double ms) { return ms * 1000; };
  std::printf("decode step pieces of %s at batch 1 (C=%ld, %ld heads), us a call / us its bytes take\n", name,
              static_cast<long>(C), static_cast<long>(heads));
  const int64_t hs = 64, capacity = 1024;
  const auto keys = torch::randn({1, heads, capacity, hs}, bf16), values = torch::randn({1, heads, capacity, hs}, bf16);
  const auto q = torch::randn({1, heads, 1, hs}, bf16);
  double per_layer = 0, per_layer_int8 = 0;
  for (const int64_t context : {128, 384, 1024}) {
    const auto positions = torch::full({1}, context - 1, torch::dtype(torch::kLong).device(torch::kCUDA));
    const double ms = time_ms([&] { gpt2::kernels::slot_attention(q, keys, values, positions); }, 200);
    const double bytes = 2.0 * heads * context * hs * 2;
    std::printf("  slot attention, %4ld positions %8.1f / %6.1f\n", static_cast<long>(context), us(ms),
                us(bytes / tbps * 1e3));
    if (context == 384) per_layer += ms, per_layer_int8 += ms;  // the bench's middle: 128 + 256 tokens
  }
  const auto x = torch::randn({1, C}, bf16);
  const int64_t shapes[4][2] = {{3 * C, C}, {C, C}, {4 * C, C}, {C, 4 * C}};
  const char* names[4] = {"qkv", "attn proj", "fc", "mlp proj"};
  for (int i = 0; i < 4; ++i) {
    const int64_t n = shapes[i][0], k = shapes[i][1];
    const auto w = torch::randn({n, k}, bf16) * 0.02, bias = torch::randn({n}, bf16);
    const auto in = torch::randn({1, k}, bf16);
    const auto w8 = gpt2::kernels::quantize_int8(w);
    const double ms = time_ms([&] { at::linear(in, w, bias); }, 200);
    const double ms8 = time_ms([&] { gpt2::kernels::int8_linear(in, w8, bias); }, 200);
    std::printf("  %-9s %5ldx%-5ld bf16 %8.1f / %6.1f   int8 %8.1f / %6.1f\n", names[i], static_cast<long>(n),
                static_cast<long>(k), us(ms), us(2.0 * n * k / tbps * 1e3), us(ms8), us((1.0 * n * k) / tbps * 1e3));
    per_layer += ms;
    per_layer_int8 += ms8;
  }
  const auto ln_w = torch::ones({C}, bf16), ln_b = torch::zeros({C}, bf16);
  const double ln_ms = time_ms([&] { at::layer_norm(x, {C}, ln_w, ln_b); }, 200);
  std::printf("  layer norm %8.1f\n", us(ln_ms));
  per_layer += 2 * ln_ms;
  per_layer_int8 += 2 * ln_ms;
  std::printf("  a layer at 384 positions (attention, 4 linears, 2 LayerNorms): bf16 %.1f us, int8 %.1f us\n",
              us(per_layer), us(per_layer_int8));
}

// A decode step's operands at random: `layers` blocks at n_embd C (bf16 or int8 weights), `rows`
// rows each at position 383 of a 1024-position cache, the tied head over 50304 tokens.
struct RandomDecodeModel {
  RandomDecodeModel(int64_t layers, int64_t C, int64_t heads, bool int8, int64_t rows) {
    namespace k = gpt2::kernels;
    const auto bf16 = torch::dtype(torch::kBFloat16).device(torch::kCUDA);
    const int64_t capacity = 1024, hs = C / heads;
    const auto weight = [&](int64_t n, int64_t kk) {
      const auto w = torch::randn({n, kk}, bf16) * 0.02, bias = torch::randn({n}, bf16) * 0.02;
      if (!int8) return k::DecodeWeight{w, nullptr, bias};
      quantized.push_back(k::quantize_int8(w));
      return k::DecodeWeight{torch::Tensor(), &quantized.back(), bias};
    };
    const auto norm = [&] { return k::DecodeNorm{torch::ones({C}, bf16), torch::zeros({C}, bf16), 1e-5}; };
    for (int64_t l = 0; l < layers; ++l) {
      stack.push_back({norm(), weight(3 * C, C), weight(C, C), norm(), weight(4 * C, C), weight(C, 4 * C),
                       torch::randn({rows, heads, capacity, hs}, bf16),
                       torch::randn({rows, heads, capacity, hs}, bf16)});
    }
    ln_f = norm();
    w_head = torch::randn({50304, C}, bf16) * 0.02;
    if (int8) head8 = k::quantize_int8(w_head);
    head = {int8 ? torch::Tensor() : w_head, int8 ? &*head8 : nullptr, {}};
    positions = torch::full({rows}, 383, torch::dtype(torch::kLong).device(torch::kCUDA));
    x = torch::randn({rows, C}, bf16);
  }
  // use(graph) with one step captured in `graph`, on the side stream it was captured on.
  template <typename F>
  auto with_graph(gpt2::kernels::OneKernel one, F&& use) {
    const auto side = c10::cuda::getStreamFromPool();
    c10::cuda::CUDAStreamGuard guard(side);
    gpt2::kernels::decode_step(x, stack, ln_f, head, positions, one);  // warm-up, outside the capture
    at::cuda::CUDAGraph graph;
    graph.capture_begin();
    gpt2::kernels::decode_step(x, stack, ln_f, head, positions, one);
    graph.capture_end();
    return use(graph);
  }
  // One step replayed from a CUDA graph, ms.
  double graph_ms(gpt2::kernels::OneKernel one) {
    return with_graph(one, [](at::cuda::CUDAGraph& graph) { return time_ms([&] { graph.replay(); }, 200); });
  }
  std::deque<gpt2::kernels::Int8Weight> quantized;  // DecodeWeight points into it: no reallocation
  std::vector<gpt2::kernels::DecodeLayer> stack;
  gpt2::kernels::DecodeNorm ln_f;
  torch::Tensor w_head, positions, x;
  std::optional<gpt2::kernels::Int8Weight> head8;
  gpt2::kernels::DecodeWeight head;
};

// The bytes a batch-1 step reads, per kind of kernel: qkv, attention (the cache at 384 positions),
// attn proj, fc, mlp proj (one layer each), and the head; weights in bf16 or int8.
std::array<double, 6> decode_bytes(int64_t C, int64_t heads, bool int8) {
  const double w = int8 ? 1.0 : 2.0, cache = 2.0 * 2 * heads * 384 * (C / heads);
  return {3 * C * C * w, cache, C * C * w, 4 * C * C * w, 4 * C * C * w, 50304.0 * C * w};
}

// The whole batch-1 decode step of a model of `layers` blocks at n_embd C (random weights, bf16 or
// int8, 384 positions into a 1024-position cache), replayed from a CUDA graph: one kernel
// (kernels::decode_step, OneKernel::kYes) against five a block, then where the one kernel's time
// goes, per phase kind and from its trace: staging the input rows (a LayerNorm or a copy), the
// columns (or the attention), the wait for the slowest block, and the barrier after it.
void decode_step_breakdown(const char* name, int64_t layers, int64_t C, int64_t heads, bool int8) {
  namespace k = gpt2::kernels;
  RandomDecodeModel m(layers, C, heads, int8, 1);
  if (!k::decode_step_in_one_kernel(m.x, m.stack, m.ln_f, m.head)) {
    std::printf("%s: the one kernel does not apply\n", name);
    return;
  }
  const double one = m.graph_ms(k::OneKernel::kYes), five = m.graph_ms(k::OneKernel::kNo);
  const auto per_kernel = decode_bytes(C, heads, int8);
  const double bytes =
      per_kernel[5] + layers * (per_kernel[0] + per_kernel[1] + per_kernel[2] + per_kernel[3] + per_kernel[4]);
  std::printf(
      "decode step of %s at batch 1, %s weights, 384 positions (graph replay): one kernel %.1f us, "
      "five kernels a block %.1f us; its bytes take %.1f us at 3.35 TB/s\n",
      name, int8 ? "int8" : "bf16", one * 1000, five * 1000, bytes / 3.35e12 * 1e6);
  torch::Tensor trace;
  k::decode_step(m.x, m.stack, m.ln_f, m.head, m.positions, k::OneKernel::kYes, &trace);
  const auto t = trace.to(torch::kCPU).to(torch::kDouble);  // (phases, 3, blocks) ns
  const int64_t phases = t.size(0);
  const char* kinds[6] = {"qkv + ln_1", "attention", "attn proj", "fc + ln_2", "mlp proj", "head + ln_f"};
  double stage[6] = {}, work[6] = {}, slowest[6] = {}, barrier[6] = {};
  int count[6] = {};
  for (int64_t p = 0; p < phases; ++p) {
    const int kind = p == phases - 1 ? 5 : static_cast<int>(p % 5);
    const auto begin = t[p][0], staged = t[p][1], done = t[p][2];
    stage[kind] += (staged - begin).mean().item<double>();
    work[kind] += (done - staged).mean().item<double>();
    slowest[kind] += (done.max() - done.mean()).item<double>();
    if (p + 1 < phases) barrier[kind] += (t[p + 1][0].mean() - done.max()).item<double>();
    ++count[kind];
  }
  std::printf("  %-12s %9s %9s %14s %9s   (us, a phase; mean over blocks)\n", "phase", "staging", "columns",
              "slowest block", "barrier");
  for (int i = 0; i < 6; ++i)
    std::printf("  %-12s %9.2f %9.2f %14.2f %9.2f\n", kinds[i], stage[i] / count[i] / 1e3, work[i] / count[i] / 1e3,
                slowest[i] / count[i] / 1e3, barrier[i] / count[i] / 1e3);
  std::printf("  traced: %.1f us from the first begin to the last done\n",
              (t[phases - 1][2].max() - t[0][0].min()).item<double>() / 1e3);
}

// Where the five-kernel step's time goes (issue 41): its CUDA graph replayed 20 times under the
// Kineto profiler (CUPTI records each kernel of a graph), the kernels of each replay in start order,
// 5 a layer and the head. A kernel's `advance` is its end minus the end of the kernel before it: what
// it adds to the step, the step being their sum (a programmatic dependent starts early, so its own
// duration also holds its wait). Means per kind, in us, against the bytes its weight (or the
// attention's cache) takes at 3.35 TB/s.
void decode_kernels(const char* name, int64_t layers, int64_t C, int64_t heads, bool int8) {
  namespace k = gpt2::kernels;
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  RandomDecodeModel m(layers, C, heads, int8, 1);
  const auto result = m.with_graph(k::OneKernel::kNo, [](at::cuda::CUDAGraph& graph) {
    const auto replay = [&] {
      for (int i = 0; i < 20; ++i) graph.replay();
      torch::cuda::synchronize();
    };
    replay();  // warm
    const std::set<ActivityType> activities{ActivityType::CPU, ActivityType::CUDA};
    const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
    prof::prepareProfiler(config, activities);
    prof::enableProfiler(config, activities);
    replay();
    return prof::disableProfiler();
  });
  std::vector<std::pair<uint64_t, uint64_t>> kernels;  // (start, end) ns
  for (const auto& e : result->events())
    if (e.deviceType() == c10::DeviceType::CUDA && e.name().find("_kernel") != std::string::npos)
      kernels.emplace_back(e.startNs(), e.endNs());
  std::sort(kernels.begin(), kernels.end());
  const int64_t per_step = 5 * layers + 1;
  if (kernels.empty() || kernels.size() % per_step != 0) {
    std::printf("%s %s: %zu kernels traced, not a multiple of %lld a step: no breakdown\n", name,
                int8 ? "int8" : "bf16", kernels.size(), static_cast<long long>(per_step));
    return;
  }
  const int64_t steps = static_cast<int64_t>(kernels.size()) / per_step;
  const char* kinds[6] = {"qkv + ln_1", "attention", "attn proj", "fc + ln_2", "mlp proj", "head + ln_f"};
  const auto bytes = decode_bytes(C, heads, int8);
  double advance[6] = {}, duration[6] = {}, span = 0;
  for (int64_t s = 0; s < steps; ++s) {
    const auto* step = &kernels[s * per_step];
    span += static_cast<double>(step[per_step - 1].second - step[0].first);
    for (int64_t i = 0; i < per_step; ++i) {
      const int kind = i == per_step - 1 ? 5 : static_cast<int>(i % 5);
      const uint64_t before = i == 0 ? step[0].first : step[i - 1].second;
      advance[kind] += static_cast<double>(step[i].second) - static_cast<double>(before);
      duration[kind] += static_cast<double>(step[i].second - step[i].first);
    }
  }
  std::printf("five-kernel decode step of %s, %s weights, 384 positions: %.1f us a replay (%lld traced)\n", name,
              int8 ? "int8" : "bf16", span / steps / 1e3, static_cast<long long>(steps));
  std::printf("  %-12s %9s %9s %9s   (us a kernel, mean)\n", "kernel", "advance", "duration", "bytes");
  for (int i = 0; i < 6; ++i) {
    const double n = static_cast<double>(steps) * (i == 5 ? 1 : layers);
    std::printf("  %-12s %9.2f %9.2f %9.2f\n", kinds[i], advance[i] / n / 1e3, duration[i] / n / 1e3,
                bytes[i] / 3.35e12 * 1e6);
  }
}

// The fused step (five kernels a block) at 1, 2, 4 and 8 rows: how its time grows with the rows
// that gpt2-serve's --max_batch 8 decodes (it runs the slots up to the last busy one).
void decode_rows(const char* name, int64_t layers, int64_t C, int64_t heads, bool int8) {
  std::printf("fused decode step of %s, %s weights, 384 positions (graph replay), us:", name, int8 ? "int8" : "bf16");
  for (const int64_t rows : {1, 2, 4, 8}) {
    RandomDecodeModel m(layers, C, heads, int8, rows);
    std::printf(" %lld rows %.1f%s", static_cast<long long>(rows), m.graph_ms(gpt2::kernels::OneKernel::kNo) * 1000,
                rows < 8 ? "," : "\n");
  }
}

}  // namespace

// kernel_bench [passes | fp8 | fp8_passes | decode | decode_step | decode_rows | decode_kernels]: "passes" leaves out
// the GEMMs and times the memory-bound passes alone; "fp8" times the FP8 GEMMs alone; "decode" a batch-1 decode step's
// pieces.
int main(int argc, char** argv) try {
  if (!torch::cuda::is_available()) {
    std::printf("kernel_bench: needs a CUDA device\n");
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "fp8") {
    fp8_gemms("gpt2-124m B=32", 32 * 1024, 768, 12);
    fp8_gemms("gpt2-1558m B=8", 8 * 1024, 1600, 48);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "fp8_passes") {
    fp8_passes("gpt2-124m B=32", 32 * 1024, 768);
    fp8_passes("gpt2-1558m B=8", 8 * 1024, 1600);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "decode") {
    decode_layer("gpt2-124m", 768, 12);
    decode_layer("gpt2-1558m", 1600, 25);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "decode_rows") {
    for (const bool int8 : {false, true}) {
      decode_rows("gpt2-124m", 12, 768, 12, int8);
      decode_rows("gpt2-1558m", 48, 1600, 25, int8);
    }
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "decode_kernels") {
    for (const bool int8 : {false, true}) {
      decode_kernels("gpt2-124m", 12, 768, 12, int8);
      decode_kernels("gpt2-1558m", 48, 1600, 25, int8);
    }
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "decode_step") {
    for (const bool int8 : {false, true}) {
      decode_step_breakdown("gpt2-124m", 12, 768, 12, int8);
      decode_step_breakdown("gpt2-1558m", 48, 1600, 25, int8);
    }
    return 0;
  }
  if (!(argc > 1 && std::string(argv[1]) == "passes")) {
    gemms("gpt2-124m B=32", 32 * 1024, 768, 12);
    gemms("gpt2-1558m B=8", 8 * 1024, 1600, 48);
  }
  gelu_backward(32 * 1024, 4 * 768);  // gpt2-124m, B=32
  gelu_backward(8 * 1024, 4 * 1600);  // gpt2-1558m, B=8
  cross_entropy(32 * 1024);           // gpt2-124m, B=32
  layer_norm(32 * 1024, 768);         // gpt2-124m, B=32
  layer_norm(8 * 1024, 1600);         // gpt2-1558m, B=8
  adamw_update(1'557'611'200);        // gpt2-1558m's parameters
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "kernel_bench: %s\n", e.what());
  return 1;
}
