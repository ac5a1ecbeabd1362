#pragma once
// Collectives over a group of ranks, on whole contiguous tensors, asynchronous.
// Contract: every call returns a Work at once; the result is ready after Work::wait(). All ranks of
// the group must issue the same collectives in the same order (Note [Collective order]). Two
// backends: MPI (non-blocking MPI collectives on host memory, wait() blocks the host; CUDA and
// bf16/fp16 tensors are staged through host buffers) and NCCL for CUDA tensors (its own stream;
// wait() makes the caller's current stream wait, the host does not).
// Both end a collective that has not finished `timeout.seconds` after this rank issued it (a peer
// died or hangs): it is counted from the enqueue on each rank, so ranks must not drift apart by
// that much before a collective (the trainer meets on the host after rank-0-only work).
#include <mpi.h>
#include <torch/types.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallel/backend.h"

namespace gpt2::parallel {

enum class ReduceOp { kSum, kAvg, kMax };

// How long a collective may take after this rank issued it, and the setting's name for the error
// that ends the job (the trainer passes "parallel.timeout_s").
struct CollectiveTimeout {
  CollectiveTimeout(double s, std::string n = "the collective timeout") : seconds(s), name(std::move(n)) {}
  double seconds;
  std::string name;
};

class Work {
 public:
  virtual ~Work() = default;
  // Makes the result visible to the caller (see the contract above). Throws gpt2::Error on failure.
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string backend() const = 0;  // "mpi" | "nccl"

  // In place over `tensor` (contiguous).
  virtual std::unique_ptr<Work> all_reduce(torch::Tensor tensor, ReduceOp op) = 0;
  // In place over `tensor`: the result (op over ranks) lands on `root` only; other ranks' `tensor`
  // is left as it was.
  virtual std::unique_ptr<Work> reduce(torch::Tensor tensor, int root, ReduceOp op) = 0;
  // `input` has world_size * n elements, `output` n: output = op over ranks of input chunk `rank`.
  virtual std::unique_ptr<Work> reduce_scatter(torch::Tensor output, torch::Tensor input, ReduceOp op) = 0;
  // `input` n elements, `output` world_size * n: chunk r of output = rank r's input. `input` may be
  // this rank's own chunk of `output` (in place).
  virtual std::unique_ptr<Work> all_gather(torch::Tensor output, torch::Tensor input) = 0;
  virtual std::unique_ptr<Work> broadcast(torch::Tensor tensor, int root) = 0;
  // Personalised exchange: `input` is send_counts[q] elements for each rank q, end to end in rank
  // order; `output` receives recv_counts[r] elements from each rank r, likewise. Values move
  // unchanged (any dtype, one for both tensors); counts may be 0, and must agree between the pairs.
  virtual std::unique_ptr<Work> all_to_all(torch::Tensor output, const std::vector<int64_t>& recv_counts,
                                           torch::Tensor input, const std::vector<int64_t>& send_counts) = 0;
  virtual void barrier() = 0;
};

// MPI backend over `comm` (not owned; must outlive the communicator). CPU tensors of fp32, fp64,
// int32, int64 and uint8 go to MPI as they are; CUDA tensors and bf16/fp16 ones are staged
// through host buffers (stage_through_host), so several ranks can share one GPU. A collective not
// finished `timeout.seconds` after it was issued makes wait() throw gpt2::Error naming it and
// timeout.name (the caller ends the job).
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, const CollectiveTimeout& timeout);

// Wraps a communicator of host tensors so that it also takes CUDA tensors and bf16/fp16 tensors:
// each collective copies them to host memory (16-bit floats as fp32) and wait() copies the result
// back (Note [Host staging]). Tensors the inner communicator takes go to it unchanged.
std::unique_ptr<Communicator> stage_through_host(std::unique_ptr<Communicator> host);

// NCCL backend for CUDA tensors on `device`, bootstrapped over `comm` (rank 0's unique id by
// MPI_Bcast). Collectives time out after `timeout.seconds`: the communicator is then aborted and
// the error surfaces in wait() and in the log, so a dead peer never hangs the job. The set-up
// (ncclCommInitRankConfig) has the same bound: past it, gpt2::Error naming timeout.name.
// Throws gpt2::Error when this build has no NCCL.
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, int device, const CollectiveTimeout& timeout);

// The communicator `backend` names for `device`. Throws gpt2::UserError when NCCL is asked for a
// CPU device or a build without NCCL.
std::unique_ptr<Communicator> make_communicator(MPI_Comm comm, const torch::Device& device, Backend backend,
                                                const CollectiveTimeout& timeout);

}  // namespace gpt2::parallel
