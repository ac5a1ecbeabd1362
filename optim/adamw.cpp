#include "optim/adamw.h"

#include <ATen/ATen.h>

#include <optional>
#include <vector>

#include "src/base/errors.h"

namespace gpt2::optim {

AdamW::AdamW(std::vector<Group> groups, AdamWOptions options) : options_(options) {
  for (auto& g : groups) {
    GroupState s;
    s.weight_decay = g.weight_decay;
    GPT2_ASSERT(g.grads.empty() || g.grads.size() == g.params.size(), "AdamW: one gradient per parameter");
    GPT2_ASSERT(g.exp_avg.size() == g.exp_avg_sq.size() && (g.exp_avg.empty() || g.exp_avg.size() == g.params.size()),
                "AdamW: one moment pair per parameter");
    s.grads = g.grads;
    for (size_t i = 0; i < g.params.size(); ++i) {
      const auto& p = g.params[i];
      s.params.push_back(p);
      s.exp_avg.push_back(g.exp_avg.empty() ? at::zeros_like(p, at::MemoryFormat::Contiguous) : g.exp_avg[i]);
      s.exp_avg_sq.push_back(g.exp_avg_sq.empty() ? at::zeros_like(p, at::MemoryFormat::Contiguous) : g.exp_avg_sq[i]);
      // The fused kernel reads the step count from a tensor on the param's device.
      s.step.push_back(at::zeros({}, p.options().dtype(at::kFloat)));
    }
    groups_.push_back(std::move(s));
  }
}

void AdamW::step(double lr, const torch::Tensor& found_inf) {
  at::NoGradGuard no_grad;
  for (auto& g : groups_) {
    std::vector<at::Tensor> params, grads, m, v, steps;
    for (size_t i = 0; i < g.params.size(); ++i) {
      const at::Tensor grad = g.grads.empty() ? g.params[i].grad() : g.grads[i];
      if (!grad.defined()) continue;
      params.push_back(g.params[i]);
      grads.push_back(grad);
      m.push_back(g.exp_avg[i]);
      v.push_back(g.exp_avg_sq[i]);
      steps.push_back(g.step[i]);
    }
    if (params.empty()) continue;
    at::_foreach_add_(steps, 1);
    const std::optional<at::Tensor> skip = found_inf.defined() ? std::optional<at::Tensor>(found_inf) : std::nullopt;
    at::_fused_adamw_(params, grads, m, v, /*max_exp_avg_sqs=*/{}, steps, lr, options_.beta1,
                      options_.beta2, g.weight_decay, options_.eps, /*amsgrad=*/false,
                      /*maximize=*/false, /*grad_scale=*/std::nullopt, /*found_inf=*/skip);
    // A skipped step does not count (as torch.amp.GradScaler does with fused optimizers).
    if (skip) at::_foreach_sub_(steps, std::vector<at::Tensor>(steps.size(), skip->reshape({})));
  }
}

int64_t AdamW::adam_step() const {
  for (const auto& g : groups_)
    if (!g.step.empty()) return static_cast<int64_t>(g.step.front().item<float>());
  return 0;
}

void AdamW::set_adam_step(int64_t step) {
  for (auto& g : groups_)
    for (auto& s : g.step) s.fill_(static_cast<double>(step));
}

int64_t AdamW::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& g : groups_)
    for (size_t i = 0; i < g.params.size(); ++i)
      bytes += g.exp_avg[i].nbytes() + g.exp_avg_sq[i].nbytes() + g.step[i].nbytes();
  return bytes;
}

}  // namespace gpt2::optim
