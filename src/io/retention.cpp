// Checkpoint retention (see retention.h).
#include "src/io/retention.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "src/base/files.h"
#include "src/io/manifest.h"

namespace gpt2 {

void prune_checkpoints(const std::string& root, int64_t keep, int64_t just_saved) {
  std::vector<std::pair<int64_t, std::string>> complete;  // by step, not by name
  for (const auto& name : files::list_directory(root)) {
    const int64_t step = step_of_dir_name(name);
    if (step >= 0 && files::is_regular_file(files::join(files::join(root, name), "manifest.json"))) {
      complete.emplace_back(step, name);
    }
  }
  std::sort(complete.begin(), complete.end());
  for (size_t i = 0; i + static_cast<size_t>(std::max<int64_t>(keep, 0)) < complete.size(); ++i) {
    if (complete[i].first != just_saved) files::remove_tree(files::join(root, complete[i].second));
  }
}

}  // namespace gpt2
