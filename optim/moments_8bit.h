#pragma once
// 8-bit AdamW moments, block-wise (Dettmers et al. 2021, "8-bit Optimizers via Block-wise
// Quantization"): a moment tensor is cut into blocks of kQuantBlock values; a block keeps one fp32
// absmax and, per value, the uint8 index of the entry of a dynamic quantization map nearest to
// value / absmax. The first moment uses the signed map, the second (never negative) the unsigned
// one, which spends the sign bit on one more bit of fraction.
//
// Note [Dynamic map]
// A code is read from its high bit down: (signed map only) a sign bit, then E zero bits, then a one
// bit, then F = bits_left fraction bits j. Its value is 10^-E * (0.1 + 0.9 * (j + 1) / 2^F): E sets
// the decade, the fraction is linear inside it, and the top of each decade is its right end (so 1.0
// is exact and the block's absmax element comes back unchanged). Signed: E = 0..6 with 6 - E
// fraction bits, for both signs (254 values), zero, and 1e-7 (the code with no one bit and a
// negative sign bit), 256 distinct values. Unsigned: E = 0..7 with 7 - E fraction bits (255 values)
// and zero. The map is kept as its 256 values sorted ascending (the code is the index there);
// a value goes to the nearest entry, a tie to the lower one, all in fp32. 10^-E is computed as
// 1 / 10^E and the map is rounded from double once, so independent implementations of this note
// (tests/python/test_moments_8bit.py) build the same fp32 table.
//
// Tensors under kMinQuantNumel values (biases, LayerNorm) keep fp32 moments, as bitsandbytes does;
// that choice belongs to the caller.
#include <array>
#include <cstdint>

#ifdef GPT2_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "optim/cpu_adamw.h"

namespace gpt2::optim {

constexpr int64_t kQuantBlock = 2048;     // values per absmax
constexpr int64_t kMinQuantNumel = 4096;  // smaller tensors keep fp32 moments

using QuantMap = std::array<float, 256>;

// The sorted 256 values of the signed ([-1, 1]) or unsigned ([0, 1]) map (Note [Dynamic map]).
const QuantMap& dynamic_map(bool is_signed);

// The code of x (already divided by its block's absmax): the index of the nearest map value, ties
// to the lower index; NaN goes to the code of zero.
uint8_t quantize_value(const QuantMap& map, float x);

// Blocks of kQuantBlock values starting at x[0] (the last one may be shorter): codes (n) and one
// absmax per block (ceil(n / kQuantBlock)). A block of zeros has absmax 0 and decodes to zeros.
void quantize_blocks(const QuantMap& map, const float* x, int64_t n, uint8_t* codes, float* absmax);
void dequantize_blocks(const QuantMap& map, const uint8_t* codes, const float* absmax, int64_t n, float* out);

// A moment stored as 8-bit codes with its block scales (pointers into the caller's buffers).
struct Moment8 {
  uint8_t* codes = nullptr;
  float* absmax = nullptr;
};

// One AdamW update of n elements (n from a block boundary) with 8-bit moments: each block's
// moments are dequantized into fp32, updated by cpu_adamw_update (the same arithmetic as the fp32
// path), and quantized again with new absmax values. grad, grad_type and param_bf16 as for
// cpu_adamw_update. Runs on the calling thread; callers split work (at kQuantBlock multiples) with
// HostThreadPool.
void cpu_adamw_update_8bit(const CpuAdamWStep& s, int64_t n, float* param, Moment8 exp_avg, Moment8 exp_avg_sq,
                           const void* grad, HostGradType grad_type, uint16_t* param_bf16);

// The same update on the GPU, for n elements of device memory from a block boundary: one CUDA
// block per quantization block, one pass, the same bits as cpu_adamw_update_8bit (explicit
// rounding, no FMA contraction). grad_scale_device (a device scalar, e.g. the clip coefficient)
// multiplies c.grad_scale when given; when found_inf (a device scalar) holds nonzero nothing
// changes.
struct Moment8Maps {
  float signed_map[256];
  float unsigned_map[256];
};
Moment8Maps moment8_maps();

struct Adamw8bitArgs {
  Moment8Maps maps;
  AdamWCoeffs c;
  int64_t n = 0;
  float* param = nullptr;
  Moment8 exp_avg, exp_avg_sq;
  const void* grad = nullptr;
  HostGradType grad_type = HostGradType::kFloat32;
  uint16_t* param_bf16 = nullptr;
  const float* grad_scale_device = nullptr;
  const float* found_inf = nullptr;
};

#ifdef GPT2_WITH_CUDA
cudaError_t launch_adamw_8bit(const Adamw8bitArgs& args, cudaStream_t stream);
#endif

}  // namespace gpt2::optim
