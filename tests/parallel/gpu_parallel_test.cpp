// GPU suite (ctest label gpu; every case skips without a GPU). What users run on GPUs, against
// references, on one GPU: under mpiexec -n 3 the ranks share the GPU through the MPI backend
// (parallel.backend = mpi stages CUDA tensors through host memory), so ZeRO, offload, fp16's loss
// scaling and checkpoints run their CUDA code with several ranks; under mpiexec -n 1 NCCL runs
// every collective the trainer uses, and trains as the MPI backend does, and one rank without
// accumulation trains with bf16 gradients.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "parallel/communicator.h"
#include "parallel/rank_env.h"
#include "src/base/files.h"
#include "src/kernels/gemm.h"
#include "src/train/trainer.h"
#include "tests/parallel/collective_checks.h"
#include "tests/parallel/training_fixtures.h"

namespace gpt2 {
namespace {

using test::quiet_logs;
using test::SharedDir;
using test::SharedTokenFile;
using test::tiny_config;
using test::world_rank;
using test::world_size;

#define SKIP_WITHOUT_GPU() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

// The tiny model on the GPU, every rank on cuda:0 (pick_device: local rank % devices), MPI backend.
// No checkpoint.dir unless a test sets one: the GEMM tuning tables (Note [GEMM tuning table]) of
// concurrent test processes would otherwise share one.
Config gpu_config(const std::string& train, const std::string& dtype) {
  auto cfg = tiny_config(train, 2 * 2 * 16 * world_size(), 0.01);
  cfg.checkpoint.dir = "";
  cfg.train.device = DeviceChoice::kCuda;
  cfg.parallel.backend = parallel::Backend::kMpi;
  cfg.precision.dtype = parse_choice<DtypeChoice>("precision.dtype", dtype);
  cfg.validate();
  return cfg;
}

torch::TensorOptions on_gpu(torch::ScalarType dtype) {
  return torch::TensorOptions().device(torch::kCUDA, 0).dtype(dtype);
}

// A run resumed at step 10 on another number of ranks against the straight run: each loss from
// step 10 on and every parameter within `tol` relative (the sums' order changes with the ranks).
void expect_resumed_within(TrainResult& resumed, TrainResult& straight, int64_t n_embd, double tol) {
  ASSERT_EQ(resumed.start_step, 10);
  for (size_t s = 10; s < 20; ++s) {
    EXPECT_LE(std::abs(resumed.losses[s] - straight.losses[s]) / std::abs(straight.losses[s]), tol) << "step " << s;
  }
  test::expect_same_parameters(resumed.model, straight.model, n_embd, tol);
}

TEST(GpuMpiBackend, EveryCollectiveOnCudaTensorsOfEveryDtype) {
  SKIP_WITHOUT_GPU();
  auto comm = parallel::make_communicator(MPI_COMM_WORLD, torch::Device(torch::kCUDA, 0), parallel::Backend::kMpi, 600);
  for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16})
    test::expect_collectives_exact(*comm, on_gpu(dtype));
}

TEST(GpuNccl, EveryCollectiveOnOneRank) {
  SKIP_WITHOUT_GPU();
  if (world_size() != 1) GTEST_SKIP() << "NCCL takes one rank per GPU: runs under mpiexec -n 1";
  auto comm =
      parallel::make_communicator(MPI_COMM_WORLD, torch::Device(torch::kCUDA, 0), parallel::Backend::kNccl, 600);
  ASSERT_EQ(comm->backend(), "nccl");
  for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16})
    test::expect_collectives_exact(*comm, on_gpu(dtype));
}

// One rank with parallel.backend = nccl trains bit for bit as with mpi: the NCCL communicator (its
// init and watchdog thread) runs beside the training without changing it.
TEST(GpuNccl, TrainsAsTheMpiBackendOnOneRank) {
  SKIP_WITHOUT_GPU();
  if (world_size() != 1) GTEST_SKIP() << "runs under mpiexec -n 1";
  SharedTokenFile file;
  const parallel::RankEnv world(MPI_COMM_WORLD);
  quiet_logs(world);
  for (const char* dtype : {"fp32", "bf16"}) {
    SCOPED_TRACE(dtype);
    auto cfg = gpu_config(file.path(), dtype);
    TrainResult mpi = train(cfg, world);
    cfg.parallel.backend = parallel::Backend::kNccl;
    TrainResult nccl = train(cfg, world);
    test::expect_params_bitwise_equal(nccl.model, mpi.model);
    EXPECT_EQ(nccl.losses, mpi.losses) << dtype;
  }
}

// One CUDA rank without accumulation in bf16 keeps a bf16 gradient buffer although reduce_dtype is
// fp32 (Note [bf16 gradients on one rank] in trainer.cpp): bit for bit the run that asks for a bf16
// buffer, and within the bf16 variant bounds of offload, which keeps the fp32 buffer and runs the
// same AdamW arithmetic on the host (only the gradient norm, summed over fp32 values there, differs).
TEST(GpuOneRank, WithoutAccumulationKeepsBf16Gradients) {
  SKIP_WITHOUT_GPU();
  if (world_size() != 1) GTEST_SKIP() << "runs under mpiexec -n 1";
  SharedTokenFile file;
  const parallel::RankEnv world(MPI_COMM_WORLD);
  quiet_logs(world);
  auto cfg = gpu_config(file.path(), "bf16");
  cfg.train.micro_batch = 4;
  cfg.train.batch_tokens = 4 * 16;  // one micro-step
  cfg.validate();
  ASSERT_EQ(cfg.grad_accum_steps(1), 1);
  ASSERT_EQ(cfg.precision.reduce_dtype, DtypeChoice::kFp32);
  TrainResult kept = train(cfg, world);
  auto asked = cfg;
  asked.precision.reduce_dtype = DtypeChoice::kBf16;
  TrainResult bf16 = train(asked, world);
  EXPECT_EQ(kept.losses, bf16.losses);
  test::expect_params_bitwise_equal(kept.model, bf16.model);
  auto offload = cfg;
  offload.parallel.offload = Offload::kOptimizer;
  offload.parallel.offload_threads = 2;
  TrainResult fp32_buffer = train(offload, world);
  test::expect_same_training(kept, fp32_buffer, cfg.model.n_embd, test::kBf16Tolerances.variants.param,
                             test::kBf16Tolerances.variants.loss);
}

// train.gemm_tuning keeps each rank's GEMM choices in checkpoint.dir (Note [GEMM tuning table]):
// a run resumed in a process that has timed nothing (its choices cleared) loads them, runs the same
// algorithms without timing again, and continues the straight run bit for bit.
TEST(GpuOneRank, ResumesBitForBitWithTheTunedGemmsOfTheRunItContinues) {
  SKIP_WITHOUT_GPU();
  if (world_size() != 1) GTEST_SKIP() << "runs under mpiexec -n 1";
  SharedTokenFile file;
  SharedDir dir;
  const parallel::RankEnv world(MPI_COMM_WORLD);
  quiet_logs(world);
  auto cfg = gpu_config(file.path(), "bf16");
  ASSERT_TRUE(cfg.train.gemm_tuning);
  cfg.checkpoint.dir = dir.file("ckpt");
  cfg.checkpoint.every = 10;
  kernels::clear_gemm_choices();
  TrainResult straight = train(cfg, world);
  const std::string table = cfg.checkpoint.dir + "/gemm_choices.rank0";
  ASSERT_TRUE(files::exists(table));
  const std::string tuned = kernels::gemm_choices_bytes();
  EXPECT_GT(kernels::gemm_choices_count(), 5);
  EXPECT_EQ(files::read_file(table), tuned);

  kernels::clear_gemm_choices();  // a new process
  auto resumed = cfg;
  resumed.checkpoint.every = 0;
  resumed.checkpoint.resume = cfg.checkpoint.dir + "/step_0000010";
  TrainResult again = train(resumed, world);
  ASSERT_EQ(again.start_step, 10);
  EXPECT_EQ(kernels::gemm_choices_bytes(), tuned) << "the resumed run timed shapes again";
  for (size_t s = 10; s < 20; ++s) EXPECT_EQ(again.losses[s], straight.losses[s]) << "step " << s;
  test::expect_params_bitwise_equal(again.model, straight.model);
  kernels::set_gemm_tuning(false);
}

// fp32 on the GPU: ZeRO 1/2, offload and recomputation within 1e-6 of ZeRO 0 (the same sums;
// offload's host AdamW rounds as the fused CUDA one does to an ulp), 3 ranks within 1e-5 of one
// (the order of the sums differs).
TEST(GpuMpiBackend, Fp32VariantsMatchZero0AndOneRank) {
  SKIP_WITHOUT_GPU();
  if (world_size() < 2) GTEST_SKIP() << "runs under mpiexec -n 3";
  SharedTokenFile file;
  test::expect_variants_match(gpu_config(file.path(), "fp32"), {/*variants=*/{1e-6, 1e-6}, /*one_rank=*/{1e-5, 1e-5}});
}

// bf16 and fp16: see Note [Mixed-precision tolerances] in training_fixtures.h.
TEST(GpuMpiBackend, Bf16VariantsMatchZero0AndOneRank) {
  SKIP_WITHOUT_GPU();
  if (world_size() < 2) GTEST_SKIP() << "runs under mpiexec -n 3";
  SharedTokenFile file;
  test::expect_variants_match(gpu_config(file.path(), "bf16"), test::kBf16Tolerances);
}

// optim.name = muon on the GPU, bf16 (Newton–Schulz in bf16 through the GEMMs): ZeRO 1/2 and
// offload give ZeRO 0's bits, as on the CPU (each owner runs the same Newton–Schulz on the same
// gradient, Note [Muon's owners]); recomputation and one rank within the bf16 bounds above, the
// same flipped roundings carried on.
TEST(GpuMpiBackend, Bf16MuonVariantsMatchZero0AndOneRank) {
  SKIP_WITHOUT_GPU();
  if (world_size() < 2) GTEST_SKIP() << "runs under mpiexec -n 3";
  SharedTokenFile file;
  auto cfg = gpu_config(file.path(), "bf16");
  cfg.optim.name = optim::UpdateRule::kMuon;
  test::expect_variants_match(cfg, test::kBf16Tolerances);
}

TEST(GpuMpiBackend, Fp16OverflowSkipsTheStepOnEveryRank) {
  SKIP_WITHOUT_GPU();
  if (world_size() < 2) GTEST_SKIP() << "runs under mpiexec -n 3";
  SharedTokenFile file;
  test::FaultAt overflow("0:5:inf");
  test::expect_variants_match(gpu_config(file.path(), "fp16"), test::kFp16Tolerances, /*loss_scale=*/32768);
}

// Sync and async checkpoints of a 3-rank GPU run (ZeRO 1), resumed at step 10 on the same 3 ranks
// (bit for bit the straight run, fp32 and bf16) and on 2 (fp32: within 1e-5, the sums' order changes).
TEST(GpuMpiBackend, CheckpointsResumeOnThreeRanksThenTwo) {
  SKIP_WITHOUT_GPU();
  if (world_size() != 3) GTEST_SKIP() << "runs under mpiexec -n 3";
  SharedTokenFile file;
  SharedDir dir;
  const parallel::RankEnv world(MPI_COMM_WORLD);
  quiet_logs(world);
  MPI_Comm two = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world.rank() < 2 ? 0 : MPI_UNDEFINED, world.rank(), &two);
  for (const char* dtype : {"fp32", "bf16"}) {
    for (const bool async : {false, true}) {
      const std::string what = std::string(dtype) + (async ? ", async" : ", sync");
      SCOPED_TRACE(what);
      auto cfg = gpu_config(file.path(), dtype);
      cfg.train.batch_tokens = 6 * 2 * 16;  // divides over 3 ranks and over 2
      cfg.parallel.zero_stage = 1;
      cfg.checkpoint.dir = dir.file(std::string("ckpt_") + dtype + (async ? "_async" : "_sync"));
      cfg.checkpoint.every = 10;
      cfg.checkpoint.async = async;
      TrainResult straight = train(cfg, world);

      auto resumed = cfg;
      resumed.checkpoint.every = 0;
      resumed.checkpoint.resume = cfg.checkpoint.dir + "/step_0000010";
      TrainResult on_three = train(resumed, world);
      ASSERT_EQ(on_three.start_step, 10);
      for (size_t s = 10; s < 20; ++s) EXPECT_EQ(on_three.losses[s], straight.losses[s]) << "step " << s;
      test::expect_params_bitwise_equal(on_three.model, straight.model);
      if (std::string(dtype) == "fp32" && two != MPI_COMM_NULL) {
        const parallel::RankEnv env2(two);
        quiet_logs(env2);
        TrainResult on_two = train(resumed, env2);
        if (env2.is_main()) std::printf("[ measured ] %s, 3 -> 2 ranks:\n", what.c_str());
        expect_resumed_within(on_two, straight, cfg.model.n_embd, 1e-5);
      }
      MPI_Barrier(MPI_COMM_WORLD);
    }
  }
  if (two != MPI_COMM_NULL) MPI_Comm_free(&two);
}

// Note [Ranks as hosts]
// NCCL's network path, exercised on one GPU. Each rank names itself another host (NCCL_HOSTID,
// set before NCCL's first use in the process: NCCL hashes it instead of the host name), and the
// ctest entries test_gpu_nccl_hosts_np2/np4 turn off what only ranks of one host share
// (NCCL_P2P_DISABLE, NCCL_SHM_DISABLE) and InfiniBand (NCCL_IB_DISABLE), so NCCL connects the
// ranks through its socket transport, over the loopback interface, as it connects nodes. (Ranks of
// one host on one GPU are refused as a duplicate GPU; ranks of different hosts are not.)
bool ranks_as_hosts() {
  const char* on = std::getenv("GPT2_TEST_RANKS_AS_HOSTS");
  if (on == nullptr || std::string(on) != "1") return false;
  const std::string host = "gpt2-test-host-" + std::to_string(world_rank());
  setenv("NCCL_HOSTID", host.c_str(), 1);
  return true;
}

#define SKIP_UNLESS_RANKS_AS_HOSTS()         \
  SKIP_WITHOUT_GPU();                        \
  if (world_size() < 2 || !ranks_as_hosts()) \
  GTEST_SKIP() << "runs under the ctest entries test_gpu_nccl_hosts_np2/np4 (Note [Ranks as hosts])"

// ZeRO 0/1/2, offload and recomputation over NCCL's socket transport against ZeRO 0 and one rank,
// with the bounds of the MPI backend's tests above; ZeRO 2 (NCCL's reduce-scatter, whose sums may
// run in another order than the all-reduce's) within the one-rank bound, the same kind of
// reordering.
TEST(GpuNcclAsHosts, VariantsMatchZero0AndOneRank) {
  SKIP_UNLESS_RANKS_AS_HOSTS();
  SharedTokenFile file;
  auto fp32 = gpu_config(file.path(), "fp32");
  fp32.parallel.backend = parallel::Backend::kNccl;
  const test::Tolerances fp32_tol{/*variants=*/{1e-6, 1e-6}, /*one_rank=*/{1e-5, 1e-5}};
  test::expect_variants_match(fp32, fp32_tol, /*loss_scale=*/1, /*zero2=*/fp32_tol.one_rank);
  auto bf16 = gpu_config(file.path(), "bf16");
  bf16.parallel.backend = parallel::Backend::kNccl;
  test::expect_variants_match(bf16, test::kBf16Tolerances, 1, test::kBf16Tolerances.one_rank);
  // Muon's owners collect gradients and return parameters through NCCL's grouped send/recv.
  auto muon = bf16;
  muon.optim.name = optim::UpdateRule::kMuon;
  test::expect_variants_match(muon, test::kBf16Tolerances, 1, test::kBf16Tolerances.one_rank);
}

// A ZeRO 2 checkpoint written over NCCL's socket transport on all ranks, resumed at step 10 on
// half of them: fp32 within 1e-5 of the straight run (the sums' order changes with the ranks).
TEST(GpuNcclAsHosts, Zero2CheckpointResumesOnHalfTheRanks) {
  SKIP_UNLESS_RANKS_AS_HOSTS();
  SharedTokenFile file;
  SharedDir dir;
  const parallel::RankEnv world(MPI_COMM_WORLD);
  quiet_logs(world);
  const int half = world.world_size() / 2;
  MPI_Comm part = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world.rank() < half ? 0 : MPI_UNDEFINED, world.rank(), &part);
  auto cfg = gpu_config(file.path(), "fp32");
  cfg.parallel.backend = parallel::Backend::kNccl;
  cfg.train.batch_tokens = 4 * 2 * 16 * world.world_size();  // divides over all ranks and over half
  cfg.parallel.zero_stage = 2;
  cfg.checkpoint.dir = dir.file("ckpt");
  cfg.checkpoint.every = 10;
  TrainResult straight = train(cfg, world);
  if (part != MPI_COMM_NULL) {
    const parallel::RankEnv fewer(part);
    quiet_logs(fewer);
    auto resumed = cfg;
    resumed.checkpoint.every = 0;
    resumed.checkpoint.resume = cfg.checkpoint.dir + "/step_0000010";
    TrainResult again = train(resumed, fewer);
    if (fewer.is_main()) std::printf("[ measured ] NCCL sockets, ZeRO 2, %d -> %d ranks:\n", world.world_size(), half);
    expect_resumed_within(again, straight, cfg.model.n_embd, 1e-5);
    MPI_Comm_free(&part);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace gpt2
