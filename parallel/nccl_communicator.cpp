// NCCL backend of Communicator (CUDA tensors). Collectives run on the communicator's own stream,
// ordered after the caller's current stream by an event; a watchdog thread polls for NCCL's
// asynchronous errors and for collectives that outlive the timeout, and then aborts the
// communicator and ends the process, so mpirun takes the whole job down instead of hanging.
// The communicator is non-blocking (ncclConfig_t::blocking = 0) so that its set-up, which waits for
// every peer, can be given up after the timeout too. Then any NCCL call on it may return
// ncclInProgress before its work is enqueued: each one is followed by wait_until_ready(), which
// polls ncclCommGetAsyncError until the call has finished, before anything depends on it.
#ifdef GPT2_WITH_NCCL
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "parallel/communicator.h"
#include "src/base/cuda_check.h"
#include "src/base/log.h"
#include "src/base/mpi_check.h"
#include "src/base/threads.h"

namespace gpt2::parallel {

std::string nccl_version_string();  // nccl_info.cu

namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return ncclFloat32;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kHalf:
      return ncclFloat16;
    case at::kDouble:
      return ncclFloat64;
    case at::kInt:
      return ncclInt32;
    case at::kLong:
      return ncclInt64;
    case at::kByte:
      return ncclUint8;
    default:
      throw Error(std::string("NCCL communicator: unsupported dtype ") + std::string(c10::toString(t.scalar_type())));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
  }
  return ncclSum;
}

class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<at::cuda::CUDAEvent> done, const std::atomic<bool>* failed)
      : done_(std::move(done)), failed_(failed) {}
  void wait() override {
    if (failed_->load()) throw Error("NCCL communicator was aborted (see the error above)");
    done_->block(at::cuda::getCurrentCUDAStream());  // the caller's stream waits; the host does not
  }

 private:
  std::shared_ptr<at::cuda::CUDAEvent> done_;
  const std::atomic<bool>* failed_;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(MPI_Comm comm, int device, const CollectiveTimeout& timeout)
      : device_(static_cast<c10::DeviceIndex>(device)),
        timeout_(timeout.seconds),
        timeout_name_(timeout.name),
        stream_(at::cuda::getStreamFromPool(/*isHighPriority=*/true, device_)) {
    MPI_CHECK(MPI_Comm_rank(comm, &rank_));
    MPI_CHECK(MPI_Comm_size(comm, &world_size_));
    ncclUniqueId id;
    if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm));
    c10::cuda::CUDAGuard guard(device_);
    // A peer that never joins (it died, or is stuck before this point) would hold a blocking
    // ncclCommInitRank forever: bounded by the timeout like the collectives.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const auto deadline = Clock::now() + seconds(timeout_);
    NCCL_CHECK(ncclCommInitRankConfig(&comm_, world_size_, id, rank_, &config));
    if (const std::string problem = wait_until_ready(deadline); !problem.empty()) {
      ncclCommAbort(comm_);
      throw Error("NCCL communicator set-up (ncclCommInitRankConfig) " + problem);
    }
    log::info("NCCL ", nccl_version_string(), ": communicator of ", world_size_, " ranks on cuda:", device);
    watchdog_ = start_helper_thread([this] { watch(); });
  }

  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    watchdog_.join();
    // On an error path a peer may never reach its matching collective: finalize would wait for
    // it, abort does not. Finalize is non-blocking here: bounded by the timeout as well.
    bool finalized = false;
    if (!failed_.load() && std::uncaught_exceptions() == 0) {
      const ncclResult_t rc = ncclCommFinalize(comm_);
      finalized =
          (rc == ncclSuccess || rc == ncclInProgress) && wait_until_ready(Clock::now() + seconds(timeout_)).empty();
    }
    if (finalized) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "nccl"; }

  std::unique_ptr<Work> all_reduce(torch::Tensor t, ReduceOp op) override {
    return enqueue("all_reduce", {t}, [&](cudaStream_t s) {
      NCCL_CHECK(ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t), nccl_op(op), comm_, s));
    });
  }
  std::unique_ptr<Work> reduce(torch::Tensor t, int root, ReduceOp op) override {
    return enqueue("reduce", {t}, [&](cudaStream_t s) {
      NCCL_CHECK(ncclReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t), nccl_op(op), root, comm_, s));
    });
  }
  std::unique_ptr<Work> reduce_scatter(torch::Tensor out, torch::Tensor in, ReduceOp op) override {
    GPT2_ASSERT(in.numel() == out.numel() * world_size_, "reduce_scatter: input must be world_size x output");
    return enqueue("reduce_scatter", {out, in}, [&](cudaStream_t s) {
      NCCL_CHECK(ncclReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), nccl_type(in), nccl_op(op), comm_, s));
    });
  }
  std::unique_ptr<Work> all_gather(torch::Tensor out, torch::Tensor in) override {
    GPT2_ASSERT(out.numel() == in.numel() * world_size_, "all_gather: output must be world_size x input");
    return enqueue("all_gather", {out, in}, [&](cudaStream_t s) {
      NCCL_CHECK(ncclAllGather(in.data_ptr(), out.data_ptr(), in.numel(), nccl_type(in), comm_, s));
    });
  }
  std::unique_ptr<Work> broadcast(torch::Tensor t, int root) override {
    return enqueue("broadcast", {t}, [&](cudaStream_t s) {
      NCCL_CHECK(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t), root, comm_, s));
    });
  }
  std::unique_ptr<Work> all_to_all(torch::Tensor out, const std::vector<int64_t>& recv_counts, torch::Tensor in,
                                   const std::vector<int64_t>& send_counts) override {
    GPT2_ASSERT(out.scalar_type() == in.scalar_type(), "all_to_all: input and output of one dtype");
    GPT2_ASSERT(
        static_cast<int>(recv_counts.size()) == world_size_ && static_cast<int>(send_counts.size()) == world_size_,
        "all_to_all: one count per rank");
    return enqueue("all_to_all", {out, in}, [&](cudaStream_t s) {
      // Bytes, so every dtype moves as it is; one group, so the pairs do not wait on each other.
      const auto size = static_cast<int64_t>(in.element_size());
      auto* send = static_cast<char*>(in.data_ptr());
      auto* recv = static_cast<char*>(out.data_ptr());
      NCCL_CHECK(ncclGroupStart());
      for (int r = 0; r < world_size_; ++r) {
        const auto q = static_cast<size_t>(r);
        if (send_counts[q] > 0) NCCL_CHECK(ncclSend(send, send_counts[q] * size, ncclUint8, r, comm_, s));
        if (recv_counts[q] > 0) NCCL_CHECK(ncclRecv(recv, recv_counts[q] * size, ncclUint8, r, comm_, s));
        send += send_counts[q] * size;
        recv += recv_counts[q] * size;
      }
      NCCL_CHECK(ncclGroupEnd());
    });
  }

  void barrier() override {
    auto one = torch::ones({1}, torch::TensorOptions().device(torch::kCUDA, device_));
    all_reduce(one, ReduceOp::kSum)->wait();
    CUDA_CHECK(cudaStreamSynchronize(at::cuda::getCurrentCUDAStream(device_).stream()));
  }

 private:
  struct Pending {
    std::shared_ptr<at::cuda::CUDAEvent> done;
    Clock::time_point start;
    const char* what;
  };

  static Clock::duration seconds(double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }

  // Polls until the communicator's last call has finished (Note at the top): "" when it succeeded,
  // else what went wrong ("failed: ..." or "did not finish within ...") to complete a message.
  std::string wait_until_ready(Clock::time_point deadline) {
    for (;;) {
      ncclResult_t state = ncclInProgress;
      const ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
      if (rc != ncclSuccess) state = rc;
      if (state == ncclSuccess) return "";
      if (state != ncclInProgress)
        return std::string("failed: ") + ncclGetErrorString(state) + ": " + ncclGetLastError(comm_);
      if (Clock::now() >= deadline) {
        return log::format("did not finish within %g s (%s): a peer rank died or hangs", timeout_,
                           timeout_name_.c_str());
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  // Ends the process as the watchdog does (see watch()); `mutex_` keeps the watchdog off comm_.
  [[noreturn]] void abort_and_exit(const std::string& problem) {
    std::lock_guard<std::mutex> lock(mutex_);
    failed_.store(true);
    log::error(problem, "; aborting the communicator and this rank");
    ncclCommAbort(comm_);
    log::flush();
    std::_Exit(1);
  }

  template <typename Launch>
  std::unique_ptr<Work> enqueue(const char* what, std::initializer_list<torch::Tensor> tensors, Launch launch) {
    if (failed_.load()) throw Error(std::string("NCCL ") + what + ": communicator was aborted");
    for (const auto& t : tensors) {
      if (!t.is_cuda() || !t.is_contiguous())
        throw Error(std::string("NCCL ") + what + ": needs contiguous CUDA tensors");
    }
    c10::cuda::CUDAGuard guard(device_);
    // The collective must see everything the caller's stream wrote into its inputs.
    at::cuda::CUDAEvent ready;
    ready.record(at::cuda::getCurrentCUDAStream(device_));
    ready.block(stream_);
    // The allocator must not hand these blocks out again until the comm stream is done with them.
    for (const auto& t : tensors) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream_);
    launch(stream_.stream());
    // Enqueued on stream_ only once the call is no longer in progress (Note at the top).
    if (const std::string problem = wait_until_ready(Clock::now() + seconds(timeout_)); !problem.empty()) {
      abort_and_exit(std::string("NCCL ") + what + " " + problem);
    }
    auto done = std::make_shared<at::cuda::CUDAEvent>();
    done->record(stream_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending_.push_back({done, Clock::now(), what});
    }
    return std::make_unique<NcclWork>(done, &failed_);
  }

  // Watchdog: every 100 ms, retire finished collectives, check NCCL's async error and the oldest
  // collective's age. On failure: abort the communicator, log, and end the process (mpirun then
  // ends the other ranks).
  void watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      wake_.wait_for(lock, std::chrono::milliseconds(100));
      while (!pending_.empty() && pending_.front().done->query()) pending_.pop_front();
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      std::string problem;
      if (async != ncclSuccess && async != ncclInProgress) {
        problem = std::string("NCCL asynchronous error: ") + ncclGetErrorString(async);
      } else if (!pending_.empty()) {
        const double age = std::chrono::duration<double>(Clock::now() - pending_.front().start).count();
        if (age > timeout_) {
          problem = std::string("NCCL ") + pending_.front().what + " did not finish within " +
                    std::to_string(static_cast<int>(timeout_)) + " s (" + timeout_name_ +
                    "): a peer rank died or hangs";
        }
      }
      if (!problem.empty()) {
        failed_.store(true);
        log::error(problem, "; aborting the communicator and this rank");
        ncclCommAbort(comm_);
        log::flush();
        std::_Exit(1);
      }
    }
  }

  c10::DeviceIndex device_;
  double timeout_;
  std::string timeout_name_;  // the setting, for the error that ends the job
  at::cuda::CUDAStream stream_;
  ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int world_size_ = 1;
  std::atomic<bool> failed_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::deque<Pending> pending_;
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, int device, const CollectiveTimeout& timeout) {
  return std::make_unique<NcclCommunicator>(comm, device, timeout);
}

}  // namespace gpt2::parallel
#endif  // GPT2_WITH_NCCL
