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
#include "optim/adamw_updates.h"
#include "optim/moments_8bit.h"
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

// optim.name = muon under ZeRO 1/2 and optimizer offload (Note [Muon's owners]): each matrix's
// owner updates it from the gradient the shards hold, which is ZeRO 0's to the bit (Note
// [Partition-free arithmetic]), through the same Newton-Schulz, and sends it back; so the runs
// equal ZeRO 0's bit for bit, as AdamW's do (one micro-step: Note [ZeRO 2 with accumulation]). In
// fp32 with fp32 AdamW moments beside Muon, in bf16 with 8-bit ones, and in fp16 (ZeRO 1/2), whose
// loss scale (always on for fp16) unscales the shards before the owners read them. Width 64, so
// that the 8-bit moments quantize.
TEST(DataParallel, MuonUnderZero1And2AndOffloadMatchesZero0) {
  SharedTokenFile file;
  const parallel::RankEnv world(MPI_COMM_WORLD);
  quiet_logs(world);
  auto cfg = tiny_config(file.path(), 2 * 16 * world_size(), 0.01);
  cfg.model.n_embd = 64;
  cfg.optim.name = optim::UpdateRule::kMuon;
  cfg.parallel.offload_threads = 2;
  for (const char* mode : {"fp32", "bf16 + 8-bit moments", "fp16"}) {
    const bool bf16 = std::string(mode) == "bf16 + 8-bit moments", fp16 = std::string(mode) == "fp16";
    cfg.precision.dtype = bf16 ? DtypeChoice::kBf16 : fp16 ? DtypeChoice::kFp16 : DtypeChoice::kFp32;
    cfg.memory.optimizer_moments = bf16 ? optim::MomentFormat::k8bit : optim::MomentFormat::kFp32;
    cfg.parallel.zero_stage = 0;
    cfg.parallel.offload = Offload::kNone;
    TrainResult zero0 = train(cfg, world);
    for (const auto& [stage, offload] : {std::pair{1, "none"}, {2, "none"}, {1, "optimizer"}, {2, "optimizer"}}) {
      if (fp16 && std::string(offload) != "none") continue;
      auto c = cfg;
      c.parallel.zero_stage = stage;
      c.parallel.offload = parse_choice<Offload>("parallel.offload", offload);
      SCOPED_TRACE(std::string("Muon, ") + mode + ", ZeRO " + std::to_string(stage) + ", offload " + offload);
      TrainResult r = train(c, world);
      test::expect_same_training(r, zero0, cfg.model.n_embd, /*tol=*/0);
    }
  }
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
        // The state: fp32 moments for the parameters' elements of this rank's shard (the padding
        // has none; ZeRO 0's shard is everything), and ZeRO 2 keeps its interleaved shard's
        // parameters apart (fp32 here) beside it.
        const int64_t bucket_elements = static_cast<int64_t>(cfg.parallel.bucket_mb * (1 << 20)) / 4;  // the trainer's
        const parallel::FlatLayout layout(sharded.model->parameters(), static_cast<int>(n),
                                          stage == 2 ? bucket_elements : 0);
        int64_t elements = layout.total;
        if (stage >= 1) {
          elements = 0;
          for (const auto& p : layout.pieces(world.rank()))
            elements += std::max<int64_t>(0, std::min(p.end, layout.total) - p.begin);
        }
        const int64_t own_params = stage == 2 ? layout.shard_size() * 4 : 0;
        if (std::string(offload) == "optimizer") {  // all in host memory: masters, moments, gradient
          EXPECT_EQ(sharded.optimizer_state_bytes, own_params);
          EXPECT_EQ(sharded.optimizer_host_bytes,
                    optim::offload_host_bytes(stage >= 1 ? layout.shard_size() : layout.padded, elements, at::kFloat,
                                              at::kFloat, false));
          continue;
        }
        EXPECT_EQ(sharded.optimizer_state_bytes - own_params, 8 * elements);
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
          if (std::string(moments) == "fp32") {  // the fullest shard's (the others may hold padding)
            EXPECT_EQ(e.optimizer_device, world.all_reduce_max(static_cast<int>(run.optimizer_state_bytes)));
            EXPECT_EQ(e.optimizer_host, world.all_reduce_max(static_cast<int>(run.optimizer_host_bytes)));
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
  // Muon (optim.name): its matrices leave AdamW's fp32 moments (8 bytes a parameter) for an fp32
  // momentum (4), plus fp32 masters for sharded bf16 parameters, held by their owners. The estimate is a
  // floor (under ZeRO 1/2 the mean share, and AdamW's packed moments lose under kMomentAlign
  // elements at each gap a matrix leaves, dense_fp32_blocks).
  cfg.memory.optimizer_moments = optim::MomentFormat::kFp32;
  cfg.parallel.offload = Offload::kNone;
  const double c = static_cast<double>(cfg.model.n_embd), layers = static_cast<double>(cfg.model.n_layer);
  const double muon_params = 12 * c * c * layers, gaps = 4 * layers;
  for (const auto& [dtype, compute] : {std::pair{"fp32", at::kFloat}, {"bf16", at::kBFloat16}}) {
    for (int64_t stage : {0, 1, 2}) {
      cfg.precision.dtype = parse_choice<DtypeChoice>("precision.dtype", dtype);
      cfg.parallel.zero_stage = stage;
      cfg.optim.name = optim::UpdateRule::kMuon;
      SCOPED_TRACE(std::string("Muon, ") + dtype + ", ZeRO " + std::to_string(stage));
      const TrainResult muon = train(cfg, world);
      const MemoryEstimate e = estimate_memory(cfg, world.world_size(), compute, at::kFloat);
      EXPECT_LE(e.optimizer_device, world.all_reduce_max(static_cast<int>(muon.optimizer_state_bytes)));
      if (stage != 0) continue;
      // ZeRO 0: 4 bytes a Muon parameter, not AdamW's 8 (fp32 parameters are their own masters,
      // bf16 ones' masters are AdamW's, shared).
      cfg.optim.name = optim::UpdateRule::kAdamW;
      const TrainResult adamw = train(cfg, world);
      const double saved = static_cast<double>(adamw.optimizer_state_bytes - muon.optimizer_state_bytes);
      EXPECT_GE(saved, 4 * muon_params - 8.0 * optim::kMomentAlign * gaps);
      EXPECT_LE(saved, 4 * muon_params);
      if (world.is_main()) {
        std::printf("[ measured ] Muon's matrices, %s: %.3f bytes of optimizer state a parameter (AdamW: 8)\n", dtype,
                    8 - saved / muon_params);
      }
    }
  }
  cfg.optim.name = optim::UpdateRule::kAdamW;
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
