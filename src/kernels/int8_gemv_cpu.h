#pragma once
// The CPU half of int8_linear's decode path (Note [int8 weights] in int8_linear.cpp): y = x Wᵀ
// (+ bias) for a few rows of fp32 x against int8 rows of W with fp32 scales, rows of W split over
// the OpenMP threads. This file's .cpp is the one built with -fopenmp, and it includes no ATen
// header: ATen's inline at::parallel_for differs with and without OpenMP, and one -fopenmp file
// that instantiates it would make the linker's one copy parallel everywhere. OpenMP here is
// LibTorch's own runtime (one libgomp.so.1 in the process), so its threads are ATen's and do not
// fight a second pool. Each output is one thread's dot products: the result does not depend on
// the number of threads.
#include <cstdint>

namespace gpt2::kernels {

// y[m, n] = sum_g scale[n, g] · sum_{k in g} q[n, k] x[m, k] (+ bias[n]).
struct Int8GemvArgs {
  const float* x;  // (m, k)
  const int8_t* q;
  const float* scale;
  const float* bias;  // nullptr: none
  float* y;           // (m, n)
  int64_t m, n, k, groups;
};

// avx2: the AVX2 + FMA loop (needs k / groups % 16 == 0), else the portable one.
void int8_gemv_cpu(const Int8GemvArgs& a, bool avx2);

}  // namespace gpt2::kernels
