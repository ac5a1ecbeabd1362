// src/kernels/gemm.h: with tuning off gemm / gemm_bias are at::mm / at::linear bit for bit (CPU
// and CUDA); with tuning on every bf16/fp16 product, plain and transposed operands, with and
// without bias, is as accurate as ATen's against float64 (Note [Kernel accuracy rule]), gives the
// same bits on every call of its shape, and a shape first met inside a CUDA graph capture runs
// ATen's GEMM there and is tuned at its first eager call. The CUDA cases skip without a GPU (CI).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#ifdef GPT2_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "src/base/errors.h"
#include "src/kernels/gemm.h"
#include "tests/kernels/compare.h"

namespace gpt2 {
namespace {

// Turns tuning on for one test, off again after it.
struct TuningOn {
  TuningOn() { kernels::set_gemm_tuning(true); }
  ~TuningOn() { kernels::set_gemm_tuning(false); }
};

// a (rows, inner), stored transposed when a_t; likewise b (inner, cols).
std::pair<torch::Tensor, torch::Tensor> operands(torch::Device device, torch::ScalarType dtype, int64_t rows,
                                                 int64_t inner, int64_t cols, bool a_t, bool b_t) {
  const auto opts = torch::dtype(torch::kFloat).device(device);
  auto a = a_t ? torch::randn({inner, rows}, opts).t() : torch::randn({rows, inner}, opts);
  auto b = b_t ? torch::randn({cols, inner}, opts).t() : torch::randn({inner, cols}, opts);
  const double scale = 1.0 / std::sqrt(static_cast<double>(inner));
  return {a.to(dtype), (b * scale).to(dtype)};
}

TEST(GemmCpu, TakesAtenWhateverTheTuning) {
  for (bool tuning : {false, true}) {
    kernels::set_gemm_tuning(tuning);
    for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
      auto [a, b] = operands(torch::kCPU, dtype, 33, 40, 24, false, true);
      EXPECT_TRUE(torch::equal(kernels::gemm(a, b), at::mm(a, b))) << c10::toString(dtype);
      auto bias = torch::randn({24}).to(dtype);
      const auto w = b.t();  // (24, 40) contiguous
      EXPECT_TRUE(torch::equal(kernels::gemm_bias(a, w, bias), at::linear(a, w, bias))) << c10::toString(dtype);
    }
  }
  kernels::set_gemm_tuning(false);
}

TEST(GemmCpu, BytesThatAreNotATuningTableAreANamedError) {
  for (const std::string bytes : {"", "gpt2-gemm-choices 1 no newline", "PAR1\n0123", "gpt2-gemm-choices 1\nabc"}) {
    try {
      kernels::load_gemm_choices(bytes, "runs/ckpt/gemm_choices.rank0");
      if (bytes != "gpt2-gemm-choices 1\nabc" || kernels::have_cuda_kernels())
        ADD_FAILURE() << "accepted '" << bytes << "'";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("runs/ckpt/gemm_choices.rank0"), std::string::npos) << e.what();
    }
  }
}

TEST(GemmGpu, UntunedIsAtenBitForBit) {
  REQUIRE_CUDA();
  kernels::set_gemm_tuning(false);
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (bool a_t : {false, true}) {
      for (bool b_t : {false, true}) {
        auto [a, b] = operands(torch::kCUDA, dtype, 256, 384, 320, a_t, b_t);
        EXPECT_TRUE(torch::equal(kernels::gemm(a, b), at::mm(a, b))) << c10::toString(dtype) << a_t << b_t;
      }
    }
    auto [x, wt] = operands(torch::kCUDA, dtype, 300, 64, 96, false, true);
    auto bias = torch::randn({96}, torch::dtype(dtype).device(torch::kCUDA));
    EXPECT_TRUE(torch::equal(kernels::gemm_bias(x, wt.t(), bias), at::linear(x, wt.t(), bias))) << c10::toString(dtype);
  }
}

// gpt2-124m's products at 4096 tokens (its forward, input-gradient and weight-gradient shapes),
// and odd sizes.
TEST(GemmGpu, TunedIsAsAccurateAsAtenAndStable) {
  REQUIRE_CUDA();
  TuningOn tuning;
  struct Case {
    int64_t rows, inner, cols;
    bool a_t, b_t, bias;
  };
  const Case cases[] = {
      {4096, 768, 2304, false, true, true},    // c_attn forward: x W^T + b
      {4096, 3072, 768, false, false, false},  // c_fc input gradient: dpre W
      {768, 4096, 768, false, false, false},   // plain, small output, long inner
      {768, 4096, 3072, true, false, false},   // c_proj weight gradient: dy^T h
      {2304, 4096, 768, true, false, false},   // c_attn weight gradient
      {600, 40, 37, false, true, true},        // odd widths
      {37, 600, 24, true, true, false},
  };
  for (auto dtype : {torch::kBFloat16, torch::kHalf}) {
    for (const Case& c : cases) {
      torch::manual_seed(c.rows * 7 + c.cols);
      auto [a, b] = operands(torch::kCUDA, dtype, c.rows, c.inner, c.cols, c.a_t, c.b_t);
      torch::Tensor bias = c.bias ? torch::randn({c.cols}, torch::dtype(dtype).device(torch::kCUDA)) : torch::Tensor();
      const auto run = [&] { return c.bias ? kernels::gemm_bias(a, b.t(), bias) : kernels::gemm(a, b); };
      const auto tuned = run();
      const auto aten = c.bias ? at::linear(a, b.t(), bias) : at::mm(a, b);
      auto ref = at::mm(a.to(torch::kDouble), b.to(torch::kDouble));
      if (c.bias) ref = ref + bias.to(torch::kDouble);
      const std::string what = std::string("gemm ") + c10::toString(dtype) + " " + std::to_string(c.rows) + "x" +
                               std::to_string(c.inner) + "x" + std::to_string(c.cols) + (c.a_t ? " a^T" : "") +
                               (c.b_t ? " b^T" : "") + (c.bias ? " +bias" : "");
      EXPECT_EQ(tuned.sizes(), aten.sizes()) << what;
      expect_as_accurate(what, tuned, aten, ref);
      for (int i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(run(), tuned)) << what << ": another call, other bits";
    }
  }
}

// A table saved and loaded into a process that forgot its choices gives the same products bit for
// bit, without timing anything again; one made by another cuBLASLt (its header) is ignored.
TEST(GemmGpu, ChoicesSurviveASaveAndALoad) {
  REQUIRE_CUDA();
  TuningOn tuning;
  kernels::clear_gemm_choices();
  std::vector<std::pair<torch::Tensor, torch::Tensor>> ops;
  std::vector<torch::Tensor> first;
  for (int64_t n : {256, 512, 768}) {
    ops.push_back(operands(torch::kCUDA, torch::kBFloat16, 2048, n, 3 * n, true, false));
    first.push_back(kernels::gemm(ops.back().first, ops.back().second));
  }
  ASSERT_EQ(kernels::gemm_choices_count(), 3);
  const std::string bytes = kernels::gemm_choices_bytes();
  kernels::clear_gemm_choices();
  ASSERT_EQ(kernels::gemm_choices_count(), 0);
  EXPECT_EQ(kernels::load_gemm_choices(bytes, "table"), 3);
  for (size_t i = 0; i < ops.size(); ++i)
    EXPECT_TRUE(torch::equal(kernels::gemm(ops[i].first, ops[i].second), first[i]));
  EXPECT_EQ(kernels::gemm_choices_bytes(), bytes) << "a loaded shape was timed again";
  std::string other = bytes;
  other.replace(other.find(' ', 18) + 1, 1, "x");  // another cuBLASLt version
  kernels::clear_gemm_choices();
  EXPECT_EQ(kernels::load_gemm_choices(other, "table"), 0);
  EXPECT_EQ(kernels::gemm_choices_count(), 0);
}

TEST(GemmGpu, AShapeFirstMetInACaptureRunsAtenThenIsTunedEagerly) {
  REQUIRE_CUDA();
#ifdef GPT2_WITH_CUDA
  TuningOn tuning;
  auto [a, b] = operands(torch::kCUDA, torch::kBFloat16, 1000, 136, 200, false, false);  // a shape no other test has
  auto side = c10::cuda::getStreamFromPool();
  c10::cuda::CUDAStreamGuard guard(side);
  at::mm(b, b.t());  // cuBLAS's handle and workspace for this stream, made outside the capture
  side.synchronize();
  at::cuda::CUDAGraph graph;
  torch::Tensor captured;
  graph.capture_begin();
  captured = kernels::gemm(a, b);
  graph.capture_end();
  graph.replay();
  side.synchronize();
  EXPECT_TRUE(torch::equal(captured, at::mm(a, b))) << "the captured product is not ATen's";
  const auto eager = kernels::gemm(a, b);  // tunes the shape now
  const Errors e = errors_of(eager, at::mm(a.to(torch::kDouble), b.to(torch::kDouble)));
  EXPECT_LE(e.norm, 1e-2);
  graph.replay();  // the graph keeps what it captured
  side.synchronize();
  EXPECT_TRUE(torch::equal(captured, at::mm(a, b)));
#endif
}

}  // namespace
}  // namespace gpt2
