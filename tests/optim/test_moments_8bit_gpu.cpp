// The GPU kernel of 8-bit AdamW moments (launch_adamw_8bit) against the CPU path
// (cpu_adamw_update_8bit) from the same start: parameters, codes, absmax values and the bf16 copy
// bitwise equal, with fp32 and bf16 gradients, a short last block, a device-side gradient scale
// and a found_inf that leaves everything as it was. Skips without a GPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#ifdef GPT2_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include "optim/moments_8bit.h"
#include "tests/optim/bf16_grads.h"

namespace gpt2::optim {
namespace {

#ifdef GPT2_WITH_CUDA
std::vector<float> randn(int64_t n, float scale, uint32_t seed, bool square = false) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) {
    v = normal(gen) * scale;
    if (square) v *= v;
  }
  return x;
}

template <typename T>
torch::Tensor on_gpu(const std::vector<T>& v, torch::ScalarType t) {
  return torch::from_blob(const_cast<T*>(v.data()), {static_cast<int64_t>(v.size())}, t).to(torch::kCUDA);
}

template <typename T>
std::vector<T> to_host(const torch::Tensor& t) {
  auto c = t.cpu().contiguous();
  std::vector<T> out(static_cast<size_t>(c.numel()));
  std::memcpy(out.data(), c.data_ptr(), out.size() * sizeof(T));
  return out;
}

void expect_gpu_equals_cpu(bool bf16_grad, float device_scale, bool skip) {
  const int64_t n = 4 * kQuantBlock + 515;
  const int64_t blocks = 5;
  auto param = randn(n, 0.02f, 1);
  auto grad = randn(n, 1e-3f, 2);
  const auto grad_bf16 = truncate_to_bf16(grad);  // the fp32 gradient holds the bf16 values exactly
  std::vector<uint8_t> mc(n), vc(n);
  std::vector<float> ma(blocks), va(blocks);
  quantize_blocks(dynamic_map(true), randn(n, 1e-3f, 3).data(), n, mc.data(), ma.data());
  quantize_blocks(dynamic_map(false), randn(n, 1e-3f, 4, true).data(), n, vc.data(), va.data());

  auto d_param = on_gpu(param, torch::kFloat), d_ma = on_gpu(ma, torch::kFloat), d_va = on_gpu(va, torch::kFloat);
  auto d_mc = on_gpu(mc, torch::kUInt8), d_vc = on_gpu(vc, torch::kUInt8);
  auto d_grad = bf16_grad ? on_gpu(grad_bf16, torch::kInt16) : on_gpu(grad, torch::kFloat);
  auto d_out = torch::zeros({n}, torch::dtype(torch::kInt16).device(torch::kCUDA));
  auto d_scale = torch::full({1}, device_scale, torch::dtype(torch::kFloat).device(torch::kCUDA));
  auto d_inf = torch::full({1}, skip ? 1.0f : 0.0f, torch::dtype(torch::kFloat).device(torch::kCUDA));

  CpuAdamWStep s;
  s.lr = 6e-4;
  s.weight_decay = 0.1;
  s.step = 3;
  s.grad_scale = 0.5;
  Adamw8bitArgs a;
  a.maps = moment8_maps();
  a.c = adamw_coeffs(s);
  a.n = n;
  a.param = d_param.data_ptr<float>();
  a.exp_avg = {d_mc.data_ptr<uint8_t>(), d_ma.data_ptr<float>()};
  a.exp_avg_sq = {d_vc.data_ptr<uint8_t>(), d_va.data_ptr<float>()};
  a.grad = d_grad.data_ptr();
  a.grad_type = bf16_grad ? HostGradType::kBFloat16 : HostGradType::kFloat32;
  a.param_bf16 = reinterpret_cast<uint16_t*>(d_out.data_ptr());
  a.grad_scale_device = d_scale.data_ptr<float>();
  a.found_inf = d_inf.data_ptr<float>();
  ASSERT_EQ(launch_adamw_8bit(a, c10::cuda::getCurrentCUDAStream().stream()), cudaSuccess);

  const auto before = param;
  const auto mc0 = mc;
  std::vector<uint16_t> out(n, 0);
  if (!skip) {
    s.grad_scale = static_cast<double>(a.c.grad_scale * device_scale);  // the kernel's product, rounded as it rounds it
    cpu_adamw_update_8bit(s, n, param.data(), {mc.data(), ma.data()}, {vc.data(), va.data()}, grad.data(),
                          HostGradType::kFloat32, out.data());
  }
  const std::string what = std::string(bf16_grad ? "bf16" : "fp32") + " gradient" + (skip ? ", found_inf" : "");
  EXPECT_EQ(to_host<float>(d_param), param) << what << ": parameters";
  EXPECT_EQ(to_host<uint8_t>(d_mc), mc) << what << ": first-moment codes";
  EXPECT_EQ(to_host<uint8_t>(d_vc), vc) << what << ": second-moment codes";
  EXPECT_EQ(to_host<float>(d_ma), ma) << what << ": first-moment absmax";
  EXPECT_EQ(to_host<float>(d_va), va) << what << ": second-moment absmax";
  if (!skip) {
    EXPECT_EQ(to_host<uint16_t>(d_out), out) << what << ": bf16 copy";
    EXPECT_NE(param, before) << what << ": the update moved the parameters";
    EXPECT_NE(mc, mc0) << what << ": and the codes";
  }
}
#endif

TEST(Moments8bitGpu, KernelEqualsTheCpuPathBitwise) {
#ifdef GPT2_WITH_CUDA
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  expect_gpu_equals_cpu(false, 1.0f, false);
  expect_gpu_equals_cpu(true, 0.37f, false);
  expect_gpu_equals_cpu(false, 1.0f, true);
#else
  GTEST_SKIP() << "a build without CUDA";
#endif
}

}  // namespace
}  // namespace gpt2::optim
