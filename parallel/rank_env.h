#pragma once
// The process's place in the job, from MPI. MpiSession owns MPI's lifetime (init, finalize);
// RankEnv describes one group of ranks (MPI_COMM_WORLD for a job, MPI_COMM_SELF for a one-rank
// reference run inside a test): rank and size in the group, local rank on the node (one GPU per
// local rank). abort() ends the whole job at once so no peer is left waiting in a collective.
#include <mpi.h>

namespace gpt2::parallel {

class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

 private:
  bool finalize_ = false;
};

class RankEnv {
 public:
  explicit RankEnv(MPI_Comm comm = MPI_COMM_WORLD);

  MPI_Comm comm() const { return comm_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  bool is_main() const { return rank_ == 0; }  // rank 0 speaks and writes shared files

  void barrier() const;
  // Sum of a double over the group (small control values: losses, norms), the same on every rank.
  double all_reduce_sum(double value) const;
  // Maximum of an int over the group (flags: "any rank got a stop signal"), the same on every rank.
  int all_reduce_max(int value) const;
  // Ends the whole job (every rank of MPI_COMM_WORLD) with `code`. Never returns.
  [[noreturn]] static void abort(int code);

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int world_size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
};

}  // namespace gpt2::parallel
