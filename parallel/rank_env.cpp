#include "parallel/rank_env.h"

#include <cstdlib>

#include "src/base/mpi_check.h"
#include "src/base/log.h"

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

RankEnv::RankEnv(MPI_Comm comm) : comm_(comm) {
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &world_size_));
  MPI_Comm node;
  MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  MPI_CHECK(MPI_Comm_rank(node, &local_rank_));
  MPI_CHECK(MPI_Comm_size(node, &local_size_));
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
