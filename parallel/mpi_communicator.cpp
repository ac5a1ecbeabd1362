// MPI backend of Communicator (CPU tensors). Non-blocking collectives, so a reduction issued from a
// backward hook proceeds while later buckets are still being computed (Open MPI progresses them
// inside later MPI calls and in wait()).
#include <ATen/ATen.h>

#include "parallel/communicator.h"
#include "parallel/mpi_check.h"
#include "src/base/errors.h"

namespace gpt2::parallel {
namespace {

MPI_Datatype mpi_type(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kInt: return MPI_INT32_T;
    case at::kLong: return MPI_INT64_T;
    case at::kByte: return MPI_UINT8_T;
    default:
      throw Error(std::string("MPI communicator: unsupported dtype ") + std::string(c10::toString(t.scalar_type())) +
                  " (reduce CPU tensors in fp32 or fp64)");
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return MPI_SUM;  // kAvg divides after completion
    case ReduceOp::kMax: return MPI_MAX;
  }
  return MPI_SUM;
}

void check_cpu_contiguous(const torch::Tensor& t, const char* what) {
  if (!t.device().is_cpu() || !t.is_contiguous()) {
    throw Error(std::string("MPI communicator: ") + what + " must be a contiguous CPU tensor");
  }
}

class MpiWork : public Work {
 public:
  MpiWork(MPI_Request request, torch::Tensor result, double divide_by)
      : request_(request), result_(std::move(result)), divide_by_(divide_by) {}
  ~MpiWork() override {
    // A request must complete before its buffers go away; normally wait() already did this.
    if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }
  void wait() override {
    if (request_ != MPI_REQUEST_NULL) MPI_CHECK(MPI_Wait(&request_, MPI_STATUS_IGNORE));
    if (divide_by_ != 1.0) {
      result_.div_(divide_by_);
      divide_by_ = 1.0;
    }
  }

 private:
  MPI_Request request_;
  torch::Tensor result_;  // keeps the buffer alive while MPI writes it
  double divide_by_;
};

class MpiCommunicator : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MPI_CHECK(MPI_Comm_size(comm_, &world_size_));
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend() const override { return "mpi"; }

  std::unique_ptr<Work> all_reduce(torch::Tensor t, ReduceOp op) override {
    check_cpu_contiguous(t, "all_reduce tensor");
    MPI_Request req;
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, t.data_ptr(), static_cast<int>(t.numel()), mpi_type(t), mpi_op(op),
                             comm_, &req));
    return std::make_unique<MpiWork>(req, t, op == ReduceOp::kAvg ? world_size_ : 1.0);
  }

  std::unique_ptr<Work> reduce_scatter(torch::Tensor out, torch::Tensor in, ReduceOp op) override {
    check_cpu_contiguous(out, "reduce_scatter output");
    check_cpu_contiguous(in, "reduce_scatter input");
    GPT2_ASSERT(in.numel() == out.numel() * world_size_, "reduce_scatter: input must be world_size x output");
    MPI_Request req;
    MPI_CHECK(MPI_Ireduce_scatter_block(in.data_ptr(), out.data_ptr(), static_cast<int>(out.numel()), mpi_type(in),
                                        mpi_op(op), comm_, &req));
    return std::make_unique<MpiWork>(req, out, op == ReduceOp::kAvg ? world_size_ : 1.0);
  }

  std::unique_ptr<Work> all_gather(torch::Tensor out, torch::Tensor in) override {
    check_cpu_contiguous(out, "all_gather output");
    check_cpu_contiguous(in, "all_gather input");
    GPT2_ASSERT(out.numel() == in.numel() * world_size_, "all_gather: output must be world_size x input");
    MPI_Request req;
    const int n = static_cast<int>(in.numel());
    MPI_CHECK(MPI_Iallgather(in.data_ptr(), n, mpi_type(in), out.data_ptr(), n, mpi_type(out), comm_, &req));
    return std::make_unique<MpiWork>(req, out, 1.0);
  }

  std::unique_ptr<Work> broadcast(torch::Tensor t, int root) override {
    check_cpu_contiguous(t, "broadcast tensor");
    MPI_Request req;
    MPI_CHECK(MPI_Ibcast(t.data_ptr(), static_cast<int>(t.numel()), mpi_type(t), root, comm_, &req));
    return std::make_unique<MpiWork>(req, t, 1.0);
  }

  void barrier() override { MPI_CHECK(MPI_Barrier(comm_)); }

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int world_size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm) {
  return std::make_unique<MpiCommunicator>(comm);
}

#ifndef GPT2_WITH_NCCL
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm, int, double) {
  throw Error("this build of gpt2-dist has no NCCL: CUDA tensors cannot be reduced");
}
#endif

std::unique_ptr<Communicator> make_communicator(MPI_Comm comm, const torch::Device& device,
                                                double timeout_seconds) {
  int size = 1;
  MPI_CHECK(MPI_Comm_size(comm, &size));
  // One rank has nothing to reduce: no NCCL communicator (and no watchdog thread) for it.
  if (device.is_cuda() && size > 1) return make_nccl_communicator(comm, device.index(), timeout_seconds);
  return make_mpi_communicator(comm);
}

}  // namespace gpt2::parallel
