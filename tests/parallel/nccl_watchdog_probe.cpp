// GPU suite probe for the NCCL watchdog (ctest nccl_watchdog_*; skips without a GPU). One rank,
// backend NCCL: the caller's stream is held busy for STALL seconds (a spin kernel) before an
// all-reduce, then COUNT more all-reduces follow 2 ms of work each, with parallel.timeout_s = TIMEOUT.
// A stall longer than the timeout must end the process with the watchdog's message; a healthy
// run (short stall, many collectives over longer than the timeout) must not.
//   nccl_watchdog_probe STALL TIMEOUT COUNT
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/Sleep.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>

#include "parallel/communicator.h"
#include "parallel/rank_env.h"
#include "src/base/cuda_check.h"
#include "src/base/log.h"

int main(int argc, char** argv) {
  gpt2::parallel::MpiSession mpi(&argc, &argv);
  if (argc != 4) {
    std::fprintf(stderr, "usage: nccl_watchdog_probe STALL_SECONDS TIMEOUT_SECONDS COUNT\n");
    return 2;
  }
  if (!torch::cuda::is_available()) {
    std::printf("no CUDA device: skipped\n");
    return 0;
  }
  const double stall = std::atof(argv[1]), timeout = std::atof(argv[2]);
  const int count = std::atoi(argv[3]);
  gpt2::log::init(0, 1);
  // The CUDA context first, so that the communicator's set-up, which shares the timeout, is only NCCL's.
  CUDA_CHECK(cudaFree(nullptr));
  auto comm = gpt2::parallel::make_communicator(MPI_COMM_WORLD, torch::Device(torch::kCUDA, 0),
                                                gpt2::parallel::Backend::kNccl, {timeout, "parallel.timeout_s"});
  int khz = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  auto t = torch::ones({1 << 20}, torch::TensorOptions().device(torch::kCUDA, 0));
  at::cuda::sleep(static_cast<int64_t>(stall * khz * 1e3));  // the caller's stream is busy this long
  comm->all_reduce(t, gpt2::parallel::ReduceOp::kSum)->wait();
  // Healthy traffic for longer than the timeout: 2 ms of work before each collective, the host
  // at most 50 collectives (0.1 s) ahead of the GPU.
  for (int i = 0; i < count; ++i) {
    at::cuda::sleep(static_cast<int64_t>(0.002 * khz * 1e3));
    comm->all_reduce(t, gpt2::parallel::ReduceOp::kMax)->wait();
    if (i % 50 == 49) CUDA_CHECK(cudaStreamSynchronize(at::cuda::getCurrentCUDAStream(0).stream()));
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  std::printf("all %d collectives finished (stall %.1f s, timeout %.1f s)\n", count + 1, stall, timeout);
  return 0;
}
