#pragma once
// Shared by the MPI training tests (data parallelism, checkpoints): a token file every rank can
// read, a tiny fp32 CPU config, and small helpers.
#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "data/token_file.h"
#include "parallel/rank_env.h"
#include "src/base/log.h"
#include "src/train/config.h"
#include "src/model/gpt2_model.h"
#include "tests/test_util.h"

namespace gpt2::test {

// A token file of a learnable stream, written by rank 0 into a temp dir every rank can read.
class SharedTokenFile {
 public:
  SharedTokenFile() {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::string path;
    if (rank == 0) {
      dir_ = std::make_unique<test::TempDir>("gpt2_dp");
      path = dir_->file("train.h5");
      std::vector<uint32_t> tokens;
      for (int i = 0; i < 20000; ++i) tokens.push_back(static_cast<uint32_t>((i * 7 + i / 13) % 251));
      data::TokenFileAttrs attrs;
      attrs.vocab_size = 256;
      attrs.eot_token = 255;
      data::write_token_file(path, tokens, attrs);
    }
    int len = static_cast<int>(path.size());
    MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD);
    path.resize(len);
    MPI_Bcast(path.data(), len, MPI_CHAR, 0, MPI_COMM_WORLD);
    path_ = path;
  }
  const std::string& path() const { return path_; }

 private:
  std::unique_ptr<test::TempDir> dir_;
  std::string path_;
};

inline Config tiny_config(const std::string& train, int64_t batch_tokens, double bucket_mb) {
  Config c;
  c.model = {/*n_layer=*/2, /*n_head=*/2, /*n_embd=*/32, /*vocab_size=*/256, /*block_size=*/32};
  c.data.train = train;
  c.train.micro_batch = 2;
  c.train.seq_len = 16;
  c.train.batch_tokens = batch_tokens;
  c.train.max_steps = 20;
  c.train.lr = 3e-3;
  c.checkpoint.resume = "none";  // never pick up a checkpoint left in the working directory
  c.train.min_lr = 3e-4;
  c.train.warmup_steps = 3;
  c.train.eval_every = 0;
  c.train.sample_tokens = 0;
  c.train.device = "cpu";
  c.precision.dtype = "fp32";
  c.parallel.bucket_mb = bucket_mb;
  c.log.metrics = "";
  c.log.every = 1;  // a loss for every step
  c.validate();
  return c;
}

// ||a - b|| / ||b||: the relative error of a against the reference b.
inline double rel_error(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).norm() / b.norm().clamp_min(1e-30)).item<double>();
}

// Parameters of `got` against `want` (relative error <= tol each; returns the worst), and the
// logits of both on a fixed batch.
// Note [Key bias]: softmax is invariant to the key bias, so its exact gradient is zero and all Adam
// sees there is fp32 rounding noise, which differs with summation order. The query and value
// thirds of c_attn.bias are compared; the key third has no effect on the function (the logits).
inline double expect_same_parameters(GPT2& got, GPT2& want, int64_t n_embd, double tol) {
  auto a = got->named_parameters(), b = want->named_parameters();
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  const int64_t C = n_embd;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    auto pa = a[i].value(), pb = b[i].value();
    if (a[i].key().find("attn.c_attn.bias") != std::string::npos) {
      EXPECT_LE(rel_error(pa.narrow(0, 0, C), pb.narrow(0, 0, C)), tol) << a[i].key() << " (query)";
      EXPECT_LE(rel_error(pa.narrow(0, 2 * C, C), pb.narrow(0, 2 * C, C)), tol) << a[i].key() << " (value)";
      continue;
    }
    worst = std::max(worst, rel_error(pa, pb));
    EXPECT_LE(rel_error(pa, pb), tol) << a[i].key();
  }
  torch::NoGradGuard no_grad;
  auto idx = torch::arange(2 * 16, torch::kInt64).view({2, 16}).remainder(256);
  EXPECT_LE(rel_error(got->forward(idx), want->forward(idx)), tol) << "logits";
  return worst;
}

inline void quiet_logs(const parallel::RankEnv& env) {
  log::init(env.rank(), env.world_size());
  log::set_level(log::Level::kWarn);
}

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

}  // namespace gpt2::test
