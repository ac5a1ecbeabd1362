// Checkpoint retention (see retention.h).
#include "src/io/retention.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "src/base/files.h"
#include "src/io/manifest.h"

namespace gpt2 {

void prune_checkpoints(const std::string& root, int64_t keep, int64_t just_saved) {
  const auto complete = CheckpointRoot::scan(root).complete;
  for (size_t i = 0; i + static_cast<size_t>(std::max<int64_t>(keep, 0)) < complete.size(); ++i) {
    if (complete[i].first == just_saved) continue;
    const std::string dir = files::join(root, complete[i].second);
    files::remove_file(files::join(dir, "manifest.json"));
    files::remove_tree(dir);
  }
}

std::vector<std::string> remove_checkpoint_leftovers(const std::string& root) {
  std::vector<std::string> removed;
  if (!files::is_directory(root)) return removed;
  const CheckpointRoot r = CheckpointRoot::scan(root);
  const int64_t newest = r.complete.empty() ? -1 : r.complete.back().first;
  std::vector<std::string> names = r.unfinished;
  for (const auto& [step, name] : r.incomplete) {
    if (step < newest) names.push_back(name);
  }
  for (const std::string& name : names) {
    removed.push_back(files::join(root, name));
    files::remove_tree(removed.back());
  }
  return removed;
}

}  // namespace gpt2
