// MPI backend of Communicator (CPU tensors). Non-blocking collectives, so a reduction issued from a
// backward hook proceeds while later buckets are still being computed (Open MPI progresses them
// inside later MPI calls and in wait()). wait() polls with MPI_Test rather than blocking in
// MPI_Wait, so a collective a peer never joins ends in an error after parallel.timeout_s, as with
// NCCL, instead of holding the job.
#include <ATen/ATen.h>

#include <chrono>
#include <functional>
#include <limits>
#include <thread>
#include <utility>
#include <vector>

#include "parallel/communicator.h"
#include "src/base/errors.h"
#include "src/base/log.h"
#include "src/base/mpi_check.h"

namespace gpt2::parallel {
namespace {

MPI_Datatype mpi_type(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return MPI_FLOAT;
    case at::kDouble:
      return MPI_DOUBLE;
    case at::kInt:
      return MPI_INT32_T;
    case at::kLong:
      return MPI_INT64_T;
    case at::kByte:
      return MPI_UINT8_T;
    default:
      throw Error(std::string("MPI communicator: unsupported dtype ") + std::string(c10::toString(t.scalar_type())) +
                  " (reduce CPU tensors in fp32 or fp64)");
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return MPI_SUM;  // kAvg divides after completion
    case ReduceOp::kMax:
      return MPI_MAX;
  }
  return MPI_SUM;
}

// MPI counts are int: larger tensors must be split by the caller (flat buffers of > 2^31 elements).
int count(const torch::Tensor& t) {
  GPT2_ASSERT(t.numel() <= std::numeric_limits<int>::max(), "tensor too large for one MPI call");
  return static_cast<int>(t.numel());
}

void check_cpu_contiguous(const torch::Tensor& t, const char* what) {
  if (!t.device().is_cpu() || !t.is_contiguous()) {
    throw Error(std::string("MPI communicator: ") + what + " must be a contiguous CPU tensor");
  }
}

// Note [Rank-order sums]
// MPI picks a reduction's algorithm by message size and world size, and with three or more ranks a
// float sum rounds differently under each: MPI_Ireduce (ZeRO 2) and MPI_Iallreduce (ZeRO 0/1) of the
// same buffers differed in the last bit. So this communicator takes floating-point sums itself, in
// rank order, ((x_0 + x_1) + x_2) + ..., element by element: the values reach the rank that sums them
// through MPI_Iallgather, MPI_Igather or MPI_Ialltoall, which move bytes and never round. all_reduce
// (every rank gathers all and sums), reduce (gather to the root, sum there) and reduce_scatter (each
// rank's chunk from every rank) give every element the same bits, on any world size and whatever
// the tensor's length or where it was cut (Note [Partition-free arithmetic], optim/grad_norm.h).
// Each is one non-blocking MPI call, so a collective a peer abandoned (a timeout) still completes on
// the others. The cost: all_reduce receives (N - 1) copies of the tensor where a ring receives
// 2 (N - 1) / N, and holds N copies; the MPI backend is for tests, ranks sharing a GPU and machines
// without NCCL. Integer sums and maxima are exact in any order and stay MPI's own.
bool rank_order_sum(const torch::Tensor& t, ReduceOp op) {
  return op != ReduceOp::kMax && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble);
}

// out = chunks[0] + chunks[1] + ... in that order (chunks: [world, n], out: n elements). An
// element-wise add rounds once per element whatever the vector width.
void sum_in_rank_order(const torch::Tensor& chunks, torch::Tensor out) {
  out.copy_(chunks[0]);
  for (int64_t r = 1; r < chunks.size(0); ++r) out.add_(chunks[r]);
}

// all_to_all's per-rank element counts as MPI byte counts and displacements (int, as MPI takes them).
struct ByteCounts {
  std::vector<int> counts, displs;
};
ByteCounts byte_counts(const std::vector<int64_t>& elements, const torch::Tensor& t) {
  ByteCounts b;
  int64_t at = 0;
  for (int64_t n : elements) {
    const int64_t bytes = n * static_cast<int64_t>(t.element_size());
    GPT2_ASSERT(n >= 0 && at + bytes <= std::numeric_limits<int>::max(), "all_to_all: counts too large for MPI");
    b.counts.push_back(static_cast<int>(bytes));
    b.displs.push_back(static_cast<int>(at));
    at += bytes;
  }
  GPT2_ASSERT(at == static_cast<int64_t>(t.nbytes()), "all_to_all: counts do not add up to the tensor");
  return b;
}

using Clock = std::chrono::steady_clock;

// A non-blocking MPI collective with the buffers MPI reads and writes, and its deadline: enqueue time
// plus the timeout, counted from the enqueue as NCCL's watchdog does. Once the request completes,
// `finish` (if any) does the local work that completes the result (a sum, a division).
class MpiWork : public Work {
 public:
  MpiWork(MPI_Request request, std::vector<torch::Tensor> buffers, const char* what, const CollectiveTimeout& timeout,
          std::function<void()> finish)
      : request_(request),
        buffers_(std::move(buffers)),
        finish_(std::move(finish)),
        what_(what),
        timeout_(timeout),
        deadline_(Clock::now() +
                  std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout.seconds))) {}
  ~MpiWork() override {
    // A request must complete before its buffers go away; normally wait() already did this. On an
    // error path (an exception unwinding, a peer gone) waiting could last forever: give up at the
    // deadline, or at once while an exception unwinds, and keep the buffers (the job is ending).
    if (request_ == MPI_REQUEST_NULL) return;
    int done = 0;
    while (std::uncaught_exceptions() == 0 && Clock::now() < deadline_) {
      if (MPI_Test(&request_, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done) return;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    abandon();
  }
  void wait() override {
    complete_request();
    if (finish_) std::exchange(finish_, nullptr)();  // a second wait() has nothing left to do
  }

 private:
  void complete_request() {
    // Spin on MPI_Test first (a reduction on the critical path is usually done within
    // microseconds of its last peer arriving), then poll more gently.
    for (int polls = 0; request_ != MPI_REQUEST_NULL; ++polls) {
      int done = 0;
      MPI_CHECK(MPI_Test(&request_, &done, MPI_STATUS_IGNORE));  // sets request_ to MPI_REQUEST_NULL when done
      if (done) break;
      if (Clock::now() >= deadline_) {
        abandon();
        throw Error(log::format("MPI %s did not finish within %g s of being issued (%s): a peer rank died or hangs",
                                what_, timeout_.seconds, timeout_.name.c_str()));
      }
      if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // A started non-blocking collective can be neither cancelled nor freed (MPI 3.1, 5.12), and MPI
  // may still write its buffers: both are kept for the rest of the process (never destroyed, so
  // nothing waits for them at exit). Only the thread that calls MPI gets here (MPI_THREAD_FUNNELED).
  void abandon() {
    static auto* abandoned = new std::vector<std::pair<MPI_Request, std::vector<torch::Tensor>>>();
    abandoned->emplace_back(request_, buffers_);
    request_ = MPI_REQUEST_NULL;
    finish_ = nullptr;
  }

  MPI_Request request_;
  std::vector<torch::Tensor> buffers_;  // keeps what MPI reads and writes alive while it does
  std::function<void()> finish_;
  const char* what_;  // the collective, for the timeout message
  CollectiveTimeout timeout_;
  Clock::time_point deadline_;
};

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, CollectiveTimeout timeout) : comm_(comm), timeout_(std::move(timeout)) {
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &world_size_));
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "mpi"; }

  std::unique_ptr<Work> all_reduce(torch::Tensor t, ReduceOp op) override {
    check_cpu_contiguous(t, "all_reduce tensor");
    if (!rank_order_sum(t, op)) {
      MPI_Request req;
      MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, t.data_ptr(), count(t), mpi_type(t), mpi_op(op), comm_, &req));
      return work(req, {t}, "all_reduce", divide_after(t, op));
    }
    // Note [Rank-order sums]: every rank gathers every rank's tensor and sums them itself.
    auto received = at::empty({world_size_, t.numel()}, t.options());
    MPI_Request req;
    MPI_CHECK(
        MPI_Iallgather(t.data_ptr(), count(t), mpi_type(t), received.data_ptr(), count(t), mpi_type(t), comm_, &req));
    return work(req, {t, received}, "all_reduce", sum_after(received, t, op));
  }

  std::unique_ptr<Work> reduce(torch::Tensor t, int root, ReduceOp op) override {
    check_cpu_contiguous(t, "reduce tensor");
    MPI_Request req;
    if (!rank_order_sum(t, op)) {
      // The root reduces in place; the others only send (their buffer is not written).
      const void* send = rank_ == root ? MPI_IN_PLACE : t.data_ptr();
      MPI_CHECK(MPI_Ireduce(send, t.data_ptr(), count(t), mpi_type(t), mpi_op(op), root, comm_, &req));
      return work(req, {t}, "reduce", rank_ == root ? divide_after(t, op) : nullptr);
    }
    // Note [Rank-order sums]: every rank's tensor is gathered to the root, which sums them.
    if (rank_ != root) {
      MPI_CHECK(MPI_Igather(t.data_ptr(), count(t), mpi_type(t), nullptr, 0, mpi_type(t), root, comm_, &req));
      return work(req, {t}, "reduce");
    }
    auto received = at::empty({world_size_, t.numel()}, t.options());
    MPI_CHECK(MPI_Igather(t.data_ptr(), count(t), mpi_type(t), received.data_ptr(), count(t), mpi_type(t), root, comm_,
                          &req));
    return work(req, {t, received}, "reduce", sum_after(received, t, op));
  }

  std::unique_ptr<Work> reduce_scatter(torch::Tensor out, torch::Tensor in, ReduceOp op) override {
    check_cpu_contiguous(out, "reduce_scatter output");
    check_cpu_contiguous(in, "reduce_scatter input");
    GPT2_ASSERT(in.numel() == out.numel() * world_size_, "reduce_scatter: input must be world_size x output");
    MPI_Request req;
    if (!rank_order_sum(in, op)) {
      MPI_CHECK(
          MPI_Ireduce_scatter_block(in.data_ptr(), out.data_ptr(), count(out), mpi_type(in), mpi_op(op), comm_, &req));
      return work(req, {out, in}, "reduce_scatter", divide_after(out, op));
    }
    // Note [Rank-order sums]: chunk `rank` of every rank's input comes here and is summed in order.
    auto received = at::empty({world_size_, out.numel()}, in.options());
    MPI_CHECK(MPI_Ialltoall(in.data_ptr(), count(out), mpi_type(in), received.data_ptr(), count(out), mpi_type(in),
                            comm_, &req));
    return work(req, {out, in, received}, "reduce_scatter", sum_after(received, out, op));
  }

  std::unique_ptr<Work> all_gather(torch::Tensor out, torch::Tensor in) override {
    check_cpu_contiguous(out, "all_gather output");
    check_cpu_contiguous(in, "all_gather input");
    GPT2_ASSERT(out.numel() == in.numel() * world_size_, "all_gather: output must be world_size x input");
    MPI_Request req;
    const int n = count(in);
    // MPI forbids aliased buffers; the in-place form is spelled MPI_IN_PLACE.
    const bool in_place = in.data_ptr() == static_cast<char*>(out.data_ptr()) + rank_ * in.nbytes();
    MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : in.data_ptr(), n, mpi_type(in), out.data_ptr(), n, mpi_type(out),
                             comm_, &req));
    return work(req, {out, in}, "all_gather");
  }

  std::unique_ptr<Work> broadcast(torch::Tensor t, int root) override {
    check_cpu_contiguous(t, "broadcast tensor");
    MPI_Request req;
    MPI_CHECK(MPI_Ibcast(t.data_ptr(), count(t), mpi_type(t), root, comm_, &req));
    return work(req, {t}, "broadcast");
  }

  std::unique_ptr<Work> all_to_all(torch::Tensor out, const std::vector<int64_t>& recv_counts, torch::Tensor in,
                                   const std::vector<int64_t>& send_counts) override {
    check_cpu_contiguous(out, "all_to_all output");
    check_cpu_contiguous(in, "all_to_all input");
    GPT2_ASSERT(out.scalar_type() == in.scalar_type(), "all_to_all: input and output of one dtype");
    // Bytes, so every dtype moves as it is.
    const auto recv = byte_counts(recv_counts, out), send = byte_counts(send_counts, in);
    MPI_Request req;
    MPI_CHECK(MPI_Ialltoallv(in.data_ptr(), send.counts.data(), send.displs.data(), MPI_BYTE, out.data_ptr(),
                             recv.counts.data(), recv.displs.data(), MPI_BYTE, comm_, &req));
    return work(req, {out, in}, "all_to_all");
  }

  void barrier() override {  // non-blocking too, so it times out like the others
    MPI_Request req;
    MPI_CHECK(MPI_Ibarrier(comm_, &req));
    work(req, {}, "barrier")->wait();
  }

 private:
  double divisor(ReduceOp op) const { return op == ReduceOp::kAvg ? world_size_ : 1.0; }
  // Note [Rank-order sums]: once every rank's values are in `received` ([world, n]), `out` (n) is
  // their sum in rank order, divided for kAvg.
  std::function<void()> sum_after(torch::Tensor received, torch::Tensor out, ReduceOp op) const {
    return [received, out, divide = divisor(op)]() mutable {
      auto flat = out.view({-1});
      sum_in_rank_order(received, flat);
      if (divide != 1.0) flat.div_(divide);
    };
  }
  // kAvg after MPI's own sum: the division, once the sum is there.
  std::function<void()> divide_after(torch::Tensor t, ReduceOp op) const {
    if (op != ReduceOp::kAvg) return {};
    return [t, divide = divisor(op)]() mutable { t.div_(divide); };
  }

  std::unique_ptr<Work> work(MPI_Request req, std::vector<torch::Tensor> buffers, const char* what,
                             std::function<void()> finish = {}) const {
    return std::make_unique<MpiWork>(req, std::move(buffers), what, timeout_, std::move(finish));
  }

  MPI_Comm comm_;
  CollectiveTimeout timeout_;
  int rank_ = 0;
  int world_size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, const CollectiveTimeout& timeout) {
  return stage_through_host(std::make_unique<MpiCommunicator>(comm, timeout));
}

#ifndef GPT2_WITH_NCCL
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm, int, const CollectiveTimeout&) {
  throw Error("this build of gpt2-dist has no NCCL: CUDA tensors cannot be reduced");
}
#endif

std::unique_ptr<Communicator> make_communicator(MPI_Comm comm, const torch::Device& device, Backend backend,
                                                const CollectiveTimeout& timeout) {
  int size = 1;
  MPI_CHECK(MPI_Comm_size(comm, &size));
  if (backend == Backend::kNccl) {
    if (!device.is_cuda()) throw UserError("the NCCL backend needs CUDA tensors; this run is on " + device.str());
#ifndef GPT2_WITH_NCCL
    throw UserError("this build of gpt2-dist has no NCCL (use the MPI backend)");
#endif
    return make_nccl_communicator(comm, device.index(), timeout);
  }
  // auto: one rank has nothing to reduce, so no NCCL communicator (and no watchdog thread) for it.
  if (backend == Backend::kAuto && device.is_cuda() && size > 1) {
    return make_nccl_communicator(comm, device.index(), timeout);
  }
  return make_mpi_communicator(comm, timeout);
}

}  // namespace gpt2::parallel
