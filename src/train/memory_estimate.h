#pragma once
// What a run will hold in memory, computed from the config before anything is allocated, and the
// check that refuses a run that cannot fit (gpt2::UserError naming the keys that set the size).
// Contract: the state (weights, gradient buffer, optimizer masters and moments) is what train()
// allocates, byte for byte for fp32 moments (8-bit moments: at least this, Note [Memory
// estimate]); activations are a lower bound for one micro-batch. A shape whose sizes overflow
// int64 is refused by fits() before any multiplication can wrap.
#include <torch/types.h>

#include <cstdint>
#include <string>

#include "src/train/config.h"

namespace gpt2 {

struct MemoryEstimate {
  int64_t parameters = 0;       // with the vocabulary padding
  int64_t flat_padded = 0;      // the flat space (parallel/flat_layout.h)
  int64_t shard = 0;            // this rank's part of it (ZeRO 1/2) or all of it
  double weights = 0;           // bytes, on the device
  double gradients = 0;         // the flat gradient buffer, on the device
  double optimizer_device = 0;  // masters, moments and copies the optimizer keeps on the device
  double optimizer_host = 0;    // the same in pinned host memory (parallel.offload = optimizer)
  double activations = 0;       // kept for backward by one micro-batch (a lower bound)

  double device_total() const { return weights + gradients + optimizer_device + activations; }
  // "2.31 GiB on the device (weights 0.23, gradients 0.47, optimizer 1.39, activations >= 0.22) + 0 in host memory"
  std::string describe() const;
};

// The estimate for one rank of `world`, with parameters in `compute` and gradients in `grads`
// (trainer.cpp's Precision). Throws gpt2::UserError naming the model keys when a size overflows.
MemoryEstimate estimate_memory(const Config& cfg, int world, at::ScalarType compute, at::ScalarType grads);

// Refuses (gpt2::UserError) a run whose estimate exceeds what the device has free (CUDA: shared by
// the `ranks_per_device` ranks on it) or what the host has available (CPU runs and offload, for the
// node's `local_ranks`). The message gives both numbers and the keys that change them.
void check_memory_fits(const MemoryEstimate& need, torch::Device device, int ranks_per_device, int local_ranks);

// MemAvailable of /proc/meminfo in bytes; -1 when it cannot be read.
double available_host_bytes();

}  // namespace gpt2
