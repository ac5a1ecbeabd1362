#include "optim/moment_layout.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace gpt2::optim {

MomentLayout::MomentLayout(std::vector<Param> params) {
  std::sort(params.begin(), params.end(), [](const Param& a, const Param& b) { return a.offset < b.offset; });
  int64_t absmax = 0, fp32 = 0;
  absmax_prefix_.push_back(0);
  fp32_prefix_.push_back(0);
  for (const Param& p : params) {
    if (p.offset < end_) throw std::logic_error("MomentLayout: parameters overlap");
    const bool q = quantized(p.numel);
    for (int64_t pos = p.offset, stop = p.offset + p.numel; pos < stop;) {
      const int64_t cell_end = (pos / kQuantBlock + 1) * kQuantBlock;
      const int64_t len = std::min(cell_end, stop) - pos;
      blocks_.push_back({pos, q ? absmax : fp32, static_cast<int32_t>(len), static_cast<uint16_t>(q ? 1 : 0),
                         static_cast<uint16_t>(p.weight_decay ? 1 : 0)});
      if (q) {
        absmax += 1;
      } else {
        fp32 += len;
      }
      absmax_prefix_.push_back(absmax);
      fp32_prefix_.push_back(fp32);
      pos += len;
    }
    end_ = p.offset + p.numel;
  }
}

size_t MomentLayout::first_block_at(int64_t flat) const {
  if (!on_grid(flat)) {
    throw std::logic_error("MomentLayout: flat position " + std::to_string(flat) + " is not on the " +
                           std::to_string(kQuantBlock) + "-element grid");
  }
  return optim::first_block_at(blocks_, flat);
}

int64_t MomentLayout::absmax_before(int64_t flat) const { return absmax_prefix_[first_block_at(flat)]; }
int64_t MomentLayout::fp32_before(int64_t flat) const { return fp32_prefix_[first_block_at(flat)]; }

MomentBlock MomentLayout::absmax_block(int64_t index) const {
  const auto it = std::upper_bound(absmax_prefix_.begin(), absmax_prefix_.end(), index);  // first prefix > index
  if (index < 0 || it == absmax_prefix_.end())
    throw std::out_of_range("MomentLayout: no absmax " + std::to_string(index));
  return blocks_[static_cast<size_t>(it - absmax_prefix_.begin()) - 1];
}

std::vector<MomentBlock> MomentLayout::blocks(int64_t begin, int64_t end) const {
  const size_t lo = first_block_at(begin), hi = first_block_at(end);
  std::vector<MomentBlock> out(blocks_.begin() + static_cast<std::ptrdiff_t>(lo),
                               blocks_.begin() + static_cast<std::ptrdiff_t>(hi));
  for (MomentBlock& b : out) {
    b.begin -= begin;
    b.state -= b.quantized ? absmax_prefix_[lo] : fp32_prefix_[lo];
  }
  return out;
}

void quantize_moments(const MomentLayout& layout, int64_t begin, int64_t end, const float* exp_avg,
                      const float* exp_avg_sq, const MomentBuffers& out) {
  for (const MomentBlock& b : layout.blocks(begin, end)) {
    if (!b.quantized) {
      std::copy(exp_avg + b.begin, exp_avg + b.begin + b.len, out.exp_avg + b.state);
      std::copy(exp_avg_sq + b.begin, exp_avg_sq + b.begin + b.len, out.exp_avg_sq + b.state);
      continue;
    }
    quantize_blocks(quant_table(true), exp_avg + b.begin, b.len, out.exp_avg_codes + b.begin,
                    out.exp_avg_absmax + b.state);
    quantize_second_moments(exp_avg_sq + b.begin, b.len, out.exp_avg_sq_codes + b.begin,
                            out.exp_avg_sq_absmax + b.state);
  }
}

void dequantize_moments(const MomentLayout& layout, int64_t begin, int64_t end, const MomentBuffers& in, float* exp_avg,
                        float* exp_avg_sq) {
  for (const MomentBlock& b : layout.blocks(begin, end)) {
    if (!b.quantized) {
      std::copy(in.exp_avg + b.state, in.exp_avg + b.state + b.len, exp_avg + b.begin);
      std::copy(in.exp_avg_sq + b.state, in.exp_avg_sq + b.state + b.len, exp_avg_sq + b.begin);
      continue;
    }
    dequantize_blocks(quant_table(true), in.exp_avg_codes + b.begin, in.exp_avg_absmax + b.state, b.len,
                      exp_avg + b.begin);
    dequantize_second_moments(in.exp_avg_sq_codes + b.begin, in.exp_avg_sq_absmax + b.state, b.len,
                              exp_avg_sq + b.begin);
  }
}

void roots_from_plain_second_moments(const MomentLayout& layout, int64_t begin, int64_t end,
                                     const MomentBuffers& state) {
  alignas(64) float v[kQuantBlock];
  for (const MomentBlock& b : layout.blocks(begin, end)) {
    if (!b.quantized) continue;
    uint8_t* codes = state.exp_avg_sq_codes + b.begin;
    float* absmax = state.exp_avg_sq_absmax + b.state;
    dequantize_blocks(quant_table(false), codes, absmax, b.len, v);
    quantize_second_moments(v, b.len, codes, absmax);
  }
}

}  // namespace gpt2::optim
