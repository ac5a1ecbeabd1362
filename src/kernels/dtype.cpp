#include "src/kernels/dtype.h"

#include <ATen/cpu/Utils.h>

namespace gpt2::kernels {

bool cpu_has_fast_bf16_gemm() {
  static const bool fast = [] {
    const auto caps = at::cpu::get_cpu_capabilities();
    auto has = [&](const char* name) {
      const auto it = caps.find(name);
      return it != caps.end() && it->second.isBool() && it->second.toBool();
    };
    return (has("avx512_bw") && has("avx512_vl") && has("avx512_dq")) || (has("avx_vnni") && has("avx_ne_convert"));
  }();
  return fast;
}

}  // namespace gpt2::kernels
