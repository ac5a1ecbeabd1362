#pragma once
// Every collective the trainer uses, on tensors of a given device and dtype, against values
// computed by hand from each rank's input. The inputs are small integers, exact in bf16 and fp16,
// so every dtype must give the exact result. Shared by the CPU tests (MPI, with bf16/fp16 staged)
// and the GPU suite (MPI staging CUDA tensors; NCCL).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "parallel/communicator.h"

namespace gpt2::test {

inline void expect_collectives_exact(parallel::Communicator& comm, const torch::TensorOptions& options) {
  using parallel::ReduceOp;
  const int rank = comm.rank(), n = comm.world_size();
  const auto host64 = torch::TensorOptions().dtype(torch::kFloat64);
  auto expect_equal = [&](const torch::Tensor& got, const torch::Tensor& want, const char* what) {
    EXPECT_TRUE(torch::equal(got.to(torch::kCPU, torch::kFloat64), want))
        << what << ": got " << got << " want " << want;
  };
  SCOPED_TRACE(std::string(comm.backend()) + " on " + c10::toString(options.dtype()) + " " + options.device().str());

  // all_reduce: rank r holds [r, 4r, 1]; sum = [s, 4s, n], s = n(n-1)/2.
  const double s = n * (n - 1) / 2.0;
  auto make = [&] { return torch::tensor({double(rank), 4.0 * rank, 1.0}, host64).to(options); };
  auto t = make();
  comm.all_reduce(t, ReduceOp::kSum)->wait();
  expect_equal(t, torch::tensor({s, 4 * s, double(n)}, host64), "all_reduce sum");
  t = make();
  comm.all_reduce(t, ReduceOp::kMax)->wait();
  expect_equal(t, torch::tensor({double(n - 1), 4.0 * (n - 1), 1.0}, host64), "all_reduce max");
  t = torch::full({2}, 2.0 * n, host64).to(options);
  comm.all_reduce(t, ReduceOp::kAvg)->wait();
  expect_equal(t, torch::full({2}, 2.0 * n, host64), "all_reduce avg");

  // reduce to each root in turn (ZeRO 2's reduce to the owners): only the root's tensor changes.
  for (int root = 0; root < n; ++root) {
    auto r = make();
    comm.reduce(r, root, ReduceOp::kSum)->wait();
    expect_equal(r,
                 rank == root ? torch::tensor({s, 4 * s, double(n)}, host64) : make().to(torch::kCPU, torch::kFloat64),
                 "reduce");
  }

  // reduce_scatter: element i of rank r's input = i + 8r; rank q gets chunk q (2 elements).
  auto in = (torch::arange(2 * n, host64) + 8.0 * rank).to(options);
  auto out = torch::empty({2}, options);
  comm.reduce_scatter(out, in, ReduceOp::kSum)->wait();
  expect_equal(out, torch::tensor({n * (2.0 * rank) + 8 * s, n * (2.0 * rank + 1) + 8 * s}, host64), "reduce_scatter");

  // all_gather in place (ZeRO's parameter gather): chunk r of the output is rank r's 3 elements.
  auto all = torch::full({3 * n}, -1.0, host64).to(options);
  all.narrow(0, 3 * rank, 3).fill_(rank + 1);
  comm.all_gather(all, all.narrow(0, 3 * rank, 3))->wait();
  expect_equal(all, (torch::arange(n, host64) + 1).repeat_interleave(3), "all_gather in place");

  // all_to_all (Muon's matrices between the ranks that hold and own them): rank r sends rank q
  // q + 1 copies of 10r + q, so it receives r + 1 values 10p + r from each rank p.
  {
    std::vector<int64_t> send_counts, recv_counts;
    std::vector<double> send, want;
    for (int q = 0; q < n; ++q) {
      send_counts.push_back(q + 1);
      recv_counts.push_back(rank + 1);
      send.insert(send.end(), static_cast<size_t>(q + 1), 10.0 * rank + q);
      want.insert(want.end(), static_cast<size_t>(rank + 1), 10.0 * q + rank);
    }
    auto got = torch::full({static_cast<int64_t>(want.size())}, -1.0, host64).to(options);
    comm.all_to_all(got, recv_counts, torch::tensor(send, host64).to(options), send_counts)->wait();
    expect_equal(got, torch::tensor(want, host64), "all_to_all");
  }

  // broadcast from the last rank, and several all-reduces in flight completed in reverse order.
  auto b = torch::full({4}, double(rank), host64).to(options);
  comm.broadcast(b, n - 1)->wait();
  expect_equal(b, torch::full({4}, double(n - 1), host64), "broadcast");
  std::vector<torch::Tensor> ts;
  std::vector<std::unique_ptr<parallel::Work>> works;
  for (int i = 0; i < 6; ++i) {
    ts.push_back(torch::full({1000}, double(i + rank), host64).to(options));
    works.push_back(comm.all_reduce(ts.back(), ReduceOp::kSum));
  }
  for (int i = 5; i >= 0; --i) works[static_cast<size_t>(i)]->wait();
  for (int i = 0; i < 6; ++i)
    expect_equal(ts[static_cast<size_t>(i)], torch::full({1000}, n * i + s, host64), "in flight");
  comm.barrier();
}

}  // namespace gpt2::test
