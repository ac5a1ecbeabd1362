#include "parallel/rank_env.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "src/base/log.h"
#include "src/base/mpi_check.h"

namespace gpt2::parallel {

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0;
  MPI_CHECK(MPI_Initialized(&initialized));
  if (initialized) return;
  // SERIALIZED: one thread at a time calls MPI. Backward hooks on CPU run on the calling thread,
  // but on CUDA in autograd's device thread while the caller waits in backward(): with
  // parallel.backend = mpi their reductions are MPI calls from that thread. The NCCL watchdog and
  // the data threads never call MPI.
  int provided = 0;
  MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided));
  finalize_ = true;
  // Errors come back as codes so MPI_CHECK can name the call instead of MPI aborting silently.
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
}

MpiSession::~MpiSession() {
  if (finalize_) MPI_Finalize();
}

std::unique_ptr<MpiProcess> MpiProcess::start(const char* tool, int* argc, char*** argv) {
  std::unique_ptr<MpiProcess> process;
  try {
    process = std::make_unique<MpiProcess>(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: cannot start MPI: %s\n", tool, e.what());
    return nullptr;
  }
  log::init(process->env.rank(), process->env.world_size());
  return process;
}

namespace {

// This process's node name (Note [Node-local rank]).
std::string launcher_node_name() {
  const char* slurm = std::getenv("SLURMD_NODENAME");
  if (slurm != nullptr && *slurm != '\0') return slurm;
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_CHECK(MPI_Get_processor_name(name, &len));
  return std::string(name, len);
}

}  // namespace

const char* RankEnv::node_name_source() {
  const char* slurm = std::getenv("SLURMD_NODENAME");
  return slurm != nullptr && *slurm != '\0' ? "SLURMD_NODENAME" : "host name";
}

RankEnv::RankEnv(MPI_Comm comm) : RankEnv(comm, launcher_node_name()) {}

RankEnv::RankEnv(MPI_Comm comm, const std::string& node_name) : comm_(comm), node_name_(node_name) {
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &world_size_));
  // The ranks that share memory, then among them those of this node name (Note [Node-local rank]).
  MPI_Comm shared;
  MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &shared));
  int shared_size = 1;
  MPI_CHECK(MPI_Comm_size(shared, &shared_size));
  int width = static_cast<int>(node_name_.size()) + 1;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &width, 1, MPI_INT, MPI_MAX, shared));
  std::vector<char> mine(width, '\0'), names(static_cast<size_t>(width) * shared_size);
  std::memcpy(mine.data(), node_name_.data(), node_name_.size());
  MPI_CHECK(MPI_Allgather(mine.data(), width, MPI_CHAR, names.data(), width, MPI_CHAR, shared));
  int color = 0;  // the first rank with this name stands for the node
  while (std::strcmp(names.data() + static_cast<size_t>(color) * width, mine.data()) != 0) ++color;
  MPI_Comm node;
  MPI_CHECK(MPI_Comm_split(shared, color, rank_, &node));
  MPI_CHECK(MPI_Comm_free(&shared));
  MPI_CHECK(MPI_Comm_rank(node, &local_rank_));
  MPI_CHECK(MPI_Comm_size(node, &local_size_));
  // Nodes numbered by their lowest rank: each node's local rank 0 (its lowest rank) takes its
  // place among the others and tells its node.
  MPI_Comm leaders;
  MPI_CHECK(MPI_Comm_split(comm_, local_rank_ == 0 ? 0 : MPI_UNDEFINED, rank_, &leaders));
  if (leaders != MPI_COMM_NULL) {
    MPI_CHECK(MPI_Comm_rank(leaders, &node_index_));
    MPI_CHECK(MPI_Comm_size(leaders, &num_nodes_));
    MPI_CHECK(MPI_Comm_free(&leaders));
  }
  int counts[2] = {node_index_, num_nodes_};
  MPI_CHECK(MPI_Bcast(counts, 2, MPI_INT, 0, node));
  node_index_ = counts[0];
  num_nodes_ = counts[1];
  MPI_CHECK(MPI_Comm_free(&node));
}

void RankEnv::barrier() const { MPI_CHECK(MPI_Barrier(comm_)); }

double RankEnv::all_reduce_sum(double value) const {
  double out = 0;
  MPI_CHECK(MPI_Allreduce(&value, &out, 1, MPI_DOUBLE, MPI_SUM, comm_));
  return out;
}

int RankEnv::all_reduce_max(int value) const {
  int out = 0;
  MPI_CHECK(MPI_Allreduce(&value, &out, 1, MPI_INT, MPI_MAX, comm_));
  return out;
}

std::vector<double> RankEnv::all_reduce_sum(std::vector<double> values) const {
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, MPI_SUM, comm_));
  return values;
}

std::vector<int> RankEnv::all_reduce_max(std::vector<int> flags) const {
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, flags.data(), static_cast<int>(flags.size()), MPI_INT, MPI_MAX, comm_));
  return flags;
}

int64_t RankEnv::all_reduce_min(int64_t value) const {
  int64_t out = 0;
  MPI_CHECK(MPI_Allreduce(&value, &out, 1, MPI_INT64_T, MPI_MIN, comm_));
  return out;
}

int RankEnv::broadcast_from_main(int value) const {
  MPI_CHECK(MPI_Bcast(&value, 1, MPI_INT, 0, comm_));
  return value;
}

void RankEnv::gather_bytes(const void* value, size_t bytes, void* out) const {
  const int n = static_cast<int>(bytes);
  MPI_CHECK(MPI_Gather(value, n, MPI_BYTE, out, n, MPI_BYTE, 0, comm_));
}

std::vector<std::string> RankEnv::gather_to_main(const std::string& text) const {
  int len = static_cast<int>(text.size());
  std::vector<int> lens(is_main() ? world_size_ : 0), offsets(lens.size());
  MPI_CHECK(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, comm_));
  int total = 0;
  for (size_t r = 0; r < lens.size(); ++r) {
    offsets[r] = total;
    total += lens[r];
  }
  std::vector<char> all(std::max(total, 1));
  MPI_CHECK(MPI_Gatherv(text.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(), MPI_CHAR, 0, comm_));
  std::vector<std::string> out;
  for (size_t r = 0; r < lens.size(); ++r) out.emplace_back(all.data() + offsets[r], lens[r]);
  return out;
}

void RankEnv::abort(int code) {
  log::flush();
  int world = 1, finalized = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world > 1) MPI_Abort(MPI_COMM_WORLD, code);
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();  // one rank: a clean exit keeps mpirun's report to the exit code
  std::exit(code);
}

}  // namespace gpt2::parallel
