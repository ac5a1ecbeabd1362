// Config parsing: INI + overrides, and errors that name the key.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "src/base/errors.h"
#include "src/base/files.h"
#include "src/train/config.h"
#include "tests/test_util.h"

namespace gpt2 {
namespace {

std::string write_ini(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

ParseResult parse(std::vector<std::string> args) {
  args.insert(args.begin(), "gpt2-train");
  std::vector<const char*> argv;
  for (auto& a : args) argv.push_back(a.c_str());
  return parse_config(static_cast<int>(argv.size()), argv.data());
}

// The error message of parse(args); fails the test when it parses.
std::string error_of(std::vector<std::string> args) {
  return test::user_error([&] { parse(std::move(args)); });
}

const char* kIni =
    "# comment\n[model]\nn_layer = 2\nn_head = 2\nn_embd = 32\nblock_size = 64\n"
    "[data]\ntrain = a.h5\n[train]\nmicro_batch = 4\nseq_len = 16\nbatch_tokens = 128\nlr = 1e-3\nmin_lr = 1e-4\n";

TEST(Config, ReadsIniAndCommandLineWins) {
  const auto ini = write_ini("ok.ini", kIni);
  auto r = parse({"--config", ini, "--train.lr=2e-3", "--model.n_layer=3"});
  EXPECT_EQ(r.config.model.n_layer, 3);         // command line over file
  EXPECT_EQ(r.config.model.n_embd, 32);         // file over default
  EXPECT_EQ(r.config.model.vocab_size, 50257);  // default
  EXPECT_DOUBLE_EQ(r.config.train.lr, 2e-3);
  EXPECT_EQ(r.config.data.train, "a.h5");
  EXPECT_EQ(r.config.grad_accum_steps(1), 2);  // 128 / (4 * 16)
  EXPECT_EQ(r.config.grad_accum_steps(2), 1);
}

TEST(Config, ValNoneMeansNoEval) {
  auto r = parse({"--config", write_ini("none.ini", kIni), "--data.val=none"});
  EXPECT_TRUE(r.config.data.val.empty());
}

TEST(Config, TensorBoardDefaultsToBesideTheMetricsFile) {
  const auto ini = write_ini("tb.ini", kIni);
  EXPECT_EQ(parse({"--config", ini, "--log.metrics=runs/x/metrics.jsonl"}).config.log.tensorboard_dir(),
            "runs/x/tensorboard");
  EXPECT_EQ(parse({"--config", ini, "--log.metrics=m.jsonl"}).config.log.tensorboard_dir(), "tensorboard");
  EXPECT_EQ(parse({"--config", ini, "--log.metrics=none"}).config.log.tensorboard_dir(), "");
  EXPECT_EQ(parse({"--config", ini, "--log.metrics=none", "--log.tensorboard=tb"}).config.log.tensorboard_dir(), "tb");
  EXPECT_EQ(parse({"--config", ini, "--log.tensorboard=none"}).config.log.tensorboard_dir(), "");
}

TEST(Config, HelpListsKeysWithDefaults) {
  auto r = parse({"--help"});
  EXPECT_TRUE(r.help);
  EXPECT_NE(r.help_text.find("train.batch_tokens"), std::string::npos);
  EXPECT_NE(r.help_text.find("524288"), std::string::npos);
  // Defaults as written in the code, not their binary expansions (0.00059999999999999995).
  for (const char* shown : {"--train.lr arg (=0.0006)", "--train.min_lr arg (=6e-05)", "--train.beta2 arg (=0.95)",
                            "--train.eps arg (=1e-08)", "--parallel.bucket_mb arg (=25)",
                            // PyTorch's NCCL default: a rank may be busy alone for minutes (saves, samples).
                            "--parallel.timeout_s arg (=600)",
                            // Booleans as the INI files and gpt2-serve spell them, not (=1).
                            "--train.fused_kernels arg (=true)", "--checkpoint.async arg (=false)"}) {
    EXPECT_NE(r.help_text.find(shown), std::string::npos) << shown << " in\n" << r.help_text;
  }
  EXPECT_EQ(r.help_text.find("0000000"), std::string::npos) << r.help_text;
}

TEST(Config, ErrorsNameTheKey) {
  const auto ini = write_ini("base.ini", kIni);
  EXPECT_NE(error_of({"--config", ini, "--train.nope=1"}).find("train.nope"), std::string::npos);
  EXPECT_NE(error_of({"--config", write_ini("unk.ini", std::string(kIni) + "[train]\nfoo = 1\n")}).find("train.foo"),
            std::string::npos);
  EXPECT_NE(error_of({"--config", ini, "--train.lr=fast"}).find("train.lr"), std::string::npos);
  EXPECT_NE(error_of({"--config", ini, "--model.n_embd=33"}).find("model.n_embd"), std::string::npos);
  EXPECT_NE(error_of({"--config", ini, "--train.seq_len=65"}).find("train.seq_len"), std::string::npos);
  EXPECT_NE(error_of({"--config", ini, "--train.batch_tokens=100"}).find("train.batch_tokens"), std::string::npos);
  EXPECT_NE(error_of({"--config", ini, "--precision.dtype=fp8"}).find("precision.dtype"), std::string::npos);
  EXPECT_NE(error_of({"--config", ini, "--train.min_lr=1"}).find("train.min_lr"), std::string::npos);
  EXPECT_NE(error_of({"--config", ini, "--train.lr_schedule=step"}).find("train.lr_schedule = step: must be one of"),
            std::string::npos);
  EXPECT_NE(error_of({"--config", ini, "--train.decay_frac=1.5"}).find("train.decay_frac"), std::string::npos);
  EXPECT_NE(error_of({"--config", ini, "--optim.name=sgd"}).find("optim.name = sgd: must be one of adamw | muon"),
            std::string::npos);
  EXPECT_NE(error_of({"--config", ini, "--optim.muon_lr=0"}).find("optim.muon_lr = 0: must be positive"),
            std::string::npos)
      << error_of({"--config", ini, "--optim.muon_lr=0"});
  EXPECT_NE(error_of({"--config", ini, "--optim.muon_momentum=1"}).find("optim.muon_momentum"), std::string::npos);
  EXPECT_NE(error_of({"--config", "/nonexistent/x.ini"}).find("/nonexistent/x.ini"), std::string::npos);
  // A directory opens as an empty stream: it would train the defaults unasked.
  const std::string dir = files::parent_path(ini);
  EXPECT_NE(error_of({"--config", dir}).find("config file " + dir + ": is a directory"), std::string::npos)
      << error_of({"--config", dir});
  EXPECT_NE(error_of({"--model.n_layer=2"}).find("data.train"), std::string::npos);
  EXPECT_NE(error_of({"--config", ini, "stray"}).find("stray"), std::string::npos);
  EXPECT_NE(error_of({"--config", ini, "--precision.reduce_dtype=fp64"}).find("precision.reduce_dtype"),
            std::string::npos);
  // Gradients reduce in fp32 or in the compute dtype itself, nothing else.
  EXPECT_NE(error_of({"--config", ini, "--precision.dtype=fp16", "--precision.reduce_dtype=bf16"})
                .find("precision.reduce_dtype = bf16: must be fp32 or precision.dtype (fp16)"),
            std::string::npos)
      << error_of({"--config", ini, "--precision.dtype=fp16", "--precision.reduce_dtype=bf16"});
  EXPECT_NE(error_of({"--config", ini, "--precision.dtype=fp16", "--precision.reduce_dtype=fp16",
                      "--parallel.offload=optimizer"})
                .find("parallel.offload"),
            std::string::npos);
  EXPECT_NE(error_of({"--config", ini, "--parallel.offload=gpu"}).find("parallel.offload"), std::string::npos);
  EXPECT_NE(error_of({"--config", ini, "--parallel.backend=gloo"}).find("parallel.backend = gloo"), std::string::npos);
  EXPECT_NE(error_of({"--config", ini, "--train.device=cpu", "--parallel.backend=nccl"})
                .find("parallel.backend = nccl: needs CUDA tensors (train.device = cpu)"),
            std::string::npos)
      << error_of({"--config", ini, "--train.device=cpu", "--parallel.backend=nccl"});
}

TEST(Config, BatchThatDoesNotDivideAcrossRanksNamesTheKey) {
  auto r = parse({"--config", write_ini("div.ini", kIni)});
  try {
    r.config.grad_accum_steps(3);
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("train.batch_tokens"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("x 3"), std::string::npos);
  }
}

TEST(Config, TableShowsResolvedValues) {
  auto r = parse({"--config", write_ini("t.ini", kIni), "--train.seed=7"});
  bool found = false;
  for (const auto& [k, v] : r.config.table())
    if (k == "train.seed") found = v == "7";
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace gpt2
