// CUDA graphs of a step, one per key (step_graphs.h; Note [Decode graphs] in decode_graphs.cpp).
#include "src/serve/step_graphs.h"

#include <map>
#include <utility>

#include "src/base/log.h"

#ifdef GPT2_WITH_CUDA
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "src/base/cuda_check.h"
#endif

namespace gpt2::serve {

#ifdef GPT2_WITH_CUDA
namespace {

constexpr int kWarmupRuns = 2;

// Ends a capture that failed part way, so that the eager runs after it go as if it had never
// begun: the stream leaves capture mode (an invalidated capture reports an error on its end, and
// still ends) and the allocators stop serving this stream from the pool (CUDAGraph::capture_end
// may have done that already, which is why their complaints are ignored). Best effort after the
// error that is reported: the return codes here say nothing more.
void abort_capture(cudaStream_t stream, c10::DeviceIndex device, c10::MempoolId_t pool) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
    cudaGraph_t partial = nullptr;
    (void)cudaStreamEndCapture(stream, &partial);
    if (partial != nullptr) (void)cudaGraphDestroy(partial);
  }
  try {
    c10::cuda::CUDACachingAllocator::endAllocateToPool(device, pool);
  } catch (const c10::Error&) {  // not routing any more
  }
  try {
    at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(pool);
  } catch (const c10::Error&) {  // not routing any more
  }
  (void)cudaGetLastError();  // a capture error is not sticky: clear it before the next launch checks
}

}  // namespace

struct StepGraphs::Graphs {
  c10::MempoolId_t pool = at::cuda::graph_pool_handle();
  std::map<int64_t, std::unique_ptr<at::cuda::CUDAGraph>> by_key;
};
#else
struct StepGraphs::Graphs {
  std::map<int64_t, int> by_key;
};
#endif

StepGraphs::StepGraphs(torch::Device device, bool use_graphs, std::string what,
                       std::function<std::string(int64_t)> name_key)
    : device_(device), what_(std::move(what)), name_key_(std::move(name_key)) {
#ifdef GPT2_WITH_CUDA
  on_ = use_graphs && device.is_cuda();
  if (on_) graphs_ = std::make_unique<Graphs>();
#else
  (void)use_graphs;
#endif
}

StepGraphs::~StepGraphs() = default;

int64_t StepGraphs::captured() const { return graphs_ ? static_cast<int64_t>(graphs_->by_key.size()) : 0; }

bool StepGraphs::replay(int64_t key, const std::function<void(int64_t)>& work) {
  if (!on_) return false;
#ifdef GPT2_WITH_CUDA
  auto found = graphs_->by_key.find(key);
  if (found == graphs_->by_key.end()) {
    const c10::DeviceIndex device = device_.index();
    const c10::cuda::CUDAGuard on_device(device);
    const auto step_stream = c10::cuda::getCurrentCUDAStream(device);
    const auto capture_stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device);
    auto graph = std::make_unique<at::cuda::CUDAGraph>();
    try {
      // Note [Decode graphs]: warm up, then capture, on a side stream that starts after the
      // inputs' copies; the replay below runs on the step's stream.
      CUDA_CHECK(cudaStreamSynchronize(step_stream.stream()));
      const c10::cuda::CUDAStreamGuard on_capture_stream(capture_stream);
      for (int i = 0; i < kWarmupRuns; ++i) work(key);
      CUDA_CHECK(cudaStreamSynchronize(capture_stream.stream()));
      graph->capture_begin(graphs_->pool, cudaStreamCaptureModeThreadLocal);
      work(key);
      graph->capture_end();
    } catch (const std::exception& e) {
      abort_capture(capture_stream.stream(), device, graphs_->pool);
      log::warn("gpt2-serve: capturing the ", what_, " in a CUDA graph failed (", name_key_(key), "): ", e.what(),
                "; running it without CUDA graphs from now on");
      graph.reset();
      graphs_.reset();
      on_ = false;
      return false;
    }
    found = graphs_->by_key.emplace(key, std::move(graph)).first;
    log::info("gpt2-serve: ", what_, " captured in a CUDA graph (", name_key_(key), "; ", graphs_->by_key.size(),
              " graph(s))");
  }
  found->second->replay();  // on the current stream
  return true;
#else
  (void)key;
  (void)work;
  return false;
#endif
}

}  // namespace gpt2::serve
