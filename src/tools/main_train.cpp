// gpt2-train: a thin entry point. Parse the config, train, and on any error make sure the whole
// job ends (MPI_Abort) with the error in the log and a non-zero exit code.
//   mpirun -np 2 build/bin/gpt2-train --config configs/tiny.ini [--section.key=value ...]
#include <hdf5.h>

#include <exception>
#include <iostream>

#include "parallel/rank_env.h"
#include "src/base/errors.h"
#include "src/base/log.h"
#include "src/train/config.h"
#include "src/train/trainer.h"

// Note [HDF5 at exit]: a write that fails inside HDF5 (a disk that fills up under it) leaves a
// file HDF5 cannot flush, hence cannot close; at exit its library cleanup then loops and prints
// "HDF5: infinite loop closing library" and a line of object codes. Every file this tool writes is
// closed by its owner (h5::H5Id), so the cleanup has nothing to do for us: it is turned off, before
// the first HDF5 call.
int main(int argc, char** argv) {
  using namespace gpt2;
  H5dont_atexit();  // Note [HDF5 at exit]
  const auto process = parallel::MpiProcess::start("gpt2-train", &argc, &argv);
  if (!process) return kExitFailure;
  const parallel::RankEnv& env = process->env;

  // Config errors are the same on every rank: rank 0 reports, every rank exits 2 on its own.
  ParseResult parsed;
  try {
    parsed = parse_config(argc, argv);
  } catch (const UserError& e) {
    if (env.is_main()) log::error(e.what());
    return kExitUsage;
  }
  if (parsed.help) {
    if (env.is_main()) std::cout << "usage: gpt2-train --config FILE [--section.key=value ...]\n" << parsed.help_text;
    return kExitOk;
  }

  // Errors from here on may hit one rank only: end the whole job so no peer hangs.
  try {
    if (train(parsed.config, env).preempted) return kExitPreempted;
  } catch (const UserError& e) {
    log::error(e.what());
    parallel::RankEnv::abort(kExitUsage);
  } catch (const std::exception& e) {
    log::error(error_message(e));
    parallel::RankEnv::abort(kExitFailure);
  }
  return kExitOk;
}
