#pragma once
// Activation recomputation: run a block without keeping its activations, run it again in backward.
//
// Contract of recomputed(fn, x):
// - Returns fn(x) (same values, same dtype). When grad mode is on and x requires grad, fn runs under
//   no-grad and the result's grad_fn is one custom node (its name() contains "RecomputeFunction")
//   that holds only x, fn and the RNG state of the forward. Otherwise it simply returns fn(x):
//   nothing to save (eval), or no edge to hang the node on (x is a constant; the block's parameters
//   would then get no gradient through the node, so it runs as is).
// - In backward the node re-runs fn on a detached copy of x with grad on, with the CPU (and x's
//   CUDA device) generator set to the state it had at forward, so dropout draws the same mask; the
//   caller's RNG state is restored afterwards.
// - Parameters fn uses (reached through fn, e.g. a captured module, not through graph edges) get
//   their gradients from a nested torch::autograd::backward on the recomputed graph: through their
//   own AccumulateGrad nodes, so post-hooks on the grad accumulators fire once per backward and an
//   existing .grad is added to in place (parallel/grad_buckets.cpp relies on both).
// - fn must take one tensor and return one tensor, be deterministic apart from the default
//   generators, and not modify x in place. Double backward (create_graph=true) is refused.
#include <torch/types.h>

#include <functional>

namespace gpt2 {

using RecomputeFn = std::function<torch::Tensor(const torch::Tensor&)>;

// fn(x), recomputed in backward as described above. x: any shape fn accepts; returns fn's output.
torch::Tensor recomputed(RecomputeFn fn, const torch::Tensor& x);

}  // namespace gpt2
