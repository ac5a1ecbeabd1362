#pragma once
// Where AdamW's moments are when they are 8-bit (memory.optimizer_moments = 8bit): which elements
// of the flat parameter space have 8-bit moments, in which quantization blocks, and which keep
// fp32 moments.
//
// Note [Moment blocks]
// The flat space is cut on a grid of kQuantBlock elements and at parameter boundaries: every piece
// is one MomentBlock. A parameter of at least kMinQuantNumel values has 8-bit moments, one absmax
// per piece; a smaller one (biases, LayerNorm) keeps fp32 moments. The cut depends only on the
// parameters' offsets and sizes, never on the world size, so a shard that starts and ends on the
// grid (FlatLayout::kGrid is a multiple of kQuantBlock) holds whole blocks, and any world size and ZeRO stage sees the
// same blocks: ZeRO 1/2 equal ZeRO 0, and checkpoints resume on any number of ranks. Absmax values
// and fp32 moments are numbered in flat order over the whole space (a shard owns a contiguous
// range of each), which is how the checkpoint stores them.
#include <cstdint>
#include <vector>

#include "optim/moments_8bit.h"

namespace gpt2::optim {

class MomentLayout {
 public:
  struct Param {
    int64_t offset = 0, numel = 0;
    bool weight_decay = false;
  };
  // The parameters (any order, not overlapping) of the flat space.
  explicit MomentLayout(std::vector<Param> params);

  // 8-bit moments for a parameter of this many values.
  static bool quantized(int64_t numel) { return numel >= kMinQuantNumel; }

  // The blocks of [begin, end), begin and end on the grid (or end past the last parameter), with
  // MomentBlock::begin relative to `begin` and MomentBlock::state relative to the range's first
  // absmax value / fp32 moment value (absmax_before(begin) / fp32_before(begin)).
  std::vector<MomentBlock> blocks(int64_t begin, int64_t end) const;
  // Whether a range may begin or end at `flat`: on the grid, or past the last parameter.
  bool on_grid(int64_t flat) const { return flat % kQuantBlock == 0 || flat >= end_; }
  // How many absmax values (8-bit blocks) / fp32 moment values belong to elements before `flat`
  // (on_grid); std::logic_error otherwise.
  int64_t absmax_before(int64_t flat) const;
  int64_t fp32_before(int64_t flat) const;
  int64_t num_absmax() const { return absmax_prefix_.back(); }
  int64_t num_fp32() const { return fp32_prefix_.back(); }
  // The 8-bit block whose absmax values have this index (begin flat); std::out_of_range if none.
  MomentBlock absmax_block(int64_t index) const;

 private:
  size_t first_block_at(int64_t flat) const;  // index of the first block that begins at or after flat

  std::vector<MomentBlock> blocks_;                   // every block, flat order, begin and state global
  std::vector<int64_t> absmax_prefix_, fp32_prefix_;  // [k]: over blocks_[0, k)
  int64_t end_ = 0;                                   // past the last parameter
};

// Checkpoint conversion between the two moment formats over a flat range [begin, end) (on the
// grid): the dense fp32 moments (end - begin values each) into the range's codes, absmax values and
// packed fp32 moments (relative to the range, as ShardedOptimizer holds them), and back. Elements in no
// block (padding) are skipped.
void quantize_moments(const MomentLayout& layout, int64_t begin, int64_t end, const float* exp_avg,
                      const float* exp_avg_sq, const MomentBuffers& out);
void dequantize_moments(const MomentLayout& layout, int64_t begin, int64_t end, const MomentBuffers& in, float* exp_avg,
                        float* exp_avg_sq);
// Checkpoints written before Note [Second moment as its root] quantized v itself: their second
// moments' codes and absmax values over [begin, end) (relative, as above) become those of sqrt(v),
// in place.
void roots_from_plain_second_moments(const MomentLayout& layout, int64_t begin, int64_t end,
                                     const MomentBuffers& state);

}  // namespace gpt2::optim
