// src/kernels/slot_attention.h against a float64 reference (softmax over positions 0..pos of each
// row, in double) and against SDPA under the mask it replaces (Note [Kernel accuracy rule],
// compare.h): several B, nh, hs, positions 0 and capacity - 1, fp32 and bf16 (fp16 too on the GPU),
// q a strided view of a qkv projection as the model hands it. And the property the kernel exists
// for: a row's output is the same bits whatever the other rows hold, in a batch of one, and with a
// larger cache holding the same prefix. The CPU cases run everywhere; the CUDA ones skip without a
// GPU (`ctest -L gpu` runs them there).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "src/kernels/slot_attention.h"
#include "tests/kernels/compare.h"

namespace gpt2 {
namespace {

struct Inputs {
  torch::Tensor qkv;           // (B, 1, 3 C): q is its first C columns
  torch::Tensor q;             // (B, nh, 1, hs) strided view of qkv, last dim contiguous
  torch::Tensor keys, values;  // (B, nh, capacity, hs)
  torch::Tensor positions;     // (B) int64
};

Inputs make_inputs(int64_t B, int64_t nh, int64_t capacity, int64_t hs, const std::vector<int64_t>& pos,
                   torch::ScalarType dtype, torch::Device device, uint64_t seed) {
  torch::manual_seed(seed);
  const auto f = torch::dtype(torch::kFloat);
  Inputs in;
  in.qkv = (torch::randn({B, 1, 3 * nh * hs}, f) * 1.5).to(device, dtype);
  in.q = in.qkv.narrow(2, 0, nh * hs).view({B, 1, nh, hs}).transpose(1, 2);
  in.keys = torch::randn({B, nh, capacity, hs}, f).to(device, dtype);
  in.values = torch::randn({B, nh, capacity, hs}, f).to(device, dtype);
  in.positions = torch::tensor(pos, torch::kLong).to(device);
  return in;
}

// softmax(q . k_j / sqrt(hs)) v_j over j <= pos[b], in float64 from the (rounded) inputs: (B, nh, 1, hs).
torch::Tensor reference(const Inputs& in) {
  const auto q = in.q.to(torch::kCPU, torch::kDouble), k = in.keys.to(torch::kCPU, torch::kDouble);
  const auto v = in.values.to(torch::kCPU, torch::kDouble);
  const auto pos = in.positions.to(torch::kCPU);
  std::vector<torch::Tensor> rows;
  for (int64_t b = 0; b < q.size(0); ++b) {
    const int64_t n = pos[b].item<int64_t>() + 1;
    const auto kb = k[b].narrow(1, 0, n), vb = v[b].narrow(1, 0, n);                        // (nh, n, hs)
    const auto s = torch::matmul(q[b], kb.transpose(1, 2)) / std::sqrt(double(q.size(3)));  // (nh, 1, n)
    rows.push_back(torch::matmul(torch::softmax(s, -1), vb));                               // (nh, 1, hs)
  }
  return torch::stack(rows);
}

// What the model ran before: SDPA over the whole cache under the mask of positions <= pos[b].
torch::Tensor masked_sdpa(const Inputs& in) {
  const auto keys = torch::arange(in.keys.size(2), in.positions.options());
  const auto mask = keys.view({1, 1, 1, -1}) <= in.positions.view({-1, 1, 1, 1});  // (B, 1, 1, capacity)
  return torch::scaled_dot_product_attention(in.q, in.keys, in.values, mask);
}

std::string name_of(torch::ScalarType dtype, int64_t B, int64_t nh, int64_t hs, torch::Device device) {
  return std::string(device.is_cuda() ? "cuda " : "cpu ") + c10::toString(dtype) + " B=" + std::to_string(B) +
         " nh=" + std::to_string(nh) + " hs=" + std::to_string(hs);
}

void check_accuracy(torch::Device device, const std::vector<torch::ScalarType>& dtypes,
                    const std::vector<int64_t>& head_sizes) {
  torch::NoGradGuard no_grad;
  struct Case {
    int64_t B, nh, capacity;
    std::vector<int64_t> pos;
  };
  const std::vector<Case> cases = {
      {1, 1, 1, {0}},
      {3, 2, 40, {0, 39, 17}},
      {5, 4, 300, {299, 0, 31, 32, 130}},  // tile edges (32) and several warps' tiles
      {2, 12, 1024, {1023, 500}},          // gpt2-124m's heads, a full context
  };
  for (const auto dtype : dtypes) {
    for (const int64_t hs : head_sizes) {
      for (const auto& c : cases) {
        const auto in = make_inputs(c.B, c.nh, c.capacity, hs, c.pos, dtype, device, c.B * 100 + hs);
        ASSERT_TRUE(kernels::slot_attention_applies(in.q, in.keys, in.values, in.positions));
        const auto y = kernels::slot_attention(in.q, in.keys, in.values, in.positions);
        ASSERT_EQ(y.sizes(), torch::IntArrayRef({c.B, c.nh, 1, hs}));
        ASSERT_EQ(y.scalar_type(), dtype);
        ASSERT_TRUE(y.is_contiguous());
        const auto ref = reference(in);
        expect_as_accurate(name_of(dtype, c.B, c.nh, hs, device) + " cap=" + std::to_string(c.capacity), y,
                           masked_sdpa(in), ref);
        // Within rounding of float64 in absolute terms too: fp32 accumulation, then one rounding
        // to the dtype (bf16: 2^-9 relative).
        const double bound = dtype == torch::kFloat ? 1e-5 : dtype == torch::kHalf ? 2e-3 : 8e-3;
        EXPECT_LE(errors_of(y, ref).max, bound) << name_of(dtype, c.B, c.nh, hs, device);
      }
    }
  }
}

// Row 0's bits with other rows changed, in a batch of one, and with a larger cache.
void check_invariance(torch::Device device, torch::ScalarType dtype, int64_t hs) {
  torch::NoGradGuard no_grad;
  const int64_t B = 6, nh = 3, capacity = 200;
  const std::vector<int64_t> pos = {150, 0, 199, 64, 5, 31};
  const auto in = make_inputs(B, nh, capacity, hs, pos, dtype, device, 7);
  const auto y = kernels::slot_attention(in.q, in.keys, in.values, in.positions);
  const std::string what = name_of(dtype, B, nh, hs, device);

  // Every other row: new keys, values, queries and positions.
  auto other = make_inputs(B, nh, capacity, hs, {199, 199, 3, 0, 198, 100}, dtype, device, 8);
  other.qkv[0].copy_(in.qkv[0]);
  other.keys[0].copy_(in.keys[0]);
  other.values[0].copy_(in.values[0]);
  other.positions[0].fill_(pos[0]);
  const auto y_other = kernels::slot_attention(other.q, other.keys, other.values, other.positions);
  EXPECT_TRUE(torch::equal(y[0], y_other[0])) << what << ": row 0 changed with the other rows";

  // Each row alone, in a batch of one.
  for (int64_t b = 0; b < B; ++b) {
    const auto q1 = in.q.narrow(0, b, 1), k1 = in.keys.narrow(0, b, 1), v1 = in.values.narrow(0, b, 1);
    const auto y1 = kernels::slot_attention(q1, k1, v1, in.positions.narrow(0, b, 1));
    EXPECT_TRUE(torch::equal(y[b], y1[0])) << what << ": row " << b << " alone";
  }

  // A larger cache (other values past the old capacity) holding the same prefix.
  const int64_t big = 1024;
  auto keys = torch::randn({B, nh, big, hs}, torch::dtype(torch::kFloat)).to(device, dtype);
  auto values = torch::randn({B, nh, big, hs}, torch::dtype(torch::kFloat)).to(device, dtype);
  keys.narrow(2, 0, capacity).copy_(in.keys);
  values.narrow(2, 0, capacity).copy_(in.values);
  const auto y_big = kernels::slot_attention(in.q, keys, values, in.positions);
  EXPECT_TRUE(torch::equal(y, y_big)) << what << ": capacity " << capacity << " against " << big;

  // Row 0 among many copies: 100 rows x nh heads are more blocks than a GPU has SMs, where the CUDA
  // launch reads a tile's values after its scores rather than with its keys (slot_attention.cu);
  // the sums are the same, so the bits must be.
  const int64_t many = 100;
  const auto y_many = kernels::slot_attention(
      in.q.narrow(0, 0, 1).repeat({many, 1, 1, 1}), in.keys.narrow(0, 0, 1).repeat({many, 1, 1, 1}),
      in.values.narrow(0, 0, 1).repeat({many, 1, 1, 1}), in.positions.narrow(0, 0, 1).repeat({many}));
  EXPECT_TRUE(torch::equal(y[0], y_many[0])) << what << ": row 0 in a batch of " << many;
}

TEST(SlotAttentionCpu, MatchesFloat64Reference) {
  check_accuracy(torch::kCPU, {torch::kFloat, torch::kBFloat16}, {64, 32});
}

TEST(SlotAttentionCpu, RowBitsDependOnlyOnTheRow) {
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) check_invariance(torch::kCPU, dtype, 64);
}

TEST(SlotAttentionCpu, ContractChecks) {
  torch::NoGradGuard no_grad;
  const auto in = make_inputs(2, 2, 8, 16, {3, 7}, torch::kFloat, torch::kCPU, 1);
  EXPECT_FALSE(kernels::slot_attention_applies(in.q.to(torch::kDouble), in.keys.to(torch::kDouble),
                                               in.values.to(torch::kDouble), in.positions));
  EXPECT_FALSE(kernels::slot_attention_applies(in.q, in.keys.transpose(2, 3), in.values, in.positions));
  EXPECT_FALSE(kernels::slot_attention_applies(in.q, in.keys, in.values, in.positions.to(torch::kInt)));
  EXPECT_THROW(kernels::slot_attention(in.q, in.keys, in.values, torch::tensor({3, 8}, torch::kLong)),
               std::invalid_argument);
  {
    torch::AutoGradMode grad(true);
    const auto q = in.q.clone().requires_grad_(true);
    EXPECT_FALSE(kernels::slot_attention_applies(q, in.keys, in.values, in.positions));
  }
}

TEST(SlotAttentionCuda, MatchesFloat64Reference) {
  REQUIRE_CUDA();
  check_accuracy(torch::kCUDA, {torch::kFloat, torch::kBFloat16, torch::kHalf}, {64, 32, 128, 80});
}

TEST(SlotAttentionCuda, RowBitsDependOnlyOnTheRow) {
  REQUIRE_CUDA();
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    for (const int64_t hs : {64, 128}) check_invariance(torch::kCUDA, dtype, hs);
  }
}

TEST(SlotAttentionCuda, OddHeadSizeFallsBackAndBadPositionIsNan) {
  REQUIRE_CUDA();
  torch::NoGradGuard no_grad;
  const auto odd = make_inputs(2, 2, 8, 33, {3, 7}, torch::kFloat, torch::kCUDA, 2);
  EXPECT_FALSE(kernels::slot_attention_applies(odd.q, odd.keys, odd.values, odd.positions));
  EXPECT_TRUE(kernels::slot_attention_applies(odd.q.cpu(), odd.keys.cpu(), odd.values.cpu(), odd.positions.cpu()));
  const auto in = make_inputs(2, 2, 8, 64, {3, 8}, torch::kFloat, torch::kCUDA, 3);
  const auto y = kernels::slot_attention(in.q, in.keys, in.values, in.positions).cpu();
  EXPECT_TRUE(torch::isfinite(y[0]).all().item<bool>());
  EXPECT_TRUE(torch::isnan(y[1]).all().item<bool>()) << "position 8 of capacity 8";
}

}  // namespace
}  // namespace gpt2
