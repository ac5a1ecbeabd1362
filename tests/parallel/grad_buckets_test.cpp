// Gradient buckets: the reduced gradient is the sum over ranks, buckets are launched in order
// and the first one before backward has finished, and parameters without a gradient don't hang.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/flat_layout.h"
#include "parallel/grad_buckets.h"

namespace gpt2::parallel {
namespace {

// Long enough never to trip on a healthy run of these tests.
constexpr double kTimeoutSeconds = 120;

// A stack of linear layers whose input depends on the rank, so every rank's gradient differs.
struct Stack {
  std::vector<torch::Tensor> weights;
  explicit Stack(int layers, int width) {
    torch::manual_seed(0);  // the same weights on every rank
    for (int i = 0; i < layers; ++i)
      weights.push_back((torch::randn({width, width}, torch::kFloat64) / width).set_requires_grad(true));
  }
  torch::Tensor loss(const torch::Tensor& x, int skip_layer = -1) {
    auto h = x;
    for (int i = 0; i < static_cast<int>(weights.size()); ++i)
      if (i != skip_layer) h = torch::tanh(h.matmul(weights[i]));
    return h.pow(2).sum();
  }
  torch::Tensor input(int rank) const {
    return torch::linspace(-1.0, 1.0, 3 * weights[0].size(0), torch::kFloat64).view({3, -1}) * (rank + 1);
  }
};

// Each rank's gradients computed alone, summed over ranks: the expected reduction. Rank
// `skip_rank` leaves out layer `skip_layer` (its gradient there is zero).
std::vector<torch::Tensor> expected_sum(int layers, int width, int world, int skip_rank = -1, int skip_layer = -1) {
  std::vector<torch::Tensor> sum;
  for (int r = 0; r < world; ++r) {
    Stack s(layers, width);
    s.loss(s.input(r), r == skip_rank ? skip_layer : -1).backward();
    for (int i = 0; i < layers; ++i) {
      auto g = s.weights[i].grad().defined() ? s.weights[i].grad() : torch::zeros_like(s.weights[i]);
      if (r == 0)
        sum.push_back(g.clone());
      else
        sum[i] += g;
    }
  }
  return sum;
}

TEST(GradBuckets, ReducedGradientIsTheSumOverRanksWithManyBuckets) {
  auto comm = make_mpi_communicator(MPI_COMM_WORLD, kTimeoutSeconds);
  Stack s(6, 16);
  // 16x16 doubles = 2 KiB per weight; a 3 KiB cap makes two weights per bucket -> 3 buckets.
  const FlatLayout layout(s.weights, comm->world_size());
  GradBuckets buckets(s.weights, layout, 3 * 1024, *comm);
  EXPECT_EQ(buckets.num_buckets(), 3);
  const auto want = expected_sum(6, 16, comm->world_size());
  for (int step = 0; step < 2; ++step) {  // twice: zero() must reset everything
    buckets.prepare_backward(true);
    s.loss(s.input(comm->rank())).backward();
    buckets.finish();
    for (int i = 0; i < 6; ++i) EXPECT_TRUE(torch::allclose(s.weights[i].grad(), want[i], 1e-12, 1e-12)) << i;
    buckets.zero();
  }
}

TEST(GradBuckets, AccumulatesWithoutReducingUntilTheLastMicroStep) {
  auto comm = make_mpi_communicator(MPI_COMM_WORLD, kTimeoutSeconds);
  Stack s(3, 8);
  const FlatLayout layout(s.weights, comm->world_size());
  GradBuckets buckets(s.weights, layout, 1, *comm);  // one parameter per bucket
  std::vector<std::string> events;
  buckets.set_observer([&](const std::string& what, int b, int) { events.push_back(what + std::to_string(b)); });
  buckets.prepare_backward(false);
  s.loss(s.input(comm->rank())).backward();
  EXPECT_TRUE(events.empty());  // accumulation only
  buckets.prepare_backward(true);
  s.loss(s.input(comm->rank())).backward();
  buckets.finish();
  EXPECT_EQ(events, (std::vector<std::string>{"launch0", "launch1", "launch2"}));
  const auto want = expected_sum(3, 8, comm->world_size());
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(torch::allclose(s.weights[i].grad(), 2 * want[i], 1e-12, 1e-12)) << i;
}

// A buffer of another dtype than the parameters (precision.reduce_dtype = fp32 for bf16 params;
// here fp32 params into an fp64 buffer, which MPI reduces): the hooks add each arriving gradient
// into the buffer, so accumulation and the reduction happen in the buffer's dtype, and .grad is
// left empty. Expected: twice the per-rank sum, from fp32 gradients computed independently.
TEST(GradBuckets, BufferOfAnotherDtypeAccumulatesConvertedGradients) {
  auto comm = make_mpi_communicator(MPI_COMM_WORLD, kTimeoutSeconds);
  Stack s(3, 8);
  for (auto& w : s.weights) w = w.detach().to(torch::kFloat).set_requires_grad(true);
  const FlatLayout layout(s.weights, comm->world_size());
  GradBuckets buckets(s.weights, layout, 1, *comm, torch::kDouble);
  ASSERT_EQ(buckets.grads().scalar_type(), torch::kDouble);
  for (bool reduce : {false, true}) {
    buckets.prepare_backward(reduce);
    s.loss(s.input(comm->rank()).to(torch::kFloat)).backward();
  }
  buckets.finish();
  // The buffer minus `times` x every rank's fp32 gradient (computed independently) is zero.
  auto expect_sum_of_ranks = [&](double times) {
    for (int r = 0; r < comm->world_size(); ++r) {
      Stack ref(3, 8);
      for (auto& w : ref.weights) w = w.detach().to(torch::kFloat).set_requires_grad(true);
      ref.loss(ref.input(r).to(torch::kFloat)).backward();
      for (int i = 0; i < 3; ++i) {
        auto got = buckets.grads().narrow(0, layout.offset[i], layout.numel[i]);
        got.sub_(times * ref.weights[i].grad().to(torch::kDouble).flatten());  // peel off rank r's share
      }
    }
    for (int i = 0; i < 3; ++i) {
      EXPECT_FALSE(s.weights[i].grad().defined()) << i;
      EXPECT_LE(buckets.grads().narrow(0, layout.offset[i], layout.numel[i]).abs().max().item<double>(), 1e-12) << i;
    }
  };
  expect_sum_of_ranks(2);
  // After zero() the next step starts over (its first gradient is copied in, not added).
  buckets.zero();
  buckets.prepare_backward(true);
  s.loss(s.input(comm->rank()).to(torch::kFloat)).backward();
  buckets.finish();
  expect_sum_of_ranks(1);
}

TEST(GradBuckets, FirstBucketIsReducedBeforeBackwardFinishes) {
  auto comm = make_mpi_communicator(MPI_COMM_WORLD, kTimeoutSeconds);
  Stack s(8, 32);
  const FlatLayout layout(s.weights, comm->world_size());
  GradBuckets buckets(s.weights, layout, 1, *comm);  // one parameter per bucket: 8 buckets
  std::vector<std::pair<int, int>> launches;         // (bucket, parameters still without gradient)
  bool backward_returned = false;
  std::vector<bool> launched_during_backward;
  buckets.set_observer([&](const std::string&, int b, int pending) {
    launches.emplace_back(b, pending);
    launched_during_backward.push_back(!backward_returned);
  });
  buckets.prepare_backward(true);
  s.loss(s.input(comm->rank())).backward();
  backward_returned = true;
  buckets.finish();
  ASSERT_EQ(launches.size(), 8u);
  for (int b = 0; b < 8; ++b) EXPECT_EQ(launches[b].first, b);  // strictly in order
  // Bucket 0 holds the last layer, whose gradient comes first: it was launched while 7 other
  // parameters still waited for theirs, i.e. while backward was still running.
  EXPECT_EQ(launches[0].second, 7);
  EXPECT_TRUE(launched_during_backward[0]);
  EXPECT_TRUE(launched_during_backward[7]);  // every bucket went out from inside backward
}

TEST(GradBuckets, ParameterWithoutGradientOnOneRankDoesNotHang) {
  auto comm = make_mpi_communicator(MPI_COMM_WORLD, kTimeoutSeconds);
  Stack s(4, 8);
  const FlatLayout layout(s.weights, comm->world_size());
  GradBuckets buckets(s.weights, layout, 1, *comm);
  // Rank 1 skips layer 2 (data-dependent control flow): its hook never fires there.
  const int skip = comm->rank() == 1 ? 2 : -1;
  buckets.prepare_backward(true);
  s.loss(s.input(comm->rank()), skip).backward();
  buckets.finish();
  // Expected: each rank's own gradients (rank 1's layer-2 gradient is zero) summed.
  const auto want = expected_sum(4, 8, comm->world_size(), /*skip_rank=*/1, /*skip_layer=*/2);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(torch::allclose(s.weights[i].grad(), want[i], 1e-12, 1e-12)) << i;
}

// zero() fills nothing (Note [Gradient hand-over]): a step's first gradient is copied over the
// slot, .grad becomes the slot, and a parameter that gets none this step reads zero, not the last
// step's gradient. Step 1: every rank computes every layer; step 2: rank 0 skips layer 1.
TEST(GradBuckets, AParameterWithoutGradientInALaterStepReadsZeroNotTheLastStep) {
  auto comm = make_mpi_communicator(MPI_COMM_WORLD, kTimeoutSeconds);
  Stack s(3, 8);
  const FlatLayout layout(s.weights, comm->world_size());
  GradBuckets buckets(s.weights, layout, 1, *comm);
  buckets.prepare_backward(true);
  s.loss(s.input(comm->rank())).backward();
  buckets.finish();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(s.weights[i].grad().data_ptr(), buckets.grads().narrow(0, layout.offset[i], 1).data_ptr()) << i;
  }
  buckets.zero();
  EXPECT_FALSE(s.weights[0].grad().defined());
  const int skip = comm->rank() == 0 ? 1 : -1;
  buckets.prepare_backward(true);
  s.loss(s.input(comm->rank()), skip).backward();
  buckets.finish();
  const auto want = expected_sum(3, 8, comm->world_size(), /*skip_rank=*/0, /*skip_layer=*/1);
  for (int i = 0; i < 3; ++i) {
    const auto got = buckets.grads().narrow(0, layout.offset[i], layout.numel[i]).view(want[i].sizes());
    EXPECT_TRUE(torch::allclose(got, want[i], 1e-12, 1e-12)) << i;
  }
}

// Note [Interleaved shards]: every rank owns chunk r of every block, the pieces tile the space
// once, each whole grid cells, and each rank holds padded / world elements.
TEST(FlatLayout, InterleavedPiecesTileTheSpaceOnTheGrid) {
  const int world = 3;
  std::vector<torch::Tensor> params;
  for (int64_t n : {5000, 70000, 123, 40000}) params.push_back(torch::zeros({n}));
  const FlatLayout layout(params, world, /*interleave_elements=*/20000);
  ASSERT_TRUE(layout.interleaved());
  const int64_t unit = world * FlatLayout::kGrid;
  EXPECT_EQ(layout.padded % unit, 0);
  std::vector<int> owners(static_cast<size_t>(layout.padded), 0);
  for (const FlatRange& b : layout.blocks) EXPECT_EQ(b.size() % unit, 0) << b.begin;
  EXPECT_EQ(layout.blocks.front().size(), 24576);  // 20000 rounded up to a multiple of 3 x 2048
  for (int r = 0; r < world; ++r) {
    int64_t held = 0;
    const auto pieces = layout.pieces(r);
    ASSERT_EQ(pieces.size(), layout.blocks.size());
    for (size_t k = 0; k < pieces.size(); ++k) {
      EXPECT_EQ(pieces[k].begin % FlatLayout::kGrid, 0);
      EXPECT_EQ(pieces[k].begin, layout.blocks[k].begin + r * layout.blocks[k].size() / world);
      for (int64_t x = pieces[k].begin; x < pieces[k].end; ++x) ++owners[static_cast<size_t>(x)];
      held += pieces[k].size();
    }
    EXPECT_EQ(held, layout.shard_size());
  }
  EXPECT_TRUE(std::all_of(owners.begin(), owners.end(), [](int n) { return n == 1; }));
  const FlatLayout contiguous(params, world);
  EXPECT_FALSE(contiguous.interleaved());
  EXPECT_EQ(contiguous.pieces(1).size(), 1u);
  EXPECT_EQ(contiguous.pieces(1)[0].begin, contiguous.shard_size());
}

// ZeRO 2: each block is reduce-scattered in every micro-step, and a rank keeps the sum over ranks
// and micro-steps of its own pieces only; the parameters' .grad is dropped. Two micro-steps, in the
// second of which the last rank skips layer 2; two steps, so zero() starts the next over. Blocks
// of 2 x world x kGrid elements cut through the 4096-element weights.
TEST(GradBuckets, Zero2ReduceScattersEveryMicroStepIntoThisRanksPieces) {
  auto comm = make_mpi_communicator(MPI_COMM_WORLD, kTimeoutSeconds);
  const int world = comm->world_size(), rank = comm->rank();
  Stack s(6, 64);
  const FlatLayout layout(s.weights, world, /*interleave_elements=*/2 * world * FlatLayout::kGrid);
  ASSERT_TRUE(layout.interleaved());
  GradBuckets buckets(s.weights, layout, 1, *comm);
  ASSERT_EQ(buckets.num_buckets(), static_cast<int>(layout.blocks.size()));
  std::vector<int> launched;
  buckets.set_observer([&](const std::string&, int b, int) { launched.push_back(b); });
  // The expected flat gradient: both micro-steps' sums over ranks.
  const auto full = expected_sum(6, 64, world), skipped = expected_sum(6, 64, world, world - 1, 2);
  auto want_flat = torch::zeros({layout.padded}, torch::kFloat64);
  for (int i = 0; i < 6; ++i) {
    want_flat.narrow(0, layout.offset[i], layout.numel[i]).copy_((full[i] + skipped[i]).reshape({-1}));
  }
  std::vector<torch::Tensor> mine;
  for (const FlatRange& p : layout.pieces(rank)) mine.push_back(want_flat.narrow(0, p.begin, p.size()));
  const auto want = torch::cat(mine);
  for (int step = 0; step < 2; ++step) {
    launched.clear();
    for (int micro = 0; micro < 2; ++micro) {
      buckets.prepare_backward(/*reduce=*/micro == 1);  // interleaved: every micro-step reduces
      s.loss(s.input(rank), micro == 1 && rank == world - 1 ? 2 : -1).backward();
    }
    buckets.finish();
    ASSERT_EQ(buckets.grads().numel(), layout.shard_size());
    EXPECT_TRUE(torch::allclose(buckets.grads(), want, 1e-12, 1e-12)) << "step " << step;
    for (const auto& w : s.weights) EXPECT_FALSE(w.grad().defined());
    // Each micro-step launched every bucket, in order.
    std::vector<int> in_order;
    for (int m = 0; m < 2; ++m) {
      for (int b = 0; b < buckets.num_buckets(); ++b) in_order.push_back(b);
    }
    EXPECT_EQ(launched, in_order);
    buckets.zero();
  }
  // Gradient memory: this rank's pieces plus at most three staging buffers of a block (and its chunk).
  const int64_t block = layout.blocks.front().size();
  EXPECT_LE(buckets.bytes(), 8 * (layout.shard_size() + 3 * (block + block / world)));
}

}  // namespace
}  // namespace gpt2::parallel
