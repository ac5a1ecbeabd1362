// N ranks train the same model as one rank with the same global batch: 20 steps of a tiny GPT-2
// in fp32 give per-step losses and final parameters within 1e-5 (relative). Rank 0 runs the
// one-rank reference on MPI_COMM_SELF inside the same job.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "data/token_file.h"
#include "parallel/flat_layout.h"
#include "parallel/rank_env.h"
#include "src/base/log.h"
#include "src/kernels/dtype.h"
#include "src/train/memory_estimate.h"
#include "src/train/trainer.h"
#include "tests/parallel/training_fixtures.h"
#include "tests/test_util.h"

namespace gpt2 {
namespace {

using test::quiet_logs;
using test::rel_error;
using test::SharedTokenFile;
using test::tiny_config;
using test::world_size;

// Training with `cfg` on all ranks against `reference` (default: the same config) on rank 0 alone.
void expect_same_as_one_rank(const Config& cfg, const Config* reference = nullptr) {
  const parallel::RankEnv world(MPI_COMM_WORLD);
  quiet_logs(world);
  TrainResult dp = train(cfg, world);
  if (world.rank() == 0) {
    const parallel::RankEnv self(MPI_COMM_SELF);
    TrainResult one = train(reference ? *reference : cfg, self);
    test::expect_same_training(dp, one, cfg.model.n_embd, 1e-5);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(DataParallel, SameAsOneRankWithTheSameGlobalBatch) {
  SharedTokenFile file;
  expect_same_as_one_rank(tiny_config(file.path(), 2 * 16 * world_size(), 25));
}

TEST(DataParallel, SameWithGradientAccumulation) {
  SharedTokenFile file;
  expect_same_as_one_rank(tiny_config(file.path(), 3 * 2 * 16 * world_size(), 25));
}

TEST(DataParallel, SameWithManySmallBuckets) {
  SharedTokenFile file;
  // 0.01 MiB = 10 KiB: the 2-layer model's ~20 parameter tensors land in many buckets.
  expect_same_as_one_rank(tiny_config(file.path(), 2 * 2 * 16 * world_size(), 0.01));
}

TEST(DataParallel, SameWithActivationCheckpointingOnTheRanks) {
  SharedTokenFile file;
  const auto plain = tiny_config(file.path(), 2 * 16 * world_size(), 0.01);
  auto recompute = plain;
  recompute.memory.activation_checkpointing = "full";  // the reducer's hooks must still fire
  expect_same_as_one_rank(recompute, &plain);
}

TEST(DataParallel, SameAsOneRankWithZero2AndAccumulation) {
  SharedTokenFile file;
  auto cfg = tiny_config(file.path(), 2 * 2 * 16 * world_size(), 0.01);
  cfg.parallel.zero_stage = 2;
  expect_same_as_one_rank(cfg);
}

// optim.name = muon (ZeRO 0): N ranks train the same model as one rank with the same global batch,
// within this file's one-rank bound (Muon's input, the momentum of a gradient summed in another
// order, moves by that order's rounding; Newton-Schulz is continuous in it), and the run learns
// (expect_same_training checks that the reference's loss falls).
TEST(DataParallel, MuonSameAsOneRank) {
  SharedTokenFile file;
  auto cfg = tiny_config(file.path(), 2 * 16 * world_size(), 0.01);
  cfg.optim.name = optim::UpdateRule::kMuon;
  expect_same_as_one_rank(cfg);
}

// ZeRO 1 and 2 on N ranks, with and without optimizer offload, train the same model as ZeRO 0 on
// N ranks, bit for bit in fp32 (Note [Partition-free arithmetic], optim/grad_norm.h: gradient sums
// in rank order, the norm over a fixed grid, the update element by element), with 1/N of its
// optimizer state per rank. Clipping is on (train.grad_clip = 1, the default).
// Note [ZeRO 2 with accumulation]: ZeRO 2 reduce-scatters every micro-step (no rank holds a whole
// gradient to accumulate into), so with accumulation it sums micro-steps of sums over ranks where
// ZeRO 0 sums ranks of sums over micro-steps: the same terms in another order, which is what N ranks
// against one rank differ by too. So it is held to that comparison's bound (1e-5, the one-rank
// tolerance of this file), and to exactness without accumulation.
TEST(DataParallel, Zero1And2AndOffloadMatchZero0WithAShareOfTheState) {
  SharedTokenFile file;
  const parallel::RankEnv world(MPI_COMM_WORLD);
  quiet_logs(world);
  const int64_t n = world_size();
  for (int64_t accum : {1, 2}) {
    auto cfg = tiny_config(file.path(), accum * 2 * 16 * world_size(), 0.01);
    TrainResult zero0 = train(cfg, world);
    int64_t offload_zero0_bytes = 0;
    for (const char* offload : {"none", "optimizer"}) {
      for (int64_t stage : {0, 1, 2}) {
        if (stage == 0 && std::string(offload) == "none") continue;  // the reference itself
        cfg.parallel.zero_stage = stage;
        cfg.parallel.offload = parse_choice<Offload>("parallel.offload", offload);
        cfg.parallel.offload_threads = 2;
        TrainResult sharded = train(cfg, world);
        SCOPED_TRACE("ZeRO " + std::to_string(stage) + ", offload " + offload + ", accumulation " +
                     std::to_string(accum));
        test::expect_same_training(sharded, zero0, cfg.model.n_embd, /*tol=*/stage == 2 && accum > 1 ? 1e-5 : 0);
        // ZeRO 2 keeps its interleaved shard's parameters apart (fp32 here) beside the state.
        const int64_t own_params =
            stage == 2 ? parallel::FlatLayout(sharded.model->parameters(), static_cast<int>(n)).padded / n * 4 : 0;
        if (std::string(offload) == "optimizer") {
          // All state in host memory; the shard's share of it is 1/N of ZeRO 0's.
          EXPECT_EQ(sharded.optimizer_state_bytes, own_params);
          if (stage == 0) offload_zero0_bytes = sharded.optimizer_host_bytes;
          const double ratio = static_cast<double>(sharded.optimizer_host_bytes) / offload_zero0_bytes;
          EXPECT_NEAR(ratio, stage == 0 ? 1.0 : 1.0 / n, 0.01);
          continue;
        }
        // Moments for a shard of padded / N elements (+ padding of under N elements, + one fp32
        // step counter per segment) against moments for every parameter.
        const double ratio =
            static_cast<double>(sharded.optimizer_state_bytes - own_params) / zero0.optimizer_state_bytes;
        EXPECT_NEAR(ratio, 1.0 / n, 0.01) << sharded.optimizer_state_bytes << " vs " << zero0.optimizer_state_bytes;
      }
    }
    cfg.parallel.zero_stage = 0;
    cfg.parallel.offload = Offload::kNone;
  }
}

// The estimate train() checks before allocating (Note [Memory estimate]) is the state the run then
// holds: the parameter count of the built model, and the optimizer's bytes on the device and in host
// memory, exactly for fp32 moments and as a floor for 8-bit ones, in every dtype, stage and offload;
// the gradient buffer exactly, and for ZeRO 2 as a floor (its staging buffers come on top), which
// is 1/N of the others'; and Muon's momentum.
TEST(DataParallel, MemoryEstimateIsTheStateTheRunHolds) {
  SharedTokenFile file;
  const parallel::RankEnv world(MPI_COMM_WORLD);
  quiet_logs(world);
  auto cfg = tiny_config(file.path(), 2 * 16 * world_size(), 25);
  cfg.train.max_steps = 1;
  cfg.parallel.offload_threads = 1;
  for (const char* moments : {"fp32", "8bit"}) {
    for (const auto& [dtype, compute] : {std::pair{"fp32", at::kFloat}, {"bf16", at::kBFloat16}, {"fp16", at::kHalf}}) {
      for (const char* offload : {"none", "optimizer"}) {
        for (int64_t stage : {0, 1, 2}) {
          if (std::string(offload) == "optimizer" && std::string(dtype) == "fp16") continue;  // refused by the config
          cfg.memory.optimizer_moments = parse_choice<optim::MomentFormat>("memory.optimizer_moments", moments);
          cfg.precision.dtype = parse_choice<DtypeChoice>("precision.dtype", dtype);
          cfg.parallel.offload = parse_choice<Offload>("parallel.offload", offload);
          cfg.parallel.zero_stage = stage;
          SCOPED_TRACE(std::string(moments) + " moments, " + dtype + ", offload " + offload + ", ZeRO " +
                       std::to_string(stage));
          const TrainResult run = train(cfg, world);
          const MemoryEstimate e = estimate_memory(cfg, world.world_size(), compute, at::kFloat);
          EXPECT_EQ(e.parameters, run.model->num_parameters(/*count_padding=*/true));
          if (std::string(moments) == "fp32") {
            EXPECT_EQ(e.optimizer_device, static_cast<double>(run.optimizer_state_bytes));
            EXPECT_EQ(e.optimizer_host, static_cast<double>(run.optimizer_host_bytes));
          } else {
            EXPECT_LE(e.optimizer_device, static_cast<double>(run.optimizer_state_bytes));
            EXPECT_LE(e.optimizer_host, static_cast<double>(run.optimizer_host_bytes));
          }
          EXPECT_GT(e.optimizer_device + e.optimizer_host, 0);
          const bool interleaved = stage == 2 && world.world_size() > 1;
          if (interleaved) {
            EXPECT_LE(e.gradients, static_cast<double>(run.gradient_bytes));
            EXPECT_NEAR(e.gradients * world.world_size(), e.flat_padded * 4.0, 0.5);
          } else {
            EXPECT_EQ(e.gradients, static_cast<double>(run.gradient_bytes));
          }
        }
      }
    }
  }
  // Muon (optim.name, ZeRO 0, fp32 moments): its fp32 momentum, 12 C^2 a block, on top.
  cfg.memory.optimizer_moments = optim::MomentFormat::kFp32;
  cfg.precision.dtype = DtypeChoice::kFp32;
  cfg.parallel.offload = Offload::kNone;
  cfg.parallel.zero_stage = 0;
  const double adamw = estimate_memory(cfg, world.world_size(), at::kFloat, at::kFloat).optimizer_device;
  cfg.optim.name = optim::UpdateRule::kMuon;
  const TrainResult muon = train(cfg, world);
  const MemoryEstimate e = estimate_memory(cfg, world.world_size(), at::kFloat, at::kFloat);
  EXPECT_EQ(e.optimizer_device, static_cast<double>(muon.optimizer_state_bytes));
  EXPECT_EQ(e.optimizer_device - adamw, 4.0 * 12 * cfg.model.n_embd * cfg.model.n_embd * cfg.model.n_layer);
}

// precision.dtype = bf16 on CPU runs the GPU's bookkeeping: bf16 parameters and gradients in the
// model, fp32 masters in the optimizer, bf16 collectives staged through fp32 host buffers.
// See Note [Mixed-precision tolerances] in training_fixtures.h.
TEST(DataParallel, Bf16VariantsMatchZero0AndOneRank) {
  SharedTokenFile file;
  auto cfg = tiny_config(file.path(), 2 * 2 * 16 * world_size(), 0.01);
  cfg.precision.dtype = DtypeChoice::kBf16;
  test::expect_variants_match(cfg, test::kBf16Tolerances);
}

// precision.dtype = auto is the dtype Note [bf16 on CPU] picks for this CPU (bf16 with AVX-512,
// else fp32): the model is in it and trains as with that dtype spelled out, bit for bit.
TEST(DataParallel, DtypeAutoTrainsAsTheDtypeItPicks) {
  SharedTokenFile file;
  auto cfg = tiny_config(file.path(), 2 * 2 * 16 * world_size(), 25);
  cfg.train.max_steps = 4;
  cfg.precision.dtype = DtypeChoice::kAuto;
  cfg.validate();
  auto spelled = cfg;
  const bool bf16 = kernels::cpu_has_fast_bf16_gemm();
  spelled.precision.dtype = bf16 ? DtypeChoice::kBf16 : DtypeChoice::kFp32;
  const parallel::RankEnv world(MPI_COMM_WORLD);
  quiet_logs(world);
  const TrainResult picked = train(cfg, world), want = train(spelled, world);
  EXPECT_EQ(picked.model->parameters().front().scalar_type(), bf16 ? torch::kBFloat16 : torch::kFloat);
  ASSERT_EQ(picked.losses.size(), 4u);
  EXPECT_EQ(picked.losses, want.losses);
}

// fp16 with dynamic loss scaling; rank 0's gradients overflow at step 5 (GPT2_FAULT_AT=0:5:inf):
// every rank, in every variant, skips that step and halves its scale (65536 -> 32768).
TEST(DataParallel, Fp16OverflowSkipsTheStepOnEveryRank) {
  SharedTokenFile file;
  auto cfg = tiny_config(file.path(), 2 * 2 * 16 * world_size(), 0.01);
  cfg.precision.dtype = DtypeChoice::kFp16;
  test::FaultAt overflow("0:5:inf");
  test::expect_variants_match(cfg, test::kFp16Tolerances, /*loss_scale=*/32768);
}

// memory.optimizer_moments = 8bit: ZeRO 1 and 2 and optimizer offload train the same model as ZeRO
// 0 with 8-bit moments on the same ranks, bit for bit (every layout sees the same quantization
// blocks, Note [Moment blocks], and the CPU update is one function on the device path and
// offloaded), with under a third of the fp32 moments' state, and learn like fp32 moments do.
// Clipping is on: its norm is the same bits on every layout (Note [Partition-free arithmetic]).
// Width 64, so most tensors have 8-bit moments (those under 4096 values keep fp32 ones).
TEST(DataParallel, EightBitMomentsMatchZero0AcrossStagesAndOffload) {
  SharedTokenFile file;
  const parallel::RankEnv world(MPI_COMM_WORLD);
  quiet_logs(world);
  auto cfg = tiny_config(file.path(), 2 * 2 * 16 * world_size(), 0.01);
  cfg.model.n_embd = 64;
  cfg.memory.optimizer_moments = optim::MomentFormat::k8bit;
  cfg.parallel.offload_threads = 2;
  TrainResult zero0 = train(cfg, world);
  // ZeRO 2 without accumulation: with it, it sums in another order (Note [ZeRO 2 with
  // accumulation]), which 8-bit codes would carry on.
  auto one_micro_step = cfg;
  one_micro_step.train.batch_tokens /= 2;
  TrainResult zero0_one_micro_step = train(one_micro_step, world);
  const struct {
    int64_t stage;
    const char* offload;
  } variants[] = {{1, "none"}, {2, "none"}, {0, "optimizer"}, {2, "optimizer"}};
  for (const auto& v : variants) {
    auto c = v.stage == 2 ? one_micro_step : cfg;
    c.parallel.zero_stage = v.stage;
    c.parallel.offload = parse_choice<Offload>("parallel.offload", v.offload);
    SCOPED_TRACE("8-bit moments, ZeRO " + std::to_string(v.stage) + ", offload " + v.offload);
    TrainResult r = train(c, world);
    test::expect_same_training(r, v.stage == 2 ? zero0_one_micro_step : zero0, cfg.model.n_embd, /*tol=*/0);
  }
  auto fp32 = cfg;
  fp32.memory.optimizer_moments = optim::MomentFormat::kFp32;
  TrainResult reference = train(fp32, world);
  const double ratio = static_cast<double>(zero0.optimizer_state_bytes) / reference.optimizer_state_bytes;
  EXPECT_LT(ratio, 0.35) << zero0.optimizer_state_bytes << " vs " << reference.optimizer_state_bytes;
  auto tail = [](const TrainResult& r) { return std::accumulate(r.losses.end() - 5, r.losses.end(), 0.0) / 5; };
  EXPECT_NEAR(tail(zero0), tail(reference), 0.02 * tail(reference)) << "the last five losses, 8-bit vs fp32 moments";
  if (world.rank() == 0) {
    std::printf("[ measured ] 8-bit moments: state %.3f of fp32 moments'; last-five mean loss %.4f vs %.4f\n", ratio,
                tail(zero0), tail(reference));
  }
}

}  // namespace
}  // namespace gpt2
