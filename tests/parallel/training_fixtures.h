#pragma once
// Shared by the MPI training tests (data parallelism, checkpoints): a token file every rank can
// read, a tiny fp32 CPU config, and small helpers.
#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "data/token_file.h"
#include "parallel/rank_env.h"
#include "src/base/files.h"
#include "src/base/log.h"
#include "src/model/gpt2_model.h"
#include "src/train/config.h"
#include "src/train/trainer.h"
#include "tests/test_util.h"

namespace gpt2::test {

inline int world_rank() {
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
      dir_ = std::make_unique<TempDir>("gpt2_mpi_test");
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
  std::unique_ptr<TempDir> dir_;
  std::string path_;
};

// A token file of a learnable stream, written by rank 0 into a directory every rank can read.
class SharedTokenFile {
 public:
  SharedTokenFile() : path_(dir_.file("train.h5")) {
    if (world_rank() == 0) {
      std::vector<uint32_t> tokens;
      for (int i = 0; i < 20000; ++i) tokens.push_back(static_cast<uint32_t>((i * 7 + i / 13) % 251));
      data::TokenFileAttrs attrs;
      attrs.vocab_size = 256;
      attrs.eot_token = 255;
      data::write_token_file(path_, tokens, attrs);
    }
    MPI_Barrier(MPI_COMM_WORLD);  // written before any rank reads it
  }
  const std::string& path() const { return path_; }

 private:
  SharedDir dir_;  // first: path_ is made from it
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
  c.train.device = DeviceChoice::kCpu;
  c.precision.dtype = DtypeChoice::kFp32;
  c.parallel.bucket_mb = bucket_mb;
  c.log.metrics = "";
  c.log.every = 1;  // a loss for every step
  c.validate();
  return c;
}

// ||a - b|| / ||b||: the relative error of a against the reference b (in fp64, on the host).
inline double rel_error(const torch::Tensor& a, const torch::Tensor& b) {
  const auto a64 = a.detach().to(torch::kCPU, torch::kDouble), b64 = b.detach().to(torch::kCPU, torch::kDouble);
  return ((a64 - b64).norm() / b64.norm().clamp_min(1e-30)).item<double>();
}

// Parameters of `got` against `want` (relative error <= tol each; returns the worst), and the
// logits of both on a fixed batch.
// Note [Key bias]: softmax is invariant to the key bias, so its exact gradient is zero and all Adam
// sees there is fp32 rounding noise, which differs with summation order. The query and value
// thirds of c_attn.bias are compared; the key third has no effect on the function (the logits).
inline void expect_params_bitwise_equal(GPT2& got, GPT2& want) {
  auto a = got->named_parameters(), b = want->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i].value(), b[i].value())) << a[i].key();
}

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
  auto idx = torch::arange(2 * 16, torch::kInt64).view({2, 16}).remainder(256).to(want->parameters().front().device());
  EXPECT_LE(rel_error(got->forward(idx), want->forward(idx)), tol) << "logits";
  return worst;
}

// Per-step losses (relative error <= loss_tol, default tol) and final parameters (<= tol) of `got`
// against `want`; the reference must have learned, or the comparison would prove little.
inline void expect_same_training(TrainResult& got, TrainResult& want, int64_t n_embd, double tol,
                                 double loss_tol = -1) {
  if (loss_tol < 0) loss_tol = tol;
  ASSERT_EQ(got.losses.size(), want.losses.size());
  ASSERT_GE(want.losses.size(), 10u);
  const size_t n = want.losses.size();
  double worst_loss = 0;
  for (size_t s = 0; s < n; ++s) {
    const double e = std::abs(got.losses[s] - want.losses[s]) / std::abs(want.losses[s]);
    worst_loss = std::max(worst_loss, e);
    EXPECT_LE(e, loss_tol) << "step " << s;
  }
  auto mean = [](auto first, auto last) { return std::accumulate(first, last, 0.0) / std::distance(first, last); };
  EXPECT_LT(mean(want.losses.end() - 5, want.losses.end()), mean(want.losses.begin(), want.losses.begin() + 5) - 0.1)
      << "the reference run did not learn: the comparison would prove little";
  const double worst = expect_same_parameters(got.model, want.model, n_embd, tol);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) std::printf("[ measured ] worst relative error: loss %.2e, parameter %.2e\n", worst_loss, worst);
}

inline void quiet_logs(const parallel::RankEnv& env) {
  log::init(env.rank(), env.world_size());
  log::set_level(log::Level::kWarn);
}

// How far a run may drift from its reference: relative error of each step's loss, and of each
// parameter tensor at the end.
struct Tolerance {
  double loss, param;
};
struct Tolerances {
  Tolerance variants;  // recomputation against ZeRO 0 on the same ranks (ZeRO 1/2 and offload: exact)
  Tolerance one_rank;  // ZeRO 0 on all ranks against rank 0 alone with the same global batch
};

// Note [Mixed-precision tolerances]: ZeRO 1/2 and offload do ZeRO 0's arithmetic on other slices,
// element by element, so they give ZeRO 0's bits in every precision (Note [Partition-free
// arithmetic], optim/grad_norm.h) and are held to exactly that. Activation recomputation runs other
// kernels on the GPU (the recomputed forward runs with gradients on, where attention may take
// another kernel than the no-grad forward did), which moves an activation by an ulp here and
// there. That flips the rounding of a 16-bit value (bf16 keeps 8 bits, one ulp is 2^-8 = 3.9e-3
// relative; fp16 2^-11 = 4.9e-4) and later steps carry the flip on; N ranks against one rank sum
// each gradient in another order (a split batch). Parameters: the worst tensors are the biases,
// near zero after 20 steps, whose relative error is large for a tiny absolute one. Measured
// (3 ranks, 20 steps, 2026-12-04), worst loss / parameter:
//   CPU bf16 and fp16: every variant 0 / 0; 3 ranks against one 1.2e-7 / 0.
//   H200 bf16: ZeRO 1/2 and offload 0 / 0; recomputation 5.1e-5 / 9.0e-2 (biases); one rank 1.2e-7 / 0.
//   H200 fp16: ZeRO 1/2 and offload 0 / 0; recomputation 6.6e-6 / 1.3e-3.
// The loss bounds sit ~15x above the worst loss measured and are what catches a wrong gradient or
// a missed step: a skipped step moves the next losses by ~1e-2 (measured 7e-3 to 1.2e-2 on
// configs/tiny.ini in fp16) while it moves parameters by only ~lr = 3e-3 relative. The parameter
// bounds sit above the worst measured and bound the drift.
inline constexpr Tolerances kBf16Tolerances{/*variants=*/{/*loss=*/1e-3, /*param=*/0.2}, /*one_rank=*/{1e-3, 0.2}};
inline constexpr Tolerances kFp16Tolerances{/*variants=*/{/*loss=*/1e-4, /*param=*/5e-3}, /*one_rank=*/{1e-4, 5e-3}};

// `base` (ZeRO 0) on all ranks of MPI_COMM_WORLD is the reference for ZeRO 1, ZeRO 2, optimizer
// offload and full activation recomputation on the same ranks; then rank 0 alone (MPI_COMM_SELF)
// with the same global batch is the reference for it. Every run, on every rank, must end with
// `loss_scale` (fp16: 65536 halved once per skipped step; 1 otherwise). ZeRO 2 is held to
// `zero2` (default exact: the MPI backend sums in rank order, Note [Rank-order sums]; NCCL's
// reduce-scatter may sum in another order than its all-reduce), and with accumulation to the
// one-rank bound (it sums micro-steps of sums over ranks: Note [ZeRO 2 with accumulation] in
// data_parallel_test.cpp).
inline void expect_variants_match(const Config& base, Tolerances tol, double loss_scale = 1, Tolerance zero2 = {0, 0}) {
  const parallel::RankEnv world(MPI_COMM_WORLD);
  quiet_logs(world);
  auto expect_scale_on_every_rank = [&](const TrainResult& r) {
    EXPECT_EQ(world.all_reduce_sum(r.loss_scale), loss_scale * world.world_size()) << "loss scale " << r.loss_scale;
  };
  TrainResult zero0 = train(base, world);
  expect_scale_on_every_rank(zero0);
  struct Variant {
    const char* name;
    int64_t zero_stage;
    const char* offload;
    const char* recompute;
  };
  for (const Variant& v :
       {Variant{"ZeRO 1", 1, "none", "none"}, Variant{"ZeRO 2", 2, "none", "none"},
        Variant{"ZeRO 1 + offload", 1, "optimizer", "none"}, Variant{"recomputation", 0, "none", "full"}}) {
    Config cfg = base;
    cfg.parallel.zero_stage = v.zero_stage;
    cfg.parallel.offload = parse_choice<Offload>("parallel.offload", v.offload);
    cfg.parallel.offload_threads = 2;
    cfg.memory.activation_checkpointing = v.recompute;
    SCOPED_TRACE(v.name);
    if (world.is_main()) std::printf("[ measured ] %s vs ZeRO 0 (%s):\n", v.name, choice_name(base.precision.dtype));
    TrainResult r = train(cfg, world);
    const bool same_kernels = std::string(v.recompute) == "none";  // ZeRO 1/2, offload: exactly ZeRO 0
    const bool accumulates = base.grad_accum_steps(world.world_size()) > 1;
    const Tolerance t = !same_kernels       ? tol.variants
                        : v.zero_stage != 2 ? Tolerance{0, 0}
                        : accumulates       ? tol.one_rank
                                            : zero2;
    expect_same_training(r, zero0, base.model.n_embd, t.param, t.loss);
    expect_scale_on_every_rank(r);
  }
  if (world.is_main()) {
    const parallel::RankEnv self(MPI_COMM_SELF);
    std::printf("[ measured ] %d ranks vs 1 rank (%s):\n", world.world_size(), choice_name(base.precision.dtype));
    TrainResult one = train(base, self);
    expect_same_training(zero0, one, base.model.n_embd, tol.one_rank.param, tol.one_rank.loss);
    EXPECT_EQ(one.loss_scale, loss_scale);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// Sets GPT2_FAULT_AT (src/train/fault_injection.h) on this rank for the lifetime of the guard.
class FaultAt {
 public:
  explicit FaultAt(const std::string& spec) { setenv("GPT2_FAULT_AT", spec.c_str(), 1); }
  ~FaultAt() { unsetenv("GPT2_FAULT_AT"); }
  FaultAt(const FaultAt&) = delete;
  FaultAt& operator=(const FaultAt&) = delete;
};

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

}  // namespace gpt2::test
