// The GPU kernel of 8-bit AdamW moments (adamw_step_gpu) against the CPU path
// (adamw_step_cpu) from the same start, over the blocks of four parameters (8-bit and fp32
// moments, with and without weight decay, short blocks at parameter boundaries): parameters,
// codes, absmax values, fp32 moments and the bf16 copy bitwise equal, with fp32 and bf16
// gradients, a device-side gradient scale, and a found_inf that leaves everything as it was.
// Skips without a GPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#ifdef GPT2_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include "optim/adamw_step.h"
#include "optim/moment_layout.h"
#include "optim/moments_8bit.h"
#include "tests/optim/bf16_grads.h"
#include "tests/optim/host_buffers.h"

namespace gpt2::optim {
namespace {

#ifdef GPT2_WITH_CUDA
// Four parameters: 8-bit with decay, fp32 without, 8-bit without, fp32 with; none on the grid but
// the first, so blocks are cut at parameter boundaries and some are short.
MomentLayout mixed_layout(int64_t* total) {
  const int64_t a = 3 * kQuantBlock + 515, b = 700, c = 2 * kQuantBlock + 100, d = 3000;
  *total = a + b + c + d;
  return MomentLayout({{0, a, true}, {a, b, false}, {a + b, c, false}, {a + b + c, d, true}});
}

void expect_gpu_equals_cpu(bool bf16_grad, float device_scale, bool skip) {
  int64_t n = 0;
  const MomentLayout layout = mixed_layout(&n);
  const auto blocks = layout.blocks(0, n);
  const int64_t na = layout.num_absmax(), nf = layout.num_fp32();
  auto param = randn(n, 0.02f, 1);
  auto grad = randn(n, 1e-3f, 2);
  const auto grad_bf16 = truncate_to_bf16(grad);  // the fp32 gradient holds the bf16 values exactly
  std::vector<uint8_t> mc(n), vc(n);
  std::vector<float> ma(na), va(na), m32(nf), v32(nf);
  auto host_buffers = [&] {
    MomentBuffers mb;
    mb.exp_avg_codes = mc.data(), mb.exp_avg_sq_codes = vc.data();
    mb.exp_avg_absmax = ma.data(), mb.exp_avg_sq_absmax = va.data();
    mb.exp_avg = m32.data(), mb.exp_avg_sq = v32.data();
    return mb;
  };
  quantize_moments(layout, 0, n, randn(n, 1e-3f, 3).data(), randn(n, 1e-3f, 4, true).data(), host_buffers());

  auto d_param = on_gpu(param, torch::kFloat), d_ma = on_gpu(ma, torch::kFloat), d_va = on_gpu(va, torch::kFloat);
  auto d_mc = on_gpu(mc, torch::kUInt8), d_vc = on_gpu(vc, torch::kUInt8);
  auto d_m32 = on_gpu(m32, torch::kFloat), d_v32 = on_gpu(v32, torch::kFloat);
  auto d_grad = bf16_grad ? on_gpu(grad_bf16, torch::kInt16) : on_gpu(grad, torch::kFloat);
  auto d_out = torch::zeros({n}, torch::dtype(torch::kInt16).device(torch::kCUDA));
  auto d_scale = torch::full({1}, device_scale, torch::dtype(torch::kFloat).device(torch::kCUDA));
  auto d_inf = torch::full({1}, skip ? 1.0f : 0.0f, torch::dtype(torch::kFloat).device(torch::kCUDA));
  auto d_blocks = bytes_on_gpu(blocks.data(), blocks.size());

  CpuAdamWStep s;
  s.lr = 6e-4;
  s.weight_decay = 0.1;
  s.step = 3;
  s.grad_scale = 0.5;
  AdamWStepArgs a;
  auto d_tables = bytes_on_gpu(&quant_tables(), 1);
  a.tables = reinterpret_cast<const QuantTables*>(d_tables.data_ptr<uint8_t>());
  a.c = adamw_coeffs(s);
  a.blocks = reinterpret_cast<const MomentBlock*>(d_blocks.data_ptr<uint8_t>());
  a.num_blocks = static_cast<int64_t>(blocks.size());
  a.param = d_param.data_ptr<float>();
  a.moments.exp_avg_codes = d_mc.data_ptr<uint8_t>();
  a.moments.exp_avg_sq_codes = d_vc.data_ptr<uint8_t>();
  a.moments.exp_avg_absmax = d_ma.data_ptr<float>();
  a.moments.exp_avg_sq_absmax = d_va.data_ptr<float>();
  a.moments.exp_avg = d_m32.data_ptr<float>();
  a.moments.exp_avg_sq = d_v32.data_ptr<float>();
  a.grad = d_grad.data_ptr();
  a.grad_type = bf16_grad ? HostGradType::kBFloat16 : HostGradType::kFloat32;
  a.param_bf16 = reinterpret_cast<uint16_t*>(d_out.data_ptr());
  a.grad_scale_device = d_scale.data_ptr<float>();
  a.found_inf = d_inf.data_ptr<float>();
  ASSERT_EQ(adamw_step_gpu(a, c10::cuda::getCurrentCUDAStream().stream()), cudaSuccess);

  const auto before = param;
  const auto mc0 = mc;
  const auto m32_0 = m32;
  std::vector<uint16_t> out(n, 0);
  if (!skip) {
    s.grad_scale = static_cast<double>(a.c.grad_scale * device_scale);  // the kernel's product, rounded as it rounds it
    adamw_step_cpu(s, blocks.data(), static_cast<int64_t>(blocks.size()), param.data(), host_buffers(), grad.data(),
                   HostGradType::kFloat32, out.data());
  }
  const std::string what = std::string(bf16_grad ? "bf16" : "fp32") + " gradient" + (skip ? ", found_inf" : "");
  EXPECT_EQ(to_host<float>(d_param), param) << what << ": parameters";
  EXPECT_EQ(to_host<uint8_t>(d_mc), mc) << what << ": first-moment codes";
  EXPECT_EQ(to_host<uint8_t>(d_vc), vc) << what << ": second-moment codes";
  EXPECT_EQ(to_host<float>(d_ma), ma) << what << ": first-moment absmax";
  EXPECT_EQ(to_host<float>(d_va), va) << what << ": second-moment absmax";
  EXPECT_EQ(to_host<float>(d_m32), m32) << what << ": fp32 first moments";
  EXPECT_EQ(to_host<float>(d_v32), v32) << what << ": fp32 second moments";
  if (!skip) {
    EXPECT_EQ(to_host<uint16_t>(d_out), out) << what << ": bf16 copy";
    EXPECT_NE(param, before) << what << ": the update moved the parameters";
    EXPECT_NE(mc, mc0) << what << ": and the codes";
    EXPECT_NE(m32, m32_0) << what << ": and the fp32 moments";
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
