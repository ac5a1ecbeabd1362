#pragma once
// The process's place in the job, from MPI. MpiSession owns MPI's lifetime (init, finalize);
// RankEnv describes one group of ranks (MPI_COMM_WORLD for a job, MPI_COMM_SELF for a one-rank
// reference run inside a test): rank and size in the group, the node it runs on and its local rank
// there (one GPU per local rank; Note [Node-local rank]). abort() ends the whole job at once so no
// peer is left waiting in a collective.
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

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

// Note [Node-local rank]: a rank's node is the ranks of the group that MPI says share memory
// (MPI_COMM_TYPE_SHARED) *and* carry the same node name: Slurm's (SLURMD_NODENAME, which slurmd
// sets for every task, and which ranks that mpirun starts inside an allocation inherit from the
// slurmd that started mpirun's daemon), else the host name. The name matters where several slurmd
// run on one host (test clusters, Slurm's multiple-slurmd): Slurm hands each node its own GPUs and
// CPUs. Open MPI 4.1's shared split follows its launcher's nodes already (srun --mpi=pmix and
// mpirun, tests/python/test_slurm_multinode.py), but an MPI that splits by host would count both
// nodes' ranks as one. Not SLURM_LOCALID: under mpirun every rank of a node inherits its daemon's
// (0). Not OMPI_COMM_WORLD_LOCAL_RANK: only Open MPI's mpirun sets it. The local rank picks the
// GPU (never the global rank modulo the GPU count); the local size is what one node's ranks share
// (host memory for offload, cores).
class RankEnv {
 public:
  explicit RankEnv(MPI_Comm comm = MPI_COMM_WORLD);
  // As above with this rank's node name given (tests place ranks on made-up nodes).
  RankEnv(MPI_Comm comm, const std::string& node_name);

  MPI_Comm comm() const { return comm_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  int num_nodes() const { return num_nodes_; }
  int node_index() const { return node_index_; }  // nodes numbered by their lowest rank
  const std::string& node_name() const { return node_name_; }
  // Where node names came from: "SLURMD_NODENAME" or "host name".
  static const char* node_name_source();
  bool is_main() const { return rank_ == 0; }  // rank 0 speaks and writes shared files

  // The collectives of small host values that set-up, checkpoints and tools need (the gradients go
  // through parallel::Communicator). Each is over the whole group and gives every rank the same
  // answer; a failed MPI call is a gpt2::Error naming it (MPI_CHECK).
  void barrier() const;
  // Sum of a double over the group (small control values: losses, norms).
  double all_reduce_sum(double value) const;
  // Element-wise sums of `values` (the same length on every rank).
  std::vector<double> all_reduce_sum(std::vector<double> values) const;
  // Maximum of an int over the group (flags: "any rank got a stop signal").
  int all_reduce_max(int value) const;
  // Element-wise maxima of `flags` (the same length on every rank).
  std::vector<int> all_reduce_max(std::vector<int> flags) const;
  // Minimum over the group ("has every rank finished", "the first bad index").
  int64_t all_reduce_min(int64_t value) const;
  // Rank 0's `value` on every rank (a decision rank 0 made alone).
  int broadcast_from_main(int value) const;
  // Every rank's `text`, by rank, on rank 0; empty on the others.
  std::vector<std::string> gather_to_main(const std::string& text) const;
  // Every rank's plain value (trivially copyable, the same type everywhere), by rank, on rank 0;
  // empty on the others.
  template <typename T>
  std::vector<T> gather_to_main(const T& value) const {
    static_assert(std::is_trivially_copyable_v<T>, "gather_to_main copies bytes");
    std::vector<T> out(is_main() ? world_size_ : 0);
    gather_bytes(&value, sizeof(T), out.data());
    return out;
  }
  // Ends the whole job (every rank of MPI_COMM_WORLD) with `code`. Never returns.
  [[noreturn]] static void abort(int code);

 private:
  void gather_bytes(const void* value, size_t bytes, void* out) const;

  MPI_Comm comm_;
  int rank_ = 0;
  int world_size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  int num_nodes_ = 1;
  int node_index_ = 0;
  std::string node_name_;
};

// A command-line tool's MPI: the session, then the job's RankEnv, ended in reverse. start()
// returns nullptr after printing "<tool>: cannot start MPI: why" to stderr (there is no log before
// MPI names the rank); on success the log knows the rank and the job's size (log::init).
struct MpiProcess {
  MpiProcess(int* argc, char*** argv) : session(argc, argv), env(MPI_COMM_WORLD) {}
  static std::unique_ptr<MpiProcess> start(const char* tool, int* argc, char*** argv);

  MpiSession session;
  RankEnv env;
};

}  // namespace gpt2::parallel
