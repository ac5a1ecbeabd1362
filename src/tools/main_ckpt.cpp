// gpt2-ckpt: inspect, verify and consolidate sharded checkpoints, and export / import Hugging Face
// weights, without MPI (never MPI_Init).
//   gpt2-ckpt inspect PATH [--json] | verify PATH | consolidate PATH --out FILE
//             | export-hf PATH --out DIR | import-hf HF_DIR --out FILE
// PATH: a checkpoint directory (manifest.json) or a checkpoint root (newest complete step_*).
// Exit 0 good, 1 damaged checkpoint, 2 usage error / not a checkpoint. Logic: checkpoint_tool.h.
// defines: main.
#include <hdf5.h>

#include <iostream>
#include <string>
#include <vector>

#include "src/tools/checkpoint_tool.h"

int main(int argc, char** argv) {
  H5dont_atexit();  // Note [HDF5 at exit] in main_train.cpp
  std::vector<std::string> args(argv + 1, argv + argc);
  const int rc = gpt2::ckpt::run_tool(args, std::cout, std::cerr);
  std::cout.flush();
  return rc;
}
