// Kernel timings on the GPU: the residual LayerNorm's forward and backward (launch.h) for
// gpt2-124m's and gpt2-1558m's activations in bf16, and the AdamW update of gpt2-1558m's 1.56B
// parameters with fp32 moments (ATen's fused AdamW + the bf16 copy, what ShardedAdamW runs) and
// with 8-bit moments (moments_8bit.h), with the bandwidth the bytes each call must move make (an
// H200 streams about 4.8 TB/s). Correctness lives in tests/kernels and tests/optim.
//   build-gpu/bin/kernel_bench
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/torch.h>

#include <cstdio>
#include <exception>
#include <functional>

#include "src/base/cuda_check.h"
#include "optim/moments_8bit.h"
#include "src/kernels/launch.h"

namespace {

// Mean milliseconds per call of fn over `iters` calls after a warm-up.
double time_ms(const std::function<void()>& fn, int iters = 50) {
  fn();
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  CUDA_CHECK(cudaEventRecord(start, c10::cuda::getCurrentCUDAStream().stream()));
  for (int i = 0; i < iters; ++i) fn();
  CUDA_CHECK(cudaEventRecord(stop, c10::cuda::getCurrentCUDAStream().stream()));
  CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0.0f;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  return ms / iters;
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
    const double ms = time_ms([&] {
      at::_fused_adamw_({master}, {grad}, {m}, {v}, {}, {steps}, 1e-4, 0.9, 0.95, 0.1, 1e-8, false, false);
      param.copy_(master);
    }, 10);
    gb = n * (4.0 * 4 + 3 * 4 + 4 + 2) / 1e9;  // master, grad, m, v in; master, m, v out; the copy
    std::printf("AdamW fp32 moments  %ld values: %7.2f ms  %6.0f GB/s\n", static_cast<long>(n), ms, gb / ms * 1e3);
  }
  const auto u8 = torch::dtype(torch::kUInt8).device(torch::kCUDA);
  const auto blocks = contiguous_blocks(n, true);
  auto blocks_device = torch::from_blob(const_cast<MomentBlock*>(blocks.data()),
                                        {static_cast<int64_t>(blocks.size() * sizeof(MomentBlock))}, torch::kUInt8).to(u8);
  auto tables = torch::from_blob(const_cast<QuantTables*>(&quant_tables()), {static_cast<int64_t>(sizeof(QuantTables))},
                                 torch::kUInt8).to(u8);
  const int64_t nb = static_cast<int64_t>(blocks.size());
  auto m_codes = torch::full({n}, 128, u8), v_codes = torch::zeros({n}, u8);
  auto m_absmax = torch::zeros({nb}, f32), v_absmax = torch::zeros({nb}, f32);
  CpuAdamWStep st;
  st.lr = 1e-4;
  st.weight_decay = 0.1;
  st.step = 3;
  Adamw8bitArgs a;
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
  const double ms = time_ms([&] { CUDA_CHECK(launch_adamw_8bit(a, c10::cuda::getCurrentCUDAStream().stream())); }, 10);
  gb = n * (4.0 + 4 + 2 + 4 + 2 + 2) / 1e9;  // master, grad, codes in; master, codes, bf16 out
  std::printf("AdamW 8-bit moments %ld values: %7.2f ms  %6.0f GB/s\n", static_cast<long>(n), ms, gb / ms * 1e3);
}

}  // namespace

int main() try {
  if (!torch::cuda::is_available()) {
    std::printf("kernel_bench: needs a CUDA device\n");
    return 0;
  }
  layer_norm(32 * 1024, 768);  // gpt2-124m, B=32
  layer_norm(8 * 1024, 1600);  // gpt2-1558m, B=8
  adamw_update(1'557'611'200);  // gpt2-1558m's parameters
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "kernel_bench: %s\n", e.what());
  return 1;
}
