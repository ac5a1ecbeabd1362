// Kernel timings on the GPU: the residual LayerNorm's forward and backward (launch.h) for
// gpt2-124m's and gpt2-1558m's activations in bf16, with the bandwidth the bytes each call must
// move make (an H200 streams about 4.8 TB/s). Correctness lives in tests/kernels.
//   build-gpu/bin/kernel_bench
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/torch.h>

#include <cstdio>
#include <exception>
#include <functional>

#include "src/base/cuda_check.h"
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

}  // namespace

int main() try {
  if (!torch::cuda::is_available()) {
    std::printf("kernel_bench: needs a CUDA device\n");
    return 0;
  }
  layer_norm(32 * 1024, 768);  // gpt2-124m, B=32
  layer_norm(8 * 1024, 1600);  // gpt2-1558m, B=8
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "kernel_bench: %s\n", e.what());
  return 1;
}
