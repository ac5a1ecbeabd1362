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
// moment_layout.h makes that choice and cuts the flat space into MomentBlocks.
//
// Note [Second moment as its root]
// The 8-bit state of the second moment v is sqrt(v), quantized with the unsigned map (its absmax
// is the block's largest root). v = E[g^2] spans twice the decades of m = E[g]: quantized as it is,
// the v of an element whose gradient is under ~1/4500 of its block's largest falls below the map's
// smallest step (1e-7 of the absmax) and decodes to 0, while its m, ~1/4500 of m's absmax, survives,
// so the update m / (sqrt(0) + eps) is orders of magnitude too large. Embedding rows of rare tokens
// did this on configs/tiny.ini: the loss jumped from 7.2 to 75.7 at step 37 where fp32 moments gave
// 7.19. Kept as its root, v resolves gradients down to 1e-7 of the block's largest, as m does. The
// update squares the decoded root and takes the root of the new v (IEEE multiply and square root:
// the same bits on CPU and GPU). Checkpoints say so (manifest exp_avg_sq_8bit = "root"; older 8-bit
// checkpoints held v itself and are converted on load, moment_layout.h).
#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "optim/cpu_adamw.h"

namespace gpt2::optim {

constexpr int64_t kQuantBlock = 2048;     // values per absmax
constexpr int64_t kMinQuantNumel = 4096;  // smaller tensors keep fp32 moments

using QuantMap = std::array<float, 256>;

// The sorted 256 values of the signed ([-1, 1]) or unsigned ([0, 1]) map (Note [Dynamic map]).
const QuantMap& dynamic_map(bool is_signed);

// The code of x (already divided by its block's absmax): the index of the nearest map value, ties
// to the lower index; NaN goes to the code of zero. A binary search: the definition, which the
// bucketed search below must equal.
uint8_t quantize_value(const QuantMap& map, float x);

#if defined(__CUDACC__)
#define GPT2_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define GPT2_HOST_DEVICE inline
#endif

// Note [Quantizer buckets]
// quantize_value's search without a binary search (8 dependent steps, each a cache or shared-
// memory bank miss on the GPU): |x|'s exponent and top 7 mantissa bits pick one of kNumBuckets
// buckets (one more for |x| < 2^-27, one for |x| >= 1), and a table built from the map gives, per
// sign of x, the range [lo, lo + span] that lower_bound(x) takes over the bucket (lower_bound is
// monotonic in x). span <= 1 for both maps (a bucket is under 0.8% of its value wide, and as it
// falls no bucket holds two entries; the table's build checks it), so one compare finds
// lower_bound(x) exactly, then the same
// nearest-entry rule, against a copy of the map between -inf and +inf so that neither end needs a
// branch: the same codes as quantize_value for every float, on CPU and GPU, in straight-line code
// that the compiler vectorises (gathers) on the host.
constexpr int kBucketMantissaBits = 7;
constexpr int kBucketMinExponent = 127 - 27;  // |x| < 2^-27 shares bucket 0
constexpr int kNumBuckets = 2 + ((127 - kBucketMinExponent) << kBucketMantissaBits);

struct QuantTable {
  float map[256];              // the sorted map
  float ext[258];              // -inf, the map, +inf: ext[k + 1] = map[k]
  uint8_t lo[2][kNumBuckets];  // [x < 0]: lower_bound(x) over the bucket is in [lo, lo + span]
  uint8_t span[2][kNumBuckets];
  uint8_t pad[4];  // the host's 4-byte gathers of the last span entry stay inside
};
struct QuantTables {  // what the GPU kernel reads: both maps
  QuantTable signed_table, unsigned_table;
};
const QuantTable& quant_table(bool is_signed);
const QuantTables& quant_tables();

GPT2_HOST_DEVICE uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

GPT2_HOST_DEVICE int quant_bucket(uint32_t abs_bits) {
  const int e = static_cast<int>(abs_bits >> 23);
  const int regular = 1 + ((e - kBucketMinExponent) << kBucketMantissaBits) +
                      static_cast<int>((abs_bits >> (23 - kBucketMantissaBits)) & ((1u << kBucketMantissaBits) - 1));
  return e < kBucketMinExponent ? 0 : (e >= 127 ? kNumBuckets - 1 : regular);
}

// quantize_value(t.map, x) through the buckets (Note [Quantizer buckets]).
GPT2_HOST_DEVICE uint8_t quantize_with(const QuantTable& t, float x) {
  x = x != x ? 0.0f : x;  // NaN
  const uint32_t u = float_bits(x);
  const int sign = static_cast<int>(u >> 31), b = quant_bucket(u & 0x7FFFFFFFu);
  const int lo = t.lo[sign][b], span = t.span[sign][b];
  const int i = lo + ((span > 0) & (t.ext[lo + 1] < x));          // lower_bound(x), the first entry >= x
  const int code = x - t.ext[i] <= t.ext[i + 1] - x ? i - 1 : i;  // the nearer of map[i - 1], map[i]
  return static_cast<uint8_t>(code < 0 ? 0 : (code > 255 ? 255 : code));
}

// Blocks of kQuantBlock values starting at x[0] (the last one may be shorter): codes (n) and one
// absmax per block (ceil(n / kQuantBlock)). A block of zeros has absmax 0 and decodes to zeros.
void quantize_blocks(const QuantTable& t, const float* x, int64_t n, uint8_t* codes, float* absmax);
void dequantize_blocks(const QuantTable& t, const uint8_t* codes, const float* absmax, int64_t n, float* out);
// The second moment's blocks (Note [Second moment as its root]): v (n values, never negative) into
// the codes and absmax values of sqrt(v), and back into v.
void quantize_second_moments(const float* v, int64_t n, uint8_t* codes, float* absmax);
void dequantize_second_moments(const uint8_t* codes, const float* absmax, int64_t n, float* v);

// A run of at most kQuantBlock elements of one parameter that the update takes as a unit: a
// quantization block (8-bit moments, one absmax per moment), or a piece of a parameter that keeps
// fp32 moments. Positions are relative to the start of the range being updated (moment_layout.h
// cuts a shard into these).
struct MomentBlock {
  int64_t begin = 0;          // first element: of the parameters, the gradient and the codes
  int64_t state = 0;          // 8-bit: index of its absmax values; fp32: offset of its moments in fp32 buffers
  int32_t len = 0;            // 1..kQuantBlock
  uint16_t quantized = 0;     // 1: 8-bit moments
  uint16_t weight_decay = 0;  // 1: the parameter decays (CpuAdamWStep::weight_decay applies)
};

// The index of the first of `blocks` (sorted by begin) that begins at or after `pos`.
size_t first_block_at(const std::vector<MomentBlock>& blocks, int64_t pos);

// Where the moments of a range are: codes for every element of the range (used at 8-bit blocks),
// one absmax per 8-bit block, and packed fp32 values for the fp32 blocks.
struct MomentBuffers {
  uint8_t* exp_avg_codes = nullptr;
  uint8_t* exp_avg_sq_codes = nullptr;
  float* exp_avg_absmax = nullptr;
  float* exp_avg_sq_absmax = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
};

// The blocks of one contiguous parameter of n elements from a block boundary, its moments all
// 8-bit (tests, and anything that quantizes a plain array).
std::vector<MomentBlock> contiguous_blocks(int64_t n, bool weight_decay);

// A piece of one parameter inside a range, in the range's coordinates.
struct ParamSpan {
  int64_t begin = 0, end = 0;
  bool weight_decay = false;
};

// The blocks of a range whose moments are all fp32 and dense over it (element i's at exp_avg[i],
// as ShardedOptimizer keeps them on the device): each span cut at the multiples of kQuantBlock of the
// range, so a block is one parameter's, at most kQuantBlock long, and every block inside a span is
// whole and starts on that grid (the GPU kernel's vector path). quantized = 0. The moments are
// packed: each span's start where the previous span's end, moved up to the span's own offset on the
// kMomentAlign grid (state = begin when the spans tile [0, n); a gap, such as Muon's matrices, costs
// under kMomentAlign moments). span_states (optional) gets each span's first moment.
// Spans sorted by begin, not overlapping; empty ones are skipped. std::logic_error otherwise.
// The vector path reads 8 elements a thread, 16-byte aligned: a block's moments keep its elements'
// offset modulo 16.
inline constexpr int64_t kMomentAlign = 16;
std::vector<MomentBlock> dense_fp32_blocks(const std::vector<ParamSpan>& spans,
                                           std::vector<int64_t>* span_states = nullptr);

}  // namespace gpt2::optim
