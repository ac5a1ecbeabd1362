// Checkpoints under mpiexec (CPU ranks, fp32): a run resumed from step 10 continues exactly as the
// run that saved it (bitwise, for ZeRO 0/1/2 and offload, with fp32 and with 8-bit moments); 8-bit
// and fp32 moments convert into each other on load, and a bad 8-bit scale is a named error; a 2-rank checkpoint resumes
// on 3 ranks and on 1 (losses and parameters within 1e-5 of the straight run); a damaged file is refused on every rank
// with an error that names it; a checkpoint is the manifest and the shards, and loads as the trained model; an async
// save writes the state of its step; resume names the parameter whose name, shape or offset differs from the model's.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <tuple>

#include "optim/loss_scaler.h"
#include "optim/sharded_optimizer.h"
#include "parallel/communicator.h"
#include "parallel/flat_layout.h"
#include "src/base/crc32c.h"
#include "src/base/files.h"
#include "src/base/json.h"
#include "src/io/checkpoint.h"
#include "src/io/h5_io.h"
#include "src/io/model_weights.h"
#include "src/train/trainer.h"
#include "tests/parallel/training_fixtures.h"

namespace gpt2 {
namespace {

using test::quiet_logs;
using test::SharedDir;
using test::SharedTokenFile;
using test::tiny_config;
using test::world_rank;
using test::world_size;

// The tiny config trained `steps` steps on every rank, saving a checkpoint of the last one into
// `dir`/ckpt/step_<steps>.
Config run_to_a_checkpoint(const SharedTokenFile& data, const SharedDir& dir, const parallel::RankEnv& world,
                           int64_t steps, TrainResult* result = nullptr) {
  auto cfg = tiny_config(data.path(), 2 * 16 * world_size(), 0.01);
  cfg.train.max_steps = steps;
  cfg.checkpoint.dir = dir.file("ckpt");
  cfg.checkpoint.every = steps;
  TrainResult trained = train(cfg, world);
  if (result != nullptr) *result = std::move(trained);
  return cfg;
}

// memory.optimizer_moments = 8bit on a model wide enough that most tensors have 8-bit moments.
Config eight_bit(Config cfg) {
  cfg.model.n_embd = 64;  // most tensors over 4096 values: 8-bit moments
  cfg.memory.optimizer_moments = optim::MomentFormat::k8bit;
  cfg.validate();
  return cfg;
}

TEST(Checkpoint, ResumeIsBitwiseForEveryZeroStageAndOffload) {
  SharedTokenFile data;
  const parallel::RankEnv world(MPI_COMM_WORLD);
  quiet_logs(world);
  const struct {
    int64_t zero;
    const char* offload;
    bool async;  // files written on a background thread while training goes on
    bool moments_8bit;
    bool muon = false;
  } modes[] = {{0, "none", false, false},       {1, "none", false, false},       {2, "none", false, false},
               {0, "optimizer", false, false},  {2, "optimizer", false, false},  {1, "none", true, false},
               {0, "none", false, true},        {2, "none", false, true},        {1, "optimizer", false, true},
               {0, "none", false, false, true}, {1, "none", false, false, true}, {2, "optimizer", true, true, true}};
  for (const auto& mode : modes) {
    SCOPED_TRACE("ZeRO " + std::to_string(mode.zero) + ", offload " + mode.offload + (mode.async ? ", async" : "") +
                 (mode.moments_8bit ? ", 8-bit moments" : "") + (mode.muon ? ", Muon" : ""));
    SharedDir dir;
    auto cfg = tiny_config(data.path(), 2 * 2 * 16 * world_size(), 0.01);  // 2 micro-steps per step
    if (mode.moments_8bit) cfg = eight_bit(cfg);
    if (mode.muon) cfg.optim.name = optim::UpdateRule::kMuon;
    cfg.parallel.zero_stage = mode.zero;
    cfg.parallel.offload = parse_choice<Offload>("parallel.offload", mode.offload);
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
    test::expect_params_bitwise_equal(resumed.model, straight.model);
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
  test::expect_params_bitwise_equal(got_model, want_model);
  for (const auto& f : want.files) {
    if (f.name.rfind("optim_r", 0) == 0) continue;
    SCOPED_TRACE(f.name);
    GPT2 a = load_model(files::join(got_dir, f.name)), b = load_model(files::join(want_dir, f.name));
    test::expect_params_bitwise_equal(a, b);
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
    cfg.parallel.offload = parse_choice<Offload>("parallel.offload", mode.offload);
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

// Saved by 2 ranks (ZeRO 1), resumed by 3 ranks (ZeRO 2) and by 1 rank (ZeRO 0), with AdamW and with
// Muon (whose matrices change owners: Note [Muon's owners]). The global batch (6 sequences) divides
// over 1, 2 and 3 ranks, and the data order depends only on the step.
void expect_resumes_on_three_ranks_and_on_one(optim::UpdateRule rule) {
  SCOPED_TRACE(choice_name(rule));
  SharedTokenFile data;
  SharedDir dir;
  const int rank = world_rank();
  auto cfg = tiny_config(data.path(), 6 * 2 * 16, 0.01);
  cfg.optim.name = rule;
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
    std::printf("[ measured ] %s, 2 -> 3 and 2 -> 1 ranks: worst relative loss error %.2e\n", choice_name(rule), worst);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (two != MPI_COMM_NULL) MPI_Comm_free(&two);
}

TEST(Checkpoint, ResumesOnThreeRanksAndOnOne) {
  if (world_size() != 3) GTEST_SKIP() << "needs mpiexec -n 3";
  expect_resumes_on_three_ranks_and_on_one(optim::UpdateRule::kAdamW);
  expect_resumes_on_three_ranks_and_on_one(optim::UpdateRule::kMuon);
}

// ZeRO 2's interleaved shards (Note [Interleaved shards]) are several flat ranges each: saved by 3
// ranks as format_version 2 with `ranges`, verified, and resumed by 2 ranks (ZeRO 1) and by 1
// (ZeRO 0), each within the one-rank tolerance of the run that went on on 3 ranks.
TEST(Checkpoint, Zero2ShardsOfManyRangesResumeOnOtherRanksAndStages) {
  if (world_size() != 3) GTEST_SKIP() << "needs mpiexec -n 3";
  SharedTokenFile data;
  SharedDir dir;
  const int rank = world_rank();
  const parallel::RankEnv world(MPI_COMM_WORLD);
  quiet_logs(world);
  auto cfg = tiny_config(data.path(), 6 * 2 * 16, 0.01);  // blocks of 6 cells: many per shard
  cfg.checkpoint.dir = dir.file("ckpt");
  auto three = cfg;
  three.parallel.zero_stage = 2;
  three.checkpoint.every = 10;
  TrainResult straight = train(three, world);
  const std::string saved = dir.file("ckpt/step_0000010");
  const CheckpointManifest m = CheckpointManifest::read(saved);
  ASSERT_EQ(m.shards.size(), 3u);
  EXPECT_GT(m.shards[1].ranges.size(), 1u);
  EXPECT_EQ(verify_checkpoint(m), std::vector<std::string>{});
  const auto manifest_text = files::read_file(files::join(saved, "manifest.json"));
  EXPECT_NE(manifest_text.find("\"format_version\":2"), std::string::npos);
  MPI_Comm two = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank < 2 ? 0 : MPI_UNDEFINED, rank, &two);
  std::vector<TrainResult> resumed;
  if (two != MPI_COMM_NULL) {
    const parallel::RankEnv env2(two);
    quiet_logs(env2);
    auto c = cfg;
    c.parallel.zero_stage = 1;
    c.checkpoint.resume = saved;
    resumed.push_back(train(c, env2));
    MPI_Comm_free(&two);
  }
  if (rank == 0) {
    const parallel::RankEnv self(MPI_COMM_SELF);
    auto one = cfg;
    one.checkpoint.resume = saved;
    resumed.push_back(train(one, self));
    for (TrainResult& r : resumed) {
      ASSERT_EQ(r.start_step, 10);
      for (size_t s = 10; s < 20; ++s) {
        EXPECT_LE(std::abs(r.losses[s] - straight.losses[s]) / std::abs(straight.losses[s]), 1e-5) << "step " << s;
      }
      test::expect_same_parameters(r.model, straight.model, cfg.model.n_embd, 1e-5);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// A checkpoint is the manifest and the optimizer shards: no model file (rank 0 used to write a full
// fp32 model.h5 into every checkpoint, which nothing read). load_model() assembles the trained
// parameters from the shards' masters, bit for bit (fp32 CPU run).
TEST(Checkpoint, IsTheManifestAndTheShardsAndLoadsAsTheTrainedModel) {
  SharedTokenFile data;
  SharedDir dir;
  const parallel::RankEnv world(MPI_COMM_WORLD);
  quiet_logs(world);
  TrainResult trained;
  const auto cfg = run_to_a_checkpoint(data, dir, world, 3, &trained);
  if (world_rank() == 0) {
    const std::string path = dir.file("ckpt/step_0000003");
    std::vector<std::string> shards, listed;
    for (int r = 0; r < world_size(); ++r) shards.push_back(shard_file_name(r));
    auto entries = files::list_directory(path), want = shards;
    want.push_back("manifest.json");
    std::sort(entries.begin(), entries.end());
    std::sort(want.begin(), want.end());
    EXPECT_EQ(entries, want);
    for (const auto& f : CheckpointManifest::read(path).files) listed.push_back(f.name);
    EXPECT_EQ(listed, shards);
    const WeightsSource source = find_weights(path);
    EXPECT_EQ(source.kind, WeightsSource::Kind::checkpoint);
    EXPECT_EQ(source.step, 3);
    EXPECT_EQ(source.config.n_layer, cfg.model.n_layer);
    EXPECT_EQ(source.config.vocab_size, cfg.model.vocab_size);
    GPT2 loaded = load_model(path);
    test::expect_params_bitwise_equal(loaded, trained.model);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// Resume checks the model's flat layout against the manifest parameter by parameter (name, shape,
// offset) and names the first one that differs, also when the total count matches, which is all
// the old check compared. The saved manifest is edited: what a model whose code changed between
// the save and the resume (same config keys, another layout) would meet.
TEST(Checkpoint, ResumeRefusesAnotherLayoutNamingTheParameter) {
  SharedTokenFile data;
  SharedDir dir;
  const parallel::RankEnv world(MPI_COMM_WORLD);
  quiet_logs(world);
  auto cfg = run_to_a_checkpoint(data, dir, world, 2);
  const std::string saved = dir.file("ckpt/step_0000002"), mf = files::join(saved, "manifest.json");
  const std::string pristine = files::read_file(mf);
  MPI_Barrier(MPI_COMM_WORLD);
  auto with_manifest = [&](const std::function<void(json::Value&)>& edit) {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) {
      json::Value m = json::parse(pristine, mf);
      edit(m);
      test::write_file(mf, json::dump(m));
    }
    MPI_Barrier(MPI_COMM_WORLD);
  };
  auto param = [](json::Value& m, const std::string& name) -> json::Value& {
    for (auto& p : m["params"])
      if (p["name"] == name) return p;
    throw std::runtime_error("no parameter " + name + " in the manifest");
  };
  auto resume = [&](Config c) {
    c.train.max_steps = 4;
    c.checkpoint.every = 0;
    c.checkpoint.resume = saved;
    return train(c, world);
  };
  auto resume_error = [&](const Config& c) { return test::user_error([&] { resume(c); }); };

  // Another model of the same parameter count: 1 layer and block_size 32 + 12 C + 13 instead of
  // 2 layers and 32 (the wpe rows make up for the block). The manifest's model.* keys are taken
  // out, so only the layout can tell the two apart.
  auto other = cfg;
  other.model.n_layer = 1;
  other.model.block_size = 32 + 12 * 32 + 13;
  other.validate();
  ASSERT_EQ(GPT2(other.model)->num_parameters(true), GPT2(cfg.model)->num_parameters(true));
  with_manifest([](json::Value& m) {
    for (const char* key : {"n_layer", "n_head", "n_embd", "vocab_size", "block_size"})
      m["config"].erase(std::string("model.") + key);
  });
  EXPECT_HAS(resume_error(other),
             mf + ": parameter transformer.wpe.weight has shape [32, 32] in the checkpoint, the model has [429, 32]");

  // The same model, one weight's shape transposed (same numel).
  with_manifest([&](json::Value& m) { param(m, "transformer.h.0.attn.c_attn.weight")["shape"] = {32, 96}; });
  EXPECT_HAS(resume_error(cfg), mf + ": parameter transformer.h.0.attn.c_attn.weight has shape [32, 96] in the "
                                     "checkpoint, the model has [96, 32]");

  // A renamed parameter.
  with_manifest([&](json::Value& m) { param(m, "transformer.h.1.ln_2.bias")["name"] = "transformer.h.1.ln_2.b"; });
  std::string err = resume_error(cfg);
  EXPECT_HAS(err, mf + ": parameter transformer.h.1.ln_2.bias of the model is not in the checkpoint");
  EXPECT_HAS(err, "transformer.h.1.ln_2.b at its flat offset");

  // Two parameters of one size at each other's place in the flat space.
  int64_t weight_at = -1, bias_at = -1;
  with_manifest([&](json::Value& m) {
    auto& w = param(m, "transformer.h.0.ln_1.weight");
    auto& b = param(m, "transformer.h.0.ln_1.bias");
    weight_at = w["offset"].get<int64_t>();
    bias_at = b["offset"].get<int64_t>();
    std::swap(w["offset"], b["offset"]);
  });
  if (world_rank() == 0) {  // rank 0 read the offsets; the message is the same on every rank
    EXPECT_HAS(resume_error(cfg), mf + ": parameter transformer.h.0.ln_1.weight is at flat offset " +
                                      std::to_string(bias_at) + " in the checkpoint, the model has it at " +
                                      std::to_string(weight_at));
  } else {
    EXPECT_HAS(resume_error(cfg), "parameter transformer.h.0.ln_1.weight is at flat offset");
  }

  // The manifest as saved: it resumes.
  with_manifest([](json::Value&) {});
  EXPECT_EQ(resume(cfg).start_step, 2);
}

TEST(Checkpoint, DamagedFilesAreRefusedOnEveryRankByName) {
  SharedTokenFile data;
  SharedDir dir;
  const parallel::RankEnv world(MPI_COMM_WORLD);
  quiet_logs(world);
  auto cfg = run_to_a_checkpoint(data, dir, world, 4);
  const std::string ckpt = dir.file("ckpt/step_0000004");
  const std::string shard = files::join(ckpt, "optim_r00001.h5");
  const std::string pristine = files::read_file(shard);
  const std::string victim = shard;
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

// ---- 8-bit moments (memory.optimizer_moments = 8bit) --------------------------------------------

// The tiny config with 8-bit moments trained `steps` steps on every rank with ZeRO 1, saving a
// checkpoint of the last one under `root`.
Config eight_bit_checkpoint(const SharedTokenFile& data, const parallel::RankEnv& world, int64_t steps,
                            const std::string& root) {
  auto cfg = eight_bit(tiny_config(data.path(), 2 * 16 * world_size(), 0.01));
  cfg.train.max_steps = steps;
  cfg.parallel.zero_stage = 1;
  cfg.checkpoint.dir = root;
  cfg.checkpoint.every = steps;
  train(cfg, world);
  return cfg;
}

// Loads checkpoint `from` on `env` into an optimizer with 8-bit or fp32 moments (ZeRO `stage`) and
// saves it unchanged under `to_root`: a conversion between the formats, or a copy. Returns the
// optimizer state of the whole flat space when env has one rank (ZeRO 0), else an empty one;
// `moment_layout`, when given, gets the optimizer's moment layout.
optim::ShardState load_and_save(const Config& cfg, const std::string& from, const std::string& to_root,
                                const parallel::RankEnv& env, int64_t stage, bool moments_8bit,
                                std::unique_ptr<optim::MomentLayout>* moment_layout = nullptr) {
  GPT2 model(cfg.model);
  const auto params = model->parameters();
  // ZeRO 2: interleaved shards of blocks of two cells a rank, so each shard is many ranges.
  const int64_t interleave = stage == 2 ? 2 * env.world_size() * parallel::FlatLayout::kGrid : 0;
  const parallel::FlatLayout layout(params, env.world_size(), interleave);
  const auto comm = parallel::make_communicator(env.comm(), torch::kCPU, parallel::Backend::kMpi, 60);
  const auto grads = torch::zeros({layout.interleaved() ? layout.shard_size() : layout.padded});
  optim::ShardedOptimizer::Options o;
  o.sharded = stage >= 1;
  o.adamw.moments_8bit = moments_8bit;
  optim::ShardedOptimizer optimizer(params, layout, grads, *comm, o);
  optim::LossScaler scaler(false, torch::kCPU);
  const int64_t step = resume_checkpoint(from, model, stage, env, layout, optimizer, scaler);
  if (!to_root.empty()) {
    CheckpointSettings settings;
    settings.dir = to_root;
    settings.zero_stage = stage;
    settings.config = cfg.table();
    CheckpointWriter writer(settings, env);
    writer.save(step, model, layout, optimizer, scaler, /*async=*/false);
  }
  if (moment_layout != nullptr) *moment_layout = std::make_unique<optim::MomentLayout>(optimizer.moment_layout());
  return env.world_size() == 1 ? optimizer.state() : optim::ShardState{};
}

// An 8-bit checkpoint (2+ ranks, ZeRO 1) resumed with fp32 moments (ZeRO 2; on 3 ranks the shards
// are not on the quantization grid) holds the dequantized moments; that fp32 checkpoint resumed with
// 8-bit moments again gives back the first one's codes and scales exactly (a dequantized block
// quantizes to its own codes). Both loads log a line saying they convert.
TEST(Checkpoint, MomentFormatsConvertBothWaysOnAnyWorldSize) {
  SharedTokenFile data;
  SharedDir dir;
  const parallel::RankEnv world(MPI_COMM_WORLD);
  quiet_logs(world);
  const Config cfg = eight_bit_checkpoint(data, world, 10, dir.file("a"));
  const std::string a = dir.file("a/step_0000010"), b = dir.file("b/step_0000010"), c = dir.file("c/step_0000010");
  load_and_save(cfg, a, dir.file("b"), world, /*stage=*/2, /*moments_8bit=*/false);
  load_and_save(cfg, b, dir.file("c"), world, /*stage=*/0, /*moments_8bit=*/true);
  EXPECT_EQ(CheckpointManifest::read(a).optimizer_moments, optim::MomentFormat::k8bit);
  EXPECT_EQ(CheckpointManifest::read(b).optimizer_moments, optim::MomentFormat::kFp32);
  EXPECT_EQ(CheckpointManifest::read(c).optimizer_moments, optim::MomentFormat::k8bit);
  if (world_rank() == 0) {
    const parallel::RankEnv self(MPI_COMM_SELF);
    std::unique_ptr<optim::MomentLayout> ml;
    const auto sa = load_and_save(cfg, a, "", self, 0, true, &ml), sc = load_and_save(cfg, c, "", self, 0, true);
    for (auto [name, x, y] : {std::tuple{"master", &sa.master, &sc.master},
                              {"exp_avg_codes", &sa.exp_avg_codes, &sc.exp_avg_codes},
                              {"exp_avg_sq_codes", &sa.exp_avg_sq_codes, &sc.exp_avg_sq_codes},
                              {"exp_avg_absmax", &sa.exp_avg_absmax, &sc.exp_avg_absmax},
                              {"exp_avg_sq_absmax", &sa.exp_avg_sq_absmax, &sc.exp_avg_sq_absmax},
                              {"exp_avg (fp32 part)", &sa.exp_avg, &sc.exp_avg},
                              {"exp_avg_sq (fp32 part)", &sa.exp_avg_sq, &sc.exp_avg_sq}}) {
      EXPECT_TRUE(torch::equal(*x, *y)) << name << ": 8-bit -> fp32 -> 8-bit";
    }
    EXPECT_GT(sa.exp_avg_absmax.max().item<float>(), 0.0f) << "the moments were trained";
    // The fp32 checkpoint holds the dequantized 8-bit moments of the first.
    const int64_t n = sa.master.numel();  // the flat space, padded
    const CheckpointManifest mb = CheckpointManifest::read(b);
    auto m = torch::zeros({n}), v = torch::zeros({n});
    optim::dequantize_moments(*ml, 0, n, sa.moment_buffers(), m.data_ptr<float>(), v.data_ptr<float>());
    for (auto [name, want] : {std::pair{"exp_avg", &m}, {"exp_avg_sq", &v}}) {
      auto got = torch::zeros({mb.flat_total});
      read_flat_range(mb, name, 0, mb.flat_total, got.data_ptr<float>());
      EXPECT_TRUE(torch::equal(got, want->narrow(0, 0, mb.flat_total))) << name << ": 8-bit -> fp32";
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// A scale of an 8-bit block that is not a finite non-negative number (here NaN, in a shard whose
// checksum the manifest was made to agree with) is refused on every rank, naming the file, the
// dataset, the index and the block's flat elements; nothing is loaded.
TEST(Checkpoint, DamagedEightBitScaleIsRefusedOnEveryRankByName) {
  SharedTokenFile data;
  SharedDir dir;
  const parallel::RankEnv world(MPI_COMM_WORLD);
  quiet_logs(world);
  const Config cfg = eight_bit_checkpoint(data, world, 4, dir.file("ckpt"));
  const std::string ckpt = dir.file("ckpt/step_0000004");
  const std::string shard = files::join(ckpt, "optim_r00001.h5");
  if (world_rank() == 0) {
    {
      h5::H5Id file(H5Fopen(shard.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
      h5::H5Id dset(H5Dopen2(file.get(), "exp_avg_sq_absmax", H5P_DEFAULT), H5Dclose);
      h5::H5Id space(H5Dget_space(dset.get()), H5Sclose);
      const hsize_t start[1] = {3}, count[1] = {1};
      H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr);
      h5::H5Id mem(H5Screate_simple(1, count, nullptr), H5Sclose);
      const float nan = std::nanf("");
      ASSERT_GE(H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, mem.get(), space.get(), H5P_DEFAULT, &nan), 0);
    }
    CheckpointManifest m = CheckpointManifest::read(ckpt);  // the checksum agrees: only the scale is wrong
    for (auto& f : m.files) {
      if (f.name == "optim_r00001.h5") f.crc32c = crc32c_hex(crc32c_file(shard, &f.bytes));
    }
    test::write_file(files::join(ckpt, "manifest.json"), json::dump(m.to_json()) + "\n");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  for (const char* moments : {"8bit", "fp32"}) {
    SCOPED_TRACE(std::string("resumed with ") + moments + " moments");
    auto c = cfg;
    c.memory.optimizer_moments = parse_choice<optim::MomentFormat>("memory.optimizer_moments", moments);
    c.checkpoint.every = 0;
    c.checkpoint.resume = ckpt;
    c.train.max_steps = 6;
    const std::string err = test::user_error([&] { train(c, world); });
    EXPECT_NE(err.find(shard + ": /exp_avg_sq_absmax[3], the scale of the 8-bit block of flat elements ["),
              std::string::npos)
        << err;
    EXPECT_NE(err.find("is not a finite non-negative number"), std::string::npos) << err;
    EXPECT_NE(err.find("nothing was loaded"), std::string::npos) << err;
  }
}

// FP8 delayed scaling's histories ride in the manifest (fp8_amax_history): fp32 values come back
// exactly, extremes included, and a history whose values do not fill its shape is refused by name.
// (That a resumed GPU run continues as if uninterrupted is tests/train/fp8_resume_gpu.sh.)
TEST(Checkpoint, Fp8AmaxHistoryRoundTripsExactlyInTheManifest) {
  SharedTokenFile data;
  SharedDir dir;
  const parallel::RankEnv world(MPI_COMM_WORLD);
  quiet_logs(world);
  run_to_a_checkpoint(data, dir, world, 2);
  const std::string ckpt = dir.file("ckpt/step_0000002");
  if (world_rank() == 0) {
    CheckpointManifest m = CheckpointManifest::read(ckpt);
    EXPECT_TRUE(m.fp8_amax_shape.empty());  // written without delayed scaling
    m.fp8_amax_shape = {1, 4, 3, 2};
    m.fp8_steps = 7;
    for (int i = 0; i < 24; ++i) m.fp8_amax.push_back(std::ldexp(1.0f / 3 + i, 4 * i - 60));
    m.fp8_amax[0] = 0.0f;
    m.fp8_amax[1] = std::numeric_limits<float>::denorm_min();
    m.fp8_amax[2] = std::numeric_limits<float>::max();
    m.fp8_amax[3] = 0.1f;
    const std::string path = files::join(ckpt, "manifest.json");
    test::write_file(path, json::dump(m.to_json()) + "\n");
    const CheckpointManifest back = CheckpointManifest::read(ckpt);
    EXPECT_EQ(back.fp8_amax_shape, m.fp8_amax_shape);
    EXPECT_EQ(back.fp8_steps, 7);
    ASSERT_EQ(back.fp8_amax.size(), m.fp8_amax.size());
    EXPECT_EQ(std::memcmp(back.fp8_amax.data(), m.fp8_amax.data(), m.fp8_amax.size() * sizeof(float)), 0);
    m.fp8_amax_shape = {1, 4, 3, 3};  // 36 values wanted, 24 given
    test::write_file(path, json::dump(m.to_json()) + "\n");
    const std::string err = test::user_error([&] { CheckpointManifest::read(ckpt); });
    EXPECT_NE(err.find(path + ": fp8_amax_history holds 24 values"), std::string::npos) << err;
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace gpt2
