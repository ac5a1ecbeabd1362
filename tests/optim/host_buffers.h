#pragma once
// For the GPU optimizer tests (and bench/kernel_bench's uploads): random host vectors and their trips to the GPU and
// back, so the kernels' results can be compared element by element with the CPU path's.
#include <torch/torch.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace gpt2::optim {

// n values of N(0, scale) from `seed` (squared when `square`: a second moment is never negative).
inline std::vector<float> randn(int64_t n, float scale, uint32_t seed, bool square = false) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) {
    v = normal(gen) * scale;
    if (square) v *= v;
  }
  return x;
}

template <typename T>
torch::Tensor on_gpu(const std::vector<T>& v, torch::ScalarType t) {
  return torch::from_blob(const_cast<T*>(v.data()), {static_cast<int64_t>(v.size())}, t).to(torch::kCUDA);
}

// `count` values of T as raw bytes in a uint8 GPU tensor (the kernels' block lists and tables).
template <typename T>
torch::Tensor bytes_on_gpu(const T* data, size_t count) {
  return torch::from_blob(const_cast<T*>(data), {static_cast<int64_t>(count * sizeof(T))}, torch::kUInt8)
      .to(torch::kCUDA);
}

template <typename T>
std::vector<T> to_host(const torch::Tensor& t) {
  auto c = t.cpu().contiguous();
  std::vector<T> out(static_cast<size_t>(c.numel()));
  std::memcpy(out.data(), c.data_ptr(), out.size() * sizeof(T));
  return out;
}

}  // namespace gpt2::optim
