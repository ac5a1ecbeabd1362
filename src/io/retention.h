#pragma once
// Checkpoint retention: after a save, only the newest `keep` complete checkpoints (step_NNNNNNN
// directories with a manifest, ordered by step) stay under the root. The one just written is never
// removed, and .tmp directories and other entries are left alone. Run by rank 0 only.
#include <cstdint>
#include <string>

namespace gpt2 {

// Removes the complete checkpoints under `root` older than the newest `keep`, sparing `just_saved`
// (a step). keep <= 0 keeps only `just_saved`.
void prune_checkpoints(const std::string& root, int64_t keep, int64_t just_saved);

}  // namespace gpt2
