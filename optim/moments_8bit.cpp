#include "optim/moments_8bit.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <tuple>
#include <vector>

namespace gpt2::optim {
namespace {

// Note [Dynamic map]: every (E, F) decade's values, then zero (and 1e-7 for the signed map), sorted.
QuantMap build_map(bool is_signed) {
  std::vector<double> values{0.0};
  const int fraction_bits = is_signed ? 6 : 7;  // bits after the sign bit, less the one bit
  double decade = 1.0;                          // 10^E, exact in double for E <= 7
  for (int e = 0; e <= fraction_bits; ++e, decade *= 10.0) {
    const int f = fraction_bits - e;
    const double levels = static_cast<double>(int64_t{1} << f);
    for (int64_t j = 0; j < (int64_t{1} << f); ++j) {
      const double v = (1.0 / decade) * (0.1 + 0.9 * static_cast<double>(j + 1) / levels);
      values.push_back(v);
      if (is_signed) values.push_back(-v);
    }
  }
  if (is_signed) values.push_back(1e-7);
  if (values.size() != 256) throw std::logic_error("optim::dynamic_map: not 256 values");
  std::sort(values.begin(), values.end());
  QuantMap map{};
  for (size_t i = 0; i < map.size(); ++i) map[i] = static_cast<float>(values[i]);
  return map;
}

}  // namespace

const QuantMap& dynamic_map(bool is_signed) {
  static const QuantMap kSigned = build_map(true), kUnsigned = build_map(false);
  return is_signed ? kSigned : kUnsigned;
}

namespace {

// Note [Quantizer buckets]: the range of lower_bound over each bucket, for each sign.
QuantTable build_table(const QuantMap& map) {
  QuantTable t{};
  std::copy(map.begin(), map.end(), t.map);
  t.ext[0] = -std::numeric_limits<float>::infinity();
  std::copy(map.begin(), map.end(), t.ext + 1);
  t.ext[257] = std::numeric_limits<float>::infinity();
  auto lower_bound = [&map](float x) {
    return static_cast<int>(std::lower_bound(map.begin(), map.end(), x) - map.begin());
  };
  auto from_bits = [](uint32_t u) {
    float x;
    std::memcpy(&x, &u, sizeof x);
    return x;
  };
  for (int b = 0; b < kNumBuckets; ++b) {
    // The smallest and largest |x| bit patterns of bucket b (the last one runs up to infinity).
    uint32_t first = 0, last = 0;
    if (b == 0) {
      last = (static_cast<uint32_t>(kBucketMinExponent) << 23) - 1;
    } else if (b == kNumBuckets - 1) {
      first = 127u << 23;
      last = 0x7F800000u;
    } else {
      first = (static_cast<uint32_t>(kBucketMinExponent) << 23) +
              (static_cast<uint32_t>(b - 1) << (23 - kBucketMantissaBits));
      last = first + (1u << (23 - kBucketMantissaBits)) - 1;
    }
    const int pos_lo = lower_bound(from_bits(first)), pos_hi = lower_bound(from_bits(last));
    const int neg_lo = lower_bound(-from_bits(last)), neg_hi = lower_bound(-from_bits(first));
    for (auto [sign, lo, hi] : {std::tuple{0, pos_lo, pos_hi}, std::tuple{1, neg_lo, neg_hi}}) {
      // quantize_avx512 reads two entries from lo on: a map with denser buckets needs more.
      if (hi - lo > 1) throw std::logic_error("optim::quant_table: a bucket spans more than 1 entry");
      t.lo[sign][b] = static_cast<uint8_t>(std::min(lo, 255));
      t.span[sign][b] = static_cast<uint8_t>(hi - std::min(lo, 255));
    }
  }
  return t;
}

}  // namespace

const QuantTable& quant_table(bool is_signed) {
  return is_signed ? quant_tables().signed_table : quant_tables().unsigned_table;
}

const QuantTables& quant_tables() {
  static const QuantTables kTables{build_table(dynamic_map(true)), build_table(dynamic_map(false))};
  return kTables;
}

uint8_t quantize_value(const QuantMap& map, float x) {
  if (std::isnan(x)) x = 0.0f;
  // First entry >= x; then the nearer of it and the one below, the lower on a tie.
  const auto it = std::lower_bound(map.begin(), map.end(), x);
  if (it == map.begin()) return 0;
  if (it == map.end()) return 255;
  const auto hi = static_cast<uint8_t>(it - map.begin());
  return (x - map[hi - 1] <= map[hi] - x) ? static_cast<uint8_t>(hi - 1) : hi;
}

namespace {

// codes[i] = quantize_with(t, x[i] / div) for i < len.
void quantize_scalar(const QuantTable& t, const float* x, int64_t len, float div, uint8_t* codes) {
  for (int64_t i = 0; i < len; ++i) codes[i] = quantize_with(t, x[i] / div);
}

// The same, 16 values at a time with AVX-512 gathers (the compiler does not vectorise the scalar
// form: its table loads are bytes). span <= 1 (build_table checks it), and map[lo + span] >= x for
// every x of the bucket, so lower_bound(x) = lo + [map[lo] < x] without reading span, and the
// three entries around it are gathered at once.
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))) void quantize_avx512(const QuantTable& t, const float* x,
                                                                                   int64_t len, float div,
                                                                                   uint8_t* codes) {
  const __m512 vdiv = _mm512_set1_ps(div);
  const __m512i one = _mm512_set1_epi32(1), byte = _mm512_set1_epi32(0xFF);
  const __m512i min_e = _mm512_set1_epi32(kBucketMinExponent), max_e = _mm512_set1_epi32(127);
  const __m512i last = _mm512_set1_epi32(kNumBuckets - 1), per_sign = _mm512_set1_epi32(kNumBuckets);
  const __m512i mant_mask = _mm512_set1_epi32((1 << kBucketMantissaBits) - 1);
  int64_t i = 0;
  for (; i + 16 <= len; i += 16) {
    __m512 y = _mm512_div_ps(_mm512_loadu_ps(x + i), vdiv);
    y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q), _mm512_setzero_ps());  // NaN -> 0
    const __m512i u = _mm512_castps_si512(y);
    const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
    const __m512i e = _mm512_srli_epi32(a, 23);
    __m512i b =
        _mm512_add_epi32(_mm512_add_epi32(one, _mm512_slli_epi32(_mm512_sub_epi32(e, min_e), kBucketMantissaBits)),
                         _mm512_and_si512(_mm512_srli_epi32(a, 23 - kBucketMantissaBits), mant_mask));
    b = _mm512_mask_mov_epi32(b, _mm512_cmplt_epi32_mask(e, min_e), _mm512_setzero_si512());
    b = _mm512_mask_mov_epi32(b, _mm512_cmpge_epi32_mask(e, max_e), last);
    const __m512i idx = _mm512_add_epi32(b, _mm512_mullo_epi32(_mm512_srli_epi32(u, 31), per_sign));
    const __m512i lo = _mm512_and_si512(_mm512_i32gather_epi32(idx, &t.lo[0][0], 1), byte);
    const __m512 e0 = _mm512_i32gather_ps(lo, t.ext, 4);  // ext[lo + j] = map[lo + j - 1]
    const __m512 e1 = _mm512_i32gather_ps(_mm512_add_epi32(lo, one), t.ext, 4);
    const __m512 e2 = _mm512_i32gather_ps(_mm512_add_epi32(lo, _mm512_set1_epi32(2)), t.ext, 4);
    const __mmask16 up = _mm512_cmp_ps_mask(e1, y, _CMP_LT_OQ);  // lower_bound(y) = lo + up
    const __m512i k = _mm512_mask_add_epi32(lo, up, lo, one);
    const __m512 below = _mm512_mask_mov_ps(e0, up, e1), above = _mm512_mask_mov_ps(e1, up, e2);
    const __mmask16 lower = _mm512_cmp_ps_mask(_mm512_sub_ps(y, below), _mm512_sub_ps(above, y), _CMP_LE_OQ);
    __m512i code = _mm512_mask_sub_epi32(k, lower, k, one);
    code = _mm512_min_epi32(_mm512_max_epi32(code, _mm512_setzero_si512()), byte);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm512_cvtepi32_epi8(code));
  }
  quantize_scalar(t, x + i, len - i, div, codes + i);
}

}  // namespace

void quantize_blocks(const QuantTable& t, const float* x, int64_t n, uint8_t* codes, float* absmax) {
  static const bool avx512 = std::strcmp(cpu_adamw_isa(), "avx512") == 0;
  for (int64_t b0 = 0, block = 0; b0 < n; b0 += kQuantBlock, ++block) {
    const int64_t len = std::min(kQuantBlock, n - b0);
    float amax = 0.0f;
    for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(x[b0 + i]));
    absmax[block] = amax;
    const float div = amax > 0.0f ? amax : 1.0f;  // a block of zeros: every value 0 / 1
    (avx512 ? quantize_avx512 : quantize_scalar)(t, x + b0, len, div, codes + b0);
  }
}

void dequantize_blocks(const QuantTable& t, const uint8_t* codes, const float* absmax, int64_t n, float* out) {
  for (int64_t b0 = 0, block = 0; b0 < n; b0 += kQuantBlock, ++block) {
    const int64_t len = std::min(kQuantBlock, n - b0);
    const float scale = absmax[block];
    for (int64_t i = 0; i < len; ++i) out[b0 + i] = t.map[codes[b0 + i]] * scale;
  }
}

void quantize_second_moments(const float* v, int64_t n, uint8_t* codes, float* absmax) {
  alignas(64) float root[kQuantBlock];
  for (int64_t b0 = 0, block = 0; b0 < n; b0 += kQuantBlock, ++block) {
    const int64_t len = std::min(kQuantBlock, n - b0);
    for (int64_t i = 0; i < len; ++i) root[i] = std::sqrt(v[b0 + i]);
    quantize_blocks(quant_table(false), root, len, codes + b0, absmax + block);
  }
}

void dequantize_second_moments(const uint8_t* codes, const float* absmax, int64_t n, float* v) {
  dequantize_blocks(quant_table(false), codes, absmax, n, v);
  for (int64_t i = 0; i < n; ++i) v[i] = v[i] * v[i];
}

size_t first_block_at(const std::vector<MomentBlock>& blocks, int64_t pos) {
  return static_cast<size_t>(
      std::lower_bound(blocks.begin(), blocks.end(), pos, [](const MomentBlock& b, int64_t x) { return b.begin < x; }) -
      blocks.begin());
}

std::vector<MomentBlock> contiguous_blocks(int64_t n, bool weight_decay) {
  std::vector<MomentBlock> blocks;
  for (int64_t b0 = 0; b0 < n; b0 += kQuantBlock) {
    blocks.push_back({b0, b0 / kQuantBlock, static_cast<int32_t>(std::min(kQuantBlock, n - b0)), 1,
                      static_cast<uint16_t>(weight_decay ? 1 : 0)});
  }
  return blocks;
}

std::vector<MomentBlock> dense_fp32_blocks(const std::vector<ParamSpan>& spans, std::vector<int64_t>* span_states) {
  std::vector<MomentBlock> blocks;
  int64_t last_end = 0, next = 0;  // next: the first moment no span has taken
  for (const ParamSpan& s : spans) {
    if (s.begin < last_end || s.end < s.begin) {
      throw std::logic_error("dense_fp32_blocks: spans unsorted or overlapping");
    }
    // The first free moment with the span's own offset modulo kMomentAlign: a gap between spans
    // costs no moments, and the blocks keep the alignment the GPU kernel's vector path needs.
    const int64_t base = next + ((s.begin - next) % kMomentAlign + kMomentAlign) % kMomentAlign;
    if (span_states != nullptr) span_states->push_back(base);
    for (int64_t pos = s.begin; pos < s.end;) {
      const int64_t len = std::min((pos / kQuantBlock + 1) * kQuantBlock, s.end) - pos;
      blocks.push_back(
          {pos, base + pos - s.begin, static_cast<int32_t>(len), 0, static_cast<uint16_t>(s.weight_decay ? 1 : 0)});
      pos += len;
    }
    last_end = s.end;
    next = base + (s.end - s.begin);
  }
  return blocks;
}

}  // namespace gpt2::optim
