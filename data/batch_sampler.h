#pragma once
// Which token window each training sample reads. The token stream is cut into non-overlapping
// windows of seq_len + 1 tokens (input + shifted target) starting at multiples of seq_len; epoch e
// visits every window once in an order fixed by (seed, e). The sampler is stateless: sample g of
// the run maps to (epoch g / W, a seeded permutation of g % W), so any rank can compute any sample,
// and resuming, or changing the number of ranks, needs only the global sample count.
#include <cstdint>
#include <string>

namespace gpt2::data {

class BatchSampler {
 public:
  // Throws gpt2::UserError when the stream holds fewer than seq_len + 1 tokens; `source` (e.g.
  // "data.train = a.h5") starts the message when given, so it names where the tokens came from.
  BatchSampler(int64_t num_tokens, int64_t seq_len, uint64_t seed, const std::string& source = "");

  int64_t num_windows() const { return num_windows_; }
  // First token of the window that global sample `g` (0, 1, 2, ... over the whole run) reads.
  int64_t window_start(int64_t g) const;
  int64_t epoch(int64_t g) const { return g / num_windows_; }

 private:
  uint64_t permute(uint64_t index, uint64_t key) const;

  int64_t num_windows_;
  int64_t seq_len_;
  uint64_t seed_;
  int half_bits_;
};

// Global sample index of row `row` of micro-step `micro` of optimizer step `step` on `rank`.
// Rows of one optimizer step are numbered micro-major, then rank, then row, so a run on N ranks
// reads exactly the samples a one-rank run with the same global batch reads (Note [Batch layout]).
inline int64_t global_sample_index(int64_t step, int64_t micro, int rank, int64_t row, int64_t micro_batch,
                                   int world_size, int64_t accum_steps) {
  const int64_t per_micro = micro_batch * world_size;
  return step * per_micro * accum_steps + micro * per_micro + rank * micro_batch + row;
}

}  // namespace gpt2::data
