#include "optim/grad_norm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#ifdef GPT2_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include "src/base/errors.h"
#ifdef GPT2_WITH_CUDA
#include "src/base/cuda_check.h"
#endif

namespace gpt2::optim {
namespace {

constexpr int kLanes = 8;

// Eight running sums, lane j taking elements j, j + 8, ..., added pairwise at the end: a fixed
// order whatever the compiler makes of the loop (it may not reassociate without -ffast-math). A
// float's square is exact in fp64 (48 significant bits), so fusing the multiply-add cannot change
// a bit either.
double combine(const double (&lane)[kLanes]) {
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

template <typename T>
double square(T x) {
  const double v = static_cast<float>(x);  // exact for bf16 and fp16
  return v * v;
}

template <typename T>
double cell_sum_squares(const T* x, int64_t n) {
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) lane[j] += square(x[i + j]);
  }
  for (int j = 0; i < n; ++i, ++j) lane[j] += square(x[i]);
  return combine(lane);
}

template <typename T>
void cpu_block_sum_squares(const T* x, int64_t num_cells, int64_t cell, double* out) {
  // Cells are independent, so how threads split them changes no bit.
  at::parallel_for(0, num_cells, 16, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) out[c] = cell_sum_squares(x + c * cell, cell);
  });
}

}  // namespace

torch::Tensor block_sum_squares(const torch::Tensor& x, int64_t cell) {
  GPT2_ASSERT(x.is_contiguous() && cell > 0 && x.numel() % cell == 0,
              "block_sum_squares: a contiguous tensor of whole cells");
  const int64_t num_cells = x.numel() / cell;
  auto out = at::empty({num_cells}, x.options().dtype(at::kDouble));
  if (num_cells == 0) return out;
  const at::ScalarType t = x.scalar_type();
  GPT2_ASSERT(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf, "block_sum_squares: fp32, bf16 or fp16");
  if (x.is_cuda()) {
#ifdef GPT2_WITH_CUDA
    const int dtype = t == at::kFloat ? 0 : (t == at::kBFloat16 ? 1 : 2);
    CUDA_CHECK(launch_block_sum_squares(x.data_ptr(), dtype, num_cells, cell, out.data_ptr<double>(),
                                        at::cuda::getCurrentCUDAStream(x.device().index()).stream()));
    return out;
#else
    throw Error("block_sum_squares: this build has no CUDA kernels");
#endif
  }
  double* o = out.data_ptr<double>();
  if (t == at::kFloat) {
    cpu_block_sum_squares(x.data_ptr<float>(), num_cells, cell, o);
  } else if (t == at::kBFloat16) {
    cpu_block_sum_squares(x.data_ptr<at::BFloat16>(), num_cells, cell, o);
  } else {
    cpu_block_sum_squares(x.data_ptr<at::Half>(), num_cells, cell, o);
  }
  return out;
}

torch::Tensor ordered_sum(const torch::Tensor& partials) {
  GPT2_ASSERT(partials.dim() == 1 && partials.scalar_type() == at::kDouble && partials.is_contiguous(),
              "ordered_sum: a contiguous 1-D fp64 tensor");
  auto out = at::empty({}, partials.options());
  if (partials.is_cuda()) {
#ifdef GPT2_WITH_CUDA
    CUDA_CHECK(launch_ordered_sum(partials.data_ptr<double>(), partials.numel(), out.data_ptr<double>(),
                                  at::cuda::getCurrentCUDAStream(partials.device().index()).stream()));
    return out;
#else
    throw Error("ordered_sum: this build has no CUDA kernels");
#endif
  }
  const double* x = partials.data_ptr<double>();
  double lane[kLanes] = {};
  for (int64_t i = 0; i < partials.numel(); ++i) lane[i % kLanes] += x[i];
  out.fill_(combine(lane));
  return out;
}

}  // namespace gpt2::optim
