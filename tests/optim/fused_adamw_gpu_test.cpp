// The GPU update of fp32 moments (optim/sharded_optimizer.h: adamw_step_gpu over dense fp32 blocks,
// the clip coefficient applied in the kernel). First the kernel alone against cpu_adamw_update,
// bitwise, over the blocks of four parameters (whole blocks on the vector path, short ones at
// parameter ends, with and without weight decay), fp32 and bf16 gradients, a device gradient
// scale, found_inf, and the element-by-element path where moments or buffers are not aligned.
// Then ShardedOptimizer on CUDA over 3 clipped steps: bitwise against cpu_adamw_update given the same
// coefficient, close to ShardedOptimizer on the CPU (ATen's AdamW, the norm summed in another order),
// with the step count kept across state() / load_state(). Skips without a GPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#ifdef GPT2_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include "optim/adamw_step.h"
#include "optim/moments_8bit.h"
#include "optim/sharded_optimizer.h"
#include "parallel/flat_layout.h"
#include "tests/optim/bf16_grads.h"
#include "tests/optim/host_buffers.h"
#include "tests/optim/one_rank.h"

namespace gpt2::optim {
namespace {

#ifdef GPT2_WITH_CUDA
// Four parameters end to end: decay, none, none, decay; only the first starts on the grid.
std::vector<ParamSpan> four_spans(int64_t* total) {
  const int64_t a = 3 * kQuantBlock + 515, b = 700, c = 2 * kQuantBlock + 100, d = 3000;
  *total = a + b + c + d;
  return {{0, a, true}, {a, a + b, false}, {a + b, a + b + c, false}, {a + b + c, *total, true}};
}

struct KernelCase {
  bool bf16_grad = false;
  float device_scale = 1.0f;  // *grad_scale_device
  bool skip = false;          // found_inf = 1
  int64_t state_shift = 0;    // moments at exp_avg + begin + shift (% 8 != 0: whole blocks element-wise)
  int64_t misalign = 0;       // every buffer starts this many elements into its tensor: 1 = not 16-byte aligned
  bool with_tables = false;   // tables given although no block is quantized
  std::string what() const {
    return std::string(bf16_grad ? "bf16" : "fp32") + " gradient, scale " + std::to_string(device_scale) +
           (skip ? ", found_inf" : "") + ", state shift " + std::to_string(state_shift) + ", misalign " +
           std::to_string(misalign) + (with_tables ? ", tables" : "");
  }
};

void expect_kernel_equals_cpu(const KernelCase& kc) {
  SCOPED_TRACE(kc.what());
  int64_t n = 0;
  const auto spans = four_spans(&n);
  auto blocks = dense_fp32_blocks(spans);
  for (auto& b : blocks) b.state += kc.state_shift;
  const int64_t off = kc.misalign, shift = kc.state_shift;
  // Host copies with `off` leading elements (never touched) before each buffer and `shift` more
  // before the moments.
  auto param = randn(off + n, 0.02f, 1);
  auto grad = randn(off + n, 1e-3f, 2);
  const auto grad_bf16 = truncate_to_bf16(grad);  // the fp32 gradient holds the bf16 values exactly
  auto m = randn(off + shift + n, 1e-3f, 3);
  auto v = randn(off + shift + n, 1e-3f, 4, /*square=*/true);

  auto d_param = on_gpu(param, torch::kFloat), d_m = on_gpu(m, torch::kFloat), d_v = on_gpu(v, torch::kFloat);
  auto d_grad = kc.bf16_grad ? on_gpu(grad_bf16, torch::kInt16) : on_gpu(grad, torch::kFloat);
  auto d_out = torch::zeros({off + n}, torch::dtype(torch::kInt16).device(torch::kCUDA));
  auto d_scale = torch::full({1}, kc.device_scale, torch::dtype(torch::kFloat).device(torch::kCUDA));
  auto d_inf = torch::full({1}, kc.skip ? 1.0f : 0.0f, torch::dtype(torch::kFloat).device(torch::kCUDA));
  auto d_blocks = bytes_on_gpu(blocks.data(), blocks.size());
  auto d_tables = bytes_on_gpu(&quant_tables(), 1);

  CpuAdamWStep s;
  s.lr = 6e-4;
  s.weight_decay = 0.1;
  s.step = 3;
  s.grad_scale = 0.5;
  AdamWStepArgs a;
  a.tables = kc.with_tables ? reinterpret_cast<const QuantTables*>(d_tables.data_ptr<uint8_t>()) : nullptr;
  a.c = adamw_coeffs(s);
  a.blocks = reinterpret_cast<const MomentBlock*>(d_blocks.data_ptr<uint8_t>());
  a.num_blocks = static_cast<int64_t>(blocks.size());
  a.param = d_param.data_ptr<float>() + off;
  a.moments.exp_avg = d_m.data_ptr<float>() + off;
  a.moments.exp_avg_sq = d_v.data_ptr<float>() + off;
  a.grad = kc.bf16_grad ? static_cast<const void*>(reinterpret_cast<const uint16_t*>(d_grad.data_ptr()) + off)
                        : static_cast<const void*>(d_grad.data_ptr<float>() + off);
  a.grad_type = kc.bf16_grad ? HostGradType::kBFloat16 : HostGradType::kFloat32;
  a.param_bf16 = reinterpret_cast<uint16_t*>(d_out.data_ptr()) + off;
  a.grad_scale_device = d_scale.data_ptr<float>();
  a.found_inf = d_inf.data_ptr<float>();
  ASSERT_EQ(adamw_step_gpu(a, c10::cuda::getCurrentCUDAStream().stream()), cudaSuccess);

  // The reference: cpu_adamw_update over each parameter, the kernel's scale product rounded as it
  // rounds it.
  const auto before = param;
  const auto m0 = m;
  std::vector<uint16_t> out(off + n, 0);
  if (!kc.skip) {
    s.grad_scale = static_cast<double>(a.c.grad_scale * kc.device_scale);
    for (const ParamSpan& span : spans) {
      CpuAdamWStep ss = s;
      ss.weight_decay = span.weight_decay ? s.weight_decay : 0.0;
      const int64_t b = off + span.begin;
      cpu_adamw_update(ss, span.end - span.begin, param.data() + b, m.data() + shift + b, v.data() + shift + b,
                       grad.data() + b, HostGradType::kFloat32, out.data() + b);
    }
  }
  EXPECT_EQ(to_host<float>(d_param), param) << "parameters";
  EXPECT_EQ(to_host<float>(d_m), m) << "first moments";
  EXPECT_EQ(to_host<float>(d_v), v) << "second moments";
  if (!kc.skip) {
    EXPECT_EQ(to_host<uint16_t>(d_out), out) << "bf16 copy";
    EXPECT_NE(param, before) << "the update moved the parameters";
    EXPECT_NE(m, m0) << "and the moments";
  }
}

// The parameters of the ShardedOptimizer tests: matrices (decay) and vectors (none), one long enough
// for whole kQuantBlock blocks; no parameter ends on the grid.
std::vector<torch::Tensor> make_params(torch::ScalarType dtype, torch::Device device) {
  torch::manual_seed(5);
  const std::vector<std::vector<int64_t>> shapes = {{48, 130}, {130}, {3 * kQuantBlock + 7}, {70, 50}, {50}};
  std::vector<torch::Tensor> params;
  for (const auto& shape : shapes) {
    params.push_back((torch::randn(shape) * 0.02).to(device, dtype).set_requires_grad(true));
  }
  return params;
}

std::vector<float> floats(const torch::Tensor& t) {
  const auto c = t.to(torch::kCPU, torch::kFloat).contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

// A gradient of norm ~1 over the flat space (padding zero), in `dtype`.
torch::Tensor make_grad(const parallel::FlatLayout& layout, torch::ScalarType dtype) {
  auto g = torch::randn({layout.padded}) / std::sqrt(static_cast<double>(layout.total));
  g.narrow(0, layout.total, layout.padded - layout.total).zero_();
  return g.to(dtype);
}

// ShardedOptimizer on CUDA (parameters `dtype`, gradient buffer `grad_dtype`, one rank) over clipped
// steps against a host replica: cpu_adamw_update over the same parameters with the coefficient
// the kernel multiplied by, bitwise (masters, moments, bf16 parameters, the step count). Also:
// the gradient buffer is never scaled; with fp32 gradients the result is within 1e-6 of
// ShardedOptimizer on the CPU (ATen's AdamW; its norm is summed in another order, and it clips a
// low-precision gradient in that precision, so only fp32 is compared); state() / load_state()
// carry the step count; a step skipped on found_inf changes nothing and drops the pending
// coefficient.
void expect_sharded_matches(torch::ScalarType dtype, torch::ScalarType grad_dtype) {
  SCOPED_TRACE(std::string("params ") + c10::toString(dtype) + ", gradients " + c10::toString(grad_dtype));
  const torch::Device cuda(torch::kCUDA, 0);
  auto gpu_params = make_params(dtype, cuda), cpu_params = make_params(dtype, torch::kCPU);
  const parallel::FlatLayout layout(gpu_params, 1);
  const int64_t n = layout.padded;
  auto gpu_grads = torch::zeros({n}, torch::dtype(grad_dtype).device(cuda));
  auto cpu_grads = torch::zeros({n}, torch::dtype(grad_dtype));
  test::OneRank one;
  ShardedOptimizer::Options options;
  options.adamw.beta1 = 0.9;
  options.adamw.beta2 = 0.95;
  options.adamw.eps = 1e-8;
  options.adamw.weight_decay = 0.1;
  ShardedOptimizer gpu(gpu_params, layout, gpu_grads, one, options);
  ShardedOptimizer cpu(cpu_params, layout, cpu_grads, one, options);
  const bool compare_cpu = grad_dtype == torch::kFloat;
  ASSERT_TRUE(gpu_adamw_updates(cuda, /*offload=*/false));
  // Two moments per parameter element (packed: none for the padding), fp32 masters for
  // low-precision parameters and an fp32 gradient copy for fp16 ones (fp32 and bf16 are read as
  // they are) over the shard, and the block list.
  const int64_t want_bytes =
      layout.total * 8 + n * ((dtype != torch::kFloat ? 4 : 0) + (grad_dtype == torch::kHalf ? 4 : 0));
  EXPECT_GE(gpu.state_bytes(), want_bytes);
  EXPECT_LT(gpu.state_bytes(), want_bytes + n / 8);

  // The replica, in flat coordinates (one rank: the shard is the flat space).
  std::vector<float> p_ref = floats(gpu.state().master), m_ref(n, 0.0f), v_ref(n, 0.0f);
  std::vector<uint16_t> bf16_ref(n, 0);
  int64_t steps = 0;
  auto host_step = [&](const torch::Tensor& grad, float coef, double lr) {
    const std::vector<float> g = floats(grad);  // bf16 and fp16 convert exactly, as the kernel reads them
    ++steps;
    for (size_t i = 0; i < gpu_params.size(); ++i) {
      CpuAdamWStep s;
      s.lr = lr;
      s.beta1 = 0.9, s.beta2 = 0.95, s.eps = 1e-8;
      s.weight_decay = gpu_params[i].dim() >= 2 ? 0.1 : 0.0;
      s.step = steps;
      s.grad_scale = coef;
      const int64_t b = layout.offset[i];
      cpu_adamw_update(s, layout.numel[i], p_ref.data() + b, m_ref.data() + b, v_ref.data() + b, g.data() + b,
                       HostGradType::kFloat32, bf16_ref.data() + b);
    }
  };
  auto expect_replica = [&](const std::string& when) {
    SCOPED_TRACE(when);
    const auto st = gpu.state();
    EXPECT_EQ(st.adam_step, steps);
    EXPECT_EQ(floats(st.master), p_ref) << "masters";
    EXPECT_EQ(floats(st.exp_avg), m_ref) << "exp_avg";
    EXPECT_EQ(floats(st.exp_avg_sq), v_ref) << "exp_avg_sq";
    if (dtype != torch::kBFloat16) return;
    for (size_t i = 0; i < gpu_params.size(); ++i) {
      const auto bits = gpu_params[i].detach().reshape({-1}).cpu().view(torch::kInt16).contiguous();
      const auto* got = reinterpret_cast<const uint16_t*>(bits.data_ptr());
      const auto* want = bf16_ref.data() + layout.offset[i];
      EXPECT_EQ(std::vector<uint16_t>(got, got + layout.numel[i]), std::vector<uint16_t>(want, want + layout.numel[i]))
          << "bf16 parameter " << i;
    }
  };
  // The coefficient clip_grad_norm keeps for the kernel, computed the same way from its norm.
  auto coefficient = [](const torch::Tensor& norm, double max_norm) {
    return (max_norm / (norm + 1e-6)).clamp_max(1.0).to(torch::kFloat).item<float>();
  };

  const double max_norm = 0.05;  // the gradients' norm is ~1: every step clips
  for (int step = 1; step <= 3; ++step) {
    const double lr = 1e-3 * step;
    const auto g = make_grad(layout, grad_dtype);
    gpu_grads.copy_(g);
    cpu_grads.copy_(g);
    const auto norm = gpu.clip_grad_norm(max_norm);
    const float coef = coefficient(norm, max_norm);
    ASSERT_LT(coef, 0.1f) << "clipping is active";
    EXPECT_EQ(floats(gpu_grads), floats(g)) << "clip_grad_norm leaves the gradient as it is";
    gpu.step(lr);
    EXPECT_EQ(floats(gpu_grads), floats(g)) << "and so does step()";
    host_step(g, coef, lr);
    expect_replica("step " + std::to_string(step));
    if (!compare_cpu) continue;
    const auto cpu_norm = cpu.clip_grad_norm(max_norm);
    cpu.step(lr);
    EXPECT_NEAR(cpu_norm.item<double>(), norm.item<double>(), 1e-5 * norm.item<double>());
  }
  if (compare_cpu) {
    const auto a = gpu.state(), b = cpu.state();
    EXPECT_EQ(b.adam_step, 3);
    auto rel = [](const torch::Tensor& x, const torch::Tensor& y) {
      return ((x - y).norm() / y.norm()).item<double>();
    };
    EXPECT_LE(rel(a.master, b.master), 1e-6) << "masters against ShardedOptimizer on the CPU";
    EXPECT_LE(rel(a.exp_avg, b.exp_avg), 1e-6) << "exp_avg against ShardedOptimizer on the CPU";
    EXPECT_LE(rel(a.exp_avg_sq, b.exp_avg_sq), 1e-6) << "exp_avg_sq against ShardedOptimizer on the CPU";
  }

  // A fresh optimizer loaded from the state takes the next step as the original does.
  auto loaded_params = make_params(dtype, cuda);
  auto loaded_grads = torch::zeros({n}, torch::dtype(grad_dtype).device(cuda));
  ShardedOptimizer loaded(loaded_params, layout, loaded_grads, one, options);
  loaded.load_state(gpu.state());
  EXPECT_EQ(loaded.state().adam_step, 3);
  const auto g = make_grad(layout, grad_dtype);
  gpu_grads.copy_(g);
  loaded_grads.copy_(g);
  const float coef = coefficient(gpu.clip_grad_norm(max_norm), max_norm);
  loaded.clip_grad_norm(max_norm);
  gpu.step(1e-3);
  loaded.step(1e-3);
  host_step(g, coef, 1e-3);
  expect_replica("step 4");
  const auto a = gpu.state(), b = loaded.state();
  EXPECT_EQ(b.adam_step, 4);
  EXPECT_TRUE(torch::equal(a.master, b.master)) << "masters after load_state";
  EXPECT_TRUE(torch::equal(a.exp_avg, b.exp_avg)) << "exp_avg after load_state";
  EXPECT_TRUE(torch::equal(a.exp_avg_sq, b.exp_avg_sq)) << "exp_avg_sq after load_state";
  for (size_t i = 0; i < gpu_params.size(); ++i) {
    EXPECT_EQ(floats(gpu_params[i].detach()), floats(loaded_params[i].detach())) << "parameter " << i;
  }

  // Skipped on found_inf: nothing moves and the step does not count; the next step, without a
  // clip of its own, applies the gradient unscaled (the skipped step's coefficient is gone).
  gpu.clip_grad_norm(max_norm);
  gpu.step(1e-3, torch::ones({1}, torch::dtype(torch::kFloat).device(cuda)));
  expect_replica("skipped step");
  gpu.step(1e-3);
  host_step(g, 1.0f, 1e-3);
  expect_replica("step 5, unclipped");
}
#endif

TEST(FusedAdamWGpu, Fp32BlocksEqualTheCpuUpdateBitwise) {
#ifdef GPT2_WITH_CUDA
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  expect_kernel_equals_cpu({});
  expect_kernel_equals_cpu({/*bf16_grad=*/true, /*device_scale=*/0.37f});
  expect_kernel_equals_cpu({false, 0.37f, /*skip=*/true});
  expect_kernel_equals_cpu({true, 1.0f, false, /*state_shift=*/4});
  expect_kernel_equals_cpu({false, 0.37f, false, 0, /*misalign=*/1});
  expect_kernel_equals_cpu({true, 1.0f, false, 0, 0, /*with_tables=*/true});
#else
  GTEST_SKIP() << "a build without CUDA";
#endif
}

TEST(FusedAdamWGpu, ShardedOptimizerOnCudaIsTheCpuUpdateWithTheClipInTheKernel) {
#ifdef GPT2_WITH_CUDA
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  expect_sharded_matches(torch::kFloat, torch::kFloat);
  expect_sharded_matches(torch::kBFloat16, torch::kFloat);
  expect_sharded_matches(torch::kBFloat16, torch::kBFloat16);
  expect_sharded_matches(torch::kHalf, torch::kHalf);  // through the fp32 gradient copy
#else
  GTEST_SKIP() << "a build without CUDA";
#endif
}

}  // namespace
}  // namespace gpt2::optim
