#pragma once
// Batch-few decoding's projections with their neighbours fused in (Note [Fused decode step] in
// src/model/fused_decode.cpp). For up to kDecodeRows rows of x (rows, K), one pass over a weight W
// (N, K), in x's dtype or int8 (int8_linear.h), computes in fp32
//   a = in Wᵀ + bias, in = x, or LayerNorm(x) rounded to x's dtype (as the LayerNorm kernel writes it),
// and then, rounded to x's dtype once:
//   decode_linear:        y = a, or gelu_tanh(a)                                  -> (rows, N)
//   decode_linear_add_to: stream += round(a), in place (a residual add)            stream (rows, N)
//   decode_qkv:           a = (q | k | v), N = 3C: returns q (rows, C); writes k and v into keys and
//                         values (rows, heads, capacity, C / heads) at position positions[r] of row r.
// And the step's input: decode_embedding(ids, positions, table, wpe) = table[ids] + wpe[positions]
// (rows, C), the table a DecodeWeight (the tied head's: wte, or its int8 rows dequantized to wpe's
// dtype as int8_embedding does), summed in fp32 and rounded once: the unfused ops' bits, in one
// kernel on CUDA, where an id or position out of range makes its row NaN (the CPU throws).
// CUDA: one kernel each (decode_linear.cu): the weight read once, 16 bytes a load, no host sync and
// no allocation but the outputs (they run inside CUDA graphs); a position outside [0, capacity)
// writes no key or value (the slot attention then gives that row NaN). CPU: ATen's ops in the same
// order, the reference the CUDA kernels are tested against (they agree to rounding, not to the bit);
// a position outside the cache throws there.
// Contract: x contiguous (rows, K); every tensor on x's device, in x's dtype (fp32, bf16 or fp16)
// but the int8 weight's q and fp32 scale and the int64 positions; no gradient. On CUDA,
// decode_linear_applies must hold; elsewhere std::invalid_argument names what is wrong.
#include <torch/types.h>

#include <cstdint>

#include "src/kernels/int8_linear.h"

namespace gpt2::kernels {

inline constexpr int64_t kDecodeRows = 8;

struct DecodeWeight {
  torch::Tensor w;                   // (N, K) in x's dtype; undefined when int8 is set
  const Int8Weight* int8 = nullptr;  // q (N, K) int8, scale (N, G) fp32
  torch::Tensor bias;                // (N), or undefined
  int64_t out_features() const { return int8 != nullptr ? int8->q.size(0) : w.size(0); }
};

struct DecodeNorm {
  torch::Tensor gamma, beta;  // (K); gamma undefined: no LayerNorm
  double eps = 1e-5;
};

// Whether rows x K inputs on `device` in `dtype` take the kernels with this weight: always on the
// CPU; on CUDA in a build with them, rows <= kDecodeRows, K a multiple of 16, the rows fitting in
// shared memory, the weight 16-byte aligned, int8 groups of a multiple of 16. (x itself must also be
// 16-byte aligned on CUDA: a fresh tensor is.)
bool decode_linear_applies(c10::Device device, c10::ScalarType dtype, int64_t rows, int64_t k, const DecodeWeight& w);

torch::Tensor decode_linear(const torch::Tensor& x, const DecodeNorm& norm, const DecodeWeight& w, bool gelu);
void decode_linear_add_to(const torch::Tensor& x, const DecodeWeight& w, torch::Tensor& stream);
torch::Tensor decode_qkv(const torch::Tensor& x, const DecodeNorm& norm, const DecodeWeight& w, torch::Tensor& keys,
                         torch::Tensor& values, const torch::Tensor& positions);
torch::Tensor decode_embedding(const torch::Tensor& ids, const torch::Tensor& positions, const DecodeWeight& table,
                               const torch::Tensor& wpe);

}  // namespace gpt2::kernels
