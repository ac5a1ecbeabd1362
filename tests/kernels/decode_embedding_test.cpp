// decode_embedding (src/kernels/decode_linear.h), the decode step's input, against an element-by-
// element reference: the table's element in the dtype (an int8 one: q * scale in fp32, rounded to
// the dtype), plus wpe's, summed in fp32 and rounded once. Both are exact operations on the same
// values, so the reference and the kernels agree bit for bit, on the CPU and on CUDA (which skips
// without a GPU). Out of range: CUDA makes the row NaN, the CPU throws.
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/kernels/decode_linear.h"
#include "src/kernels/int8_linear.h"

namespace gpt2::kernels {
namespace {

constexpr int64_t kVocab = 50, kPositions = 40, kC = 64;

float round_to(float v, torch::ScalarType dtype) {
  if (dtype == torch::kBFloat16) return static_cast<float>(c10::BFloat16(v));
  if (dtype == torch::kHalf) return static_cast<float>(c10::Half(v));
  return v;
}

// (rows, C) in `dtype`, from the CPU tables.
torch::Tensor reference(const std::vector<int64_t>& ids, const std::vector<int64_t>& positions, const torch::Tensor& w,
                        const Int8Weight* int8, const torch::Tensor& wpe) {
  const auto dtype = wpe.scalar_type();
  const auto wf = int8 ? torch::Tensor() : w.to(torch::kFloat), pf = wpe.to(torch::kFloat);
  auto out = torch::empty({static_cast<int64_t>(ids.size()), kC});
  for (size_t r = 0; r < ids.size(); ++r) {
    for (int64_t c = 0; c < kC; ++c) {
      float e;
      if (int8 != nullptr) {
        const int64_t group = kC / int8->scale.size(1);
        volatile float product =  // volatile: no contraction with the add below
            static_cast<float>(int8->q[ids[r]][c].item<int8_t>()) * int8->scale[ids[r]][c / group].item<float>();
        e = round_to(product, dtype);
      } else {
        e = wf[ids[r]][c].item<float>();
      }
      out[r][c] = round_to(e + pf[positions[r]][c].item<float>(), dtype);
    }
  }
  return out.to(dtype);
}

struct Tables {
  torch::Tensor w, wpe;
  Int8Weight int8;
};

Tables tables(torch::ScalarType dtype, int64_t group) {
  torch::manual_seed(5);
  const auto w = torch::randn({kVocab, kC}) * 0.1;
  return {w.to(dtype), (torch::randn({kPositions, kC}) * 0.01).to(dtype), quantize_int8(w, group)};
}

const std::vector<int64_t> kIds = {3, 49, 0}, kPos = {0, 39, 17};

TEST(DecodeEmbeddingCpu, EachElementRoundedAsTheUnfusedOps) {
  for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (const int64_t group : {0, 16}) {
      const Tables t = tables(dtype, group);
      const auto ids = torch::tensor(kIds), pos = torch::tensor(kPos);
      const std::string what = std::string(c10::toString(dtype)) + ", group " + std::to_string(group);
      EXPECT_TRUE(torch::equal(decode_embedding(ids, pos, {t.w, nullptr, {}}, t.wpe),
                               reference(kIds, kPos, t.w, nullptr, t.wpe)))
          << what;
      EXPECT_TRUE(torch::equal(decode_embedding(ids, pos, {{}, &t.int8, {}}, t.wpe),
                               reference(kIds, kPos, t.w, &t.int8, t.wpe)))
          << what << ", int8";
    }
  }
}

TEST(DecodeEmbeddingCpu, BadInputsAreRefusedByName) {
  const Tables t = tables(torch::kBFloat16, 0);
  const auto ids = torch::tensor(kIds), pos = torch::tensor(kPos);
  const auto refused = [](auto&& call, const std::string& what) {
    try {
      call();
      ADD_FAILURE() << "accepted: " << what;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("decode_embedding"), std::string::npos) << e.what();
    }
  };
  refused([&] { decode_embedding(ids, pos, {t.w.to(torch::kFloat), nullptr, {}}, t.wpe); }, "a table in fp32");
  refused([&] { decode_embedding(ids.to(torch::kInt), pos, {t.w, nullptr, {}}, t.wpe); }, "int32 ids");
  refused([&] { decode_embedding(ids, pos.narrow(0, 0, 2), {t.w, nullptr, {}}, t.wpe); }, "fewer positions");
  refused([&] { decode_embedding(ids, pos, {t.w.narrow(1, 0, 32), nullptr, {}}, t.wpe); }, "a narrower table");
  EXPECT_ANY_THROW(decode_embedding(torch::tensor(std::vector<int64_t>{kVocab}), pos.narrow(0, 0, 1),
                                    {t.w, nullptr, {}}, t.wpe));  // an id past the table
}

TEST(DecodeEmbeddingCuda, TheCpuBitsAndNanRowsOutOfRange) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (const int64_t group : {0, 16}) {
      const Tables t = tables(dtype, group);
      const Int8Weight int8{t.int8.q.cuda(), t.int8.scale.cuda()};
      const auto w = t.w.cuda(), wpe = t.wpe.cuda();
      const std::string what = std::string(c10::toString(dtype)) + ", group " + std::to_string(group);
      const auto ids = torch::tensor(kIds).cuda(), pos = torch::tensor(kPos).cuda();
      EXPECT_TRUE(torch::equal(decode_embedding(ids, pos, {w, nullptr, {}}, wpe).cpu(),
                               reference(kIds, kPos, t.w, nullptr, t.wpe)))
          << what;
      EXPECT_TRUE(torch::equal(decode_embedding(ids, pos, {{}, &int8, {}}, wpe).cpu(),
                               reference(kIds, kPos, t.w, &t.int8, t.wpe)))
          << what << ", int8";
      // Row 1's id and row 2's position out of range: NaN rows; row 0 as before; both tables.
      for (const bool quantized : {false, true}) {
        const DecodeWeight table = quantized ? DecodeWeight{{}, &int8, {}} : DecodeWeight{w, nullptr, {}};
        const auto bad = decode_embedding(torch::tensor(std::vector<int64_t>{3, kVocab, 0}).cuda(),
                                          torch::tensor(std::vector<int64_t>{0, 1, kPositions}).cuda(), table, wpe)
                             .cpu();
        const auto want = reference(kIds, kPos, t.w, quantized ? &t.int8 : nullptr, t.wpe);
        const std::string which = what + (quantized ? ", int8" : "");
        EXPECT_TRUE(torch::equal(bad[0], want[0])) << which;
        EXPECT_TRUE(bad[1].isnan().all().item<bool>()) << which;
        EXPECT_TRUE(bad[2].isnan().all().item<bool>()) << which;
      }
    }
  }
}

}  // namespace
}  // namespace gpt2::kernels
