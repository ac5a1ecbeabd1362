#pragma once
// Batches of (inputs, targets) on the training device. Rows of batch `index` are the windows
// start_of(index, row) of seq_len + 1 tokens; token ids are checked against the model's vocab (an
// error names the file and position). With depth > 0 a Prefetcher fills pinned host buffers ahead
// and, on CUDA, each batch goes to the GPU on a copy stream of its own, ordered for the compute
// stream by an event, so neither the disk nor the copy makes the GPU wait. get() is the
// synchronous path for evaluation.
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "data/prefetcher.h"
#include "data/token_stream.h"

namespace gpt2::data {

struct DeviceBatch {
  torch::Tensor x;          // (B, T) int64 on the device
  torch::Tensor y;          // (B, T) int64 on the device, x shifted by one
  double wait_seconds = 0;  // how long next() blocked waiting for the prefetcher
};

class BatchLoader {
 public:
  using StartOf = std::function<int64_t(int64_t index, int64_t row)>;

  // depth 0: no thread, get() only. first_index: where next() starts (resume = skip to it).
  BatchLoader(const TokenStream& stream, StartOf start_of, int64_t rows, int64_t seq_len, int64_t vocab_size,
              torch::Device device, int depth, int64_t first_index = 0);
  ~BatchLoader();

  DeviceBatch next();              // batches first_index, first_index + 1, ... in order
  DeviceBatch get(int64_t index);  // any batch, read now on the calling thread

 private:
  void fill(int64_t index, torch::Tensor& buffer) const;
  DeviceBatch to_device(const torch::Tensor& host, std::function<void()>* reusable);

  const TokenStream& stream_;
  StartOf start_of_;
  int64_t rows_, seq_len_, vocab_size_;
  torch::Device device_;
  torch::Tensor sync_buffer_;  // for get()
  std::unique_ptr<Prefetcher> prefetcher_;
  struct CudaState;  // copy stream and events (CUDA builds only)
  std::unique_ptr<CudaState> cuda_;
};

}  // namespace gpt2::data
