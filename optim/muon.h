#pragma once
// Muon's update of one matrix (torch.optim.Muon's arithmetic; issue 42 builds the sharded
// optimizer path on it):
//   momentum ← momentum + (1 − μ) (grad − momentum)
//   update   ← nesterov ? grad + μ (momentum − grad) : momentum
//   param    ← param (1 − lr · weight_decay) − lr · √max(1, rows / cols) · newton_schulz(update)
// rows and cols are the parameter's as stored. param and momentum are fp32 (param: the master
// weights); grad fp32 or bf16. The orthogonalisation runs as newton_schulz.h says (bf16 on CUDA,
// fp32 on the CPU, or `compute`).
#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "optim/newton_schulz.h"

namespace gpt2::optim {

struct MuonOptions {
  double momentum = 0.95;
  bool nesterov = true;
  double weight_decay = 0.1;  // decoupled, scaled by lr
  NewtonSchulz ns;
};

// √max(1, rows / cols): the scale of a rows x cols matrix's orthogonalised update.
double muon_lr_scale(int64_t rows, int64_t cols);

// One step on a stack of same-shape matrices (Note [Muon's owners]), in place on `params` (k
// matrices [rows, cols]) and `momentum` [k, rows, cols]; grads [k, rows, cols]. The stack is
// orthogonalised as one (newton_schulz on a stack).
void muon_step(const std::vector<torch::Tensor>& params, const torch::Tensor& grads, torch::Tensor momentum, double lr,
               const MuonOptions& options, at::ScalarType compute = at::ScalarType::Undefined);
// One step on one matrix: a stack of one.
void muon_step(torch::Tensor param, const torch::Tensor& grad, torch::Tensor momentum, double lr,
               const MuonOptions& options, at::ScalarType compute = at::ScalarType::Undefined);

}  // namespace gpt2::optim
