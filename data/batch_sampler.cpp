#include "data/batch_sampler.h"

#include <string>

#include "src/base/errors.h"

namespace gpt2::data {
namespace {

// splitmix64's finalizer: a cheap bijective 64-bit mixer.
uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

BatchSampler::BatchSampler(int64_t num_tokens, int64_t seq_len, uint64_t seed, const std::string& source)
    : num_windows_(seq_len > 0 && num_tokens > seq_len ? (num_tokens - 1) / seq_len : 0),
      seq_len_(seq_len),
      seed_(seed) {
  if (num_windows_ <= 0) {
    throw UserError((source.empty() ? "" : source + ": ") + "token stream of " + std::to_string(num_tokens) +
                    " tokens is shorter than one window of " + std::to_string(seq_len + 1) +
                    " tokens (the sequence length + 1)");
  }
  int bits = 2;
  while ((int64_t{1} << bits) < num_windows_) ++bits;
  half_bits_ = (bits + 1) / 2;  // a balanced Feistel network over 2 * half_bits_ bits
}

// A 4-round Feistel network is a bijection on [0, 2^(2h)); cycle-walking restricts it to
// [0, num_windows_) while staying a bijection, with under 4 rounds of walking on average.
uint64_t BatchSampler::permute(uint64_t index, uint64_t key) const {
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  uint64_t x = index;
  do {
    uint64_t left = x >> half_bits_, right = x & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t f = mix64(key ^ (round * 0x632be59bd9b4e019ULL) ^ right) & mask;
      const uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    x = (left << half_bits_) | right;
  } while (x >= static_cast<uint64_t>(num_windows_));
  return x;
}

int64_t BatchSampler::window_start(int64_t g) const {
  GPT2_ASSERT(g >= 0, "negative sample index");
  const uint64_t key = mix64(seed_ ^ mix64(static_cast<uint64_t>(epoch(g)) + 1));
  return static_cast<int64_t>(permute(static_cast<uint64_t>(g % num_windows_), key)) * seq_len_;
}

}  // namespace gpt2::data
