// The stateless sampler: every window once per epoch, seeded orders, rank-count independence.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "data/batch_sampler.h"
#include "src/base/errors.h"

namespace gpt2::data {
namespace {

std::vector<int64_t> epoch_order(const BatchSampler& s, int64_t epoch) {
  std::vector<int64_t> out;
  for (int64_t j = 0; j < s.num_windows(); ++j) out.push_back(s.window_start(epoch * s.num_windows() + j));
  return out;
}

TEST(BatchSampler, EveryWindowOncePerEpoch) {
  for (int64_t tokens : {17, 65, 1000, 4097, 100001}) {
    BatchSampler s(tokens, 16, 42);
    EXPECT_EQ(s.num_windows(), (tokens - 1) / 16);
    for (int64_t e = 0; e < 3; ++e) {
      auto order = epoch_order(s, e);
      std::set<int64_t> seen(order.begin(), order.end());
      ASSERT_EQ(seen.size(), order.size()) << tokens;
      for (int64_t start : order) {
        EXPECT_EQ(start % 16, 0);
        EXPECT_LE(start + 17, tokens);  // input + shifted target fit
      }
    }
  }
}

TEST(BatchSampler, OrdersDifferBySeedAndEpochAndRepeatAcrossRuns) {
  BatchSampler a(100001, 16, 1), a2(100001, 16, 1), b(100001, 16, 2);
  EXPECT_EQ(epoch_order(a, 0), epoch_order(a2, 0));
  EXPECT_NE(epoch_order(a, 0), epoch_order(b, 0));
  EXPECT_NE(epoch_order(a, 0), epoch_order(a, 1));
}

TEST(BatchSampler, RanksSplitTheGlobalBatchLikeOneRank) {
  // 3 ranks x 2 micro-steps x 4 rows == 1 rank x 6 micro-steps x 4 rows, for every step.
  std::set<int64_t> three, one;
  for (int64_t step = 0; step < 5; ++step) {
    for (int rank = 0; rank < 3; ++rank)
      for (int64_t m = 0; m < 2; ++m)
        for (int64_t r = 0; r < 4; ++r) three.insert(global_sample_index(step, m, rank, r, 4, 3, 2));
    for (int64_t m = 0; m < 6; ++m)
      for (int64_t r = 0; r < 4; ++r) one.insert(global_sample_index(step, m, 0, r, 4, 1, 6));
  }
  EXPECT_EQ(three, one);
  EXPECT_EQ(three.size(), 5u * 24u);
  EXPECT_EQ(*three.rbegin(), 5 * 24 - 1);
}

TEST(BatchSampler, TooShortStreamIsANamedError) {
  EXPECT_THROW(BatchSampler(16, 16, 0), UserError);
  EXPECT_NO_THROW(BatchSampler(17, 16, 0));
  try {
    BatchSampler(10, 32, 0, "data.val = v.h5");
    FAIL() << "no error for a stream shorter than one window";
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(),
                 "data.val = v.h5: token stream of 10 tokens is shorter than one window of 33 tokens "
                 "(the sequence length + 1)");
  }
}

}  // namespace
}  // namespace gpt2::data
