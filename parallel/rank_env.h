#pragma once
// The process's place in the job, from MPI: world rank/size, local rank on its node (one GPU per
// local rank). RankEnv owns MPI's lifetime (init in the constructor, finalize in the destructor);
// abort() ends every rank at once so no peer is left waiting in a collective after an error.
#include <string>

namespace gpt2::parallel {

class RankEnv {
 public:
  RankEnv(int* argc, char*** argv);
  ~RankEnv();
  RankEnv(const RankEnv&) = delete;
  RankEnv& operator=(const RankEnv&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  bool is_main() const { return rank_ == 0; }  // rank 0 speaks and writes shared files

  void barrier() const;
  // Sum of a double over all ranks (small control values: losses, norms), identical on every rank.
  double all_reduce_sum(double value) const;
  // Ends the whole job with `code` (MPI_Abort when several ranks run). Never returns.
  [[noreturn]] void abort(int code) const;

 private:
  int rank_ = 0;
  int world_size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  bool finalize_ = false;
};

}  // namespace gpt2::parallel
