// Checkpoints under mpiexec (CPU ranks, fp32): a run resumed from step 10 continues exactly as the
// run that saved it (bitwise, for ZeRO 0/1/2 and offload); a 2-rank checkpoint resumes on 3 ranks
// and on 1 (losses and parameters within 1e-5 of the straight run); a damaged file is refused on
// every rank with an error that names it; the checkpoint's model.h5 loads as a model file.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "src/base/files.h"
#include "src/io/checkpoint.h"
#include "src/io/model_weights.h"
#include "src/train/trainer.h"
#include "tests/parallel/training_fixtures.h"

namespace gpt2 {
namespace {

using test::SharedTokenFile;
using test::quiet_logs;
using test::tiny_config;
using test::world_size;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// A directory rank 0 makes and every rank uses (one machine: the file system is shared).
class SharedDir {
 public:
  SharedDir() {
    std::string path;
    if (world_rank() == 0) {
      dir_ = std::make_unique<test::TempDir>("gpt2_ckpt");
      path = dir_->path();
    }
    int len = static_cast<int>(path.size());
    MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD);
    path.resize(len);
    MPI_Bcast(path.data(), len, MPI_CHAR, 0, MPI_COMM_WORLD);
    path_ = path;
  }
  std::string file(const std::string& name) const { return files::join(path_, name); }

 private:
  std::unique_ptr<test::TempDir> dir_;
  std::string path_;
};

void expect_params_bitwise_equal(GPT2& got, GPT2& want) {
  auto a = got->named_parameters(), b = want->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i].value(), b[i].value())) << a[i].key();
}

TEST(Checkpoint, ResumeIsBitwiseForEveryZeroStageAndOffload) {
  SharedTokenFile data;
  const parallel::RankEnv world(MPI_COMM_WORLD);
  quiet_logs(world);
  const struct {
    int64_t zero;
    const char* offload;
    bool async;  // files written on a background thread while training goes on
  } modes[] = {{0, "none", false}, {1, "none", false}, {2, "none", false}, {0, "optimizer", false},
               {2, "optimizer", false}, {1, "none", true}};
  for (const auto& mode : modes) {
    SCOPED_TRACE("ZeRO " + std::to_string(mode.zero) + ", offload " + mode.offload + (mode.async ? ", async" : ""));
    SharedDir dir;
    auto cfg = tiny_config(data.path(), 2 * 2 * 16 * world_size(), 0.01);  // 2 micro-steps per step
    cfg.parallel.zero_stage = mode.zero;
    cfg.parallel.offload = mode.offload;
    cfg.parallel.offload_threads = 2;
    cfg.checkpoint.dir = dir.file("ckpt");
    cfg.checkpoint.every = 10;
    cfg.checkpoint.async = mode.async;
    TrainResult straight = train(cfg, world);
    ASSERT_EQ(straight.last_checkpoint, dir.file("ckpt/step_0000020"));
    auto resumed_cfg = cfg;
    resumed_cfg.checkpoint.every = 0;
    resumed_cfg.checkpoint.resume = dir.file("ckpt/step_0000010");
    TrainResult resumed = train(resumed_cfg, world);
    ASSERT_EQ(resumed.start_step, 10);
    ASSERT_EQ(resumed.losses.size(), 20u);
    for (size_t s = 10; s < 20; ++s) EXPECT_EQ(resumed.losses[s], straight.losses[s]) << "step " << s;
    expect_params_bitwise_equal(resumed.model, straight.model);
  }
}

// Every tensor a checkpoint holds, against another checkpoint of the same step: the optimizer
// state over the whole flat space (masters, moments), the loss scaler, the model loaded from it,
// and every model file it carries (model.h5 of the writers that wrote one), bit for bit.
void expect_same_checkpoint_state(const std::string& got_dir, const std::string& want_dir) {
  const CheckpointManifest got = CheckpointManifest::read(got_dir), want = CheckpointManifest::read(want_dir);
  ASSERT_EQ(got.flat_total, want.flat_total);
  for (const char* dataset : {"master", "exp_avg", "exp_avg_sq"}) {
    auto a = torch::empty({got.flat_total}, torch::kFloat), b = torch::empty({want.flat_total}, torch::kFloat);
    read_flat_range(got, dataset, 0, got.flat_total, a.data_ptr<float>());
    read_flat_range(want, dataset, 0, want.flat_total, b.data_ptr<float>());
    EXPECT_TRUE(torch::equal(a, b)) << dataset << ": max |diff| " << (a - b).abs().max().item<float>();
  }
  EXPECT_EQ(got.loss_scale, want.loss_scale);
  EXPECT_EQ(got.growth_tracker, want.growth_tracker);
  GPT2 got_model = load_model(got_dir), want_model = load_model(want_dir);
  expect_params_bitwise_equal(got_model, want_model);
  for (const auto& f : want.files) {
    if (f.name.rfind("optim_r", 0) == 0) continue;
    SCOPED_TRACE(f.name);
    GPT2 a = load_model(files::join(got_dir, f.name)), b = load_model(files::join(want_dir, f.name));
    expect_params_bitwise_equal(a, b);
  }
}

// An async save writes the state of its step, not whatever training has made of it by the time
// the files are written. GPT2_CKPT_HOLD=2 (checkpoint_writer.h) holds the writing thread of the
// save of step 3 until two more steps have changed every parameter and the optimizer state; that
// checkpoint must still equal, tensor for tensor, a synchronous save of step 3 by the same run
// (training is deterministic on CPU ranks).
TEST(Checkpoint, AsyncSaveWritesTheStateOfItsStep) {
  SharedTokenFile data;
  const parallel::RankEnv world(MPI_COMM_WORLD);
  quiet_logs(world);
  const struct {
    int64_t zero;
    const char* offload;
  } modes[] = {{0, "none"}, {1, "none"}, {2, "none"}, {1, "optimizer"}};
  for (const auto& mode : modes) {
    SCOPED_TRACE("ZeRO " + std::to_string(mode.zero) + ", offload " + mode.offload);
    SharedDir dir;
    auto cfg = tiny_config(data.path(), 2 * 2 * 16 * world_size(), 0.01);
    cfg.train.max_steps = 6;
    cfg.parallel.zero_stage = mode.zero;
    cfg.parallel.offload = mode.offload;
    cfg.parallel.offload_threads = 2;
    cfg.checkpoint.every = 3;
    cfg.checkpoint.dir = dir.file("sync");
    train(cfg, world);
    cfg.checkpoint.dir = dir.file("async");
    cfg.checkpoint.async = true;
    ::setenv("GPT2_CKPT_HOLD", "2", 1);
    const TrainResult async = train(cfg, world);
    ::unsetenv("GPT2_CKPT_HOLD");
    ASSERT_EQ(async.last_checkpoint, dir.file("async/step_0000006"));
    if (world_rank() == 0) expect_same_checkpoint_state(dir.file("async/step_0000003"), dir.file("sync/step_0000003"));
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

// Saved by 2 ranks (ZeRO 1), resumed by 3 ranks (ZeRO 2) and by 1 rank (ZeRO 0). The global batch
// (6 sequences) divides over 1, 2 and 3 ranks, and the data order depends only on the step.
TEST(Checkpoint, ResumesOnThreeRanksAndOnOne) {
  if (world_size() != 3) GTEST_SKIP() << "needs mpiexec -n 3";
  SharedTokenFile data;
  SharedDir dir;
  const int rank = world_rank();
  auto cfg = tiny_config(data.path(), 6 * 2 * 16, 0.01);
  cfg.checkpoint.dir = dir.file("ckpt");
  MPI_Comm two = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank < 2 ? 0 : MPI_UNDEFINED, rank, &two);
  TrainResult straight;
  if (two != MPI_COMM_NULL) {
    const parallel::RankEnv env2(two);
    quiet_logs(env2);
    auto c = cfg;
    c.parallel.zero_stage = 1;
    c.checkpoint.every = 10;
    straight = train(c, env2);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const parallel::RankEnv world(MPI_COMM_WORLD);
  quiet_logs(world);
  auto three = cfg;
  three.parallel.zero_stage = 2;
  three.checkpoint.resume = dir.file("ckpt/step_0000010");
  TrainResult on_three = train(three, world);
  ASSERT_EQ(on_three.start_step, 10);
  if (rank == 0) {
    const parallel::RankEnv self(MPI_COMM_SELF);
    auto one = cfg;
    one.checkpoint.resume = three.checkpoint.resume;
    TrainResult on_one = train(one, self);
    ASSERT_EQ(on_one.start_step, 10);
    double worst = 0;
    for (TrainResult* r : {&on_three, &on_one}) {
      for (size_t s = 10; s < 20; ++s) {
        const double e = std::abs(r->losses[s] - straight.losses[s]) / std::abs(straight.losses[s]);
        worst = std::max(worst, e);
        EXPECT_LE(e, 1e-5) << "step " << s;
      }
      test::expect_same_parameters(r->model, straight.model, cfg.model.n_embd, 1e-5);
    }
    std::printf("[ measured ] 2 -> 3 and 2 -> 1 ranks: worst relative loss error %.2e\n", worst);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (two != MPI_COMM_NULL) MPI_Comm_free(&two);
}

// The model.h5 inside a checkpoint is a model file (src/io/model_file.h): load_model() reads its
// sizes and step and gives the trained parameters bit for bit (fp32 CPU run).
TEST(Checkpoint, ItsModelFileLoadsAsTheTrainedModel) {
  SharedTokenFile data;
  SharedDir dir;
  const parallel::RankEnv world(MPI_COMM_WORLD);
  quiet_logs(world);
  auto cfg = tiny_config(data.path(), 2 * 16 * world_size(), 0.01);
  cfg.train.max_steps = 3;
  cfg.checkpoint.dir = dir.file("ckpt");
  cfg.checkpoint.every = 3;
  TrainResult trained = train(cfg, world);
  if (world_rank() == 0) {
    const std::string path = dir.file("ckpt/step_0000003/model.h5");
    const WeightsSource source = find_weights(path);
    EXPECT_EQ(source.kind, WeightsSource::Kind::model_file);
    EXPECT_EQ(source.step, 3);
    EXPECT_EQ(source.config.n_layer, cfg.model.n_layer);
    EXPECT_EQ(source.config.vocab_size, cfg.model.vocab_size);
    GPT2 loaded = load_model(path);
    expect_params_bitwise_equal(loaded, trained.model);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(Checkpoint, DamagedFilesAreRefusedOnEveryRankByName) {
  SharedTokenFile data;
  SharedDir dir;
  const parallel::RankEnv world(MPI_COMM_WORLD);
  quiet_logs(world);
  auto cfg = tiny_config(data.path(), 2 * 16 * world_size(), 0.01);
  cfg.train.max_steps = 4;
  cfg.checkpoint.dir = dir.file("ckpt");
  cfg.checkpoint.every = 4;
  train(cfg, world);
  const std::string ckpt = dir.file("ckpt/step_0000004");
  const std::string shard = files::join(ckpt, "optim_r00001.h5");
  const std::string pristine = files::read_file(world_size() > 1 ? shard : files::join(ckpt, "model.h5"));
  const std::string victim = world_size() > 1 ? shard : files::join(ckpt, "model.h5");
  MPI_Barrier(MPI_COMM_WORLD);  // every rank has read the pristine bytes before rank 0 damages them
  auto resume_error = [&] {
    auto c = cfg;
    c.checkpoint.every = 0;
    c.checkpoint.resume = "auto";
    return test::user_error([&] { train(c, world); });
  };
  // One flipped byte in the middle.
  if (world_rank() == 0) {
    std::string bad = pristine;
    bad[bad.size() / 2] ^= 0x10;
    test::write_file(victim, bad);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  std::string err = resume_error();
  EXPECT_NE(err.find(victim + ": checksum mismatch"), std::string::npos) << err;
  EXPECT_NE(err.find("nothing was loaded"), std::string::npos) << err;
  // Truncated.
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) test::write_file(victim, pristine.substr(0, pristine.size() - 100));
  MPI_Barrier(MPI_COMM_WORLD);
  err = resume_error();
  EXPECT_NE(err.find(victim + ": " + std::to_string(pristine.size() - 100) + " bytes, the manifest says " +
                     std::to_string(pristine.size())),
            std::string::npos)
      << err;
  // Restored: it loads again.
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) test::write_file(victim, pristine);
  MPI_Barrier(MPI_COMM_WORLD);
  auto c = cfg;
  c.train.max_steps = 6;
  c.checkpoint.every = 0;
  c.checkpoint.resume = "auto";
  EXPECT_EQ(train(c, world).start_step, 4);
}

}  // namespace
}  // namespace gpt2
