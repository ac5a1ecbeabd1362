// Host staging for the MPI backend (see stage_through_host in communicator.h).
//
// Note [Host staging]: MPI moves host memory of the types it knows. A CUDA tensor, or a bf16/fp16
// tensor anywhere, is copied into a host buffer first (fp32 for 16-bit floats: exact for gathers
// and broadcasts, and reductions then sum in fp32 and round once), the collective runs on that
// buffer, and wait() copies the result back. The copy out is blocking, so the collective sees
// everything the caller's stream wrote; the copy back is blocking too, so the result is in place
// when wait() returns, as the contract asks. Slow by design: tests run several ranks on one GPU
// with it, and machines without NCCL can still train.
#include <ATen/ATen.h>

#include "parallel/communicator.h"
#include "src/base/errors.h"

namespace gpt2::parallel {
namespace {

bool mpi_native(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
    case at::kDouble:
    case at::kInt:
    case at::kLong:
    case at::kByte:
      return true;
    default:
      return false;
  }
}

bool needs_staging(const torch::Tensor& t) { return !t.device().is_cpu() || !mpi_native(t); }

// Host buffers for `t`, in a type MPI reduces: 16-bit floats widen to fp32. Pinned for CUDA tensors.
torch::TensorOptions host_options(const torch::Tensor& t) {
  const bool narrow_float = t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
  return torch::TensorOptions()
      .device(torch::kCPU)
      .dtype(narrow_float ? at::kFloat : t.scalar_type())
      .pinned_memory(t.is_cuda());
}

torch::Tensor to_host(const torch::Tensor& t) {
  auto host = torch::empty({t.numel()}, host_options(t));
  host.copy_(t.reshape({-1}));
  return host;
}

void check_contiguous(const torch::Tensor& t, const char* what) {
  if (!t.is_contiguous()) throw Error(std::string("MPI communicator: ") + what + " must be contiguous");
}

// The inner collective on host buffers; wait() then writes `result` (host) back into `target`.
// `input` is a staged input the collective still reads until it completes.
class StagedWork : public Work {
 public:
  StagedWork(std::unique_ptr<Work> inner, torch::Tensor target, torch::Tensor result, torch::Tensor input = {})
      : target_(std::move(target)), result_(std::move(result)), input_(std::move(input)), inner_(std::move(inner)) {}
  void wait() override {
    inner_->wait();
    if (target_.defined()) {
      target_.view({-1}).copy_(result_);
      target_ = torch::Tensor();  // a second wait() has nothing left to do
    }
  }

 private:
  torch::Tensor target_, result_, input_;
  std::unique_ptr<Work> inner_;  // last: destroyed first, so an unwaited request completes before the buffers go
};

class StagedCommunicator : public Communicator {
 public:
  explicit StagedCommunicator(std::unique_ptr<Communicator> host) : host_(std::move(host)) {}
  int rank() const override { return host_->rank(); }
  int world_size() const override { return host_->world_size(); }
  std::string backend() const override { return host_->backend(); }

  std::unique_ptr<Work> all_reduce(torch::Tensor t, ReduceOp op) override {
    if (!needs_staging(t)) return host_->all_reduce(t, op);
    check_contiguous(t, "all_reduce tensor");
    auto host = to_host(t);
    return std::make_unique<StagedWork>(host_->all_reduce(host, op), t, host);
  }

  std::unique_ptr<Work> reduce(torch::Tensor t, int root, ReduceOp op) override {
    if (!needs_staging(t)) return host_->reduce(t, root, op);
    check_contiguous(t, "reduce tensor");
    auto host = to_host(t);
    auto inner = host_->reduce(host, root, op);
    // Only the root's tensor changes (the contract): the others keep theirs untouched.
    return std::make_unique<StagedWork>(std::move(inner), rank() == root ? t : torch::Tensor(), host);
  }

  std::unique_ptr<Work> reduce_scatter(torch::Tensor out, torch::Tensor in, ReduceOp op) override {
    if (!needs_staging(out) && !needs_staging(in)) return host_->reduce_scatter(out, in, op);
    check_contiguous(out, "reduce_scatter output");
    check_contiguous(in, "reduce_scatter input");
    auto host_in = to_host(in);
    auto host_out = torch::empty({out.numel()}, host_options(out));
    return std::make_unique<StagedWork>(host_->reduce_scatter(host_out, host_in, op), out, host_out, host_in);
  }

  std::unique_ptr<Work> all_gather(torch::Tensor out, torch::Tensor in) override {
    if (!needs_staging(out) && !needs_staging(in)) return host_->all_gather(out, in);
    check_contiguous(out, "all_gather output");
    check_contiguous(in, "all_gather input");
    GPT2_ASSERT(out.numel() == in.numel() * world_size(), "all_gather: output must be world_size x input");
    // Gathered in place in one host buffer: this rank's chunk is its input (which may itself be
    // that chunk of `out`).
    auto host_out = torch::empty({out.numel()}, host_options(in));
    auto mine = host_out.narrow(0, rank() * in.numel(), in.numel());
    mine.copy_(in.reshape({-1}));
    return std::make_unique<StagedWork>(host_->all_gather(host_out, mine), out, host_out);
  }

  std::unique_ptr<Work> broadcast(torch::Tensor t, int root) override {
    if (!needs_staging(t)) return host_->broadcast(t, root);
    check_contiguous(t, "broadcast tensor");
    auto host = to_host(t);
    return std::make_unique<StagedWork>(host_->broadcast(host, root), t, host);
  }

  std::unique_ptr<Work> all_to_all(torch::Tensor out, const std::vector<int64_t>& recv_counts, torch::Tensor in,
                                   const std::vector<int64_t>& send_counts) override {
    // Bytes move as they are (no widening): only device tensors are staged.
    if (out.device().is_cpu() && in.device().is_cpu()) return host_->all_to_all(out, recv_counts, in, send_counts);
    check_contiguous(out, "all_to_all output");
    check_contiguous(in, "all_to_all input");
    auto pinned = [](const torch::Tensor& t) {
      return torch::TensorOptions().device(torch::kCPU).dtype(t.scalar_type()).pinned_memory(t.is_cuda());
    };
    auto host_in = torch::empty({in.numel()}, pinned(in));
    host_in.copy_(in.reshape({-1}));
    auto host_out = torch::empty({out.numel()}, pinned(out));
    return std::make_unique<StagedWork>(host_->all_to_all(host_out, recv_counts, host_in, send_counts), out, host_out,
                                        host_in);
  }

  void barrier() override { host_->barrier(); }

 private:
  std::unique_ptr<Communicator> host_;
};

}  // namespace

std::unique_ptr<Communicator> stage_through_host(std::unique_ptr<Communicator> host) {
  return std::make_unique<StagedCommunicator>(std::move(host));
}

}  // namespace gpt2::parallel
