#include "src/train/profiler.h"

#include <torch/cuda.h>

#include <torch/csrc/autograd/profiler_kineto.h>
#ifdef GPT2_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "src/base/errors.h"
#include "src/base/files.h"
#include "src/base/log.h"

namespace gpt2 {

namespace prof = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;

Phase::Phase(const char* name) {
  if (record_.isActive()) record_.before(name);
#ifdef GPT2_WITH_CUDA
  nvtxRangePushA(name);
#endif
}

Phase::~Phase() {
#ifdef GPT2_WITH_CUDA
  nvtxRangePop();
#endif
}

StepProfiler::StepProfiler(int64_t steps, std::string dir, int64_t first_step, int rank, bool cuda)
    : steps_(steps), begin_(first_step + 2), dir_(std::move(dir)), rank_(rank), cuda_(cuda) {
  if (steps_ > 0) files::create_directories(dir_);
}

StepProfiler::~StepProfiler() {
  if (active_) prof::disableProfiler();  // an error mid-profile: stop without writing
}

void StepProfiler::step_begin(int64_t step) {
  if (steps_ <= 0 || step != begin_) return;
  // The host runs ahead of the GPU: without a synchronisation at both ends the window would hold
  // kernels of the step before and miss the last step's (which ran after disableProfiler).
  if (cuda_) torch::cuda::synchronize();
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda_) activities.insert(ActivityType::CUDA);
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  active_ = true;
  log::info("profiling steps ", begin_, "-", begin_ + steps_ - 1, " into ", dir_);
}

void StepProfiler::step_end(int64_t step) {
  if (!active_ || step != begin_ + steps_ - 1) return;
  active_ = false;
  if (cuda_) torch::cuda::synchronize();
  const auto result = prof::disableProfiler();
  // Time per name: CUDA kernels when there are any, else CPU ops (nested ops count in each).
  std::map<std::string, std::pair<double, int64_t>> by_name;
  double total = 0;
  for (const auto& e : result->events()) {
    const bool gpu = e.deviceType() == c10::DeviceType::CUDA;
    // (Phase ranges are mirrored onto the GPU timeline as annotations: not kernels.)
    static const std::set<std::string> phases{"data", "forward", "backward", "reduce_wait", "optimizer"};
    if (gpu != cuda_ || e.name().rfind("ProfilerStep", 0) == 0 || (gpu && phases.count(e.name()))) continue;
    auto& slot = by_name[e.name()];
    slot.first += e.durationNs() / 1e6;
    slot.second += 1;
    total += e.durationNs() / 1e6;
  }
  std::vector<std::pair<std::string, std::pair<double, int64_t>>> top(by_name.begin(), by_name.end());
  std::sort(top.begin(), top.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  const std::string path = files::join(dir_, "trace_rank" + std::to_string(rank_) + ".json");
  result->save(path);  // after reading events(): saving hands the trace over
  log::info("trace of ", steps_, " step(s) written to ", path, "; top ", cuda_ ? "CUDA kernels" : "CPU ops",
            " by time (ms per step, calls per step, share):");
  for (size_t i = 0; i < top.size() && i < 15; ++i) {
    const auto& [name, t] = top[i];
    log::info(log::format("  %9.3f ms %6.1f %5.1f%%  %s", t.first / steps_, double(t.second) / steps_,
                          total > 0 ? 100.0 * t.first / total : 0.0, name.substr(0, 110).c_str()));
  }
}

}  // namespace gpt2
