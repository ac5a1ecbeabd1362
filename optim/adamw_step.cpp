#include "optim/adamw_step.h"

namespace gpt2::optim {

void adamw_step_cpu(const CpuAdamWStep& s, const MomentBlock* blocks, int64_t num_blocks, float* param,
                    const MomentBuffers& mb, const void* grad, HostGradType grad_type, uint16_t* param_bf16) {
  const QuantTable& signed_map = quant_table(true);
  const int64_t grad_bytes = grad_type == HostGradType::kBFloat16 ? 2 : 4;
  CpuAdamWStep no_decay = s;
  no_decay.weight_decay = 0;
  // One block of each moment in fp32 on the stack: 16 KiB, in L1/L2 while it is updated.
  alignas(64) float m[kQuantBlock];
  alignas(64) float v[kQuantBlock];
  for (int64_t k = 0; k < num_blocks; ++k) {
    const MomentBlock& b = blocks[k];
    const CpuAdamWStep& step = b.weight_decay ? s : no_decay;
    const void* g = static_cast<const char*>(grad) + b.begin * grad_bytes;
    uint16_t* out = param_bf16 != nullptr ? param_bf16 + b.begin : nullptr;
    if (!b.quantized) {
      cpu_adamw_update(step, b.len, param + b.begin, mb.exp_avg + b.state, mb.exp_avg_sq + b.state, g, grad_type, out);
      continue;
    }
    dequantize_blocks(signed_map, mb.exp_avg_codes + b.begin, mb.exp_avg_absmax + b.state, b.len, m);
    dequantize_second_moments(mb.exp_avg_sq_codes + b.begin, mb.exp_avg_sq_absmax + b.state, b.len, v);
    cpu_adamw_update(step, b.len, param + b.begin, m, v, g, grad_type, out);
    quantize_blocks(signed_map, m, b.len, mb.exp_avg_codes + b.begin, mb.exp_avg_absmax + b.state);
    quantize_second_moments(v, b.len, mb.exp_avg_sq_codes + b.begin, mb.exp_avg_sq_absmax + b.state);
  }
}

}  // namespace gpt2::optim
