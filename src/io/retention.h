#pragma once
// Checkpoint retention: after a save, only the newest `keep` complete checkpoints (step_NNNNNNN
// directories with a manifest, ordered by step) stay under the root. The one just written is never
// removed; other entries are left alone. Run by rank 0 only.
#include <cstdint>
#include <string>
#include <vector>

namespace gpt2 {

// Removes the complete checkpoints under `root` older than the newest `keep`, sparing `just_saved`
// (a step). keep <= 0 keeps only `just_saved`. Each loses its manifest.json first, so a kill in
// the middle leaves an incomplete directory, never a complete-looking one with files missing.
void prune_checkpoints(const std::string& root, int64_t keep, int64_t just_saved);

// What interrupted saves and removals left under `root` (CheckpointRoot::scan): every step_*.tmp,
// and every incomplete step directory older than the newest complete checkpoint. Incomplete ones
// newer than it are kept for the user to look at (find_checkpoint warns about them; a save of that
// step replaces them). Returns the paths removed.
std::vector<std::string> remove_checkpoint_leftovers(const std::string& root);

}  // namespace gpt2
