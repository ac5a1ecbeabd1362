// Activation recomputation (src/model/recompute.h, GPT2::set_recompute_every,
// memory.activation_checkpointing): same loss and gradients as without, gradients still flow
// through the parameters' accumulators (hooks, in-place .grad), fewer graph nodes kept, dropout
// recomputed with the forward's RNG state, config parsing. CPU only.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "src/base/errors.h"
#include "src/model/gpt2_model.h"
#include "src/model/recompute.h"
#include "src/train/config.h"
#include "tests/test_util.h"

namespace gpt2 {
namespace {

constexpr int64_t kLayers = 4;

GPT2Config small_config() {
  GPT2Config cfg;
  cfg.n_layer = kLayers;
  cfg.n_head = 2;
  cfg.n_embd = 16;
  cfg.vocab_size = 50;
  cfg.block_size = 12;
  return cfg;
}

// A model with every parameter random (LN and biases too) in `dtype`, the same for every call.
GPT2 make_model(torch::Dtype dtype) {
  GPT2 model(small_config());
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(123);
  for (auto& p : model->parameters()) p.copy_(torch::empty(p.sizes(), torch::kFloat).normal_(0.0, 0.3, gen));
  model->to(dtype);
  return model;
}

struct Batch {
  torch::Tensor idx, targets;  // (B, T) int64 each
};

Batch make_batch() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  auto tokens = torch::randint(0, 50, {3, 11}, gen, torch::kLong);  // (B, T + 1)
  return {tokens.narrow(1, 0, 10), tokens.narrow(1, 1, 10)};
}

struct LossAndGrads {
  double loss;
  std::vector<torch::Tensor> grads;  // in parameters() order
};

LossAndGrads loss_and_grads(GPT2& model, int64_t every_k, const Batch& b) {
  model->set_recompute_every(every_k);
  model->zero_grad();
  auto loss = model->loss(b.idx, b.targets);
  loss.backward();
  LossAndGrads r{loss.item<double>(), {}};
  for (auto& p : model->parameters()) r.grads.push_back(p.grad().clone());
  return r;
}

// max |a - b| / max |b| over all tensors: relative to the gradients' scale, robust to tiny entries.
double max_rel_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, (a[i] - b[i]).abs().max().item<double>());
    scale = std::max(scale, b[i].abs().max().item<double>());
  }
  return diff / scale;
}

// Every node reachable from `root`, each once (the graph is a DAG with shared subgraphs).
std::vector<torch::autograd::Node*> graph_nodes(const torch::Tensor& root) {
  std::vector<torch::autograd::Node*> nodes, stack{root.grad_fn().get()};
  std::unordered_set<torch::autograd::Node*> seen;
  while (!stack.empty()) {
    auto* n = stack.back();
    stack.pop_back();
    if (n == nullptr || !seen.insert(n).second) continue;
    nodes.push_back(n);
    for (const auto& e : n->next_edges()) stack.push_back(e.function.get());
  }
  return nodes;
}

int64_t count_named(const std::vector<torch::autograd::Node*>& nodes, const std::string& part) {
  int64_t n = 0;
  for (auto* node : nodes) n += node->name().find(part) != std::string::npos;
  return n;
}

// Counts calls, like parallel/grad_buckets.cpp's hook that marks a parameter's gradient ready.
class CountingHook : public torch::autograd::FunctionPostHook {
 public:
  explicit CountingHook(int* count) : count_(count) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    ++*count_;
    return outputs;
  }

 private:
  int* count_;
};

// ---------------------------------------------------------------------------------------------
// Same numbers as without recomputation

void expect_same_as_none(torch::Dtype dtype, double tol) {
  auto model = make_model(dtype);
  const auto batch = make_batch();
  const auto ref = loss_and_grads(model, 0, batch);
  for (int64_t k : {1, 2, 3}) {
    SCOPED_TRACE("every_k = " + std::to_string(k));
    const auto got = loss_and_grads(model, k, batch);
    EXPECT_NEAR(got.loss, ref.loss, tol * std::abs(ref.loss));
    EXPECT_LE(max_rel_diff(got.grads, ref.grads), tol);
  }
}

TEST(Recompute, SameLossAndGradsFp64) { expect_same_as_none(torch::kDouble, 1e-12); }
TEST(Recompute, SameLossAndGradsFp32) { expect_same_as_none(torch::kFloat, 1e-6); }

TEST(Recompute, EvalForwardUnchangedAndBuildsNoGraph) {
  auto model = make_model(torch::kFloat);
  const auto batch = make_batch();
  torch::NoGradGuard no_grad;
  auto ref = model->forward(batch.idx);
  model->set_recompute_every(1);
  auto got = model->forward(batch.idx);
  EXPECT_TRUE(torch::equal(got, ref));
  EXPECT_FALSE(got.requires_grad());
}

TEST(Recompute, RejectsNegativeEveryK) {
  auto model = make_model(torch::kFloat);
  EXPECT_THROW(model->set_recompute_every(-1), std::invalid_argument);
  const auto batch = make_batch();  // the setting is unchanged: no block is recomputed
  EXPECT_EQ(count_named(graph_nodes(model->loss(batch.idx, batch.targets)), "RecomputeFunction"), 0);
}

// ---------------------------------------------------------------------------------------------
// Gradients go through the parameters' accumulators (what the data-parallel reducer relies on)

TEST(Recompute, AccumulatorPostHooksFireOncePerParameterPerBackward) {
  auto model = make_model(torch::kFloat);
  const auto batch = make_batch();
  auto params = model->parameters();
  std::vector<int> calls(params.size(), 0);
  // The parameter holds its accumulator weakly: keep it alive, as GradBuckets does, or the hook
  // would vanish with it between backward passes.
  std::vector<std::shared_ptr<torch::autograd::Node>> accs;
  std::vector<uintptr_t> keys;
  for (size_t i = 0; i < params.size(); ++i) {
    accs.push_back(torch::autograd::impl::grad_accumulator(params[i]));
    keys.push_back(accs.back()->add_post_hook(std::make_unique<CountingHook>(&calls[i])));
  }
  for (int64_t k : {1, 2}) {
    model->set_recompute_every(k);
    for (int step = 1; step <= 2; ++step) {
      std::fill(calls.begin(), calls.end(), 0);
      model->loss(batch.idx, batch.targets).backward();
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_EQ(calls[i], 1) << "parameter " << i << ", every_k " << k << ", backward " << step;
      }
    }
  }
  for (size_t i = 0; i < accs.size(); ++i) accs[i]->del_post_hook(keys[i]);
}

TEST(Recompute, GradsAccumulateInPlaceIntoExistingBuffers) {
  auto model = make_model(torch::kDouble);
  const auto batch = make_batch();
  const auto ref = loss_and_grads(model, 0, batch);
  auto params = model->parameters();
  int64_t total = 0;
  for (auto& p : params) total += p.numel();
  // One flat buffer with a view per parameter, as GradBuckets lays out a bucket.
  auto flat = torch::zeros({total}, torch::kDouble);
  std::vector<torch::Tensor> views;
  int64_t offset = 0;
  for (auto& p : params) {
    views.push_back(flat.narrow(0, offset, p.numel()).view(p.sizes()));
    p.mutable_grad() = views.back();
    offset += p.numel();
  }
  model->set_recompute_every(1);
  for (int pass = 1; pass <= 2; ++pass) {  // the second pass adds to the first
    model->loss(batch.idx, batch.targets).backward();
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_TRUE(params[i].grad().is_same(views[i])) << "parameter " << i << ": .grad was replaced";
      EXPECT_TRUE(torch::allclose(views[i], pass * ref.grads[i], 1e-12, 1e-14)) << "parameter " << i;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// What the forward keeps: one node per recomputed block, none of the block's inner nodes

TEST(Recompute, GraphHasOneNodePerRecomputedBlock) {
  auto model = make_model(torch::kFloat);
  const auto batch = make_batch();
  struct Case {
    int64_t every_k, recomputed;
  };
  // Blocks 0, K, 2K, ... are recomputed; GELU (one per MLP) appears only in the others.
  std::vector<int64_t> total_nodes;
  for (const Case c : {Case{0, 0}, Case{1, kLayers}, Case{2, 2}, Case{3, 2}}) {
    SCOPED_TRACE("every_k = " + std::to_string(c.every_k));
    model->set_recompute_every(c.every_k);
    auto loss = model->loss(batch.idx, batch.targets);
    const auto nodes = graph_nodes(loss);
    EXPECT_EQ(count_named(nodes, "RecomputeFunction"), c.recomputed);
    EXPECT_EQ(count_named(nodes, "GeluBackward"), kLayers - c.recomputed);
    EXPECT_EQ(count_named(nodes, "LayerNormBackward"), 2 * (kLayers - c.recomputed) + 1);  // + ln_f
    total_nodes.push_back(static_cast<int64_t>(nodes.size()));
  }
  EXPECT_LT(total_nodes[1], total_nodes[2]);
  EXPECT_LT(total_nodes[2], total_nodes[0]);
}

// ---------------------------------------------------------------------------------------------
// Dropout (test-only blocks): the recompute draws the same mask; the caller's RNG is not disturbed

struct DropoutStackImpl : torch::nn::Module {
  std::vector<torch::nn::Linear> layers;
  DropoutStackImpl() {
    for (int i = 0; i < 3; ++i) layers.push_back(register_module("l" + std::to_string(i), torch::nn::Linear(8, 8)));
  }
  // x: (N, 8) -> (N, 8); each layer recomputed when `recompute`.
  torch::Tensor forward(torch::Tensor x, bool recompute) {
    for (auto& layer : layers) {
      auto block = [lin = layer.ptr()](const torch::Tensor& in) {
        return in + torch::dropout(torch::tanh(lin->forward(in)), /*p=*/0.5, /*train=*/true);
      };
      x = recompute ? recomputed(block, x) : block(x);
    }
    return x;
  }
};
TORCH_MODULE(DropoutStack);

std::vector<torch::Tensor> dropout_grads(DropoutStack& net, const torch::Tensor& x, bool recompute, uint64_t seed,
                                         torch::Tensor* rng_after_forward = nullptr) {
  net->zero_grad();
  torch::manual_seed(seed);
  auto y = net->forward(x, recompute);  // (N, 8)
  if (rng_after_forward) *rng_after_forward = at::detail::getDefaultCPUGenerator().get_state();
  (y * y).sum().backward();
  std::vector<torch::Tensor> grads;
  for (auto& p : net->parameters()) grads.push_back(p.grad().clone());
  return grads;
}

TEST(Recompute, DropoutRecomputesWithForwardRngState) {
  torch::manual_seed(0);
  DropoutStack net;
  net->to(torch::kDouble);
  auto x = torch::randn({16, 8}, torch::kDouble).requires_grad_(true);  // (N, 8)
  const auto ref = dropout_grads(net, x, /*recompute=*/false, 42);
  torch::Tensor rng_after_forward;
  const auto got = dropout_grads(net, x, /*recompute=*/true, 42, &rng_after_forward);
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_TRUE(torch::allclose(got[i], ref[i], 1e-12, 1e-14)) << i;
  // The backward put the caller's generator back where the forward left it.
  EXPECT_TRUE(torch::equal(at::detail::getDefaultCPUGenerator().get_state(), rng_after_forward));
  // Control: another seed gives other masks, so the equality above is not vacuous.
  const auto other = dropout_grads(net, x, /*recompute=*/false, 43);
  EXPECT_FALSE(torch::allclose(other[0], ref[0]));
}

// ---------------------------------------------------------------------------------------------
// Config: memory.activation_checkpointing

ParseResult parse(std::vector<std::string> args) {
  args.insert(args.begin(), "gpt2-train");
  args.push_back("--data.train=a.h5");
  std::vector<const char*> argv;
  for (auto& a : args) argv.push_back(a.c_str());
  return parse_config(static_cast<int>(argv.size()), argv.data());
}

TEST(ActivationCheckpointConfig, AcceptsNoneFullEveryK) {
  EXPECT_EQ(parse({}).config.recompute_every(), 0);  // default: none
  EXPECT_EQ(parse({"--memory.activation_checkpointing=none"}).config.recompute_every(), 0);
  EXPECT_EQ(parse({"--memory.activation_checkpointing=full"}).config.recompute_every(), 1);
  EXPECT_EQ(parse({"--memory.activation_checkpointing=every_k=2"}).config.recompute_every(), 2);
  EXPECT_EQ(parse({"--memory.activation_checkpointing=every_k=1"}).config.recompute_every(), 1);
}

TEST(ActivationCheckpointConfig, RejectsBadValuesNamingTheKey) {
  for (const char* bad : {"every_k=0", "every_k=x", "bogus", "every_k=", "every_k=-1", "every_k=2x", "every_k=+2",
                          "Full", "every_k=99999999999999999999"}) {
    SCOPED_TRACE(bad);
    const auto msg = test::user_error([&] { parse({std::string("--memory.activation_checkpointing=") + bad}); });
    EXPECT_HAS(msg, "memory.activation_checkpointing");
  }
}

}  // namespace
}  // namespace gpt2
