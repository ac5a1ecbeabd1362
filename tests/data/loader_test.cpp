// The data path from token files to batches: shards as one stream, the prefetcher's order and
// error handling, and resumption (same and different rank counts) reading exactly what an
// uninterrupted run reads.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <set>
#include <stdexcept>
#include <vector>

#include "data/batch_loader.h"
#include "data/batch_sampler.h"
#include "data/prefetcher.h"
#include "data/token_stream.h"
#include "tests/test_util.h"

namespace gpt2::data {
namespace {

std::vector<uint32_t> pattern(int64_t n, uint32_t offset) {
  std::vector<uint32_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(static_cast<uint32_t>((i * 31 + offset) % 1000));
  return v;
}

TokenFileAttrs attrs() {
  TokenFileAttrs a;
  a.vocab_size = 1000;
  a.eot_token = 999;
  return a;
}

TEST(TokenStream, ShardsReadAsTheirConcatenation) {
  test::TempDir dir;
  std::vector<uint32_t> all;
  for (int k = 0; k < 3; ++k) {
    auto part = pattern(100 + 37 * k, k);
    write_token_file(dir.file("shard_" + std::to_string(k) + ".h5"), part, attrs());
    all.insert(all.end(), part.begin(), part.end());
  }
  for (const std::string& spec :
       {dir.file("shard_*.h5"), dir.file("shard_0.h5") + "," + dir.file("shard_1.h5") + "," + dir.file("shard_2.h5")}) {
    auto s = TokenStream::open(spec, 1000, "data.train");
    ASSERT_EQ(s.size(), static_cast<int64_t>(all.size()));
    EXPECT_EQ(s.describe(), std::to_string(all.size()) + " tokens in 3 file(s) from " + dir.file("shard_0.h5"));
    std::vector<int64_t> got(all.size());
    s.read(0, s.size(), got.data());
    for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(got[i], all[i]) << i;
    std::vector<int64_t> window(50);
    s.read(80, 50, window.data());  // crosses from shard 0 into shard 1
    for (int i = 0; i < 50; ++i) EXPECT_EQ(window[i], all[80 + i]);
    EXPECT_EQ(s.locate(120).first, dir.file("shard_1.h5"));
    EXPECT_EQ(s.locate(120).second, 20);
  }
}

TEST(TokenStream, ErrorsNameTheSpecOrFile) {
  test::TempDir dir;
  EXPECT_HAS(test::user_error([&] { TokenStream::open(dir.file("nothing_*.h5"), 1000, "data.train"); }), "data.train");
  EXPECT_HAS(test::user_error([&] { TokenStream::open(dir.file("nothing_*.h5"), 1000, "data.train"); }),
             "matches no file");
  write_token_file(dir.file("a.h5"), pattern(100, 0), attrs());
  auto other = attrs();
  other.eot_token = 5;
  write_token_file(dir.file("b.h5"), pattern(100, 0), other);
  EXPECT_HAS(test::user_error([&] { TokenStream::open(dir.file("*.h5"), 1000, "data.train"); }), "b.h5");
  EXPECT_HAS(test::user_error([&] { TokenStream::open(dir.file("missing.h5"), 1000, "data.val"); }), "missing.h5");
}

TEST(Prefetcher, DeliversInOrderAndSurfacesErrors) {
  std::atomic<int> filled{0};
  auto fill = [&](int64_t index, torch::Tensor& buf) {
    if (index == 7) throw std::runtime_error("disk on fire at batch 7");
    buf.fill_(index);
    ++filled;
  };
  Prefetcher p(2, 3, /*depth=*/3, /*pinned=*/false, fill, /*first_index=*/2);
  for (int64_t i = 2; i < 7; ++i) {
    auto slot = p.next();
    EXPECT_EQ(slot.index, i);
    EXPECT_EQ(slot.buffer[1][2].item<int64_t>(), i);
    p.release(slot);
  }
  try {
    p.next();
    FAIL() << "expected the fill error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "disk on fire at batch 7");
  }
}

TEST(Prefetcher, StopsCleanlyWhileAhead) {
  int reusable_calls = 0;
  {
    Prefetcher p(
        1, 4, /*depth=*/2, false, [](int64_t i, torch::Tensor& b) { b.fill_(i); }, 0);
    auto slot = p.next();
    p.release(slot, [&] { ++reusable_calls; });
    p.next();  // keep one in use; the thread is blocked on a full ring when we leave
  }
  EXPECT_LE(reusable_calls, 1);
}

// Windows read by `steps` optimizer steps starting at `first_step` on `world` ranks.
std::vector<int64_t> windows_read(const TokenStream& stream, const BatchSampler& sampler, int world, int64_t mb,
                                  int64_t accum, int64_t first_step, int64_t steps) {
  std::vector<int64_t> starts;
  for (int rank = 0; rank < world; ++rank) {
    BatchLoader loader(
        stream,
        [&](int64_t i, int64_t row) {
          return sampler.window_start(global_sample_index(i / accum, i % accum, rank, row, mb, world, accum));
        },
        mb, 8, 50000, torch::kCPU, /*depth=*/2, /*first_index=*/first_step * accum);
    for (int64_t i = 0; i < steps * accum; ++i) {
      auto b = loader.next();
      for (int64_t row = 0; row < mb; ++row) starts.push_back(b.x[row][0].item<int64_t>());  // token = position
    }
  }
  return starts;
}

TEST(BatchLoader, ResumeMidEpochReadsWhatAnUninterruptedRunReads) {
  test::TempDir dir;
  std::vector<uint32_t> tokens;
  for (int64_t i = 0; i < 20000; ++i) tokens.push_back(static_cast<uint32_t>((i * 7919) % 997));
  write_token_file(dir.file("t.h5"), tokens, attrs());
  auto stream = TokenStream::open(dir.file("t.h5"), 1000, "data.train");
  const BatchSampler sampler(stream.size(), 8, 42);
  auto make = [&](int64_t first_index) {
    return std::make_unique<BatchLoader>(
        stream,
        [&](int64_t i, int64_t row) {
          return sampler.window_start(global_sample_index(i / 2, i % 2, 0, row, 4, 1, 2));
        },
        4, 8, 1000, torch::kCPU, 3, first_index);
  };
  auto straight = make(0);
  std::vector<torch::Tensor> xs, ys;
  for (int i = 0; i < 20; ++i) {
    auto b = straight->next();
    xs.push_back(b.x);
    ys.push_back(b.y);
  }
  auto resumed = make(11);  // "stopped" after batch 10
  for (int i = 11; i < 20; ++i) {
    auto b = resumed->next();
    EXPECT_TRUE(torch::equal(b.x, xs[i])) << i;
    EXPECT_TRUE(torch::equal(b.y, ys[i])) << i;
    EXPECT_TRUE(torch::equal(b.x.narrow(1, 1, 7), b.y.narrow(1, 0, 7)));  // targets are inputs shifted
  }
  auto again = make(0)->get(5);  // the synchronous path reads the same batch
  EXPECT_TRUE(torch::equal(again.x, xs[5]));
}

TEST(BatchLoader, TwoRanksThenThreeReadWhatOneRankReads) {
  test::TempDir dir;
  // Token i is i: the first token of a row is the window's start.
  std::vector<uint32_t> tokens;
  for (int64_t i = 0; i < 40000; ++i) tokens.push_back(static_cast<uint32_t>(i));
  TokenFileAttrs wide;
  wide.vocab_size = 50000;
  wide.eot_token = 49999;
  write_token_file(dir.file("t.h5"), tokens, wide);
  auto stream = TokenStream::open(dir.file("t.h5"), 50000, "data.train");
  const BatchSampler sampler(stream.size(), 8, 7);
  // Global batch of 12 rows: 2 ranks x 2 rows x 3 micro-steps, then 3 ranks x 2 rows x 2.
  auto before = windows_read(stream, sampler, 2, 2, 3, 0, 6);
  auto after = windows_read(stream, sampler, 3, 2, 2, 6, 6);
  auto one = windows_read(stream, sampler, 1, 2, 6, 0, 12);
  std::multiset<int64_t> resumed(before.begin(), before.end());
  resumed.insert(after.begin(), after.end());
  std::multiset<int64_t> reference(one.begin(), one.end());
  EXPECT_EQ(resumed, reference);
  EXPECT_EQ(std::set<int64_t>(one.begin(), one.end()).size(), one.size());  // nothing twice in the epoch
  EXPECT_EQ(one.size(), 12u * 12u);
}

TEST(BatchLoader, IdsOutsideTheModelVocabNameFileAndPosition) {
  test::TempDir dir;
  auto tokens = pattern(500, 0);
  tokens[123] = 990;
  write_token_file(dir.file("t.h5"), tokens, attrs());
  auto stream = TokenStream::open(dir.file("t.h5"), 1000, "data.train");
  BatchLoader loader(
      stream, [](int64_t, int64_t) { return int64_t{120}; }, 1, 8, /*vocab_size=*/990, torch::kCPU, 2);
  const std::string msg = test::user_error([&] { loader.next(); });
  EXPECT_HAS(msg, "t.h5");
  EXPECT_HAS(msg, "position 123");
}

}  // namespace
}  // namespace gpt2::data
