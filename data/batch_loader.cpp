#include "data/batch_loader.h"

#include <ATen/ATen.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#ifdef GPT2_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#endif

#include "src/base/errors.h"

namespace gpt2::data {

#ifdef GPT2_WITH_CUDA
// Device batches live in a ring of buffers owned by the loader, never in blocks the caching
// allocator could hand out again while kernels queued on the compute stream still use them.
// Slot k is refilled on the copy stream only after the compute stream has copied out of it.
struct BatchLoader::CudaState {
  at::cuda::CUDAStream copy_stream;
  std::vector<torch::Tensor> slots;
  std::vector<std::unique_ptr<at::cuda::CUDAEvent>> consumed;  // recorded on the compute stream
  size_t next = 0;
};
#else
struct BatchLoader::CudaState {};
#endif

BatchLoader::BatchLoader(const TokenStream& stream, StartOf start_of, int64_t rows, int64_t seq_len, int64_t vocab_size,
                         torch::Device device, int depth, int64_t first_index)
    : stream_(stream),
      start_of_(std::move(start_of)),
      rows_(rows),
      seq_len_(seq_len),
      vocab_size_(vocab_size),
      device_(device),
      sync_buffer_(at::empty({rows, seq_len + 1}, at::kLong)) {
#ifdef GPT2_WITH_CUDA
  if (device_.is_cuda()) {
    cuda_.reset(new CudaState{at::cuda::getStreamFromPool(false, device_.index()), {}, {}, 0});
    for (int k = 0; k < 2; ++k) {
      cuda_->slots.push_back(at::empty({rows, seq_len + 1}, at::TensorOptions().dtype(at::kLong).device(device_)));
      cuda_->consumed.push_back(std::make_unique<at::cuda::CUDAEvent>());
    }
  }
#endif
  if (depth > 0) {
    prefetcher_ = std::make_unique<Prefetcher>(
        rows, seq_len + 1, depth, /*pinned=*/device_.is_cuda(),
        [this](int64_t index, torch::Tensor& buffer) { fill(index, buffer); }, first_index);
  }
}

BatchLoader::~BatchLoader() = default;

void BatchLoader::fill(int64_t index, torch::Tensor& buffer) const {
  int64_t* base = buffer.data_ptr<int64_t>();
  const int64_t width = seq_len_ + 1;
  for (int64_t row = 0; row < rows_; ++row) {
    const int64_t start = start_of_(index, row);
    int64_t* out = base + row * width;
    stream_.read_ids(start, width, out, vocab_size_, "model.vocab_size");
  }
}

DeviceBatch BatchLoader::to_device(const torch::Tensor& host, std::function<void()>* reusable) {
  DeviceBatch batch;
#ifdef GPT2_WITH_CUDA
  if (cuda_) {
    const auto compute = at::cuda::getCurrentCUDAStream(device_.index());
    const size_t k = cuda_->next++ % cuda_->slots.size();
    auto& dev = cuda_->slots[k];
    auto done = std::make_shared<at::cuda::CUDAEvent>();
    {
      c10::cuda::CUDAStreamGuard guard(cuda_->copy_stream);
      cuda_->consumed[k]->block(cuda_->copy_stream);  // the compute stream is done with slot k
      dev.copy_(host, /*non_blocking=*/true);
      done->record(cuda_->copy_stream);
    }
    done->block(compute);
    if (reusable) *reusable = [done] { done->synchronize(); };  // the pinned buffer is free once copied
    batch.x = dev.narrow(1, 0, seq_len_).contiguous();          // (B, T), allocated on the compute stream
    batch.y = dev.narrow(1, 1, seq_len_).contiguous();          // (B, T)
    cuda_->consumed[k]->record(compute);
    return batch;
  }
#endif
  (void)reusable;
  // CPU: always copy out (clone), since the buffer is refilled while the batch is in use.
  batch.x = host.narrow(1, 0, seq_len_).clone(at::MemoryFormat::Contiguous);
  batch.y = host.narrow(1, 1, seq_len_).clone(at::MemoryFormat::Contiguous);
  return batch;
}

DeviceBatch BatchLoader::next() {
  GPT2_ASSERT(prefetcher_ != nullptr, "BatchLoader::next() needs depth > 0");
  const auto t0 = std::chrono::steady_clock::now();
  auto slot = prefetcher_->next();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::function<void()> reusable;
  DeviceBatch batch = to_device(slot.buffer, &reusable);
  prefetcher_->release(slot, std::move(reusable));
  batch.wait_seconds = waited;
  return batch;
}

DeviceBatch BatchLoader::get(int64_t index) {
  fill(index, sync_buffer_);
  DeviceBatch batch = to_device(sync_buffer_, nullptr);
#ifdef GPT2_WITH_CUDA
  // sync_buffer_ is pageable and refilled by the next get(): finish this copy first.
  if (cuda_) cuda_->copy_stream.synchronize();
#endif
  return batch;
}

}  // namespace gpt2::data
