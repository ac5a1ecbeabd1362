// GPU suite (ctest label gpu; skips without a GPU): the offload pipeline on CUDA streams (Note
// [Offload pipeline]: gradient chunks copied down on one stream, updated on the host pool, copied
// back on another) gives bit for bit the parameters of the serial path that CPU parameters take,
// from the same start and the same gradients: both run the same host AdamW on the same values, so
// any chunk read before its copy landed, or written back out of order, shows as a difference.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "optim/sharded_optimizer.h"
#include "parallel/flat_layout.h"
#include "tests/optim/one_rank.h"

namespace gpt2::optim {
namespace {

TEST(OffloadOnCuda, PipelineEqualsTheSerialPath) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    torch::manual_seed(5);
    // Sizes that cut chunks inside parameters, and enough chunks that copies overlap updates.
    const std::vector<std::vector<int64_t>> shapes{{257, 131}, {131}, {64, 515}, {7}};
    auto make = [&](torch::Device device) {
      std::vector<torch::Tensor> ps;
      torch::manual_seed(6);
      for (const auto& s : shapes) ps.push_back(torch::randn(s).to(device, dtype).set_requires_grad(true));
      return ps;
    };
    auto on_cuda = make(torch::kCUDA), on_cpu = make(torch::kCPU);
    const parallel::FlatLayout layout(on_cuda, 1);
    auto grads_cuda = torch::zeros({layout.padded}, torch::TensorOptions().dtype(dtype).device(torch::kCUDA));
    auto grads_cpu = torch::zeros({layout.padded}, dtype);
    test::OneRank one;
    ShardedOptimizer::Options options;
    options.adamw.weight_decay = 0.1;
    options.offload = true;
    options.adamw.host_threads = 4;
    options.adamw.chunk_elements = 4099;  // ~17 chunks
    ShardedOptimizer pipelined(on_cuda, layout, grads_cuda, one, options);
    ShardedOptimizer serial(on_cpu, layout, grads_cpu, one, options);
    for (int step = 0; step < 6; ++step) {
      auto g = (torch::randn({layout.padded}) * 0.1).to(dtype);
      grads_cpu.copy_(g);
      grads_cuda.copy_(g);
      pipelined.step(1e-2);
      serial.step(1e-2);
      // The next forward would run on the compute stream right away: read there, no extra sync.
      for (size_t i = 0; i < on_cuda.size(); ++i) {
        ASSERT_TRUE(torch::equal(on_cuda[i].detach().cpu(), on_cpu[i].detach()))
            << "parameter " << i << ", step " << step;
      }
    }
    std::printf("[ measured ] offload pipeline (%s, %lld elements, 17 chunks): bitwise equal to the serial path\n",
                c10::toString(dtype), (long long)layout.padded);
  }
}

// 8-bit moments: the CUDA kernel (parameters on the GPU), offload on CUDA streams (the host update)
// and CPU parameters (the host update, no copies) give the same bits after every step, with fp32
// and bf16 parameters; tensors over and under 4096 values (8-bit and fp32 moments), with and
// without weight decay, none on the quantization grid but the first.
TEST(EightBitMomentsOnCuda, KernelOffloadAndCpuGiveTheSameBits) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    const std::vector<std::vector<int64_t>> shapes{{257, 131}, {131}, {64, 515}, {7}, {70, 70}, {3000}, {5000}};
    auto make = [&](torch::Device device) {
      std::vector<torch::Tensor> ps;
      torch::manual_seed(6);
      for (const auto& s : shapes) ps.push_back((torch::randn(s) * 0.02).to(device, dtype).set_requires_grad(true));
      return ps;
    };
    std::vector<torch::Tensor> params[3] = {make(torch::kCUDA), make(torch::kCUDA), make(torch::kCPU)};
    const parallel::FlatLayout layout(params[0], 1);
    test::OneRank one;
    ShardedOptimizer::Options options;
    options.adamw.weight_decay = 0.1;
    options.adamw.moments_8bit = true;
    options.adamw.host_threads = 4;
    options.adamw.chunk_elements = 3 * kQuantBlock;  // several chunks
    std::vector<torch::Tensor> grads;
    std::vector<std::unique_ptr<ShardedOptimizer>> opts;
    for (int k = 0; k < 3; ++k) {
      grads.push_back(torch::zeros({layout.padded}, torch::TensorOptions().dtype(dtype).device(params[k][0].device())));
      options.offload = k == 1;
      opts.push_back(std::make_unique<ShardedOptimizer>(params[k], layout, grads[k], one, options));
    }
    for (int step = 0; step < 6; ++step) {
      auto g = (torch::randn({layout.padded}) * 1e-3).to(dtype);
      for (int k = 0; k < 3; ++k) {
        grads[k].copy_(g);
        opts[k]->step(1e-3);
      }
      for (size_t i = 0; i < shapes.size(); ++i) {
        const auto want = params[2][i].detach();
        ASSERT_TRUE(torch::equal(params[0][i].detach().cpu(), want)) << "kernel, parameter " << i << ", step " << step;
        ASSERT_TRUE(torch::equal(params[1][i].detach().cpu(), want)) << "offload, parameter " << i << ", step " << step;
      }
    }
    const auto s0 = opts[0]->state(), s2 = opts[2]->state();
    EXPECT_TRUE(torch::equal(s0.master, s2.master));
    EXPECT_TRUE(torch::equal(s0.exp_avg_codes, s2.exp_avg_codes));
    EXPECT_TRUE(torch::equal(s0.exp_avg_sq_absmax, s2.exp_avg_sq_absmax));
    EXPECT_TRUE(torch::equal(s0.exp_avg_sq, s2.exp_avg_sq)) << "fp32 moments of the small tensors";
    std::printf("[ measured ] 8-bit moments (%s, %lld elements): kernel, offload and CPU bitwise equal over 6 steps\n",
                c10::toString(dtype), (long long)layout.padded);
  }
}

}  // namespace
}  // namespace gpt2::optim
