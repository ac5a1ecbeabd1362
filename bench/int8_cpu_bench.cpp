// One decoding row (batch 1) through gpt2-124m's four projections on the CPU: fp32 at::linear,
// our weight-only int8 kernel (src/kernels/int8_linear.h) and FBGEMM's dynamic int8 linear
// (quantized::linear_dynamic, per-channel int8 weights, the activation rounded to 8 bits per
// call), each with its error against the fp32 product (||y - y32|| / ||y32||) on random N(0, 1)
// inputs and N(0, 0.02) weights. Why our kernel over FBGEMM's: the activation rounding.
//   build/bin/int8_cpu_bench [iterations]
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "src/kernels/int8_linear.h"

namespace {

double time_us(const std::function<void()>& fn, int iters) {
  for (int i = 0; i < 10; ++i) fn();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) fn();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
}

c10::IValue call(const char* op, std::vector<c10::IValue> args) {
  const auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(op, "");
  torch::jit::Stack stack(std::move(args));
  handle.callBoxed(&stack);
  return stack.at(0);
}

double rel(const torch::Tensor& y, const torch::Tensor& ref) { return ((y - ref).norm() / ref.norm()).item<double>(); }

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::stoi(argv[1]) : 200;
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  std::printf("threads %d, our int8 kernel: %s\n", at::get_num_threads(), gpt2::kernels::int8_cpu_isa().c_str());
  double total[3] = {0, 0, 0};
  for (auto [n, k] : {std::pair<int64_t, int64_t>{2304, 768}, {768, 768}, {3072, 768}, {768, 3072}}) {
    const auto w = torch::randn({n, k}) * 0.02, b = torch::randn({n}) * 0.01, x = torch::randn({1, k});
    const auto y32 = at::linear(x, w, b);
    const auto int8 = gpt2::kernels::quantize_int8(w);
    const auto wq = at::quantize_per_channel(w, int8.scale.view({n}).to(torch::kDouble),
                                             torch::zeros({n}, torch::kLong), 0, torch::kQInt8);
    const auto packed = call("quantized::linear_prepack", {wq, b});
    const auto y_ours = gpt2::kernels::int8_linear(x, int8, b);
    const auto y_fbgemm = call("quantized::linear_dynamic", {x, packed, false}).toTensor();
    const double t[3] = {time_us([&] { at::linear(x, w, b); }, iters),
                         time_us([&] { gpt2::kernels::int8_linear(x, int8, b); }, iters),
                         time_us(
                             [&] {
                               call("quantized::linear_dynamic", {x, packed, false});
                             },
                             iters)};
    for (int i = 0; i < 3; ++i) total[i] += t[i];
    std::printf("%5lld x %4lld: fp32 %7.1f us | ours int8 %7.1f us (error %.2e) | FBGEMM int8 %7.1f us (error %.2e)\n",
                static_cast<long long>(k), static_cast<long long>(n), t[0], t[1], rel(y_ours, y32), t[2],
                rel(y_fbgemm, y32));
  }
  std::printf("one block: fp32 %.1f us, ours int8 %.1f us (%.2fx), FBGEMM int8 %.1f us (%.2fx)\n", total[0], total[1],
              total[0] / total[1], total[2], total[0] / total[2]);
}
